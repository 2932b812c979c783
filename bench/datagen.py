"""Generate ImageNet-like data sets for tests, benchmarks and demos.

Layout (torchvision ImageFolder)::

    OUT/.datagen.json                  parameters + result, written last
    OUT/n12345678/n12345678_0.JPEG
    OUT/n12345678/n12345678_1.JPEG
    ...

* Class names look like ImageNet WordNet ids: "n" + 8 digits, drawn from the seed and
  sorted, so class index i is the same for every run with the same seed.
* File sizes follow a log-normal distribution clipped to [4 KiB, 4 MiB] whose mean (after
  clipping) is ``mean_size`` (ImageNet's train set: about 110 KiB, long tail to MiBs).
* Default content: random bytes of the drawn size (fast; they are *not* decodable images,
  read them raw, e.g. ``ImageFolder(..., decode=False)`` in examples/imagefolder.py).
* ``jpeg=True``: real JPEG files made with Pillow (class colour + gradient + noise, so a
  tiny CNN can learn the classes). The image dimensions are chosen from the drawn size
  with a calibrated bytes-per-pixel estimate, so sizes follow the distribution only
  approximately (measured: within about 10% per file, small files come out a little
  smaller); ``DatasetInfo.bytes`` is the real total.
* Everything is deterministic: the same arguments give a byte-identical tree (for JPEGs:
  on the same Pillow/libjpeg build). File i's size and content depend only on
  (seed, i), not on the number of parallel writers.
* Files are written under a temporary name and renamed into place; ``.datagen.json`` is
  written last, so an interrupted run is never taken for a complete one. Re-running an
  interrupted run with the same parameters resumes it.

CLI::

    python -m bench.datagen OUT --classes 10 --files 1000 [--mean-size 110KiB] [--jpeg]
    python -m bench.datagen OUT --classes 100 --size 2GiB [--seed 1] [--jobs 2]
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np

from tiering.units import parse_size

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

MIN_SIZE = 4 * KiB
MAX_SIZE = 4 * MiB
SIGMA = 0.75  # log-normal shape: ~0.5% of files above 4x the mean, a tail up to MiBs
DEFAULT_MEAN = 110 * KiB
MAX_CLASSES = 1_000_000

META_NAME = ".datagen.json"
PARTIAL_NAME = ".datagen-partial.json"
FORMAT_VERSION = 1

# Independent random streams derived from the seed.
_STREAM_SIZES = 0
_STREAM_CLASSES = 1
_STREAM_CONTENT = 2

# JPEG content: quality and noise amplitude, and the measured cost per pixel at them.
_JPEG_QUALITY = 90
_JPEG_NOISE = 96
_JPEG_HEADER = 620  # bytes of JFIF header + tables, whatever the image size


class DatagenError(click.ClickException):
    """A user-facing error (bad arguments, refusing to overwrite)."""


@dataclass(frozen=True)
class DatasetInfo:
    root: Path
    files: int
    bytes: int
    classes: int
    up_to_date: bool = False  # True when an existing identical output was reused

    def summary(self, seconds: float | None = None) -> str:
        mean = self.bytes / self.files if self.files else 0
        what = "up to date" if self.up_to_date else "wrote"
        text = (f"datagen: {self.root}: {what}: {self.files} files in {self.classes} "
                f"classes, {format_size(self.bytes)} (mean {format_size(mean)})")
        if seconds is not None and not self.up_to_date:
            text += f" in {seconds:.1f} s"
        return text


# --------------------------------------------------------------------------- sizes

def format_size(n: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, lo: float, hi: float) -> float:
    """Mean of min(max(X, lo), hi) for X ~ LogNormal(mu, sigma)."""
    a, b = math.log(lo), math.log(hi)
    below = _phi((a - mu) / sigma)
    above = 1.0 - _phi((b - mu) / sigma)
    inside = math.exp(mu + sigma * sigma / 2) * (
        _phi((b - mu - sigma * sigma) / sigma) - _phi((a - mu - sigma * sigma) / sigma))
    return lo * below + hi * above + inside


def lognormal_mu(mean_size: int, sigma: float = SIGMA) -> float:
    """The mu whose clipped log-normal has mean ``mean_size`` (bisection, monotone)."""
    if not MIN_SIZE < mean_size < MAX_SIZE:
        raise DatagenError(f"mean size {mean_size} B is outside ({format_size(MIN_SIZE)}, "
                           f"{format_size(MAX_SIZE)}); pick a mean size between the clip bounds")
    lo, hi = math.log(MIN_SIZE) - 10 * sigma, math.log(MAX_SIZE) + 10 * sigma
    for _ in range(200):
        mid = (lo + hi) / 2
        if clipped_lognormal_mean(mid, sigma, MIN_SIZE, MAX_SIZE) < mean_size:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def draw_sizes(n: int, mean_size: int = DEFAULT_MEAN, seed: int = 0) -> np.ndarray:
    """Sizes (int64 bytes) of files 0..n-1; a prefix of a longer draw is the shorter draw."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM_SIZES]))
    x = rng.lognormal(lognormal_mu(mean_size), SIGMA, size=n)
    return np.clip(np.rint(x), MIN_SIZE, MAX_SIZE).astype(np.int64)


