"""tiering.catalog: the parallel scan, the scan cache and the data-set order.

The ImageFolder/DatasetFolder orders are checked against examples/imagefolder.py
(an independent implementation of torchvision's documented rules, run on the
same trees): the sample paths must agree element for element, and the catalog
file each sample maps to must hold the bytes ImageFolder would read."""
from __future__ import annotations

import importlib
import io
import json
import logging
import os
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import LazyModule, age, alias_tree
from tiering import catalog as catalog_mod
from tiering.catalog import (
    IMG_EXTENSIONS,
    Catalog,
    CatalogError,
    CatalogFile,
    Layout,
    PathIndex,
    ScanError,
    dataset_order,
    dataset_samples,
    scan,
)
from tiering.catalog.cache import cache_file
from tiering.catalog.layout import _NameMatch
from tiering.catalog.model import FILE_COLUMNS, FileTable

REPO = Path(__file__).resolve().parent.parent
# examples/imagefolder.py, torchvision's rules; it imports torch: loaded by the first test that uses it
imagefolder = LazyModule("imagefolder", REPO / "examples" / "imagefolder.py")


def touch(path: Path, data: bytes | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if data is not None else os.fsencode(str(path)))  # unique bytes per file
    return path


def link_dir(link: Path, target: Path | str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)


def reference(root: Path, extensions: tuple[str, ...] | None = None,
              allow_empty: bool = False) -> list[str]:
    """Sample paths as examples/imagefolder.py lists them."""
    _, class_to_idx = imagefolder.find_classes(root)
    return [p for p, _ in imagefolder.make_dataset(str(root), class_to_idx, extensions=extensions,
                                                   allow_empty=allow_empty)]


def assert_same_samples(cat: Catalog, layout: Layout, expected: list[str]) -> list[int]:
    samples = dataset_samples(cat, layout)
    assert [p for p, _ in samples] == expected
    order = dataset_order(cat, layout)
    assert order == [k for _, k in samples]
    for path, k in samples:   # the catalog file is the one opened, byte for byte
        src = cat.source_path(cat.files[k])
        assert os.path.realpath(src) == os.path.realpath(path)
        assert Path(src).read_bytes() == Path(path).read_bytes()
    return order


# ------------------------------------------------------------------ the scan

def test_scan_catalogue(tmp_path: Path) -> None:
    root = tmp_path / "d"
    touch(root / "b" / "x.bin", b"12345")
    touch(root / "a" / "deep" / "y.bin", b"")
    touch(root / ".hidden", b"abc")
    (root / "empty").mkdir()
    (root / "gone.jpg").symlink_to(tmp_path / "nowhere")
    os.mkfifo(root / "b" / "pipe.jpg")
    (root / "b" / "flink.bin").symlink_to(root / "b" / "x.bin")
    cat = scan([str(root)], threads=4)
    assert cat.roots == [str(root)] and cat.dir_links == [False] and not cat.from_cache
    assert [(f.root, f.rel, f.size) for f in cat.files] == [
        (0, ".hidden", 3), (0, "a/deep/y.bin", 0), (0, "b/flink.bin", 5), (0, "b/x.bin", 5)]
    assert [f.link for f in cat.files] == [False, False, True, False]   # the path itself is a symlink
    st = os.stat(root / "b" / "x.bin")
    assert cat.files[3].mtime_ns == st.st_mtime_ns
    assert cat.total_bytes == 13
    assert cat.source_path(cat.files[1]) == str(root / "a" / "deep" / "y.bin")
    assert [d.rel for d in cat.dirs] == ["", "a", "a/deep", "b", "empty"]
    assert cat.dirs[3].ino == os.stat(root / "b").st_ino
    assert cat.skipped == [(0, "b/pipe.jpg"), (0, "gone.jpg")]
    assert cat.aliases == []
    # the fields job.py builds by hand still work positionally
    assert Catalog(cat.roots, cat.files, cat.dir_links).total_bytes == 13
    with pytest.raises(ScanError, match="not a directory"):
        scan([str(root / "b" / "x.bin")])


def test_symlinked_dirs_catalogued_once_deterministically(tmp_path: Path) -> None:
    root, ext = tmp_path / "d", tmp_path / "ext"
    touch(ext / "e.jpg")
    touch(root / "real" / "r.jpg")
    link_dir(root / "a_link", root / "real")       # sorts before "real": the real path still wins
    link_dir(root / "l1", ext)
    link_dir(root / "z" / "l2", ext)               # a second link to ext
    link_dir(root / "real" / "up", "..")           # a loop
    for _ in range(3):
        cat = scan([str(root)], threads=8)
        assert [f.rel for f in cat.files] == ["l1/e.jpg", "real/r.jpg"]
        assert [(a.rel, a.target) for a in cat.aliases] == [("a_link", "real"), ("real/up", ""),
                                                             ("z/l2", "l1")]
        assert cat.dir_links == [True]
    only_loop = tmp_path / "o"
    touch(only_loop / "c" / "f.jpg")
    link_dir(only_loop / "c" / "back", "..")
    assert scan([str(only_loop)]).dir_links == [True]   # an alias alone is a symlinked dir too


REAL_SCANDIR = os.scandir


class SlowFS:
    """os.scandir with a delay per listing and per entry stat, as a PFS has,
    counting how many calls are in flight at once."""

    def __init__(self, listing: float, per_stat: float):
        self.listing, self.per_stat = listing, per_stat
        self.lock = threading.Lock()
        self.inflight = self.max_inflight = self.calls = 0

    def wait(self, seconds: float) -> None:
        with self.lock:
            self.inflight += 1
            self.calls += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
        time.sleep(seconds)
        with self.lock:
            self.inflight -= 1

    def scandir(self, path: str):  # type: ignore[no-untyped-def]
        fs = self
        fs.wait(fs.listing)

        class Entry:
            def __init__(self, e: os.DirEntry) -> None:
                self.e, self.name = e, e.name

            def is_symlink(self) -> bool:
                return self.e.is_symlink()

            def stat(self, follow_symlinks: bool = True) -> os.stat_result:
                fs.wait(fs.per_stat)
                return self.e.stat(follow_symlinks=follow_symlinks)

        class It:
            def __init__(self) -> None:
                self.it = REAL_SCANDIR(path)

            def __enter__(self) -> It:
                return self

            def __exit__(self, *a: object) -> None:
                self.it.close()

            def __iter__(self):  # type: ignore[no-untyped-def]
                return (Entry(e) for e in self.it)

        return It()


