"""What the shim sees besides write opens: renames, unlinks and truncates
by path (NOTE [namespace changes]) and descriptors a process was started
with open for writing (NOTE [inherited writes]).  Each case: the copies
are published, COMMAND changes a data-set file, and a later open (or
stat) answers what the file system holds."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import PYTHON, ShimEnv, alias_tree, catalog_shimenv
from tiering.placement.index import lib

# run under the shim: argv[1] is a script of the change, then each later path is read back
CHANGE_THEN_READ = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
exec(sys.argv[1])
for p in sys.argv[2:]:
    try:
        with open(p, 'rb') as f:
            where = os.readlink(f'/proc/self/fd/{f.fileno()}')
            print(p, where, f.read().hex(), os.stat(p).st_size)
    except FileNotFoundError:
        print(p, 'ENOENT', os.path.exists(p))
"""


def change_then_read(se: ShimEnv, change: str, *paths: Path, cwd: Path | None = None) -> dict[str, list[str]]:
    r = se.run([PYTHON, "-c", CHANGE_THEN_READ, change, *map(str, paths)], cwd=cwd)
    assert r.returncode == 0, r.stderr
    return {line.split(" ")[0]: line.split(" ")[1:] for line in r.stdout.splitlines()}


def served(se: ShimEnv, p: Path, seen: dict[str, list[str]]) -> bytes:
    """The bytes a later open of p read, checked to come from the PFS with
    the size the file system has."""
    where, data, size = seen[str(p)]
    assert where == str(p), where                      # not the tier's copy
    assert int(size) == len(bytes.fromhex(data))       # nor the stat the scan recorded
    return bytes.fromhex(data)


# the calls under test, each as COMMAND makes it: renames over a data file, unlinks of one
CALLS = {
    "rename: os.replace": "os.replace({tmp!r}, {dst!r})",
    "rename: renameat": "d = os.open({dir!r}, os.O_RDONLY); os.replace('one.tmp', 'one.bin', src_dir_fd=d, dst_dir_fd=d)",
    "rename: renameat2": "assert libc.renameat2(-100, {tmp!r}.encode(), -100, {dst!r}.encode(), 0) == 0",
    "rename: mv": "import subprocess; subprocess.run(['mv', {tmp!r}, {dst!r}], check=True)",
    "rename: sed -i": "import subprocess; subprocess.run(['sed', '-i', '-e', '1s/^/NEW/', {dst!r}], check=True)",
    "unlink: os.unlink": "os.unlink({dst!r})",
    "unlink: unlinkat": "d = os.open({dir!r}, os.O_RDONLY); os.unlink('one.bin', dir_fd=d)",
    "unlink: remove": "assert libc.remove({dst!r}.encode()) == 0",
    "unlink: rm": "import subprocess; subprocess.run(['rm', {dst!r}], check=True)",
}


def calls(kind: str) -> list[str]:
    return [k.split(": ")[1] for k in CALLS if k.startswith(kind + ": ")]


@pytest.mark.parametrize("how", calls("rename"))
def test_a_file_renamed_over_a_data_file_is_what_later_opens_read(shimenv, how, reliability):
    """The atomic-save idiom (os.replace of a temporary file, sed -i, mv):
    the old copy is never served again, and the stat is the new file's."""
    shimenv.place_all()
    dst = shimenv.root / "a/one.bin"
    tmp = shimenv.root / "a/one.tmp"
    tmp.write_bytes(b"the new bytes\n" * 9)
    change = CALLS[f"rename: {how}"].format(dst=str(dst), tmp=str(tmp), dir=str(dst.parent))
    seen = change_then_read(shimenv, change, dst, cwd=dst.parent)
    now = dst.read_bytes()
    assert now != shimenv.contents["a/one.bin"]
    assert served(shimenv, dst, seen) == now
    assert shimenv.state("a/one.bin") == lib.TIERING_STATE_INVALID
    assert shimenv.state("a/two.bin") == 1                     # the rest stays in service
    # one a call (mv tries a rename that does not replace first, then one that does)
    assert shimenv.index.counters()["writes"] == (2 if how == "mv" else 1)
    assert lib.TIERING_EV_WRITE in [e.kind for e in shimenv.index.drain()]
    reliability.survived(f"a data file renamed over by COMMAND ({how})")
    reliability.checked(reads=1, nbytes=len(now))