def count_for_bytes(total_bytes: int, mean_size: int, seed: int) -> int:
    """The file count whose drawn sizes add up closest to ``total_bytes``."""
    n = max(16, int(total_bytes / mean_size * 1.25) + 64)
    while True:
        csum = np.cumsum(draw_sizes(n, mean_size, seed))
        if csum[-1] >= total_bytes:
            k = int(np.searchsorted(csum, total_bytes))  # csum[k] >= total_bytes
            if k > 0 and total_bytes - csum[k - 1] < csum[k] - total_bytes:
                return k  # k files (csum[k-1]) is closer than k + 1
            return k + 1
        n *= 2


# --------------------------------------------------------------------------- plan

def class_names(classes: int, seed: int) -> list[str]:
    """Sorted ImageNet-like WordNet ids ("n" + 8 digits), distinct, drawn from the seed."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM_CLASSES]))
    ids = rng.choice(10**8, size=classes, replace=False)
    return sorted(f"n{int(i):08d}" for i in ids)


@dataclass(frozen=True)
class FileSpec:
    index: int        # global file index: size and content depend on (seed, index)
    class_index: int
    relpath: str      # "<class>/<class>_<k>.JPEG"
    size: int         # drawn size (exact for random bytes, a target for JPEGs)


@dataclass(frozen=True)
class Plan:
    params: dict[str, Any]
    names: list[str]
    files: list[FileSpec]

    @property
    def drawn_bytes(self) -> int:
        return sum(f.size for f in self.files)


def make_plan(*, classes: int, files: int | None, per_class: int | None,
              total_bytes: int | None, mean_size: int, jpeg: bool, seed: int) -> Plan:
    chosen = [name for name, v in (("files", files), ("per_class", per_class),
                                   ("total_bytes", total_bytes)) if v is not None]
    if len(chosen) != 1:
        raise DatagenError("give exactly one of files (--files), per_class (--per-class) "
                           f"or total_bytes (--size); got {chosen or 'none'}")
    if not 1 <= classes <= MAX_CLASSES:
        raise DatagenError(f"classes must be between 1 and {MAX_CLASSES}, got {classes}")
    if seed < 0:
        raise DatagenError(f"seed must be >= 0, got {seed}")
    lognormal_mu(mean_size)  # validates mean_size
    if files is not None:
        n = files
    elif per_class is not None:
        n = per_class * classes
    else:
        assert total_bytes is not None
        if total_bytes <= 0:
            raise DatagenError(f"size must be positive, got {total_bytes}")
        n = count_for_bytes(total_bytes, mean_size, seed)
    if n < classes:
        raise DatagenError(f"{n} files cannot fill {classes} classes (ImageFolder rejects "
                           "empty classes); ask for more files/bytes or fewer classes")
    names = class_names(classes, seed)
    sizes = draw_sizes(n, mean_size, seed)
    specs: list[FileSpec] = []
    base, extra = divmod(n, classes)
    i = 0
    for c, name in enumerate(names):
        for k in range(base + (1 if c < extra else 0)):
            specs.append(FileSpec(i, c, f"{name}/{name}_{k}.JPEG", int(sizes[i])))
            i += 1
    params = {"format": FORMAT_VERSION, "classes": classes, "files": files,
              "per_class": per_class, "total_bytes": total_bytes, "mean_size": mean_size,
              "jpeg": jpeg, "seed": seed}
    return Plan(params, names, specs)


# --------------------------------------------------------------------------- content

def _content_rng(seed: int, index: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, _STREAM_CONTENT, index]))


def random_bytes(seed: int, spec: FileSpec) -> bytes:
    return _content_rng(seed, spec.index).bytes(spec.size)


def _class_colour(seed: int, class_index: int) -> np.ndarray:
    rng = np.random.default_rng(np.random.SeedSequence([seed, _STREAM_CLASSES, 1, class_index]))
    return rng.integers(40, 216, size=3).astype(np.int16)


def _jpeg_dims(size: int, rng: np.random.Generator) -> tuple[int, int]:
    """Width and height whose JPEG (at our quality and noise) is about ``size`` bytes."""
    pixels = max(size - _JPEG_HEADER, 256) / 0.76
    side = math.sqrt(pixels)
    for _ in range(3):  # small images cost more per pixel (block overhead)
        side = math.sqrt(max(size - _JPEG_HEADER, 256) / (0.76 + 11.0 / side))
    aspect = float(rng.uniform(0.75, 1.333))
    w = int(min(4096, max(16, round(side * math.sqrt(aspect)))))
    h = int(min(4096, max(16, round(side / math.sqrt(aspect)))))
    return w, h


def jpeg_bytes(seed: int, spec: FileSpec) -> bytes:
    """A real JPEG: class colour + random gradient + noise, sized after ``spec.size``."""
    from PIL import Image  # imported lazily: the random-bytes mode does not need Pillow

    rng = _content_rng(seed, spec.index)
    w, h = _jpeg_dims(spec.size, rng)
    colour = _class_colour(seed, spec.class_index)
    ys, xs = np.mgrid[0:h, 0:w]
    angle = float(rng.uniform(0, 2 * math.pi))
    ramp = (np.cos(angle) * xs / w + np.sin(angle) * ys / h)  # in about [-1.4, 1.4]
    strength = rng.integers(10, 40, size=3).astype(np.float32)
    img = colour[None, None, :] + (ramp[..., None] * strength[None, None, :]).astype(np.int16)
    img = img + rng.integers(-_JPEG_NOISE, _JPEG_NOISE + 1, size=(h, w, 3), dtype=np.int16)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(
        buf, "JPEG", quality=_JPEG_QUALITY)
    return buf.getvalue()


# --------------------------------------------------------------------------- writing

def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    _atomic_write(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


_OURS_TOP = re.compile(
    r"^(n\d{8}|\.datagen(-partial)?\.json|\.\.datagen(-partial)?\.json\.tmp\d+)$")


def _foreign_entries(out: Path) -> list[str]:
    """Top-level entries of ``out`` that datagen would not have written."""
    bad = []
    for entry in os.scandir(out):
        ours = _OURS_TOP.match(entry.name) and (
            entry.name.startswith(".") or entry.is_dir(follow_symlinks=False))
        if not ours:
            bad.append(entry.name)
    return sorted(bad)


def _clear(out: Path) -> None:
    """Remove datagen output from ``out`` (only called after _foreign_entries() == [])."""
    for entry in os.scandir(out):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _chunks(items: Sequence[FileSpec], n: int) -> Iterator[Sequence[FileSpec]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _write_files(out: Path, plan: Plan, jobs: int, resume: bool) -> int:
    seed = plan.params["seed"]
    jpeg = plan.params["jpeg"]
    for name in plan.names:
        d = out / name
        d.mkdir(exist_ok=True)
        if resume:  # temp files of an interrupted run
            for entry in os.scandir(d):
                if entry.name.startswith(".") and ".tmp" in entry.name:
                    os.unlink(entry.path)

    def work(chunk: Sequence[FileSpec]) -> int:
        total = 0
        for spec in chunk:
            path = out / spec.relpath
            if resume:
                try:
                    st = path.stat()
                except FileNotFoundError:
                    pass
                else:  # complete: files appear only by rename
                    if jpeg or st.st_size == spec.size:
                        total += st.st_size
                        continue
            data = jpeg_bytes(seed, spec) if jpeg else random_bytes(seed, spec)
            _atomic_write(path, data)
            total += len(data)
        return total

    chunks = list(_chunks(plan.files, 64))
    if jobs <= 1:
        return sum(work(c) for c in chunks)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return sum(pool.map(work, chunks))


def default_jobs() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def generate(out: Path, *, classes: int, files: int | None = None,
             per_class: int | None = None, total_bytes: int | None = None,
             mean_size: int = DEFAULT_MEAN, jpeg: bool = False, seed: int = 0,
             force: bool = False, jobs: int | None = None) -> DatasetInfo:
    """Write the data set to ``out`` (see the module docstring); return what is there.

    Reuses ``out`` when it already holds the output of the same parameters; resumes an
    interrupted run with the same parameters; refuses any other non-empty directory,
    except that ``force=True`` replaces a previous datagen output (never foreign files).
    """
    out = Path(out)
    plan = make_plan(classes=classes, files=files, per_class=per_class,
                     total_bytes=total_bytes, mean_size=mean_size, jpeg=jpeg, seed=seed)
    if out.exists() and not out.is_dir():
        raise DatagenError(f"{out} exists and is not a directory; pass a new directory")
    out.mkdir(parents=True, exist_ok=True)

    meta = _read_json(out / META_NAME)
    if meta is not None and meta.get("params") == plan.params:
        (out / PARTIAL_NAME).unlink(missing_ok=True)
        res = meta.get("result", {})
        return DatasetInfo(out, int(res.get("files", len(plan.files))),
                           int(res.get("bytes", 0)), classes, up_to_date=True)

    resume = False
    if any(os.scandir(out)):
        partial = _read_json(out / PARTIAL_NAME)
        foreign = _foreign_entries(out)
        if (meta is None and not foreign and partial is not None
                and partial.get("params") == plan.params):
            resume = True  # an interrupted run with the same parameters
        elif force and not foreign:
            _clear(out)
        elif foreign:
            shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
            raise DatagenError(
                f"{out} is not empty and holds files datagen did not write ({shown}); "
                "pass a new (or empty) directory")
        else:
            what = ("a datagen output with other parameters" if meta is not None
                    else "an interrupted datagen run with other parameters")
            raise DatagenError(f"{out} holds {what}; pass a new directory, or --force "
                               "to replace it")

    _write_json(out / PARTIAL_NAME, {"params": plan.params})
    written = _write_files(out, plan, jobs or default_jobs(), resume)
    info = DatasetInfo(out, len(plan.files), written, classes)
    _write_json(out / META_NAME, {
        "generator": "bench.datagen", "params": plan.params,
        "result": {"files": info.files, "bytes": info.bytes, "classes": classes}})
    (out / PARTIAL_NAME).unlink(missing_ok=True)
    return info


# --------------------------------------------------------------------------- CLI

class SizeType(click.ParamType):
    name = "size"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_size(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


SIZE = SizeType()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--classes", type=click.IntRange(1, MAX_CLASSES), required=True,
              help="Number of class folders.")
@click.option("--files", type=click.IntRange(1), help="Total number of files.")
@click.option("--per-class", type=click.IntRange(1), help="Files per class.")
@click.option("--size", "total_bytes", type=SIZE,
              help="Total size (e.g. 2GiB, 500MB): the file count is chosen to match it.")
@click.option("--mean-size", type=SIZE, default="110KiB", show_default=True,
              help="Mean file size (log-normal, clipped to [4 KiB, 4 MiB]).")
@click.option("--jpeg", is_flag=True,
              help="Real JPEG images (Pillow) instead of random bytes; sizes approximate.")
@click.option("--seed", type=click.IntRange(0), default=0, show_default=True)
@click.option("--force", is_flag=True,
              help="Replace a previous datagen output with other parameters.")
@click.option("--jobs", type=click.IntRange(1), default=None,
              help="Writer threads (default: CPUs, at most 8).")
def main(out: Path, classes: int, files: int | None, per_class: int | None,
         total_bytes: int | None, mean_size: int, jpeg: bool, seed: int, force: bool,
         jobs: int | None) -> None:
    """Generate an ImageNet-like data set in ImageFolder layout under OUT.

    Exactly one of --files, --per-class and --size is required."""
    if sum(v is not None for v in (files, per_class, total_bytes)) != 1:
        raise click.UsageError("give exactly one of --files, --per-class, --size")
    t0 = time.perf_counter()
    info = generate(out, classes=classes, files=files, per_class=per_class,
                    total_bytes=total_bytes, mean_size=mean_size, jpeg=jpeg, seed=seed,
                    force=force, jobs=jobs)
    click.echo(info.summary(time.perf_counter() - t0))


if __name__ == "__main__":
    main()