def test_scan_overlaps_metadata_latency(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "d"
    for c in range(12):
        for f in range(15):
            touch(root / f"c{c}" / "s" / f"{f}.jpg", b"")
    for f in range(600):                 # one flat directory: its stats are batched too
        touch(root / "flat" / f"{f}.jpg", b"")
    expected = scan([str(root)], threads=1)
    assert len(expected.files) == 12 * 15 + 600
    fs = SlowFS(listing=0.02, per_stat=0.002)
    monkeypatch.setattr(os, "scandir", fs.scandir)
    t0 = time.monotonic()
    cat = scan([str(root)], threads=16)
    elapsed = time.monotonic() - t0
    serial = 26 * fs.listing + (12 * 16 + 13 + 600) * fs.per_stat    # >= 2.6 s one after another
    assert fs.calls == 26 + 12 * 16 + 13 + 600
    assert cat.files == expected.files and cat.dirs == expected.dirs
    assert fs.max_inflight >= 8
    # the overlap is what max_inflight proves; the time is reported, not asserted (a loaded host)
    print(f"latency emulation: {elapsed:.2f} s with 16 threads, {serial:.2f} s of latency in series")
    fs1 = SlowFS(listing=0.0, per_stat=0.0)
    monkeypatch.setattr(os, "scandir", fs1.scandir)
    scan([str(root)], threads=1)
    assert fs1.max_inflight == 1


# ------------------------------------------------------------ ImageFolder order

@pytest.fixture
def hand_tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for rel in ["a/z.JPG", "a/a.png", "a/B.jpeg", "a/notes.txt", "a/.hidden.jpg", "a/.jpg",
                "a/x/1.jpeg", "a/x-y/2.jpg", "a/x.y/4.JPEG", "a/x/deep/3.jpg", "a/x/deep/n.txt",
                "a/É.png", "a/e.png", "a/ß.webp", "a/with space.tif",
                "B/only.WebP", "Z z/k.bmp", "_u/m.pgm", "ä/ü.ppm", ".dotclass/d.jpg",
                "n/n1/n2/n3/deep.jpeg", "n/n1-/x.jpg", "n/n1/a.jpg",
                "top.jpg"]:
        touch(root / rel)
    outside = tmp_path / "outside"
    touch(outside / "5.jpg")
    touch(outside / "sub" / "6.png")
    touch(tmp_path / "linked" / "7.jpg")
    link_dir(root / "c", outside)                          # class via symlink
    link_dir(root / "c2", outside)                         # a second link to the same directory
    link_dir(root / "a" / "link", tmp_path / "linked")     # symlinked subdirectory, outside
    link_dir(root / "a" / "again", "x/deep")               # symlinked subdirectory, inside the class
    link_dir(root / "B" / "peer", "../_u")                 # another class's directory
    (root / "file-link").symlink_to(root / "top.jpg")      # not a class
    touch(root / "B" / "notes.md")
    return root


def test_imagefolder_order_matches_reference(hand_tree: Path) -> None:
    cat = scan([str(hand_tree)])
    expected = reference(hand_tree)
    order = assert_same_samples(cat, Layout("imagefolder"), expected)
    rel = [os.path.relpath(p, hand_tree) for p in expected]
    # the documented rules, spelled out: classes sorted by code point (".dotclass" < "B" < "Z z"
    # < "_u" < "a" < "c" < "c2" < "n" < "ä"; symlinked and hidden directories count), walk tuples
    # sorted by directory path string ("n/n1" < "n/n1-" < "n/n1/n2"), names sorted by code point
    # ("É" < "ß"), dot files kept, case-insensitive extensions, files in the root ignored,
    # symlinked directories walked wherever they appear
    assert rel == [
        ".dotclass/d.jpg", "B/only.WebP", "B/peer/m.pgm", "Z z/k.bmp", "_u/m.pgm",
        "a/.hidden.jpg", "a/.jpg", "a/B.jpeg", "a/a.png", "a/e.png", "a/with space.tif", "a/z.JPG",
        "a/É.png", "a/ß.webp", "a/again/3.jpg", "a/link/7.jpg", "a/x/1.jpeg", "a/x-y/2.jpg",
        "a/x.y/4.JPEG", "a/x/deep/3.jpg", "c/5.jpg", "c/sub/6.png", "c2/5.jpg", "c2/sub/6.png",
        "n/n1/a.jpg", "n/n1-/x.jpg", "n/n1/n2/n3/deep.jpeg", "ä/ü.ppm"]
    # one catalog file per directory: paths through a second link map to the same entry
    ids = dict(zip(rel, order))
    assert ids["a/again/3.jpg"] == ids["a/x/deep/3.jpg"]
    assert ids["c/5.jpg"] == ids["c2/5.jpg"] and ids["B/peer/m.pgm"] == ids["_u/m.pgm"]
    assert len(set(order)) == len(order) - 4
    # the ImageFolder dataset itself (same list) and its layout given as Layout.root
    ds = imagefolder.ImageFolder(str(hand_tree), decode=False)
    assert [p for p, _ in ds.samples] == expected
    assert dataset_order(cat, Layout("imagefolder", root=hand_tree)) == order


def test_imagefolder_walk_order_of_nested_names(tmp_path: Path) -> None:
    """Walk tuples sort by path string: '-' (0x2d) and '.' (0x2e) come before '/' (0x2f),
    '0' (0x30) after it, upper case before lower case."""
    root = tmp_path / "r"
    for rel in ["k/n1/a.jpg", "k/n1-/x.jpg", "k/n1.b/y.jpg", "k/n1/n2/deep.jpeg", "k/N0/z.png",
                "k/n10/w.jpg"]:
        touch(root / rel)
    cat = scan([str(root)])
    expected = [str(root / r) for r in ["k/N0/z.png", "k/n1/a.jpg", "k/n1-/x.jpg", "k/n1.b/y.jpg",
                                        "k/n1/n2/deep.jpeg", "k/n10/w.jpg"]]
    assert reference(root) == expected
    assert_same_samples(cat, Layout("imagefolder"), expected)


def test_datasetfolder_with_extensions(hand_tree: Path) -> None:
    cat = scan([str(hand_tree)])
    exts = (".txt", ".md", ".png")
    with pytest.raises(CatalogError, match=r"no valid file for the classes \.dotclass, Z z, _u, n, ä\b"):
        dataset_order(cat, Layout("datasetfolder", extensions=exts))
    expected = reference(hand_tree, extensions=exts, allow_empty=True)
    assert [os.path.relpath(p, hand_tree) for p in expected] == [
        "B/notes.md", "a/a.png", "a/e.png", "a/notes.txt", "a/É.png", "a/again/n.txt",
        "a/x/deep/n.txt", "c/sub/6.png", "c2/sub/6.png"]
    assert_same_samples(cat, Layout("datasetfolder", extensions=exts, allow_empty=True), expected)
    with pytest.raises(CatalogError, match="needs the extensions"):
        dataset_order(cat, Layout("datasetfolder"))
    # a single string works as in torchvision; upper-case extensions match nothing there either
    one = Layout("datasetfolder", extensions=".txt", allow_empty=True)  # type: ignore[arg-type]
    assert one.extensions == (".txt",)
    assert_same_samples(cat, one, reference(hand_tree, extensions=(".txt",), allow_empty=True))
    with pytest.raises(CatalogError, match="Found no valid file for the classes"):
        dataset_order(cat, Layout("datasetfolder", extensions=(".TXT",)))
    with pytest.raises(FileNotFoundError):
        reference(hand_tree, extensions=(".TXT",))


def test_imagefolder_errors(hand_tree: Path, tmp_path: Path) -> None:
    (hand_tree / "empty" / "sub").mkdir(parents=True)
    touch(hand_tree / "empty" / "sub" / "readme.txt")
    cat = scan([str(hand_tree)])
    with pytest.raises(CatalogError, match="Found no valid file for the classes empty"):
        dataset_order(cat, Layout("imagefolder"))
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes empty"):
        reference(hand_tree)
    assert_same_samples(cat, Layout("imagefolder", allow_empty=True), reference(hand_tree, allow_empty=True))

    flat = tmp_path / "flat"
    touch(flat / "a.jpg")
    with pytest.raises(CatalogError, match="Couldn't find any class folder"):
        dataset_order(scan([str(flat)]), Layout("imagefolder"))

    dangling = tmp_path / "dangling"
    touch(dangling / "k" / "ok.jpg")
    (dangling / "k" / "gone.jpg").symlink_to(tmp_path / "nowhere.jpg")
    (dangling / "k" / "gone.txt").symlink_to(tmp_path / "nowhere.txt")   # not a sample: fine
    assert len(reference(dangling)) == 2          # ImageFolder lists the dangling link
    with pytest.raises(CatalogError, match="gone.jpg is not a regular file"):
        dataset_order(scan([str(dangling)]), Layout("imagefolder"))

    loop = tmp_path / "loop"
    touch(loop / "k" / "sub" / "f.jpg")
    link_dir(loop / "k" / "sub" / "up", "../..")
    with pytest.raises(CatalogError, match="loop"):
        dataset_order(scan([str(loop)]), Layout("imagefolder"))

    with pytest.raises(CatalogError, match="unknown layout"):
        dataset_order(cat, Layout("webdataset"))


def test_imagefolder_with_several_roots(tmp_path: Path) -> None:
    ds, other = tmp_path / "ds", tmp_path / "other"
    touch(ds / "train" / "k1" / "a.jpg")
    touch(ds / "train" / "k0" / "b.jpg")
    touch(ds / "val" / "k0" / "c.jpg")
    touch(other / "k" / "d.jpg")
    cat = scan([str(other), str(ds)])
    with pytest.raises(CatalogError, match="2 data roots"):
        dataset_order(cat, Layout("imagefolder"))
    assert_same_samples(cat, Layout("imagefolder", root=ds / "train"), reference(ds / "train"))
    assert_same_samples(cat, Layout("imagefolder", root=other), reference(other))
    with pytest.raises(CatalogError, match="not inside the data roots"):
        dataset_order(cat, Layout("imagefolder", root=tmp_path))
    with pytest.raises(CatalogError, match="no such directory"):
        dataset_order(cat, Layout("imagefolder", root=ds / "test"))


def test_imagefolder_through_symlinked_root_and_odd_bytes(tmp_path: Path) -> None:
    real = tmp_path / "real"
    touch(real / "k" / "plain.jpg")
    bad = os.fsencode(str(real / "k")) + b"/caf\xe9.jpg"       # not UTF-8: a surrogate escape
    with open(bad, "wb") as f:
        f.write(b"latin-1 name")
    (tmp_path / "alias").symlink_to(real, target_is_directory=True)
    cat = scan([str(tmp_path / "alias")])
    assert_same_samples(cat, Layout("imagefolder"), reference(tmp_path / "alias"))
    assert os.fsencode(cat.source_path(cat.files[0])) == bad.replace(b"/real/", b"/alias/")
    assert cat.files[0].size == len(b"latin-1 name")


def test_catalog_built_by_hand_infers_directories(tmp_path: Path) -> None:
    files = [CatalogFile(0, r, 1, 1) for r in ["a/x/1.jpg", "a/x-y/2.jpg", "b/3.png", "top.jpg"]]
    cat = Catalog(["/data"], files, [False])
    assert [p for p, _ in dataset_samples(cat, Layout("imagefolder"))] == [
        "/data/a/x/1.jpg", "/data/a/x-y/2.jpg", "/data/b/3.png"]


# ------------------------------------------------------------- sorted and manifest

def test_sorted_layout(tmp_path: Path) -> None:
    r1, r2 = tmp_path / "d", tmp_path / "d-2"
    for rel in ["b.JPG", "a/x.jpg", "a-b/y.txt", ".h.jpg"]:
        touch(r1 / rel)
    touch(r2 / "z.jpg")
    cat = scan([str(r2), str(r1)])
    paths = [p for p, _ in dataset_samples(cat, Layout("sorted"))]
    # by full path: "/d-2/..." sorts before "/d/..." ('-' < '/')
    assert paths == sorted(str(p) for p in list(r1.rglob("*")) + list(r2.rglob("*")) if p.is_file())
    assert paths[0] == str(r2 / "z.jpg")
    assert [os.path.basename(p) for p, _ in dataset_samples(cat, Layout("sorted", extensions=(".jpg",)))] \
        == ["z.jpg", ".h.jpg", "x.jpg", "b.JPG"]
    one = scan([str(r1)])
    assert dataset_order(one, Layout("sorted")) == list(range(len(one.files)))


def test_manifest_layout(tmp_path: Path) -> None:
    root, ext = tmp_path / "d", tmp_path / "ext"
    touch(root / "a" / "1.jpg")
    touch(root / "b c" / "ü.bin")
    touch(ext / "e.jpg")
    link_dir(root / "l1", ext)
    link_dir(root / "l2", ext)                           # alias of l1
    (tmp_path / "rootlink").symlink_to(root, target_is_directory=True)
    cat = scan([str(root)])
    ids = {f.rel: k for k, f in enumerate(cat.files)}
    text = tmp_path / "m.txt"
    text.write_text("b c/ü.bin\r\n\n" + str(root / "a" / "1.jpg") + "\n./l2/e.jpg\n"
                    + str(root / "l2" / ".." / "l1" / "e.jpg") + "\na/1.jpg\n", encoding="utf-8")
    order = dataset_order(cat, Layout("manifest", manifest=text))
    assert order == [ids["b c/ü.bin"], ids["a/1.jpg"], ids["l1/e.jpg"], ids["l1/e.jpg"], ids["a/1.jpg"]]
    js = tmp_path / "m.json"
    js.write_text(json.dumps([["a/1.jpg", 0], "l1/e.jpg", [str(root / "b c" / "ü.bin"), 1]]))
    assert dataset_order(cat, Layout("manifest", manifest=js)) == [ids["a/1.jpg"], ids["l1/e.jpg"],
                                                                    ids["b c/ü.bin"]]
    # relative to Layout.root
    (tmp_path / "rel.txt").write_text("1.jpg\n")
    assert dataset_order(cat, Layout("manifest", manifest=tmp_path / "rel.txt", root=root / "a")) \
        == [ids["a/1.jpg"]]
    # a root given through a symlink: paths under the link and under its target both resolve
    via_link = scan([str(tmp_path / "rootlink")])
    assert via_link.roots == [str(tmp_path / "rootlink")]
    (tmp_path / "both.txt").write_text(f"{tmp_path / 'rootlink' / 'a' / '1.jpg'}\n{root / 'l2' / 'e.jpg'}\n")
    assert dataset_order(via_link, Layout("manifest", manifest=tmp_path / "both.txt")) == [
        ids["a/1.jpg"], ids["l1/e.jpg"]]

    bad = tmp_path / "bad.txt"
    bad.write_text(f"a/1.jpg\n{ext / 'e.jpg'}\na/missing.jpg\na\n../escape.jpg\n")
    with pytest.raises(CatalogError) as e:
        dataset_order(cat, Layout("manifest", manifest=bad))
    msg = str(e.value)
    assert "4 of 5 entries" in msg and "line 2" in msg and "outside the data roots" in msg
    assert "line 3" in msg and "does not exist" in msg and "line 4" in msg and "not a regular file" in msg
    assert "line 5" in msg
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(CatalogError, match="lists no files"):
        dataset_order(cat, Layout("manifest", manifest=tmp_path / "empty.txt"))
    (tmp_path / "broken.json").write_text("[1, 2")
    with pytest.raises(CatalogError, match="not valid JSON"):
        dataset_order(cat, Layout("manifest", manifest=tmp_path / "broken.json"))
    (tmp_path / "num.json").write_text("[3]")
    with pytest.raises(CatalogError, match="item 0"):
        dataset_order(cat, Layout("manifest", manifest=tmp_path / "num.json"))
    with pytest.raises(CatalogError, match="needs the manifest"):
        dataset_order(cat, Layout("manifest"))
    with pytest.raises(CatalogError, match="cannot read"):
        dataset_order(cat, Layout("manifest", manifest=tmp_path / "nope.txt"))
    two = scan([str(root), str(ext)])
    with pytest.raises(CatalogError, match="must give absolute paths"):
        dataset_order(two, Layout("manifest", manifest=text))


# ------------------------------------------------------------------ the cache

class StatCounter:
    """Counts os.stat calls and refuses os.scandir (a cache hit lists nothing)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.paths: list[str] = []
        real = os.stat

        def counting_stat(path, *a, **kw):  # type: ignore[no-untyped-def]
            self.paths.append(os.fsdecode(path))
            return real(path, *a, **kw)

        def no_scandir(path):  # type: ignore[no-untyped-def]
            raise AssertionError(f"scandir({path}) on a cache hit")

        monkeypatch.setattr(os, "stat", counting_stat)
        monkeypatch.setattr(os, "scandir", no_scandir)


def cached_tree(tmp_path: Path) -> tuple[Path, Path]:
    root, ext = tmp_path / "d", tmp_path / "ext"
    for rel in ["k1/a.jpg", "k1/n/deep/b.jpg", "k2/c.jpg", "k2/.h.jpg"]:
        touch(root / rel)
    touch(ext / "e.jpg")
    link_dir(root / "k3", ext)
    link_dir(root / "k1" / "again", "n")
    (root / "k2" / "l.jpg").symlink_to("c.jpg")
    age(root, ext)
    return root, ext


def test_cache_reused_without_per_file_stats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    first = scan([str(root)], cache_dir=cache)
    assert not first.from_cache and cache_file(cache, str(root)).is_file()
    assert oct(cache.stat().st_mode & 0o777) == "0o700"
    assert oct(cache_file(cache, str(root)).stat().st_mode & 0o777) == "0o600"
    counter = StatCounter(monkeypatch)
    again = scan([str(root)], threads=4, cache_dir=cache)
    monkeypatch.undo()
    assert again.from_cache
    for name in ("roots", "files", "dir_links", "dirs", "aliases", "skipped"):
        assert getattr(again, name) == getattr(first, name), name
    assert [f.rel for f in again.files if f.link] == ["k2/l.jpg"]
    files = {again.source_path(f) for f in again.files}
    assert not files & set(counter.paths)          # no stat of any file
    assert len(counter.paths) <= len(first.dirs) + len(first.aliases) + 2
    assert dataset_order(again, Layout("imagefolder")) == dataset_order(first, Layout("imagefolder"))
    # without cache_dir nothing is read or written
    assert not scan([str(root)]).from_cache
    # a file rewritten in place is not seen (documented); dropping the cache rescans
    touch(root / "k2" / "c.jpg", b"longer than before")
    stale = scan([str(root)], cache_dir=cache)
    assert stale.from_cache and stale.files == first.files
    catalog_mod.drop_cache(cache, again.roots)
    fresh = scan([str(root)], cache_dir=cache)
    assert not fresh.from_cache and fresh.files != first.files
    assert scan([str(root)], cache_dir=cache).files == fresh.files


@pytest.mark.parametrize("change", ["add", "remove", "rename", "mkdir", "retarget"])
def test_cache_invalidated_by_changes(tmp_path: Path, change: str) -> None:
    root, ext = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    scan([str(root)], cache_dir=cache)
    assert scan([str(root)], cache_dir=cache).from_cache
    deep = root / "k1" / "n" / "deep"
    if change == "add":
        touch(deep / "new.jpg")
    elif change == "remove":
        (deep / "b.jpg").unlink()
    elif change == "rename":
        (deep / "b.jpg").rename(deep / "b2.jpg")
    elif change == "mkdir":
        (deep / "sub").mkdir()
    else:   # the directory behind the symlinked class is replaced: no mtime under root changes
        ext.rename(tmp_path / "ext.old")
        touch(tmp_path / "ext" / "e.jpg")
        touch(tmp_path / "ext" / "f.jpg")
    fresh = scan([str(root)])
    got = scan([str(root)], cache_dir=cache)
    assert not got.from_cache
    assert got.files == fresh.files and got.dirs == fresh.dirs
    # too recent to be trusted: not cached again until the tree has aged
    assert not cache_file(cache, str(root)).exists()
    age(root, tmp_path / "ext")
    scan([str(root)], cache_dir=cache)
    assert scan([str(root)], cache_dir=cache).files == fresh.files


def read_doc(path: Path) -> dict[str, Any]:
    """A catalog cache file as one document: its meta data, and its file
    arrays as lists under "files" (the paths as "rel")."""
    with np.load(path, allow_pickle=False) as z:
        doc = json.loads(z["meta"].tobytes())
        cols = {k: z[k] for k in FILE_COLUMNS}
        table = FileTable(z["paths"], z["offsets"], np.zeros(len(z["dir"]), np.int32), z["dir"], cols)
        doc["files"] = {"rel": table.rels(), "dir": z["dir"].tolist(), **{k: v.tolist() for k, v in cols.items()}}
    return doc


def encode_doc(doc: dict[str, Any], meta: bytes | None = None, offsets_reversed: bool = False) -> bytes:
    """read_doc's document as a cache file (a column that does not fit its
    dtype is written with the dtype numpy gives it)."""
    files = doc["files"]
    data = [r.encode("utf-8", "surrogateescape") for r in files["rel"]]
    offsets = np.concatenate(([0], np.cumsum([len(d) for d in data]))).astype(np.int64)
    arrays: dict[str, np.ndarray] = {"paths": np.frombuffer(b"".join(data), np.uint8), "offsets":
                                     offsets[::-1].copy() if offsets_reversed else offsets}
    for k, dtype in {"dir": "<i4", **FILE_COLUMNS}.items():
        try:
            arrays[k] = np.asarray(files[k], dtype)
        except (ValueError, OverflowError, TypeError):
            arrays[k] = np.asarray(files[k])
    head = json.dumps({**{k: v for k, v in doc.items() if k != "files"}, "files": len(data)}).encode()
    out = io.BytesIO()
    np.savez(out, meta=np.frombuffer(meta if meta is not None else head, np.uint8), **arrays)
    return out.getvalue()


def zip_damaged(data: bytes, what: str) -> bytes:
    """A cache file with its zip directory or a member's .npy header damaged."""
    b = bytearray(data)
    entry = b.rfind(b"PK\x01\x02")          # the central directory entry of the last member
    if what == "compression":
        b[entry + 10:entry + 12] = (99).to_bytes(2, "little")
    elif what == "deflated":
        b[entry + 10:entry + 12] = (8).to_bytes(2, "little")
    elif what == "sizes":
        b[entry + 20:entry + 28] = (0xFFFFFFF0).to_bytes(4, "little") * 2
    elif what == "offset":
        b[entry + 42:entry + 46] = (len(b) - 10).to_bytes(4, "little")
    elif what == "shape":                    # the paths member claims 10**12 bytes
        at = b.index(b"'shape': (", b.index(b"paths.npy"))
        end = b.index(b")", at)
        b[at:end + 1] = b"'shape': (999999999999,)".ljust(end + 1 - at)
    return bytes(b)