def test_a_data_file_renamed_over_another_leaves_its_old_name_missing(shimenv):
    shimenv.place_all()
    one, two = shimenv.root / "a/one.bin", shimenv.root / "a/two.bin"
    seen = change_then_read(shimenv, f"os.rename({str(one)!r}, {str(two)!r})", one, two)
    assert seen[str(one)] == ["ENOENT", "False"]
    assert served(shimenv, two, seen) == shimenv.contents["a/one.bin"]
    assert shimenv.state("a/one.bin") == shimenv.state("a/two.bin") == lib.TIERING_STATE_INVALID


def test_an_exchange_of_two_data_files_swaps_what_they_read(shimenv):
    shimenv.place_all()
    one, two = shimenv.root / "a/one.bin", shimenv.root / "a/two.bin"
    change = f"assert libc.renameat2(-100, {str(one).encode()!r}, -100, {str(two).encode()!r}, 2) == 0"
    seen = change_then_read(shimenv, change, one, two)   # RENAME_EXCHANGE
    assert served(shimenv, one, seen) == shimenv.contents["a/two.bin"]
    assert served(shimenv, two, seen) == shimenv.contents["a/one.bin"]


def test_a_file_renamed_over_the_target_of_a_symlink_is_what_the_symlink_reads(tmp_path):
    """NOTE [alias invalidation]: the symlink in the data set and the one
    outside it reach the new file, not the copy of the old."""
    root, _ = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    (tmp_path / "new.bin").write_bytes(b"replaced")
    seen = change_then_read(se, f"os.replace({str(tmp_path / 'new.bin')!r}, {str(root / 'real.bin')!r})",
                            root / "link.bin", tmp_path / "outside.bin")
    assert bytes.fromhex(seen[str(root / "link.bin")][1]) == b"replaced"
    assert bytes.fromhex(seen[str(tmp_path / "outside.bin")][1]) == b"replaced"
    assert se.state("link.bin") == se.state("real.bin") == lib.TIERING_STATE_INVALID
    se.index.close()


@pytest.mark.parametrize("how", calls("unlink"))
def test_an_unlinked_data_file_is_missing_for_later_opens_and_stats(shimenv, how, reliability):
    shimenv.place_all()
    p = shimenv.root / "a/one.bin"
    seen = change_then_read(shimenv, CALLS[f"unlink: {how}"].format(dst=str(p), dir=str(p.parent)), p)
    assert not p.exists()
    assert seen[str(p)] == ["ENOENT", "False"]              # open and stat alike
    assert shimenv.state("a/one.bin") == lib.TIERING_STATE_INVALID
    assert shimenv.index.counters()["writes"] == 1
    reliability.survived(f"a data file unlinked by COMMAND ({how})")


@pytest.mark.parametrize("how", ["os.truncate", "truncate64"])
def test_a_data_file_truncated_by_path_reads_its_truncated_bytes(shimenv, how):
    shimenv.place_all()
    p = shimenv.root / "a/two.bin"
    change = {"os.truncate": f"os.truncate({str(p)!r}, 10)",
              "truncate64": f"assert libc.truncate64({str(p).encode()!r}, ctypes.c_int64(10)) == 0"}[how]
    seen = change_then_read(shimenv, change, p)
    assert served(shimenv, p, seen) == shimenv.contents["a/two.bin"][:10]
    assert shimenv.state("a/two.bin") == lib.TIERING_STATE_INVALID


def test_a_renamed_directory_of_the_data_set_turns_redirection_off(shimenv):
    """The index has no directories: the entries below a renamed one cannot
    be found, so the job redirects nothing more (and answers no stat)."""
    shimenv.place_all()
    root = shimenv.root
    seen = change_then_read(shimenv, f"os.rename({str(root / 'a')!r}, {str(root / 'moved')!r})",
                            root / "a/one.bin", root / "moved/one.bin", root / "top.bin")
    assert seen[str(root / "a/one.bin")] == ["ENOENT", "False"]
    assert served(shimenv, root / "moved/one.bin", seen) == shimenv.contents["a/one.bin"]
    assert served(shimenv, root / "top.bin", seen) == b""          # from the PFS now
    assert shimenv.index.header.disabled == 1


def test_renames_outside_the_data_set_leave_the_copies_in_service(shimenv, tmp_path):
    shimenv.place_all()
    (tmp_path / "d").mkdir()
    (tmp_path / "f").write_bytes(b"x")
    change = (f"os.rename({str(tmp_path / 'd')!r}, {str(tmp_path / 'e')!r}); "
              f"os.replace({str(tmp_path / 'f')!r}, {str(tmp_path / 'g')!r}); os.unlink({str(tmp_path / 'g')!r})")
    p = shimenv.root / "a/one.bin"
    seen = change_then_read(shimenv, change, p)
    assert seen[str(p)][0] == str(shimenv.tier / "0/a/one.bin")
    assert shimenv.index.header.disabled == 0
    assert shimenv.index.counters()["writes"] == 0
    assert {shimenv.state(rel) for rel in shimenv.contents} == {1}


