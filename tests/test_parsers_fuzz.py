"""Every parser a user feeds, fed what hypothesis makes of it: random bytes,
valid files mutated (bytes set, cut, inserted, repeated), wrong dtypes,
huge numbers, duplicate entries.  Each input is accepted or refused with
the parser's own clear error (the error tier-run and tiering turn into exit
status 2); nothing else may escape, and the CLI surfaces exit 0 or 2 with
no traceback.  Parsers: the profile YAML, order files (text and .npy),
manifests (text and JSON), the catalog cache, and `tiering report`'s JSON."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_catalog import cached_tree, encode_doc, read_doc
from test_observe_job import small_stats

from tiering.catalog import CatalogError, scan
from tiering.catalog.cache import cache_file
from tiering.catalog.layout import Layout, dataset_samples
from tiering.clairvoyant.orderfile import read_order_file
from tiering.clairvoyant.samplers import OrderError
from tiering.cli import main
from tiering.observe.plot import PlotError, load_stats
from tiering.placement.index import Root, SharedIndex
from tiering.profile import ProfileError, check_profile

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
REPO = Path(__file__).resolve().parent.parent


def apply(base: bytes, ops: list[tuple[Any, ...]]) -> bytes:
    b = bytearray(base)
    for op in ops:
        at = op[1] % (len(b) + 1)
        if op[0] == "set" and b:
            b[at % len(b)] = op[2]
        elif op[0] == "cut":
            del b[at:]
        elif op[0] == "insert":
            b[at:at] = op[2]
        elif op[0] == "repeat":
            b[at:at] = bytes(b[at:at + op[2]])
    return bytes(b)


def mutated(base: bytes) -> st.SearchStrategy[bytes]:
    """base with up to 4 changes (or, sometimes, bytes of no relation to it)."""
    pos = st.integers(0, max(0, len(base)))
    op = st.one_of(st.tuples(st.just("set"), pos, st.integers(0, 255)), st.tuples(st.just("cut"), pos),
                   st.tuples(st.just("insert"), pos, st.binary(max_size=16)),
                   st.tuples(st.just("repeat"), pos, st.integers(1, 64)))
    return st.one_of(st.lists(op, min_size=1, max_size=4).map(lambda ops: apply(base, ops)),
                     st.binary(max_size=200))


HUGE = st.sampled_from([2**63, 2**64 + 1, 10**30, -(2**63) - 1, 10**400, float("inf"), float("nan"), 1e308])
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), HUGE,
                    st.floats(allow_nan=False), st.text(max_size=20))


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# -- profile YAML -------------------------------------------------------------------------------------

PROFILE_KEYS = ["name", "description", "tiers", "pfs", "network", "kind", "path", "capacity", "threads",
                "bandwidth", "optional", "local_only", "chunked_copy_mb", "read_threads", "latency_ms", "interface"]
VALUES = st.recursive(st.one_of(SCALARS, st.sampled_from(["memory", "filesystem", "auto", "50%", "1GiB", "/dev/shm",
                                                         "${TMPDIR:-/tmp}", "10 GB/s"])),
                      lambda inner: st.one_of(st.lists(inner, max_size=3),
                                              st.dictionaries(st.sampled_from(PROFILE_KEYS), inner, max_size=5)),
                      max_leaves=12)
SHIPPED = sorted((REPO / "profiles").glob("*.yaml"))


def profile_texts() -> st.SearchStrategy[bytes]:
    shipped = st.sampled_from(SHIPPED).flatmap(lambda p: mutated(p.read_bytes()))
    built = VALUES.map(lambda v: yaml.safe_dump(v).encode())
    tiers = st.lists(st.dictionaries(st.sampled_from(PROFILE_KEYS[5:]), VALUES, max_size=6), max_size=4)
    shaped = st.tuples(st.one_of(st.none(), st.text(max_size=8)), tiers).map(
        lambda nt: yaml.safe_dump({"name": nt[0], "tiers": nt[1]}).encode())
    return st.one_of(shipped, built, shaped)


@pytest.mark.slow
@FUZZ
@given(text=profile_texts())
def test_a_profile_is_loaded_or_a_profile_error(work: Path, text: bytes) -> None:
    path = work / "profile.yaml"
    path.write_bytes(text)
    try:
        check_profile(str(path))
    except ProfileError as e:
        assert str(e)
    r = CliRunner().invoke(main, ["profile", "check", str(path)])
    assert r.exit_code in (0, 2) and (r.exception is None or isinstance(r.exception, SystemExit)), r.output


# -- order files ---------------------------------------------------------------------------------------

def npy_bytes(arr: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, arr)
    return out.getvalue()


def npy_with_header(shape: str, descr: str = "<i8", fortran: str = "False", values: int = 3) -> bytes:
    """An .npy file of `values` int64 values whose header says what it is told to."""
    head = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()
    head = head.ljust(118) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head + b"\0" * 8 * values


ORDERS = st.lists(st.integers(0, 9), min_size=1, max_size=12)
HEADERS = st.one_of(
    st.tuples(st.integers(-2, 2**64), st.integers(0, 4)).map(lambda nv: npy_with_header(f"({nv[0]},)", values=nv[1])),
    st.tuples(st.integers(-2, 2**40), st.integers(-2, 2**40)).map(lambda rc: npy_with_header(f"({rc[0]}, {rc[1]})")),
    st.sampled_from(["()", "(3, 1, 1)", "[3]", "(3.0,)", "('3',)", "(10**9,)", "{1: 2}", "(", "None"]).map(
        npy_with_header),
    st.sampled_from(["<i8", "|O", "<U1", "V8", "[('a', '<i4')]", "('<i4', (2,))", "<q", "xx"]).map(
        lambda d: npy_with_header("(3,)", descr=d)),
    st.sampled_from(["True", "1", "None"]).map(lambda f: npy_with_header("(3,)", fortran=f)),
)
NPY = st.one_of(
    HEADERS,
    ORDERS.map(lambda o: npy_bytes(np.array(o, np.int64))).flatmap(mutated),
    st.tuples(ORDERS, st.sampled_from(["<i2", ">i4", "<u8", "<f4", "|b1", "<U3", "<c8", "|S2", "<M8[s]"])).map(
        lambda od: npy_bytes(np.array(od[0]).astype(od[1]))),
    st.lists(st.integers(-(2**63), 2**64 - 1), min_size=1, max_size=4).map(
        lambda o: npy_bytes(np.array(o, np.uint64 if min(o) >= 0 else np.int64) if max(o) < 2**63 or min(o) >= 0
                            else np.array([0]))),
    st.tuples(st.integers(1, 3), st.integers(0, 4)).map(lambda s: npy_bytes(np.zeros(s, np.int32).T)),
)
LINES = st.lists(st.one_of(st.integers(-5, 2**70).map(str), st.sampled_from(["", "# epoch", "#", " 3 ", "a/x.bin",
                                                                            "/abs/path", "\x00", "९", "9" * 5000, "0" * 5000 + "5",
                                                                            str(2**63), str(2**63 - 1)])),
                 max_size=12).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogatepass"))


@FUZZ
@given(content=st.one_of(NPY, LINES, LINES.flatmap(mutated)))
def test_an_order_file_is_read_or_an_order_error(work: Path, content: bytes) -> None:
    path = work / "order.npy" if content.startswith(b"\x93NUMPY") else work / "order.txt"
    path.write_bytes(content)
    for resolve in (None, {"a/x.bin": 1}.__getitem__):
        try:
            epochs = read_order_file(path, resolve)
        except OrderError as e:
            assert str(e)
        else:
            assert epochs and all(e and all(type(i) is int and 0 <= i < 2**63 for i in e) for e in epochs)


@pytest.fixture(scope="module")
def plan_data(work: Path) -> tuple[Path, Path, dict[str, str]]:
    data = work / "pfs"
    for k in range(10):
        (data / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
        (data / f"c{k % 2}" / f"f{k}.bin").write_bytes(b"x" * (100 + k))
    prof = work / "plan.yaml"
    prof.write_text(f"name: p\ntiers:\n  - {{name: ram, kind: memory, path: {work}, capacity: 1MiB}}\n")
    return data, prof, {"XDG_CACHE_HOME": str(work / "xdg")}


@settings(FUZZ, max_examples=20)
@given(content=st.one_of(NPY, LINES))
def test_tiering_plan_of_any_order_file_exits_0_or_2(work: Path, plan_data: tuple[Path, Path, dict[str, str]],
                                                    content: bytes) -> None:
    data, prof, env = plan_data
    path = work / ("plan-order.npy" if content.startswith(b"\x93NUMPY") else "plan-order.txt")
    path.write_bytes(content)
    r = CliRunner(env=env).invoke(main, ["plan", "--profile", str(prof), "--data", str(data), "--layout", "sorted",
                                         "--order-file", str(path)])
    assert r.exit_code in (0, 2) and (r.exception is None or isinstance(r.exception, SystemExit)), \
        (r.output, r.exception)


# -- manifests -----------------------------------------------------------------------------------------

ENTRIES = st.lists(st.one_of(st.sampled_from(["c0/f0.bin", "c1/f1.bin", "c0/f0.bin", "/etc/passwd", "../x", "",
                                              "c0", "c0/f0.bin\x00", "/", "." * 300]), st.text(max_size=12)),
                   max_size=8)
MANIFESTS = st.one_of(
    ENTRIES.map(lambda es: (".txt", "\n".join(es).encode("utf-8", "surrogatepass"))),
    st.one_of(ENTRIES, st.lists(st.one_of(SCALARS, st.lists(SCALARS, max_size=2)), max_size=5)).map(
        lambda es: (".json", json.dumps(es).encode())),
    st.tuples(st.sampled_from([".json", ".txt"]), st.binary(max_size=100)),
    st.just((".json", b"[" * 5_000)),
)


@FUZZ
@given(manifest=MANIFESTS)
def test_a_manifest_is_read_or_a_catalog_error(work: Path, plan_data: tuple[Path, Path, dict[str, str]],
                                               manifest: tuple[str, bytes]) -> None:
    data = plan_data[0]
    cat = scan([str(data)])
    path = work / f"manifest{manifest[0]}"
    path.write_bytes(manifest[1])
    try:
        samples = dataset_samples(cat, Layout("manifest", manifest=path))
    except CatalogError as e:
        assert str(e)
    else:
        assert samples and all(0 <= k < len(cat.files) for _, k in samples)


# -- the catalog cache ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cache_case(work: Path) -> tuple[Path, Path, Path, bytes, dict[str, Any]]:
    tree = work / "tree"
    tree.mkdir()
    root, _ = cached_tree(tree)
    cache = work / "cache"
    scan([str(root)], cache_dir=cache)
    path = cache_file(cache, str(root))
    return root, cache, path, path.read_bytes(), read_doc(path)


def doc_changes(doc: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """The cache's document with its lists and numbers changed: paths
    repeated, reordered or odd, columns of other types and sizes."""
    rels = doc["files"]["rel"]
    n = len(rels)
    paths = st.lists(st.one_of(st.sampled_from(rels), st.text(max_size=6)), min_size=n, max_size=n)

    def with_files(**change: Any) -> bytes:
        return encode_doc({**doc, "files": {**doc["files"], **change}})

    column = st.sampled_from(sorted(k for k in doc["files"] if k != "rel"))
    return st.one_of(
        paths.map(lambda p: with_files(rel=p)),
        st.tuples(column, st.lists(SCALARS, max_size=n + 1)).map(lambda cv: with_files(**{cv[0]: cv[1]})),
        st.tuples(st.sampled_from(["ino", "dev", "mtime_ns"]), st.lists(HUGE | st.integers(), min_size=1,
                                                                        max_size=len(doc["dirs"]["ino"]))).map(
            lambda kv: encode_doc({**doc, "dirs": {**doc["dirs"], kv[0]: kv[1]}})),
        st.dictionaries(st.sampled_from(["files", "scanned_ns", "dir_links", "skipped", "aliases", "version"]),
                        VALUES, max_size=2).map(lambda change: encode_doc({**doc, **change}) if "files" not in change
                                                else encode_doc(doc, meta=json.dumps({**doc, **change},
                                                                                     default=str).encode())),
    )


@pytest.mark.slow
@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_a_damaged_catalog_cache_is_used_or_ignored_never_raised(
        work: Path, cache_case: tuple[Path, Path, Path, bytes, dict[str, Any]], data: st.DataObject) -> None:
    root, cache, path, good, doc = cache_case
    content = data.draw(st.one_of(mutated(good), doc_changes(doc)))
    path.write_bytes(content)
    cat = scan([str(root)], cache_dir=cache)               # a bad cache is ignored (a log line) and rewritten
    rels = cat.files.rels()
    assert len(set(rels)) == len(rels)
    index, _ = SharedIndex.for_catalog(work / "index", [Root(cat.roots[0], 0)], [str(work)], cat)
    index.close()
    os.unlink(work / "index")


# -- tiering report's JSON -----------------------------------------------------------------------------

def stats_changes() -> st.SearchStrategy[bytes]:
    base = small_stats()
    keys = sorted(base)
    replaced = st.dictionaries(st.sampled_from(keys), VALUES, min_size=1, max_size=3).map(
        lambda change: json.dumps({**base, **change}, default=str).encode())
    nested = st.tuples(st.sampled_from(["series", "pfs", "seconds"]), st.sampled_from(
        ["t", "tier_bytes", "hit_ratio", "pfs_mib_per_s", "bytes", "bytes_without_tiering", "command", "warm"]),
        VALUES).map(lambda c: json.dumps({**base, c[0]: {**base[c[0]], c[1]: c[2]}}, default=str).encode())
    return st.one_of(replaced, nested, mutated(json.dumps(base).encode()))


@settings(FUZZ, max_examples=150)
@given(content=stats_changes())
def test_a_stats_file_is_loaded_or_a_plot_error(work: Path, content: bytes) -> None:
    path = work / "stats.json"
    path.write_bytes(content)
    try:
        load_stats(path)
    except PlotError as e:
        assert str(e)


@pytest.mark.slow
@settings(FUZZ, max_examples=10)
@given(content=stats_changes())
def test_tiering_report_of_any_stats_file_exits_0_or_2(work: Path, content: bytes) -> None:
    path = work / "report.json"
    path.write_bytes(content)
    r = CliRunner().invoke(main, ["report", str(path), "-o", str(work / "report.svg")])
    assert r.exit_code in (0, 2) and (r.exception is None or isinstance(r.exception, SystemExit)), \
        (r.output, r.exception)