def test_corrupt_cache_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    good = scan([str(root)], cache_dir=cache)
    path = cache_file(cache, str(root))
    doc = read_doc(path)
    rels = doc["files"]["rel"]
    assert len(rels) >= 3
    raw = path.read_bytes()
    bads = {
        "a path twice": encode_doc({**doc, "files": {**doc["files"], "rel": [rels[0], *rels[:-1]]}}),
        "a path twice, apart": encode_doc({**doc, "files": {**doc["files"], "rel": [*rels[:-1], rels[0]]}}),
        "paths out of order": encode_doc({**doc, "files": {**doc["files"], "rel": [rels[1], rels[0], *rels[2:]]}}),
        **{f"zip directory: {what}": zip_damaged(raw, what) for what in ("compression", "deflated", "sizes", "offset")},
        "a member's shape": zip_damaged(raw, "shape"),
        "meta nested deeply": encode_doc(doc, meta=b"[" * 100_000),
        "a directory's inode below 0": encode_doc({**doc, "dirs": {**doc["dirs"], "ino": [-1] * len(doc["dirs"]["ino"])}}),
        "garbage": b"not a zip file at all",
        "truncated": path.read_bytes()[:40],
        "not json": encode_doc(doc, meta=b"{"),
        "wrong root": encode_doc({**doc, "root": "/elsewhere"}),
        "wrong version": encode_doc({**doc, "version": 99}),
        "bad column": encode_doc({**doc, "files": {**doc["files"], "size": ["x"] * len(doc["files"]["size"])}}),
        "short column": encode_doc({**doc, "files": {**doc["files"], "size": doc["files"]["size"][1:]}}),
        "bad offsets": encode_doc(doc, offsets_reversed=True),
        "missing table": encode_doc({k: v for k, v in doc.items() if k != "dirs"}),
    }
    for what, data in bads.items():
        path.write_bytes(data)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tiering"):
            got = scan([str(root)], cache_dir=cache)
        assert not got.from_cache and got.files == good.files, what
        assert any("ignoring the catalog cache" in r.getMessage() for r in caplog.records), what
        assert scan([str(root)], cache_dir=cache).from_cache, what    # rewritten