READ_BACK = """
import os, sys
os.write(1, b'NEW')
with open(sys.argv[1], 'rb') as f:
    sys.stderr.write(os.readlink(f'/proc/self/fd/{f.fileno()}') + ' ' + f.read().hex())
"""


@pytest.mark.parametrize("mode", ["ab", "r+b"])
def test_a_descriptor_inherited_open_for_writing_invalidates_its_file(shimenv, mode):
    """`job >> D/x`: the shell opened the file, the process under the shim
    starts with it on stdout, writes and reads the file back."""
    shimenv.place_all()
    p = shimenv.root / "a/one.bin"
    with open(p, mode) as out:
        if mode == "r+b":
            out.seek(0, os.SEEK_END)
        r = subprocess.run([PYTHON, "-c", READ_BACK, str(p)], stdout=out, stderr=subprocess.PIPE, text=True,
                           env=shimenv.env, timeout=120)
    assert r.returncode == 0, r.stderr
    where, data = r.stderr.split(" ")
    assert where == str(p)
    assert bytes.fromhex(data) == p.read_bytes() == shimenv.contents["a/one.bin"] + b"NEW"
    assert shimenv.state("a/one.bin") == lib.TIERING_STATE_INVALID
    assert shimenv.index.counters()["writes"] == 1


def test_descriptors_inherited_for_reading_leave_the_copy_in_service(shimenv):
    shimenv.place_all()
    p = shimenv.root / "a/one.bin"
    with open(p, "rb") as inp:
        r = subprocess.run([PYTHON, "-c", READ_BACK, str(p)], stdin=inp, capture_output=True, text=True,
                           env=shimenv.env, timeout=120)
    assert r.returncode == 0, r.stderr
    where, data = r.stderr.split(" ")
    assert where == str(shimenv.tier / "0/a/one.bin")
    assert bytes.fromhex(data) == shimenv.contents["a/one.bin"]
    assert shimenv.state("a/one.bin") == 1 and shimenv.index.counters()["writes"] == 0


# a change of a data file's metadata by path, as COMMAND makes it
META_CALLS = {
    "os.chmod": "os.chmod({p!r}, 0o604)",
    "chmod command": "import subprocess; subprocess.run(['chmod', '604', {p!r}], check=True)",
    "os.chown": "os.chown({p!r}, 54321, 54321)",
    "os.utime": "os.utime({p!r}, ns=(1_500_000_000_000_000_001, 1_500_000_000_000_000_002))",
    "touch command": "import subprocess; subprocess.run(['touch', '-d', '@1500000000', {p!r}], check=True)",
    "utime": "import ctypes; assert libc.utime({p!r}.encode(), None) == 0",
    "os.setxattr": "os.setxattr({p!r}, 'user.tiering-test', b'v')",
}


@pytest.mark.parametrize("call", list(META_CALLS))
def test_a_change_of_metadata_by_path_is_seen_by_later_stats(tmp_path, call, reliability):
    """The scan's record answered stats of the file; after COMMAND changes
    its mode, owner, times or attributes by path, stats are the kernel's
    (and the copy serves no more)."""
    root, contents = alias_tree(tmp_path)
    se = catalog_shimenv(tmp_path, root)
    p = root / "real.bin"
    assert se.index.files["flags"][int(se.index.entries[se.slots["real.bin"]].file)] & lib.TIERING_FILE_STAT
    prog = META_CALLS[call].format(p=str(p)) + f"\nst = os.stat({str(p)!r}); print(st.st_mode, st.st_uid, st.st_mtime_ns, st.st_ctime_ns)"
    r = se.run([PYTHON, "-c", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n" + prog])
    assert r.returncode == 0, r.stderr
    st = p.stat()
    assert r.stdout.split() == [str(st.st_mode), str(st.st_uid), str(st.st_mtime_ns), str(st.st_ctime_ns)]
    assert se.state("real.bin") == lib.TIERING_STATE_INVALID
    assert se.state("link.bin") == se.state("hard.bin") == lib.TIERING_STATE_INVALID   # its other paths
    reliability.survived(f"a data file's metadata changed by path ({call})")
    se.index.close()
