"""The simulator's input: a cluster, a data set and a training loop, as in the
HDMLP performance model (NOTE [simulator] in docs/design.md).

A config is YAML (or the same structure as a dict):

    nodes: 4                 # N
    epochs: 10               # E
    batch_size: 100          # B, the global batch; each node reads ceil(B / N) of it
    drop_last: true
    seed: 0                  # the DistributedSampler seed of the access streams
    files: {count: 150000, size_mb: {mean: 1.0, std: 0.1}}   # or {catalog: DIR}
    compute_mb_s: 100        # c
    preprocess_mb_s: 200     # beta
    network_mb_s: 10000      # b_c
    pfs_link_mb_s: 2000      # b_fs
    pfs_mb_s: {1: 66, 4: 146}           # t(gamma), aggregate MB/s by PFS clients
    pfs_latency_ms: 0                   # per file read from the PFS (optional)
    copy_threads: 0          # tier-run's copies: one pool of this many threads for all
                             # classes (its pfs.read_threads); 0: each class's own threads
    copy_latency_ms: 0       # per file a copy reads from the PFS (optional; default pfs_latency_ms)
    head_start_s: 0          # seconds tier-run's copies run before the reader starts (optional)
    storage:                 # fastest first; the first class is the staging buffer
      - {capacity_mb: 1024, threads: 2, read_mb_s: {1: 16550, 2: 21164}}

Rate tables map a count (threads, clients) to MB/s; missing points are
interpolated linearly and held constant past the last point (and before the
first)."""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MB = 1_000_000


class ConfigError(Exception):
    """A config value is wrong; the message names the key and the fix."""