@pytest.mark.slow
@pytest.mark.parametrize("what", ["a path twice", "zip directory"])
def test_tier_run_ignores_a_damaged_cache_and_rewrites_it(tmp_path: Path, what: str, reliability) -> None:
    from helpers import PYTHON, profile, tier_run
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "xdg"
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    path = cache_file(cache / "tiering" / "catalogs", str(root))
    scan([str(root)], cache_dir=path.parent)
    doc = read_doc(path)
    rels = doc["files"]["rel"]
    path.write_bytes(encode_doc({**doc, "files": {**doc["files"], "rel": [rels[0], *rels[:-1]]}})
                     if what == "a path twice" else zip_damaged(path.read_bytes(), "compression"))
    args = ["--profile", str(profile(tmp_path)), "--data", str(root), "--", PYTHON, "-c", "raise SystemExit(7)"]
    r = tier_run(args, env=env)
    assert r.returncode == 7 and "Traceback" not in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if "ignoring the catalog cache" in ln]) == 1, r.stderr
    r = tier_run(args, env=env)                           # rewritten by the first run
    assert r.returncode == 7 and "catalog from cache" in r.stderr and "ignoring" not in r.stderr, r.stderr
    reliability.survived(f"a damaged catalog cache ({what}): ignored once, rewritten, COMMAND's status kept")

