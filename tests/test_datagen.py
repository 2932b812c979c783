"""bench.datagen, examples/imagefolder.py (torchvision rules) and tests/workloads/reader.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench import datagen
from bench.datagen import DatagenError, KiB, MiB, generate
from helpers import LazyModule

REPO = Path(__file__).resolve().parent.parent
READER = REPO / "tests" / "workloads" / "reader.py"


# both import torch: loaded by the first test that uses them, not while pytest collects
imagefolder = LazyModule("imagefolder_under_test", REPO / "examples" / "imagefolder.py")
reader = LazyModule("reader_under_test", READER)


def tree(root: Path) -> dict[str, str]:
    """relpath -> sha256 of every file under root (dot files included)."""
    out = {}
    for dirpath, _, names in os.walk(root):
        for name in names:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def data_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


SMALL = dict(classes=3, files=40, mean_size=16 * KiB)


# ----------------------------------------------------------------------------- datagen

def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path) -> None:
    a = generate(tmp_path / "a", seed=1, jobs=1, **SMALL)
    b = generate(tmp_path / "b", seed=1, jobs=2, **SMALL)
    c = generate(tmp_path / "c", seed=2, **SMALL)
    ta, tb, tc = tree(a.root), tree(b.root), tree(c.root)
    assert ta == tb and a.bytes == b.bytes
    assert len(ta) == 41  # 40 files + .datagen.json
    assert set(ta) != set(tc)  # other class names
    assert sorted(ta.values()) != sorted(tc.values())


def test_layout_and_info(tmp_path: Path) -> None:
    info = generate(tmp_path / "d", classes=3, files=10, mean_size=8 * KiB, seed=0)
    assert (info.files, info.classes, info.up_to_date) == (10, 3, False)
    classes = sorted(p.name for p in info.root.iterdir() if p.is_dir())
    assert len(classes) == 3 and all(re.fullmatch(r"n\d{8}", c) for c in classes)
    assert classes == datagen.class_names(3, 0)
    counts = [len(list((info.root / c).iterdir())) for c in classes]
    assert counts == [4, 3, 3]  # the first classes take the remainder
    for c in classes:
        for p in (info.root / c).iterdir():
            assert re.fullmatch(rf"{c}_\d+\.JPEG", p.name)
    files = data_files(info.root)
    assert info.bytes == sum(p.stat().st_size for p in files)
    assert [p.name for p in info.root.iterdir() if p.is_file()] == [".datagen.json"]
    meta = json.loads((info.root / ".datagen.json").read_text())
    assert meta["params"]["files"] == 10 and meta["result"]["bytes"] == info.bytes

    per = generate(tmp_path / "p", classes=4, per_class=2, mean_size=8 * KiB)
    assert per.files == 8
    assert all(len(list(d.iterdir())) == 2 for d in per.root.iterdir() if d.is_dir())


@pytest.mark.slow
def test_size_distribution_and_clipping(tmp_path: Path) -> None:
    info = generate(tmp_path / "m", classes=5, files=500, seed=0)  # default mean 110 KiB
    mean = info.bytes / info.files
    assert abs(mean - 110 * KiB) <= 0.15 * 110 * KiB
    sizes = [p.stat().st_size for p in data_files(info.root)]
    assert min(sizes) >= datagen.MIN_SIZE and max(sizes) <= datagen.MAX_SIZE
    assert max(sizes) > 3 * 110 * KiB  # a long tail

    small = datagen.draw_sizes(2000, 6 * KiB, seed=0)  # below the floor often
    big = datagen.draw_sizes(2000, 3 * MiB, seed=0)    # above the ceiling often
    assert small.min() == datagen.MIN_SIZE and (small == datagen.MIN_SIZE).sum() > 100
    assert big.max() == datagen.MAX_SIZE and (big == datagen.MAX_SIZE).sum() > 100
    for m, s in ((6 * KiB, small), (3 * MiB, big)):  # the mean is kept despite clipping
        assert abs(s.mean() - m) <= 0.05 * m
    assert np.array_equal(datagen.draw_sizes(100, 6 * KiB, 0), small[:100])
    with pytest.raises(DatagenError):
        datagen.draw_sizes(10, 2 * KiB)


def test_size_target(tmp_path: Path) -> None:
    target = 3 * MiB
    info = generate(tmp_path / "s", classes=4, total_bytes=target, mean_size=16 * KiB)
    sizes = datagen.draw_sizes(info.files + 1, 16 * KiB, 0)
    assert abs(info.bytes - target) <= sizes.max() / 2 + 1  # the closest file count
    assert abs(info.bytes - target) <= 0.02 * target

    res = CliRunner().invoke(datagen.main, [str(tmp_path / "cli"), "--classes", "2",
                                            "--size", "1MiB", "--mean-size", "16KiB"])
    assert res.exit_code == 0, res.output
    total = sum(p.stat().st_size for p in data_files(tmp_path / "cli"))
    assert abs(total - MiB) <= 0.05 * MiB
    assert "wrote" in res.output and "2 classes" in res.output


def test_parse_size() -> None:
    """datagen reads sizes with the one parser of the package (tiering.units)."""
    assert datagen.parse_size("110KiB") == 110 * 1024
    assert datagen.parse_size("2GiB") == 2 * 1024**3
    assert datagen.parse_size("500MB") == 500_000_000
    assert datagen.parse_size("4096") == 4096
    assert datagen.parse_size("1.5MiB") == int(1.5 * MiB)
    for bad in ("", "12XB", "KiB", "1i", "1.5M"):
        with pytest.raises(ValueError):
            datagen.parse_size(bad)


def test_rerun_is_up_to_date(tmp_path: Path) -> None:
    out = tmp_path / "u"
    first = generate(out, **SMALL)
    mtimes = {p: p.stat().st_mtime_ns for p in data_files(out)}
    again = generate(out, **SMALL)
    assert again.up_to_date and (again.files, again.bytes) == (first.files, first.bytes)
    assert mtimes == {p: p.stat().st_mtime_ns for p in data_files(out)}
    args = [str(out), "--classes", "3", "--files", "40", "--mean-size", "16KiB"]
    res = CliRunner().invoke(datagen.main, args)
    assert res.exit_code == 0 and "up to date" in res.output


def test_refuses_foreign_and_other_params(tmp_path: Path) -> None:
    foreign = tmp_path / "f"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    for force in (False, True):  # --force never deletes files datagen did not write
        with pytest.raises(DatagenError, match="precious.txt"):
            generate(foreign, force=force, **SMALL)
    assert (foreign / "precious.txt").read_text() == "keep me"

    out = tmp_path / "o"
    generate(out, seed=1, **SMALL)
    with pytest.raises(DatagenError, match="--force"):
        generate(out, seed=2, **SMALL)
    res = CliRunner().invoke(datagen.main, [str(out), "--classes", "3", "--files", "41"])
    assert res.exit_code != 0 and "new directory" in res.output
    generate(out, seed=2, force=True, **SMALL)
    assert tree(out) == tree(generate(tmp_path / "fresh", seed=2, **SMALL).root)


def test_interrupted_run_is_not_complete_and_resumes(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "i"
    real = datagen.random_bytes
    calls = {"n": 0}

    def failing(seed: int, spec: datagen.FileSpec) -> bytes:
        calls["n"] += 1
        if calls["n"] > 25:
            raise KeyboardInterrupt
        return real(seed, spec)

    monkeypatch.setattr(datagen, "random_bytes", failing)
    with pytest.raises(KeyboardInterrupt):
        generate(out, jobs=1, **SMALL)
    assert not (out / ".datagen.json").exists()
    assert len(data_files(out)) == 25
    monkeypatch.setattr(datagen, "random_bytes", real)
    info = generate(out, **SMALL)  # same parameters: resumes
    assert not info.up_to_date and info.files == 40
    assert tree(out) == tree(generate(tmp_path / "fresh", **SMALL).root)


def test_real_jpegs_decode(tmp_path: Path) -> None:
    from PIL import Image

    info = generate(tmp_path / "j", classes=2, files=8, mean_size=24 * KiB, jpeg=True)
    plan = datagen.make_plan(classes=2, files=8, per_class=None, total_bytes=None,
                             mean_size=24 * KiB, jpeg=True, seed=0)
    for spec in plan.files:
        path = info.root / spec.relpath
        with Image.open(path) as img:
            assert img.format == "JPEG"
            img.load()
            assert img.mode == "RGB" and min(img.size) >= 16
        assert 0.7 * spec.size <= path.stat().st_size <= 1.3 * spec.size
    assert tree(info.root) == tree(generate(tmp_path / "j2", classes=2, files=8,
                                            mean_size=24 * KiB, jpeg=True).root)


# ------------------------------------------------------------------------- imagefolder

def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")
    return path


@pytest.fixture
def hand_tree(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for rel in ["a/z.JPG", "a/a.png", "a/B.jpeg", "a/notes.txt", "a/x/1.jpeg",
                "a/x-y/2.jpg", "a/x.y/4.JPEG", "a/x/deep/3.jpg", "B/only.WebP",
                "top.jpg"]:
        touch(root / rel)
    outside = tmp_path / "outside"
    touch(outside / "5.jpg")
    touch(tmp_path / "linked" / "6.jpg")
    (root / "c").symlink_to(outside, target_is_directory=True)          # class via symlink
    (root / "a" / "link").symlink_to(tmp_path / "linked", target_is_directory=True)
    (root / "file-link").symlink_to(root / "top.jpg")                    # not a class
    return root


def test_imagefolder_order_follows_torchvision_rules(hand_tree: Path) -> None:
    classes, class_to_idx = imagefolder.find_classes(hand_tree)
    assert classes == ["B", "a", "c"]  # sorted by code point, symlinked dir included
    assert class_to_idx == {"B": 0, "a": 1, "c": 2}
    got = [(os.path.relpath(p, hand_tree), t)
           for p, t in imagefolder.make_dataset(hand_tree, class_to_idx)]
    # walk tuples sorted by directory path string: a < a/link < a/x < a/x-y < a/x.y
    # < a/x/deep ('-' < '.' < '/'); names sorted in each directory; root files ignored.
    assert got == [("B/only.WebP", 0),
                   ("a/B.jpeg", 1), ("a/a.png", 1), ("a/z.JPG", 1),
                   ("a/link/6.jpg", 1),
                   ("a/x/1.jpeg", 1), ("a/x-y/2.jpg", 1), ("a/x.y/4.JPEG", 1),
                   ("a/x/deep/3.jpg", 1),
                   ("c/5.jpg", 2)]
    ds = imagefolder.ImageFolder(hand_tree, decode=False)
    assert [os.path.relpath(p, hand_tree) for p, _ in ds.samples] == [g[0] for g in got]
    assert ds.imgs is ds.samples and ds.targets == [t for _, t in got]
    assert ds.classes == classes and ds.class_to_idx == class_to_idx


def test_imagefolder_is_valid_file_and_errors(hand_tree: Path, tmp_path: Path) -> None:
    seen: list[str] = []

    def only_txt_or_webp(path: str) -> bool:
        seen.append(path)
        return path.endswith((".txt", ".WebP", "5.jpg"))

    ds = imagefolder.ImageFolder(hand_tree, is_valid_file=only_txt_or_webp, decode=False)
    assert [os.path.relpath(p, hand_tree) for p, _ in ds.samples] == [
        "B/only.WebP", "a/notes.txt", "c/5.jpg"]
    assert all(os.path.isabs(p) or p.startswith(str(hand_tree)) for p in seen)
    assert ds.extensions is None
    assert [os.path.relpath(p, hand_tree) for p, _ in imagefolder.make_dataset(
        hand_tree, extensions=(".txt",), allow_empty=True)] == ["a/notes.txt"]
    with pytest.raises(ValueError):
        imagefolder.make_dataset(hand_tree, extensions=(".jpg",), is_valid_file=bool)
    with pytest.raises(ValueError):
        imagefolder.make_dataset(hand_tree, {})

    (hand_tree / "empty" / "sub").mkdir(parents=True)
    touch(hand_tree / "empty" / "readme.md")
    with pytest.raises(FileNotFoundError, match="empty"):
        imagefolder.ImageFolder(hand_tree)
    ds = imagefolder.ImageFolder(hand_tree, allow_empty=True, decode=False)
    assert "empty" in ds.classes and "empty" not in {ds.classes[t] for t in ds.targets}

    flat = tmp_path / "flat"
    touch(flat / "x.jpg")
    with pytest.raises(FileNotFoundError, match="class folder"):
        imagefolder.find_classes(flat)


def test_imagefolder_on_generated_jpegs(tmp_path: Path) -> None:
    info = generate(tmp_path / "g", classes=3, files=9, mean_size=12 * KiB, jpeg=True)
    ds = imagefolder.ImageFolder(info.root)
    assert len(ds) == 9 and ds.classes == datagen.class_names(3, 0)
    img, target = ds[4]
    assert img.mode == "RGB" and target == 1
    raw = imagefolder.ImageFolder(info.root, decode=False)
    data, _ = raw[4]
    assert data.dtype.is_floating_point is False and data.numel() == os.path.getsize(
        raw.samples[4][0])


# ------------------------------------------------------------------------------ reader

@pytest.fixture(scope="module")
def reader_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = generate(tmp_path_factory.mktemp("rd") / "data", classes=3, files=30,
                    mean_size=8 * KiB).root
    touch(root / "n00000000" / "deeper" / "extra.bin")
    touch(root / ".hidden" / "skipped.jpg")
    return root


def run_reader(root: Path, out: Path, *args: str) -> dict:
    proc = subprocess.run([sys.executable, str(READER), "--data", str(root), "--out",
                           str(out), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text())


@pytest.mark.slow
def test_reader_modes_agree(reader_tree: Path, tmp_path: Path) -> None:
    plain = run_reader(reader_tree, tmp_path / "p.json", "--mode", "plain", "--epochs", "3")
    dl = run_reader(reader_tree, tmp_path / "d.json", "--mode", "dataloader", "--epochs",
                    "3", "--workers", "2", "--mp-context", "fork")
    expected = {str(p.relative_to(reader_tree)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in data_files(reader_tree) if ".hidden" not in p.parts}
    assert plain["files"] == dl["files"] == 31 == len(expected)
    for result in (plain, dl):
        assert result["sha256"] == expected
        assert result["digest"] == reader.digest_of(expected)
        assert [e["opens"] for e in result["epochs"]] == [31] * 3
        assert sum(e["opens"] for e in result["epochs"]) == result["files"] * 3
        assert all(e["bytes"] == sum(p.stat().st_size for p in data_files(reader_tree)
                                     if ".hidden" not in p.parts) for e in result["epochs"])
    # same shuffled order as torch's DataLoader, epoch by epoch, and it changes per epoch
    orders = [e["order_sha256"] for e in plain["epochs"]]
    assert orders == [e["order_sha256"] for e in dl["epochs"]] and len(set(orders)) == 3


@pytest.mark.slow
def test_reader_spawn(reader_tree: Path, tmp_path: Path) -> None:
    res = run_reader(reader_tree, tmp_path / "s.json", "--epochs", "1", "--workers", "1",
                     "--mp-context", "spawn")
    assert res["epochs"][0]["opens"] == 31 and len(res["sha256"]) == 31


def test_reader_exits_3_when_a_file_changes(reader_tree: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    real = reader.FileDataset.__getitem__
    calls = {"n": 0}

    def flaky(self, index: int):  # type: ignore[no-untyped-def]
        i, n, hexd, local = real(self, index)
        calls["n"] += 1
        return (i, n, "0" * 64, local) if calls["n"] == 40 else (i, n, hexd, local)

    monkeypatch.setattr(reader.FileDataset, "__getitem__", flaky)
    assert reader.main(["--data", str(reader_tree), "--mode", "plain", "--epochs", "2"]) == 3
    assert "checksum changed" in capsys.readouterr().err