def _fail(key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{key}: {problem}; {fix}")


@dataclass(frozen=True)
class Table:
    """MB/s by a count (threads or clients)."""
    points: tuple[tuple[int, float], ...]

    def __call__(self, n: float) -> float:
        xs = [p[0] for p in self.points]
        k = bisect.bisect_left(xs, n)
        if k < len(xs) and xs[k] == n:
            return self.points[k][1]
        if k == 0:
            return self.points[0][1]
        if k == len(xs):
            return self.points[-1][1]
        (x0, y0), (x1, y1) = self.points[k - 1], self.points[k]
        return y0 + (n - x0) * (y1 - y0) / (x1 - x0)

    def as_dict(self) -> dict[int, float]:
        return dict(self.points)

    @staticmethod
    def parse(raw: Any, key: str) -> Table:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = {1: raw}
        if not isinstance(raw, Mapping) or not raw:
            raise _fail(key, f"must be a table of MB/s by count, got {raw!r}", "e.g. {1: 66, 4: 146}")
        pts = []
        for k, v in raw.items():
            try:
                n = int(k)
            except (TypeError, ValueError):
                raise _fail(key, f"key {k!r} is not a count", "keys are thread or client counts >= 1") from None
            if n < 1 or isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
                raise _fail(key, f"entry {k!r}: {v!r} is not a positive MB/s at a count >= 1",
                            "e.g. {1: 66, 4: 146}")
            pts.append((n, float(v)))
        return Table(tuple(sorted(pts)))


@dataclass(frozen=True)
class StorageClass:
    capacity_mb: float
    threads: int
    read: Table            # r_j(p), MB/s by threads
    name: str = ""

    @property
    def rate(self) -> float:
        """MB/s of the class with all its threads reading: r_j(p_j)."""
        return self.read(self.threads)


@dataclass(frozen=True)
class FileSpec:
    count: int = 0
    mean_mb: float = 0.0
    std_mb: float = 0.0
    catalog: str | None = None
    sizes_mb: tuple[float, ...] | None = None   # given sizes (catalog or --profile), in catalog order


@dataclass(frozen=True)
class SimConfig:
    nodes: int
    epochs: int
    batch_size: int
    files: FileSpec
    compute_mb_s: float
    preprocess_mb_s: float
    network_mb_s: float
    pfs_link_mb_s: float
    pfs: Table
    storage: tuple[StorageClass, ...]
    drop_last: bool = True
    seed: int = 0
    pfs_latency_ms: float = 0.0
    copy_threads: int = 0             # > 0: one pool shared by classes 1.. (tier-run's PFS read threads)
    copy_latency_ms: float | None = None   # a copy's PFS latency per file (None: pfs_latency_ms)
    head_start_s: float = 0.0         # tier-run's copies start this long before the reader
    # per-node streams given explicitly (from --profile with a real order):
    # orders[node][epoch] = catalog file ids in read order
    orders: tuple[tuple[tuple[int, ...], ...], ...] | None = field(default=None, repr=False)

    @property
    def local_batch(self) -> int:
        return -(-self.batch_size // self.nodes)

    def with_value(self, path: str, value: Any) -> SimConfig:
        """A copy with one value changed: `nodes`, `storage[0].capacity_mb`, ..."""
        return _set_path(self, path, value)


_TOP = ("nodes", "epochs", "batch_size", "drop_last", "seed", "files", "compute_mb_s", "preprocess_mb_s",
        "network_mb_s", "pfs_link_mb_s", "pfs_mb_s", "pfs_latency_ms", "copy_threads", "copy_latency_ms",
        "head_start_s", "storage")
_REQUIRED = ("nodes", "epochs", "batch_size", "files", "compute_mb_s", "pfs_mb_s", "storage")


def _positive(raw: Mapping[str, Any], key: str, default: float | None = None, *, integer: bool = False,
              zero: bool = False) -> Any:
    v = raw.get(key, default)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (v > 0 or (zero and v == 0))
    if integer:
        ok = ok and float(v).is_integer()
    if not ok:
        what = "an integer" if integer else "a number"
        raise _fail(key, f"must be {what} {'>= 0' if zero else '> 0'}, got {v!r}", f"e.g. {key}: {default or 1}")
    return int(v) if integer else float(v)


def _files(raw: Any, base: Path | None) -> FileSpec:
    if not isinstance(raw, Mapping):
        raise _fail("files", f"must be a mapping, got {raw!r}",
                    "e.g. files: {count: 150000, size_mb: {mean: 1.0, std: 0.1}} or files: {catalog: DIR}")
    if "catalog" in raw:
        d = Path(str(raw["catalog"])).expanduser()
        if base is not None and not d.is_absolute():
            d = base / d
        if not d.is_dir():
            raise _fail("files.catalog", f"{d} is not a directory", "give the data-set directory")
        return FileSpec(catalog=str(d))
    count = _positive(raw, "count", integer=True)
    size = raw.get("size_mb")
    if isinstance(size, (int, float)) and not isinstance(size, bool):
        size = {"mean": size, "std": 0}
    if not isinstance(size, Mapping):
        raise _fail("files.size_mb", f"must be {{mean: MB, std: MB}} or a number, got {size!r}",
                    "e.g. size_mb: {mean: 1.0, std: 0.1}")
    mean = _positive(size, "mean")
    std = _positive(size, "std", 0.0, zero=True)
    return FileSpec(count=count, mean_mb=mean, std_mb=std)


def _storage(raw: Any) -> tuple[StorageClass, ...]:
    if not isinstance(raw, list) or not raw:
        raise _fail("storage", "must be a list of classes, fastest first (the first is the staging buffer)",
                    "e.g. storage: [{capacity_mb: 1024, threads: 2, read_mb_s: {1: 16550, 2: 21164}}]")
    out = []
    for k, c in enumerate(raw):
        key = f"storage[{k}]"
        if not isinstance(c, Mapping):
            raise _fail(key, f"must be a mapping, got {c!r}", "e.g. {capacity_mb: 1024, threads: 2, read_mb_s: 5000}")
        unknown = set(c) - {"capacity_mb", "threads", "read_mb_s", "name"}
        if unknown:
            raise _fail(key, f"unknown key {sorted(unknown)[0]!r}", "keys: capacity_mb, threads, read_mb_s, name")
        cap = _positive(c, "capacity_mb", zero=True)
        threads = _positive(c, "threads", 1, integer=True)
        out.append(StorageClass(cap, threads, Table.parse(c.get("read_mb_s"), key + ".read_mb_s"),
                                str(c.get("name", f"class{k}"))))
    return tuple(out)


def config_from_dict(raw: Mapping[str, Any], base: Path | None = None) -> SimConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("the config must be a YAML mapping (nodes: ..., epochs: ..., storage: [...])")
    unknown = [k for k in raw if k not in _TOP]
    if unknown:
        raise _fail(str(unknown[0]), "unknown key", "keys: " + ", ".join(_TOP))
    missing = [k for k in _REQUIRED if k not in raw]
    if missing:
        raise _fail(missing[0], "missing", "see `tiering simulate --help` for an example config")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise _fail("seed", f"must be an integer >= 0, got {seed!r}", "e.g. seed: 0")
    drop_last = raw.get("drop_last", True)
    if not isinstance(drop_last, bool):
        raise _fail("drop_last", f"must be true or false, got {drop_last!r}", "e.g. drop_last: true")
    compute = _positive(raw, "compute_mb_s")
    return SimConfig(
        nodes=_positive(raw, "nodes", integer=True), epochs=_positive(raw, "epochs", integer=True),
        batch_size=_positive(raw, "batch_size", integer=True), files=_files(raw["files"], base),
        compute_mb_s=compute, preprocess_mb_s=_positive(raw, "preprocess_mb_s", 1e12),
        network_mb_s=_positive(raw, "network_mb_s", 1e12), pfs_link_mb_s=_positive(raw, "pfs_link_mb_s", 1e12),
        pfs=Table.parse(raw["pfs_mb_s"], "pfs_mb_s"), storage=_storage(raw["storage"]),
        drop_last=drop_last, seed=seed, pfs_latency_ms=_positive(raw, "pfs_latency_ms", 0.0, zero=True),
        copy_threads=int(_positive(raw, "copy_threads", 0, integer=True, zero=True)),
        copy_latency_ms=_positive(raw, "copy_latency_ms", zero=True) if "copy_latency_ms" in raw else None,
        head_start_s=_positive(raw, "head_start_s", 0.0, zero=True))


def load_config(path: str | Path) -> SimConfig:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text())
    except OSError as e:
        raise ConfigError(f"{p}: cannot read: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    try:
        return config_from_dict(raw, p.parent)
    except ConfigError as e:
        raise ConfigError(f"{p}: {e}") from None


# -- changing one value (sweeps) ----------------------------------------------------

_TABLES = {"pfs_mb_s": "pfs", "read_mb_s": "read"}


def _set_path(obj: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    name, index = head, None
    if head.endswith("]") and "[" in head:
        name, _, idx = head[:-1].partition("[")
        try:
            index = int(idx)
        except ValueError:
            raise _fail(path, f"index {idx!r} is not a number", "e.g. storage[1].capacity_mb") from None
    name = _TABLES.get(name, name)
    if name == "files" and rest in ("count", "mean_mb", "std_mb"):
        name, rest = "files", rest
    if not dataclasses.is_dataclass(obj) or name not in {f.name for f in dataclasses.fields(obj)}:
        raise _fail(path, f"{head!r} is not a setting here",
                    "e.g. nodes, epochs, compute_mb_s, storage[0].capacity_mb, files.count")
    current = getattr(obj, name)
    if index is not None:
        if not isinstance(current, tuple) or not -len(current) <= index < len(current):
            raise _fail(path, f"{name} has no element {index}", f"{name} has {len(current)} elements")
        items = list(current)
        items[index] = _set_path(items[index], rest, value) if rest else value
        return dataclasses.replace(obj, **{name: tuple(items)})  # type: ignore[type-var]
    if rest:
        return dataclasses.replace(obj, **{name: _set_path(current, rest, value)})  # type: ignore[type-var]
    if isinstance(current, Table):
        value = Table.parse(value, path)
    elif isinstance(current, bool):
        value = bool(value)
    elif isinstance(current, int):
        if not float(value).is_integer():
            raise _fail(path, f"must be an integer, got {value!r}", "e.g. 4")
        value = int(value)
    elif isinstance(current, float):
        value = float(value)
    return dataclasses.replace(obj, **{name: value})  # type: ignore[type-var]