def test_cache_per_root_and_unwritable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, _ = cached_tree(tmp_path)
    other = tmp_path / "other"
    touch(other / "k" / "o.jpg")
    age(other)
    cache = tmp_path / "cache"
    scan([str(root)], cache_dir=cache)
    both = scan([str(other), str(root)], cache_dir=cache)    # root from the cache, other scanned
    assert not both.from_cache
    assert scan([str(other), str(root)], cache_dir=cache).from_cache
    fresh = tmp_path / "fresh"
    touch(fresh / "k" / "f.jpg")                          # too recent: not cached
    assert not scan([str(fresh)], cache_dir=cache).from_cache
    assert not cache_file(cache, str(fresh)).exists()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache directory should be")
    with caplog.at_level(logging.WARNING, logger="tiering"):
        got = scan([str(root)], cache_dir=blocked / "catalogs")
    assert got.files == [f for f in both.files if f.root == 0] and not got.from_cache
    assert any("cannot write the catalog cache" in r.getMessage() for r in caplog.records)
    assert not list(cache.glob(".tmp-*"))


@pytest.mark.parametrize("what", ["dir of another user", "dir writable by others", "file of another user",
                                  "file writable by group", "file is a symlink"])
def test_a_cache_that_is_not_the_users_own_is_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                      what: str) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    good = scan([str(root)], cache_dir=cache)
    path = cache_file(cache, str(root))
    if what == "dir of another user":
        os.chown(cache, 54321, 54321)
    elif what == "dir writable by others":
        os.chmod(cache, 0o777)
    elif what == "file of another user":
        os.chown(path, 54321, 54321)
    elif what == "file writable by group":
        os.chmod(path, 0o620)
    else:
        real = path.with_name("real.json.gz")
        path.rename(real)
        path.symlink_to(real.name)
    # what is there claims a file the tree does not have
    doc = read_doc(path)
    doc["files"] = {k: v + v[:1] for k, v in doc["files"].items()}
    doc["files"]["rel"][-1] = "planted.jpg"
    planted = encode_doc(doc)
    (path.resolve()).write_bytes(planted)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tiering"):
        got = scan([str(root)], cache_dir=cache)
    assert not got.from_cache and got.files == good.files
    assert [r.getMessage() for r in caplog.records if "not using the catalog cache" in r.getMessage()]
    assert path.resolve().read_bytes() == planted            # nothing written there
    assert not list(cache.glob(".tmp-*"))


BAD_PATHS = [(table, bad) for table in ("files", "dirs", "aliases", "targets", "skipped")
             for bad in ("../escape.jpg", "/etc/passwd", "k1//a.jpg", "k1/./a.jpg", "", "k1/")
             if (table, bad) != ("targets", "")]      # an alias target "" is the root itself


@pytest.mark.parametrize(("table", "bad"), BAD_PATHS)
def test_a_cache_with_a_path_outside_its_root_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         bad: str, table: str) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    good = scan([str(root)], cache_dir=cache)
    path = cache_file(cache, str(root))
    doc = read_doc(path)
    if table == "skipped":
        doc["skipped"] = [bad]
    elif table == "targets":
        doc["aliases"]["target"][-1] = bad
    else:
        doc[table]["rel"][-1] = bad
    path.write_bytes(encode_doc(doc))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tiering"):
        got = scan([str(root)], cache_dir=cache)
    assert not got.from_cache and got.files == good.files and got.dirs == good.dirs
    assert any("is not a relative path below the root" in r.getMessage() for r in caplog.records)
    assert scan([str(root)], cache_dir=cache).from_cache       # rewritten from the fresh scan


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert catalog_mod.default_cache_dir() == tmp_path / "tiering" / "catalogs"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert catalog_mod.default_cache_dir() == tmp_path / "home" / ".cache" / "tiering" / "catalogs"


def test_img_extensions_are_torchvisions() -> None:
    assert IMG_EXTENSIONS == tuple(imagefolder.IMG_EXTENSIONS)


# ------------------------------------------------------- file identities (dev, ino)

def test_scan_records_each_files_identity(tmp_path: Path) -> None:
    root, _ = cached_tree(tmp_path)
    os.link(root / "k1" / "a.jpg", root / "k1" / "hard.jpg")
    (root / "k2" / "sym.jpg").symlink_to(root / "k1" / "a.jpg")
    cat = scan([str(root)])
    for f in cat.files:
        st = os.stat(cat.source_path(f))     # symlinks followed, as the shim's fstat sees them
        assert (f.dev, f.ino) == (st.st_dev, st.st_ino), f.rel
    ident = {f.rel: (f.dev, f.ino) for f in cat.files}
    assert ident["k1/a.jpg"] == ident["k1/hard.jpg"] == ident["k2/sym.jpg"] != ident["k2/c.jpg"]


class OtherDevices:
    """os.stat as on another node: the devices of paths under `moved` are
    shifted by `shift`, everything else by `base` (their inodes stay)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, base: int, moved: Path | None = None,
                 shift: int = 0):
        self.files: list[str] = []
        real = os.stat

        class Shifted:
            def __init__(self, r: os.stat_result, dev: int):
                self._r, self.st_dev = r, dev

            def __getattr__(self, name: str) -> object:
                return getattr(self._r, name)

        def fake(path, *a, **kw):  # type: ignore[no-untyped-def]
            r = real(path, *a, **kw)
            p = os.fsdecode(path)
            if not stat.S_ISDIR(r.st_mode):
                self.files.append(p)
            extra = shift if moved is not None and (p + "/").startswith(str(moved) + "/") else base
            return Shifted(r, r.st_dev + extra)

        monkeypatch.setattr(os, "stat", fake)


def test_a_cached_catalog_takes_the_devices_of_this_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    first = scan([str(root)], cache_dir=cache)
    node = OtherDevices(monkeypatch, base=1000)     # same cache, another node: other device numbers
    again = scan([str(root)], cache_dir=cache)
    monkeypatch.undo()
    assert again.from_cache and node.files == []   # no file stat'ed
    assert [(f.rel, f.dev - 1000, f.ino) for f in again.files] == [(f.rel, f.dev, f.ino) for f in first.files]


def test_a_cached_file_on_a_device_of_no_directory_is_stat_itself(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    first = scan([str(root)], cache_dir=cache)
    path = cache_file(cache, str(root))
    doc = read_doc(path)
    k = doc["files"]["rel"].index("k2/c.jpg")
    doc["files"]["dev"][k] = 424242                 # as if a symlink to a file on another file system
    path.write_bytes(encode_doc(doc))
    node = OtherDevices(monkeypatch, base=1000)
    again = scan([str(root)], cache_dir=cache)
    monkeypatch.undo()
    assert again.from_cache and node.files == [str(root / "k2" / "c.jpg")]
    assert [(f.dev - 1000, f.ino) for f in again.files] == [(f.dev, f.ino) for f in first.files]


def test_a_cached_device_that_is_two_devices_here_rescans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    first = scan([str(root)], cache_dir=cache)
    OtherDevices(monkeypatch, base=0, moved=root / "k2", shift=5)
    again = scan([str(root)], cache_dir=cache)
    monkeypatch.undo()
    assert not again.from_cache
    assert [f.rel for f in again.files] == [f.rel for f in first.files]


# ------------------------------------------------ the catalog's arrays (NOTE [catalog arrays])

ODD_FILES = [CatalogFile(0, "a/x.JPG", 5, 10, 1, 2, False, 0o100644, 1, 2, 1, 3, 4, 8, 4096),
             CatalogFile(1, "é/ü.png", 0, 11, 2**63 + 5, 2**64 - 1, True),
             CatalogFile(0, "top", 2**40, -5)]


def test_file_table_is_the_catalog_files_as_arrays() -> None:
    cat = Catalog(["/r0", "/r1"], list(ODD_FILES), [False, False])
    t = cat.files
    assert isinstance(t, FileTable) and len(t) == 3
    assert list(t) == ODD_FILES and t == ODD_FILES and [t[k] for k in (-1, -2, -3)] == ODD_FILES[::-1]
    assert t[1:] == ODD_FILES[1:]
    with pytest.raises(IndexError):
        t[3]
    assert t.size.tolist() == [5, 0, 2**40] and t.dev.tolist() == [1, 2**63 + 5, 0]
    assert t.ino.tolist() == [2, 2**64 - 1, 0] and t.link.tolist() == [False, True, False]
    assert t.root.tolist() == [0, 1, 0] and t.dir.tolist() == [-1, -1, -1]
    assert cat.total_bytes == 5 + 2**40
    assert t.rels() == [f.rel for f in ODD_FILES]
    assert t.terminated() == b"".join(f.rel.encode() + b"\0" for f in ODD_FILES)
    assert Catalog(cat.roots, t).files is t
    both = FileTable.concat([t, t.take(np.array([2, 0]))], [0, 1], [0, 7])
    # each part takes the root id it is given (a scan's parts have root 0)
    assert list(both) == [replace(f, root=0) for f in ODD_FILES] + [replace(ODD_FILES[2], root=1),
                                                                   replace(ODD_FILES[0], root=1)]
    assert both.dir.tolist() == [-1] * 5 and FileTable.empty() == []


def test_scan_gives_each_file_its_directory(tmp_path: Path) -> None:
    root, _ = alias_tree(tmp_path)
    other = tmp_path / "other"
    touch(other / "k" / "x.bin")
    cat = scan([str(root), str(other)])
    assert len(cat.files) == 6 and cat.files.dir.min() >= 0
    for k, f in enumerate(cat.files):
        d = cat.dirs[int(cat.files.dir[k])]
        assert d.root == f.root and d.rel == f.rel.rpartition("/")[0]


def test_path_index_finds_every_catalogued_path(tmp_path: Path) -> None:
    root, _ = alias_tree(tmp_path)
    other = tmp_path / "other"
    touch(other / "real.bin")          # the same relative path under another root
    cat = scan([str(root), str(other)])
    paths = PathIndex(cat)
    for k, f in enumerate(cat.files):
        assert paths.id_of(cat.source_path(f)) == k
    assert paths.id_of(str(other / "real.bin")) != paths.id_of(str(root / "real.bin"))
    assert paths.id_of(str(root / "nothing.bin")) == -1
    assert paths.id_of(str(root / "d")) == -1 and paths.id_of(str(tmp_path / "outside.bin")) == -1


def test_path_index_finds_a_path_among_colliding_hashes(tmp_path: Path, monkeypatch) -> None:
    """Paths whose hashes are equal (every one here: the index's hash made a
    constant) are told apart by the path itself, in either order of the run."""
    from tiering.catalog import roots as roots_mod
    for k in range(5):
        touch(tmp_path / "r" / f"f{k}.bin")
    cat = scan([str(tmp_path / "r")])
    monkeypatch.setattr(roots_mod, "hash", lambda value: 7, raising=False)
    paths = PathIndex(cat)
    for k, f in enumerate(cat.files):
        assert paths.id_of(cat.source_path(f)) == k
    assert paths.id_of(str(tmp_path / "r" / "f9.bin")) == -1


NAMES = ["a.jpg", "b.JPG", "c.Jpeg", "d.png.txt", ".jpg", "jpg", "e.pNg", "K.kpg", "\u212a.KPG", "\u0130.PNG",
         "ü.jpg", "x", "y.webp", "\udcff.jpg", "z.TIFF", "f.TAR.gzipped", "g.tar.gzipped.x", "tar.gzipped"]


@pytest.mark.parametrize("exts", [IMG_EXTENSIONS, (".kpg",), ("",), (".JPG",), ("a/b", ".png"), ("ü.jpg",),
                                  (".jpeg", ".jpg"), (".tar.gzipped", ".png.txt"), ("ar.gzipped", "g")])
def test_extension_match_on_the_arrays_is_pythons(exts: tuple[str, ...]) -> None:
    files = [CatalogFile(0, f"c{k % 3}/{name}", 1, 1) for k, name in enumerate(NAMES)]
    t = Catalog(["/r"], files, [False]).files
    ids = np.arange(len(files))
    expected = [name.lower().endswith(exts) for name in NAMES]
    assert _NameMatch(t, exts)(ids).tolist() == expected
    assert _NameMatch(t, exts)(ids[::-2]).tolist() == expected[::-2]


def test_cache_file_holds_the_arrays_and_replaces_the_old_format(tmp_path: Path) -> None:
    root, _ = cached_tree(tmp_path)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    old = cache / cache_file(cache, str(root)).name.replace(".npz", ".json.gz")
    old.write_bytes(b"a cache of format version 4")
    first = scan([str(root)], cache_dir=cache)
    assert not old.exists()
    with np.load(cache_file(cache, str(root)), allow_pickle=False) as z:
        assert sorted(z.files) == sorted(["meta", "paths", "offsets", "dir", *FILE_COLUMNS])
        assert z["size"].tolist() == first.files.size.tolist()
    again = scan([str(root)], cache_dir=cache)
    assert again.from_cache and again.files == first.files and again.dirs == first.dirs
    assert again.files.dir.tolist() == first.files.dir.tolist()


@pytest.mark.parametrize("rel", [".", "..", "a/.", "a/..", "./a", "../a", "a/./b", "a/../b", "a//b", "/a", "a/", "",
                                 "a\0b"])
@pytest.mark.parametrize("before", [[], ["k"]])
@pytest.mark.parametrize("block", [1, 2, 1 << 16])
def test_cached_paths_are_checked_on_the_arrays(rel: str, before: list[str], block: int,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tiering.catalog import cache
    from tiering.catalog.cache import _check_file_paths
    monkeypatch.setattr(cache, "CHECK_BLOCK", block)
    files = [CatalogFile(0, r, 1, 1) for r in [*before, rel, "z"]]
    with pytest.raises(ValueError, match="relative path below the root|NUL"):
        _check_file_paths(Catalog(["/r"], files, [False]).files)
    fine = [CatalogFile(0, r, 1, 1) for r in ["a", ".h", "a/.h", "..x", "a/...", "a/.b./c", "x.", "b/c..d"]]
    _check_file_paths(Catalog(["/r"], fine, [False]).files)


@pytest.mark.parametrize("block", [1, 2, 3, 1 << 16])
def test_terminated_paths_are_the_same_in_any_block_size(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import tiering.catalog.model as model
    monkeypatch.setattr(model, "TERMINATE_BLOCK", block)
    files = ODD_FILES * 3
    assert Catalog(["/r0", "/r1"], files, [False, False]).files.terminated() == \
        b"".join(f.rel.encode("utf-8", "surrogateescape") + b"\0" for f in files)
    assert FileTable.empty().terminated() == b""


# ------------------------------------------------------------ the scan in C

def odd_tree(root: Path) -> None:
    """Every kind of entry the scan sorts out, and names that sort oddly."""
    for rel in ["a/b/y", "a/b-c/x", "a/b.txt", "a/b0", "a-/z", "é/ü", "z/deep/er/f", ".hidden"]:
        touch(root / rel)
    big = root / "big"                    # more entries than one stat batch
    for k in range(700):
        touch(big / f"{k:04d}.jpg", b"x" * (k % 7))
    (big / "sub").mkdir()
    touch(big / "sub" / "in.jpg")
    os.symlink("0001.jpg", big / "link.jpg")                  # a symlinked file
    os.link(big / "0002.jpg", big / "hard.jpg")               # a hard link
    os.symlink("nowhere", root / "dangling")                  # skipped
    os.mkfifo(root / "a" / "fifo")                            # skipped
    link_dir(root / "zlink", "a")                             # a symlinked directory: catalogued once
    link_dir(root / "a" / "up", "..")                         # a link to an ancestor: an alias
    (root / "empty").mkdir()
    touch(root / os.fsdecode(b"bad-\xff-name"))               # not UTF-8


def scan_via_scandir(roots: list[str], monkeypatch: pytest.MonkeyPatch) -> Catalog:
    """scan through os.scandir and os.stat (a replaced os.scandir is used as given)."""
    real = os.scandir
    with monkeypatch.context() as m:
        m.setattr(os, "scandir", lambda p: real(p))
        return scan(roots, threads=4)


def test_the_scan_in_c_gives_the_catalog_of_os_scandir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "d"
    odd_tree(root)
    from tiering.catalog.scan import _c_scanner
    assert _c_scanner() is not None          # the library is built: scan() goes through C
    fast = scan([str(root)], threads=4)
    slow = scan_via_scandir([str(root)], monkeypatch)
    assert len(fast.files) == 700 + 1 + 2 + 8 + 1     # big/, big/sub, link and hard link, the names, the undecodable one
    assert fast.files == slow.files                           # paths, order, every column
    assert np.array_equal(fast.files.dir, slow.files.dir)
    assert fast.dirs == slow.dirs and fast.aliases == slow.aliases and fast.skipped == slow.skipped
    assert fast.dir_links == slow.dir_links == [True]
    rels = fast.files.rels()
    assert rels == sorted(rels)                               # as str, the undecodable name too
    assert "a/b-c/x" in rels and "zlink/b0" not in rels       # zlink is a's second place: an alias
    assert (0, "zlink", "a") in [(x.root, x.rel, x.target) for x in fast.aliases]
    assert (0, "dangling") in fast.skipped and (0, "a/fifo") in fast.skipped
    f = fast.files[rels.index("big/link.jpg")]
    assert f.link and f.size == 1 and f.ino == os.stat(root / "big" / "0001.jpg").st_ino
    h = fast.files[rels.index("big/hard.jpg")]
    assert not h.link and h.nlink == 2 and h.ino == os.stat(root / "big" / "0002.jpg").st_ino
    s = os.stat(root / "é" / "ü")
    u = fast.files[rels.index("é/ü")]
    assert (u.size, u.mtime_ns, u.dev, u.ino, u.mode, u.ctime_ns, u.blocks) == (
        s.st_size, s.st_mtime_ns, s.st_dev, s.st_ino, s.st_mode, s.st_ctime_ns, s.st_blocks)


def test_the_scan_in_c_stats_entries_of_unknown_type_as_those_of_known_type(tmp_path: Path) -> None:
    """A file system that gives no d_type (DT_UNKNOWN, 0): each entry is
    lstat'ed to tell a symlink; the records are those taken with d_type."""
    root = tmp_path / "d"
    odd_tree(root)
    from tiering.catalog.scan import _listing, _stat_names

    def stats(d: Path, known: bool) -> np.ndarray:
        listing = _listing(str(d))
        assert listing.types.all()               # this file system gives every d_type
        return _stat_names(str(d), listing if known else replace(listing, types=np.zeros_like(listing.types)))
    for d in [root, root / "big", root / "a"]:
        assert np.array_equal(stats(d, False), stats(d, True))
    big, top = stats(root / "big", False), stats(root, False)
    assert big["link"].sum() == 1 and big["ok"].all()                # big/link.jpg
    assert top["link"].sum() == 2 and (top["ok"] == 0).sum() == 1    # zlink, and the dangling link


def test_the_scan_in_c_reports_an_unreadable_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "d"
    touch(root / "ok" / "f.bin")
    touch(root / "closed" / "g.bin")
    scan_mod = importlib.import_module("tiering.catalog.scan")
    real = scan_mod._listing

    def listing(path: str):  # type: ignore[no-untyped-def]
        if path.endswith("closed"):     # as root, a mode does not make it unreadable
            raise OSError(13, os.strerror(13), path)
        return real(path)

    monkeypatch.setattr(scan_mod, "_listing", listing)
    part = scan_mod._walk_root(str(root), 2)
    assert part.files.rels() == ["ok/f.bin"] and len(part.errors) == 1 and "closed" in part.errors[0]


def closed_listing(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """The scan cannot list the directories of these names (EACCES): as
    root, a mode does not make a directory unreadable."""
    scan_mod = importlib.import_module("tiering.catalog.scan")
    real = scan_mod._listing

    def listing(path: str):  # type: ignore[no-untyped-def]
        if os.path.basename(path.rstrip("/")) in names:
            raise OSError(13, os.strerror(13), path)
        return real(path)
    monkeypatch.setattr(scan_mod, "_listing", listing)


def test_unreadable_directories_of_a_data_root_are_a_warning_with_their_paths_and_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "d"
    touch(root / "ok" / "f.bin")
    touch(root / "closed" / "g.bin")
    touch(root / "ok" / "shut" / "h.bin")
    closed_listing(monkeypatch, "closed", "shut")
    with caplog.at_level(logging.WARNING, logger="tiering"):
        cat = scan([str(root)])
    assert cat.files.rels() == ["ok/f.bin"]
    said = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert said == [f"2 directories under {root} cannot be read (Permission denied): {root}/closed, {root}/ok/shut; "
                    "the files in them are not catalogued (COMMAND reads them from the PFS, if it can, never from "
                    "the tiers)"]


def test_a_data_root_whose_only_directory_is_unreadable_is_an_empty_data_set_and_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "d"
    touch(root / "closed" / "g.bin")
    closed_listing(monkeypatch, "closed")
    with caplog.at_level(logging.WARNING, logger="tiering"):
        cat = scan([str(root)])
    assert len(cat.files) == 0
    assert any(r.getMessage().startswith(f"1 directory under {root} cannot be read (Permission denied): "
                                         f"{root}/closed; the files in it") for r in caplog.records)
    closed_listing(monkeypatch, "d")                       # the root itself: an error, as before
    with pytest.raises(ScanError, match="cannot scan .*Permission denied"):
        scan([str(root)])


def test_the_scan_in_c_lists_and_stats_through_the_library(tmp_path: Path) -> None:
    from tiering.catalog.scan import _listing, _stat_names
    root = tmp_path / "d"
    touch(root / "f.bin", b"12345")
    os.symlink("f.bin", root / "l")
    os.symlink("none", root / "gone")
    (root / "sub").mkdir()
    lst = _listing(str(root))
    names = lst.names.split(b"\0")[:-1]
    assert sorted(names) == [b"f.bin", b"gone", b"l", b"sub"] and lst.entries is None
    recs = _stat_names(str(root), lst)
    by = {n: r for n, r in zip(names, recs)}
    assert by[b"f.bin"]["ok"] == 1 and by[b"f.bin"]["size"] == 5 and by[b"f.bin"]["link"] == 0
    assert by[b"l"]["ok"] == 1 and by[b"l"]["link"] == 1 and by[b"l"]["ino"] == os.stat(root / "f.bin").st_ino
    assert by[b"gone"]["ok"] == 0
    assert stat.S_ISDIR(int(by[b"sub"]["mode"]))
    with pytest.raises(OSError) as e:
        _listing(str(root / "missing"))
    assert e.value.errno == 2 and str(root / "missing") in str(e.value)


def test_one_root_keeps_its_arrays_in_the_catalog() -> None:
    t = FileTable.from_rows(["a", "b"], [0, 0], [-1, -1], {k: [1, 2] for k in FILE_COLUMNS})
    one = FileTable.concat([t], [0], [0])
    assert one.paths is t.paths and one.columns["size"] is t.columns["size"] and one == t
    moved = FileTable.concat([t], [3], [0])
    assert moved.root.tolist() == [3, 3] and moved.paths is t.paths


def test_a_table_lets_go_of_the_columns_only_the_index_needs() -> None:
    t = FileTable.from_rows(["a", "b"], [0, 0], [-1, -1], {k: [7, 9] for k in FILE_COLUMNS})
    before = t.nbytes
    freed = t.release_indexed()
    assert freed == sum(np.dtype(FILE_COLUMNS[k]).itemsize * 2 for k in catalog_mod.model.INDEXED_ONLY)
    assert t.nbytes == before - freed and t.release_indexed() == 0
    f = t[1]
    assert (f.rel, f.size, f.mtime_ns, f.link) == ("b", 9, 9, True)       # what the daemon reads stays
    assert (f.dev, f.ino, f.mode, f.uid, f.nlink, f.blocks, f.blksize) == (0, 0, 0, 0, 0, 0, 0)   # 0: unknown
    part = t.take(np.array([1, 0]))
    assert part.rels() == ["b", "a"] and part.size.tolist() == [9, 7]
    for table in (t, part):     # a released column is an error, never zeros
        for name in catalog_mod.model.INDEXED_ONLY:
            with pytest.raises(catalog_mod.model.ReleasedColumn, match=f"{name} column was released"):
                getattr(table, name)
            with pytest.raises(catalog_mod.model.ReleasedColumn, match="read it from the index"):
                _ = table.columns[name]
    with pytest.raises(AttributeError):
        _ = t.no_such_column


def test_leaf_directories_with_entries_that_are_not_files_keep_their_order(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The sorted listings of leaf directories that also hold a dangling
    symlink, a fifo and a symlink to a file: the files in path order, the
    others skipped, as the general sort gives them."""
    root = tmp_path / "d"
    for rel in ["a/f3", "a/f1", "a/f2", "b/g2", "b/g1", "c/zz"]:
        touch(root / rel)
    os.symlink("nowhere", root / "a" / "dangling")
    os.mkfifo(root / "b" / "fifo")
    os.symlink("../a/f1", root / "c" / "link")
    scan_mod = importlib.import_module("tiering.catalog.scan")
    calls: list[Any] = []
    real = scan_mod._batch_order
    monkeypatch.setattr(scan_mod, "_batch_order", lambda *a: calls.append(real(*a)) or calls[-1])
    fast = scan([str(root)])
    assert calls and calls[0] is not None
    assert fast.files.rels() == ["a/f1", "a/f2", "a/f3", "b/g1", "b/g2", "c/link", "c/zz"]
    assert fast.skipped == [(0, "a/dangling"), (0, "b/fifo")]
    monkeypatch.setattr(scan_mod, "_batch_order", lambda *a: None)
    general = scan([str(root)])
    assert fast.files == general.files and np.array_equal(fast.files.dir, general.files.dir)


@pytest.mark.slow
@pytest.mark.parametrize("lister", ["c", "scandir"])
def test_a_tree_of_leaf_directories_is_ordered_as_its_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            lister: str) -> None:
    """Files only in directories without subdirectories (ImageNet's shape):
    the order comes from directories and names, without the whole paths:
    the sorted listings in directory order (_batch_order), those of the C
    scanner or of os.scandir (sorted by name bytes as the C scanner's)."""
    root = tmp_path / "d"
    for rel in ["a/b/x", "a/b/x-1", "a/b/x.1", "a/b-/y", "a/b.c/z", "a-/f", "a.b/g", "ab/h", "é/i", "z/0", "z/00",
                "z/0-", "z/1", "a/b!/k"]:
        touch(root / rel)
    for k in range(3000):                    # a directory of several stat batches
        touch(root / "big" / f"{k * 7919 % 3001}.jpg", b"")
    scan_mod = importlib.import_module("tiering.catalog.scan")
    if lister == "scandir":                  # a replaced os.scandir is used as given
        real_scandir = os.scandir
        monkeypatch.setattr(os, "scandir", lambda p: real_scandir(p))
    calls: list[Any] = []
    real = scan_mod._batch_order
    monkeypatch.setattr(scan_mod, "_batch_order", lambda *a: calls.append(real(*a)) or calls[-1])
    leaf = scan([str(root)], threads=4)
    assert calls and calls[0] is not None               # the shortcut was taken
    monkeypatch.setattr(scan_mod, "_batch_order", lambda *a: None)
    general = scan([str(root)], threads=4)
    rels = leaf.files.rels()
    assert rels == sorted(rels) and len(rels) == 14 + 3000
    assert leaf.files == general.files and np.array_equal(leaf.files.dir, general.files.dir)
    assert rels[:6] == ["a-/f", "a.b/g", "a/b!/k", "a/b-/y", "a/b.c/z", "a/b/x"]   # "-" and "." sort before "/"
    assert [leaf.dirs[d].rel for d in leaf.files.dir[:3]] == ["a-", "a.b", "a/b!"]


def test_the_cache_writer_is_waited_for_and_reaped() -> None:
    """wait_writer: False while the child runs (it is left to end alone),
    True once it ended, reaped (no zombie), and True for a child reaped already."""
    from tiering.catalog.cache import wait_writer
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],   # ends when stdin closes
                             stdin=subprocess.PIPE)
    pid = child.pid
    try:
        assert wait_writer(pid, 0.05) is False
    finally:
        assert child.stdin is not None
        child.stdin.close()
    assert wait_writer(pid, 300) is True
    child.returncode = 0             # reaped by wait_writer, not by Popen
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped
    assert wait_writer(pid, 0.05) is True


def test_scan_tasks_hand_back_results_and_errors_and_close_drops_what_did_not_start() -> None:
    import threading

    from tiering.catalog.scan import _Tasks
    gate = threading.Event()
    started: list[int] = []

    def job(k: int) -> int:
        started.append(k)
        gate.wait(30)
        if k == 1:
            raise OSError(5, "boom")
        return k * 10

    tasks = _Tasks(2, "test-tasks")
    for k in range(2):
        tasks.submit(k, job, k)
    gate.set()
    got = sorted((tag, out, type(err).__name__ if err else None) for tag, out, err in tasks.results())
    assert got == [(0, 0, None), (1, None, "OSError")]
    gate.clear()
    for k in range(2, 7):
        tasks.submit(k, job, k)           # two start on the two threads; three wait
    while len(started) < 4:
        threading.Event().wait(0.01)

    def release_once_dropped() -> None:   # the running two end only after close dropped the other three
        for _ in range(3000):
            if tasks.pending <= 2:
                break
            threading.Event().wait(0.01)
        gate.set()
    threading.Thread(target=release_once_dropped).start()
    tasks.close()
    assert tasks.threads == []
    assert sorted(started) == [0, 1, 2, 3] and tasks.pending == 2   # the two that ran are not collected
    assert not [t for t in threading.enumerate() if t.name.startswith("test-tasks")]
