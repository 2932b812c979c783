"""Tests for tiering.profile: YAML profiles, sizes, ${VAR} expansion, validation, sizing."""

from __future__ import annotations

import contextlib
import os
import shutil
import textwrap
from pathlib import Path

import pytest

from helpers import tmpfs_mounted
from tiering import profile as prof
from tiering import rundirs
from tiering.profile import (
    Profile,
    ProfileError,
    check_profile,
    format_profile,
    human_bytes,
    list_profiles,
    load_profile,
    model,
    node,
    parse_size,
)

GiB = 1 << 30
MiB = 1 << 20
SHIPPED = ("abci", "auto", "frontera", "perlmutter", "piz-daint", "summit")


# --------------------------------------------------------------------------- helpers


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def one_tier(tmp_path: Path, **tier: object) -> str:
    """YAML for a profile with a single tier; keys of `tier` override a valid filesystem tier."""
    fields = {"name": "disk", "kind": "filesystem", "path": str(tmp_path), "capacity": "1MiB"}
    fields.update(tier)
    lines = "\n".join(f"    {k}: {v}" for k, v in fields.items() if v is not None)
    return f"name: test\ntiers:\n  - {lines.lstrip()}\n"


@pytest.fixture
def no_cgroup(tmp_path, monkeypatch):
    """Pretend there is no cgroup memory limit and 64 GiB of available RAM."""
    root = tmp_path / "cgroup-none"
    root.mkdir()
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/\n")
    monkeypatch.setattr(node, "CGROUP_ROOT", root)
    monkeypatch.setattr(node, "PROC_SELF_CGROUP", proc)
    monkeypatch.setattr(node, "available_memory", lambda: 64 * GiB)
    return root


def fake_cgroup_v2(tmp_path: Path, monkeypatch, limits: dict[str, tuple[str, int]], self_path: str = "/") -> None:
    """Build a fake cgroup v2 tree: limits maps a relative dir to (memory.max, memory.current)."""
    root = tmp_path / "cgroup"
    for rel, (limit, current) in limits.items():
        directory = root / rel.strip("/") if rel.strip("/") else root
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "memory.max").write_text(f"{limit}\n")
        (directory / "memory.current").write_text(f"{current}\n")
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{self_path}\n")
    monkeypatch.setattr(node, "CGROUP_ROOT", root)
    monkeypatch.setattr(node, "PROC_SELF_CGROUP", proc)


def dev_shm_is_tmpfs() -> bool:
    return os.path.isdir("/dev/shm") and node.filesystem_type("/dev/shm") == "tmpfs"


# --------------------------------------------------------------------------- shipped profiles


def test_list_profiles_names_the_shipped_files():
    assert list_profiles() == sorted(list_profiles())
    assert set(SHIPPED) <= set(list_profiles())


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_profile_loads(name, tmp_path, no_cgroup, monkeypatch):
    fake_disk(monkeypatch, total=400 * GiB, free=300 * GiB)   # free space others change meanwhile: faked
    env = {"TMPDIR": str(tmp_path), "USER": "nobody-here"}
    p = load_profile(name, env=env)
    assert isinstance(p, Profile)
    assert p.name == name
    assert p.source.endswith(f"{name}.yaml")
    assert p.description  # each says where its numbers come from
    assert 1 <= len(p.tiers) <= prof.MAX_TIERS
    ram = p.tiers[0]
    assert (ram.name, ram.kind, ram.path, ram.capacity_spec) == ("ram", "memory", "/dev/shm", "auto")
    assert 0 < ram.capacity <= node.free_bytes("/dev/shm")
    assert p.pfs.read_threads >= 1
    for tier in p.tiers:
        assert tier.capacity <= node.free_bytes(tier.path)


def test_auto_profile_keeps_ssd_under_tmpdir_when_it_is_a_local_disk(tmp_path, no_cgroup, monkeypatch):
    fake_disk(monkeypatch, total=400 * GiB, free=300 * GiB)
    p = load_profile(None, env={"TMPDIR": str(tmp_path)})
    assert p.name == "auto"
    local = node.is_local_fstype(node.filesystem_type(str(tmp_path)))
    separate = os.stat(tmp_path).st_dev != os.stat("/dev/shm").st_dev
    names = [t.name for t in p.tiers]
    if local and separate:
        ssd = p.tiers[1]
        assert names == ["ram", "ssd"]
        assert (ssd.kind, ssd.path, ssd.capacity_spec, ssd.threads) == ("filesystem", str(tmp_path), "50%", 4)
        assert ssd.capacity <= node.free_bytes(str(tmp_path)) // 2 + 1
    else:
        assert names == ["ram"]


def test_summit_nvme_is_dropped_off_summit(tmp_path):
    p = load_profile("summit", env={"USER": "no-such-user-xyz"})
    assert [t.name for t in p.tiers] == ["ram"]
    assert any("nvme" in n and "/mnt/bb/no-such-user-xyz" in n for n in p.notes)


def test_abci_nvme_uses_sge_localdir(tmp_path):
    p = load_profile("abci", env={"SGE_LOCALDIR": str(tmp_path), "TMPDIR": "/nonexistent"})
    if node.is_local_fstype(node.filesystem_type(str(tmp_path))):
        assert p.tiers[1].path == str(tmp_path)
        assert p.tiers[1].capacity_spec == "1.6TB"


def test_load_profile_unknown_name_lists_shipped_names():
    with pytest.raises(ProfileError) as exc:
        load_profile("fronterra")
    msg = str(exc.value)
    assert "did you mean 'frontera'" in msg
    for name in SHIPPED:
        assert name in msg


def test_load_profile_treats_paths_and_yaml_names_as_files(tmp_path, monkeypatch):
    path = write(tmp_path, one_tier(tmp_path))
    assert load_profile(str(path)).tiers[0].path == str(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert load_profile("cluster.yaml").name == "test"
    with pytest.raises(ProfileError, match="missing.yml: profile file not found"):
        load_profile("missing.yml")


# --------------------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    "text, free, expected",
    [
        ("4096", None, 4096),
        ("0", None, 0),
        ("64GiB", None, 64 * GiB),
        ("64gib", None, 64 * GiB),
        ("500MB", None, 500_000_000),
        ("1.5 TiB", None, int(1.5 * (1 << 40))),
        ("  2 KiB ", None, 2048),
        ("1KB", None, 1000),
        ("10B", None, 10),
        ("144GB", None, 144 * 10**9),
        ("1.6TB", None, 1_600_000_000_000),
        ("25%", 1000, 250),
        ("12.5%", 1000, 125),
        ("100%", 4096, 4096),
        ("0%", 4096, 0),
        (2048, None, 2048),
    ],
)
def test_parse_size(text, free, expected):
    assert parse_size(text, free=free) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("10G", "ambiguous: write GiB"),
        ("3t", "ambiguous: write TiB"),
        ("64 gibs", "did you mean GiB"),
        ("64GB2", "cannot read size"),
        ("abc", "cannot read size"),
        ("", "cannot read size"),
        ("-1GiB", "cannot read size"),
        ("150%", "above 100%"),
        ("25%", "needs the free space"),
        ("5 parsecs", "unknown unit"),
    ],
)
def test_parse_size_errors(text, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_size(text)


@pytest.mark.parametrize(
    "n, text",
    [(0, "0 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (64 * GiB, "64 GiB"),
     (int(1.5 * GiB), "1.5 GiB"), (3 << 40, "3 TiB"), (-2048, "-2 KiB")],
)
def test_human_bytes(n, text):
    assert human_bytes(n) == text


# --------------------------------------------------------------------------- expansion


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"SLURM_JOB_ID": "11", "PBS_JOBID": "22", "LSB_JOBID": "33", "JOB_ID": "44"}, "11"),
        ({"PBS_JOBID": "22.pbs", "LSB_JOBID": "33", "JOB_ID": "44"}, "22.pbs"),
        ({"LSB_JOBID": "33", "JOB_ID": "44"}, "33"),
        ({"JOB_ID": "44"}, "44"),
        ({}, str(os.getpid())),
        ({"SLURM_JOB_ID": ""}, str(os.getpid())),
    ],
)
def test_job_id_fallbacks(env, expected):
    assert prof.expand_vars("/x/${JOB_ID}", env) == f"/x/{expected}"


@pytest.mark.parametrize(
    "text, env, expected",
    [
        ("${TMPDIR}/t", {}, "/tmp/t"),
        ("${TMPDIR}/t", {"TMPDIR": "/scratch/me"}, "/scratch/me/t"),
        ("${TMPDIR:-/local}", {}, "/local"),
        ("${SLURM_TMPDIR}", {"SLURM_TMPDIR": "/localscratch/j1"}, "/localscratch/j1"),
        ("/mnt/bb/${USER}", {"USER": "alice"}, "/mnt/bb/alice"),
        ("${FOO:-/tmp}/x", {}, "/tmp/x"),
        ("${FOO:-/tmp}/x", {"FOO": ""}, "/tmp/x"),
        ("${FOO:-/tmp}/x", {"FOO": "/data"}, "/data/x"),
        ("${A:-${B:-/deep}}", {}, "/deep"),
        ("${A:-${B:-/deep}}", {"B": "/b"}, "/b"),
        ("${A}${B}", {"A": "/a", "B": "b"}, "/ab"),
        ("$HOME/plain", {"HOME": "/h"}, "$HOME/plain"),
        ("no vars", {}, "no vars"),
    ],
)
def test_expand_vars(text, env, expected):
    assert prof.expand_vars(text, env) == expected


def test_user_falls_back_to_account_name():
    import pwd

    assert prof.expand_vars("${USER}", {}) == pwd.getpwuid(os.getuid()).pw_name


def test_expansion_in_a_profile_path_and_capacity(tmp_path):
    (tmp_path / "job-77").mkdir()
    text = one_tier(tmp_path, path=str(tmp_path) + "/job-${JOB_ID}", capacity="${DISK_CAP:-2MiB}")
    p = check_profile(str(write(tmp_path, text)), env={"SLURM_JOB_ID": "77"})
    assert p.tiers[0].path == str(tmp_path / "job-77")
    assert p.tiers[0].capacity == 2 * MiB


def test_undefined_variable_is_an_error_with_a_default_hint(tmp_path):
    path = write(tmp_path, one_tier(tmp_path, path="${NOPE_NOT_SET}/x"))
    with pytest.raises(ProfileError) as exc:
        check_profile(str(path), env={})
    msg = str(exc.value)
    assert "cluster.yaml" in msg and "tiers[0].path" in msg
    assert "${NOPE_NOT_SET} is not set" in msg and "${NOPE_NOT_SET:-/tmp}" in msg
    assert exc.value.key == "tiers[0].path"


# --------------------------------------------------------------------------- validation errors


def _errors(tmp_path: Path) -> list[tuple[str, str, str, str]]:
    """(id, yaml text, key fragment, hint fragment) for each validation error."""
    d = str(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    five = "name: t\ntiers:\n" + "".join(
        f"  - {{name: t{i}, kind: filesystem, path: {d}, capacity: 1MiB}}\n" for i in range(5)
    )
    return [
        ("unknown-top-key", "name: t\ntier: []\n", "tier", "did you mean 'tiers'"),
        ("unknown-tier-key", one_tier(tmp_path, capacty="1MiB"), "tiers[0].capacty", "did you mean 'capacity'"),
        ("unknown-pfs-key", one_tier(tmp_path) + "pfs:\n  read_thread: 4\n", "pfs.read_thread", "did you mean 'read_threads'"),
        ("missing-name", "tiers:\n  - {name: a, kind: memory, path: /dev/shm, capacity: auto}\n", "name", "add 'name:'"),
        ("missing-tiers", "name: t\n", "tiers", "add 'tiers:'"),
        ("empty-tiers", "name: t\ntiers: []\n", "tiers", "non-empty list"),
        ("missing-tier-path", one_tier(tmp_path, path=None), "tiers[0].path", "add 'path:'"),
        ("missing-tier-capacity", one_tier(tmp_path, capacity=None), "tiers[0].capacity", "add 'capacity:'"),
        ("bad-kind", one_tier(tmp_path, kind="memroy"), "tiers[0].kind", "did you mean 'memory'"),
        ("bad-unit", one_tier(tmp_path, capacity="64GB2"), "tiers[0].capacity", "GiB"),
        ("ambiguous-unit", one_tier(tmp_path, capacity="64G"), "tiers[0].capacity", "write GiB"),
        ("duplicate-tier", one_tier(tmp_path) + f"  - {{name: disk, kind: filesystem, path: {d}, capacity: 1MiB}}\n",
         "tiers[1].name", "give each tier its own name"),
        ("threads-zero", one_tier(tmp_path, threads=0), "tiers[0].threads", "at least 1"),
        ("pfs-threads-zero", one_tier(tmp_path) + "pfs:\n  read_threads: 0\n", "pfs.read_threads", "at least 1"),
        ("pfs-latency", one_tier(tmp_path) + "pfs:\n  latency_ms: -1\n", "pfs.latency_ms", ">= 0"),
        ("bad-bandwidth", one_tier(tmp_path, bandwidth="{1: fast}"), "tiers[0].bandwidth[1]", "MB/s"),
        ("no-such-path", one_tier(tmp_path, path=d + "/does/not/exist"), "tiers[0].path",
         "create it or mark the tier optional: true"),
        ("path-is-file", one_tier(tmp_path, path=str(a_file)), "tiers[0].path", "not a directory"),
        ("relative-path", one_tier(tmp_path, path="relative/dir"), "tiers[0].path", "absolute path"),
        ("too-big", one_tier(tmp_path, capacity="1000PiB"), "tiers[0].capacity", "free at " + d),
        ("auto-on-filesystem", one_tier(tmp_path, capacity="auto"), "tiers[0].capacity", "only for memory tiers"),
        ("zero-capacity", one_tier(tmp_path, capacity="0%"), "tiers[0].capacity", "resolves to 0 bytes"),
        ("optional-not-bool", one_tier(tmp_path, optional="maybe"), "tiers[0].optional", "true or false"),
        ("five-tiers", five, "tiers", "at most 4"),
        ("yaml-syntax", "name: t\ntiers:\n  - name: [oops\n", "line 4", "check the indentation"),
        ("colon-in-value", "name: t\ndescription: node: 192 GB\ntiers: []\n", "line 2", "quote values"),
        ("duplicate-yaml-key", one_tier(tmp_path) + "name: again\n", "line", "duplicate key 'name'; keep only one"),
        ("empty-file", "", "empty", "tiering profile show auto"),
        ("not-a-mapping", "- a\n- b\n", "top level", "expected a mapping"),
    ]


ERROR_IDS = [case[0] for case in _errors(Path("/tmp"))]


@pytest.mark.parametrize("case_id", ERROR_IDS)
def test_validation_errors_name_file_key_and_fix(case_id, tmp_path):
    (text, key, hint), = [c[1:] for c in _errors(tmp_path) if c[0] == case_id]
    path = write(tmp_path, text, name=f"{case_id}.yaml")
    with pytest.raises(ProfileError) as exc:
        check_profile(str(path), env={})
    msg = str(exc.value)
    assert f"{case_id}.yaml" in msg
    assert key in msg
    assert hint in msg


def test_unwritable_path_is_an_error(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with contextlib.ExitStack() as stack:
        if os.geteuid() == 0:  # root writes through mode bits: a read-only mount stops it
            stack.enter_context(tmpfs_mounted(locked, "1m", read_only=True))
        path = write(tmp_path, one_tier(tmp_path, path=str(locked), capacity="4KiB"))
        with pytest.raises(ProfileError, match=r"tiers\[0\].path: path .* is not writable.*optional: true"):
            check_profile(str(path))


def test_check_profile_missing_file(tmp_path):
    with pytest.raises(ProfileError, match="nothere.yaml: profile file not found"):
        check_profile(str(tmp_path / "nothere.yaml"))


# --------------------------------------------------------------------------- optional tiers and capacities


def test_optional_tier_with_unusable_path_is_dropped(tmp_path):
    text = one_tier(tmp_path) + f"  - {{name: gone, kind: filesystem, path: {tmp_path}/missing, capacity: 1MiB, optional: true}}\n"
    p = check_profile(str(write(tmp_path, text)))
    assert [t.name for t in p.tiers] == ["disk"]
    assert p.notes == (f"tier 'gone' dropped: path {tmp_path}/missing does not exist",)


def test_optional_tier_too_big_is_reduced_to_free(tmp_path):
    p = check_profile(str(write(tmp_path, one_tier(tmp_path, capacity="1000PiB", optional="true"))))
    tier = p.tiers[0]
    assert tier.capacity_spec == "1000PiB"
    assert 0 < tier.capacity <= node.free_bytes(str(tmp_path)) + 64 * MiB
    assert "capacity 1000PiB reduced to the" in p.notes[0]


def test_optional_tier_of_zero_bytes_is_dropped(tmp_path):
    text = one_tier(tmp_path) + f"  - {{name: none, kind: filesystem, path: {tmp_path}, capacity: 0%, optional: true}}\n"
    p = check_profile(str(write(tmp_path, text)))
    assert [t.name for t in p.tiers] == ["disk"]
    assert "tier 'none' dropped: capacity 0% resolves to 0 bytes" in p.notes[0]


def test_all_tiers_dropped_is_an_error(tmp_path):
    text = one_tier(tmp_path, path=f"{tmp_path}/missing", optional="true")
    with pytest.raises(ProfileError, match="no tier is usable on this machine"):
        check_profile(str(write(tmp_path, text)))


def test_two_tiers_on_one_filesystem_are_allowed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    text = (
        "name: two\ntiers:\n"
        f"  - {{name: a, kind: filesystem, path: {tmp_path}/a, capacity: 1MiB, threads: 2}}\n"
        f"  - {{name: b, kind: filesystem, path: {tmp_path}/b, capacity: 30%}}\n"
    )
    p = check_profile(str(write(tmp_path, text)))
    assert [(t.name, t.capacity, t.threads) for t in p.tiers][0] == ("a", MiB, 2)
    assert p.tiers[1].threads == model.DEFAULT_TIER_THREADS
    assert any("share one file system" in n for n in p.notes)


def test_bare_number_capacity_and_bandwidth_tables(tmp_path):
    text = one_tier(tmp_path, capacity=4096, bandwidth="{4: 12000, 1: 5000}") + (
        "pfs:\n  read_threads: 16\n  bandwidth: {1: 200, 16: 1500}\n  latency_ms: 1\n"
    )
    p = check_profile(str(write(tmp_path, text)))
    assert (p.tiers[0].capacity, p.tiers[0].capacity_spec) == (4096, "4096")
    assert p.tiers[0].bandwidth == {1: 5000.0, 4: 12000.0}
    assert p.pfs == prof.Pfs(read_threads=16, bandwidth={1: 200.0, 16: 1500.0}, latency_ms=1.0)


def test_pfs_defaults(tmp_path):
    p = check_profile(str(write(tmp_path, one_tier(tmp_path))))
    assert p.pfs == prof.Pfs(read_threads=8, bandwidth={}, latency_ms=None)
    assert p.description == ""


# --------------------------------------------------------------------------- memory tiers and cgroups


def memory_profile(tmp_path: Path, capacity: str) -> Path:
    return write(tmp_path, f"name: m\ntiers:\n  - {{name: ram, kind: memory, path: {tmp_path}, capacity: '{capacity}'}}\n")


def test_cgroup_v2_headroom_root(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": (str(1 * GiB), 256 * MiB)})
    assert node.cgroup_memory_headroom() == 768 * MiB


def test_cgroup_v2_unlimited(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": ("max", 256 * MiB)})
    assert node.cgroup_memory_headroom() is None


def test_cgroup_v2_smallest_limit_along_the_path_wins(tmp_path, monkeypatch):
    fake_cgroup_v2(
        tmp_path, monkeypatch,
        {"/": ("max", 0), "slurm": (str(8 * GiB), 1 * GiB), "slurm/job_7": (str(4 * GiB), 3 * GiB),
         "slurm/job_7/step_0": ("max", 0)},
        self_path="/slurm/job_7/step_0",
    )
    assert node.cgroup_memory_headroom() == 1 * GiB


def test_cgroup_v1_memory_controller(tmp_path, monkeypatch):
    root = tmp_path / "cg1"
    job = root / "memory" / "slurm" / "uid_1" / "job_9"
    job.mkdir(parents=True)
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (job / "memory.limit_in_bytes").write_text(str(2 * GiB))
    (job / "memory.usage_in_bytes").write_text(str(512 * MiB))
    proc = tmp_path / "proc"
    proc.write_text("5:memory:/slurm/uid_1/job_9\n0::/\n")
    assert node.cgroup_memory_headroom(root, proc) == 1536 * MiB


def test_auto_profile_honours_a_cgroup_limit(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": (str(1 * GiB), 256 * MiB)})
    monkeypatch.setattr(node, "available_memory", lambda: 100 * GiB)
    p = load_profile("auto", env={"TMPDIR": str(tmp_path)})
    ram = p.tiers[0]
    room = node.free_bytes("/dev/shm") - node.shm_reserve("/dev/shm")
    assert ram.capacity == min(room, 384 * MiB)  # half of 1 GiB - 256 MiB
    assert ram.capacity_spec == "auto"


def test_auto_without_cgroup_takes_half_of_available_ram(tmp_path, no_cgroup, monkeypatch):
    monkeypatch.setattr(node, "available_memory", lambda: 6 * GiB)
    fake_disk(monkeypatch, total=16 * GiB, free=14 * GiB)   # room for more than half the RAM after the reserve
    p = check_profile(str(memory_profile(tmp_path, "auto")))
    assert p.tiers[0].capacity == 3 * GiB


def test_memory_percent_is_capped_by_the_cgroup_bound(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": (str(1 * GiB), 0)})
    monkeypatch.setattr(node, "available_memory", lambda: 100 * GiB)
    p = check_profile(str(memory_profile(tmp_path, "90%")))
    assert p.tiers[0].capacity == min(int(node.free_bytes(str(tmp_path)) * 0.9), 512 * MiB)
    assert p.notes == ("tier 'ram': 90% of " + str(tmp_path) + " capped at 512 MiB (half of the available RAM / of the cgroup memory headroom)",)


def test_filesystem_percent_is_not_capped_by_memory(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": (str(1 * GiB), 0)})
    text = one_tier(tmp_path, capacity="50%")
    p = check_profile(str(write(tmp_path, text)))
    free = node.free_bytes(str(tmp_path))
    assert abs(p.tiers[0].capacity - free // 2) <= 64 * MiB  # free space may move a little


def test_absolute_memory_capacity_above_cgroup_headroom_is_an_error(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": (str(1 * GiB), 512 * MiB)})
    with pytest.raises(ProfileError) as exc:
        check_profile(str(memory_profile(tmp_path, "600MiB")))
    msg = str(exc.value)
    assert "tiers[0].capacity" in msg and "512 MiB left under this job's cgroup memory limit" in msg
    assert "auto" in msg


def test_memory_auto_with_no_cgroup_room_is_an_error(tmp_path, monkeypatch):
    fake_cgroup_v2(tmp_path, monkeypatch, {"/": (str(1 * GiB), 2 * GiB)})
    with pytest.raises(ProfileError, match=r"tiers\[0\].capacity: auto resolves to 0 bytes"):
        check_profile(str(memory_profile(tmp_path, "auto")))


# --------------------------------------------------------------------------- local_only


def local_only_profile(tmp_path: Path, ram_path: str, disk_path: str, optional: bool = True) -> Path:
    return write(
        tmp_path,
        "name: lo\ntiers:\n"
        f"  - {{name: ram, kind: memory, path: {ram_path}, capacity: 1MiB}}\n"
        f"  - {{name: ssd, kind: filesystem, path: {disk_path}, capacity: 1MiB, "
        f"optional: {str(optional).lower()}, local_only: true}}\n",
    )


@pytest.mark.skipif(not dev_shm_is_tmpfs(), reason="/dev/shm is not tmpfs here")
def test_local_only_drops_a_tier_on_tmpfs(tmp_path, no_cgroup):
    p = check_profile(str(local_only_profile(tmp_path, str(tmp_path), "/dev/shm")))
    assert [t.name for t in p.tiers] == ["ram"]
    assert p.notes == ("tier 'ssd' dropped: path /dev/shm is on a tmpfs file system, not a node-local disk (local_only)",)


def test_local_only_drops_a_tier_on_the_memory_tier_filesystem(tmp_path, no_cgroup, monkeypatch):
    monkeypatch.setattr(node, "filesystem_type", lambda path: "ext4")
    (tmp_path / "ram").mkdir()
    (tmp_path / "ssd").mkdir()
    p = check_profile(str(local_only_profile(tmp_path, f"{tmp_path}/ram", f"{tmp_path}/ssd")))
    assert [t.name for t in p.tiers] == ["ram"]
    assert "same file system as tier 'ram'" in p.notes[0]


@pytest.mark.parametrize("fstype", ["lustre", "nfs4", "gpfs", "beegfs", "fuse.sshfs", "tmpfs"])
def test_local_only_drops_network_and_memory_filesystems(tmp_path, no_cgroup, monkeypatch, fstype):
    monkeypatch.setattr(node, "filesystem_type", lambda path: fstype if path.endswith("ssd") else "tmpfs")
    monkeypatch.setattr(os, "stat", _distinct_dev_stat(os.stat))
    (tmp_path / "ssd").mkdir()
    p = check_profile(str(local_only_profile(tmp_path, "/dev/shm", f"{tmp_path}/ssd")))
    assert [t.name for t in p.tiers] == ["ram"]
    assert f"on a {fstype} file system" in p.notes[0]


def test_local_only_keeps_a_separate_local_disk(tmp_path, no_cgroup, monkeypatch):
    monkeypatch.setattr(node, "filesystem_type", lambda path: "xfs" if path.endswith("ssd") else "tmpfs")
    monkeypatch.setattr(os, "stat", _distinct_dev_stat(os.stat))
    (tmp_path / "ssd").mkdir()
    p = check_profile(str(local_only_profile(tmp_path, "/dev/shm", f"{tmp_path}/ssd")))
    assert [t.name for t in p.tiers] == ["ram", "ssd"]


def test_local_only_on_a_required_tier_is_an_error(tmp_path, no_cgroup, monkeypatch):
    monkeypatch.setattr(node, "filesystem_type", lambda path: "lustre")
    (tmp_path / "ssd").mkdir()
    path = local_only_profile(tmp_path, "/dev/shm", f"{tmp_path}/ssd", optional=False)
    with pytest.raises(ProfileError) as exc:
        check_profile(str(path))
    msg = str(exc.value)
    assert "cluster.yaml" in msg
    assert "tiers[1].path" in msg and "lustre" in msg and "node-local disk or mark the tier optional: true" in msg


def _distinct_dev_stat(real_stat):
    """os.stat that gives paths under /dev/shm a device number of their own."""

    def fake(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if str(path).startswith("/dev/shm"):
            values = list(result)
            values[2] = -12345  # st_dev
            return os.stat_result(values)
        return result

    return fake


def test_is_local_fstype():
    assert node.is_local_fstype("ext4") and node.is_local_fstype("xfs") and node.is_local_fstype("overlay")
    for fstype in ("nfs", "NFS4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "fuse", "fuse.s3fs", "tmpfs"):
        assert not node.is_local_fstype(fstype)


# --------------------------------------------------------------------------- format_profile


def test_format_profile_shows_tiers_capacities_and_pfs(tmp_path):
    text = one_tier(tmp_path, capacity="3MiB", bandwidth="{1: 5000, 4: 12000}") + (
        f"  - {{name: gone, kind: filesystem, path: {tmp_path}/missing, capacity: 1MiB, optional: true}}\n"
        "pfs:\n  read_threads: 16\n  bandwidth: {1: 200, 16: 1500}\n  latency_ms: 1.5\n"
    )
    out = format_profile(check_profile(str(write(tmp_path, text))))
    assert "profile test" in out
    assert "cluster.yaml" in out
    assert "1. disk (filesystem)" in out
    assert f"path:      {tmp_path}" in out
    assert "capacity:  3 MiB (spec: 3MiB)" in out
    assert "bandwidth: 1 thread: 5000 MB/s, 4 threads: 12000 MB/s" in out
    assert "read threads: 16" in out
    assert "1 thread: 200 MB/s, 16 threads: 1500 MB/s" in out
    assert "latency:      1.5 ms" in out
    assert "tier 'gone' dropped" in out


@pytest.mark.parametrize("name", SHIPPED)
def test_format_shipped_profiles(name, tmp_path):
    p = load_profile(name, env={"TMPDIR": str(tmp_path), "USER": "nobody-here"})
    out = format_profile(p)
    for tier in p.tiers:
        assert f"{tier.name} ({tier.kind})" in out
        assert f"{human_bytes(tier.capacity)} (spec: {tier.capacity_spec})" in out


def test_shipped_profiles_are_found_as_package_resources(tmp_path):
    """Installed layout: setup.py maps profiles/ to the package tiering.profiles."""
    import shutil
    import subprocess
    import sys

    repo = Path(__file__).resolve().parent.parent
    pkg = tmp_path / "site" / "tiering"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copytree(repo / "tiering" / "profile", pkg / "profile")   # no shim, no other module
    shutil.copy(repo / "tiering" / "units.py", pkg / "units.py")
    shutil.copytree(repo / "profiles", pkg / "profiles")
    (pkg / "profiles" / "only-installed.yaml").write_text(
        "name: only-installed\ntiers:\n  - {name: ram, kind: memory, path: /dev/shm, capacity: 1MiB}\n"
    )
    code = (
        "from tiering.profile import list_profiles, load_profile; "
        "print(','.join(list_profiles())); print(load_profile('only-installed').source)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert "only-installed" in out[0].split(",") and "frontera" in out[0].split(",")
    assert out[1] == str(pkg / "profiles" / "only-installed.yaml")


def fake_disk(monkeypatch: pytest.MonkeyPatch, total: int, free: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(node.shutil, "disk_usage", lambda _p: usage._replace(total=total, used=total - free, free=free))


def test_auto_memory_tier_leaves_a_quarter_of_shm_to_the_job(tmp_path, no_cgroup, monkeypatch):
    monkeypatch.setattr(node, "available_memory", lambda: 100 * GiB)
    fake_disk(monkeypatch, total=16 * GiB, free=14 * GiB)
    assert node.shm_reserve(str(tmp_path)) == 4 * GiB
    assert check_profile(str(memory_profile(tmp_path, "auto"))).tiers[0].capacity == 10 * GiB
    fake_disk(monkeypatch, total=2 * GiB, free=2 * GiB)   # small: the 1 GiB floor
    assert check_profile(str(memory_profile(tmp_path, "auto"))).tiers[0].capacity == 1 * GiB


def test_auto_memory_tier_on_a_tiny_shm_is_refused_or_dropped(tmp_path, no_cgroup, monkeypatch):
    """A default Docker /dev/shm (64 MiB) is the job's own: no tier there."""
    monkeypatch.setattr(node, "available_memory", lambda: 100 * GiB)
    fake_disk(monkeypatch, total=64 * MiB, free=64 * MiB)
    with pytest.raises(ProfileError) as exc:
        check_profile(str(memory_profile(tmp_path, "auto")))
    msg = str(exc.value)
    assert "auto resolves to 0 bytes" in msg and "stay free for the job's own shared memory" in msg
    try:  # the shipped auto profile marks its ram tier optional
        p = load_profile("auto", env={"TMPDIR": str(tmp_path)})
    except ProfileError as e:  # and no local disk tier either: says why
        assert "tier 'ram' dropped" in str(e)
    else:
        assert [t.name for t in p.tiers] == ["ssd"]
        assert any("tier 'ram' dropped" in n for n in p.notes)


# --------------------------------------------------------------------------- every error at once, shipped names


def test_every_error_of_a_profile_is_reported(tmp_path):
    hostile = tmp_path / "shared"
    hostile.mkdir()
    os.chmod(hostile, 0o777)
    text = f"""\
        name: t
        colour: blue
        tiers:
          - {{name: ram, kind: memroy, path: /dev/shm, capacity: auto, threads: 0}}
          - {{name: ssd, kind: filesystem, path: {hostile}, capacity: 64G}}
          - {{name: ssd, kind: filesystem, path: {tmp_path}, capacity: 1MiB, optional: maybe}}
        pfs:
          latency_ms: -1
          read_threads: 0
        """
    path = write(tmp_path, text)
    expected = [("colour", "unknown key"), ("tiers[2].name", "give each tier its own name"),
                ("tiers[0].kind", "did you mean 'memory'"), ("tiers[0].threads", "at least 1"),
                ("tiers[1].capacity", "write GiB"), ("tiers[1].path", "use a sticky directory such as /tmp"),
                ("tiers[2].optional", "true or false"), ("pfs.latency_ms", ">= 0"), ("pfs.read_threads", "at least 1")]
    with pytest.raises(ProfileError) as exc:
        check_profile(str(path))
    lines = str(exc.value).splitlines()
    assert len(exc.value.errors) == len(lines) == len(expected)
    for line, err, (key, fix) in zip(lines, exc.value.errors, expected):
        assert line == str(err)
        assert line.startswith(f"{path}: {key}: ") and fix in line, line
    assert exc.value.key == "colour"
    # the command reports them all and fails
    from click.testing import CliRunner

    from tiering.cli import main
    r = CliRunner().invoke(main, ["profile", "check", str(path)])
    assert r.exit_code != 0
    assert all(line in r.output for line in lines)


def test_a_tier_path_others_can_rename_in_is_refused(tmp_path):
    hostile = tmp_path / "shared"
    hostile.mkdir()
    os.chmod(hostile, 0o777)
    (hostile / "mine").mkdir(mode=0o700)
    for path in (hostile, hostile / "mine"):
        with pytest.raises(ProfileError) as exc:
            check_profile(str(write(tmp_path, one_tier(tmp_path, path=str(path)))))
        msg = str(exc.value)
        assert msg.startswith(f"{tmp_path}/cluster.yaml: tiers[0].path: path {path} is not safe for a private "
                              f"directory: {hostile} is writable by other users and has no sticky bit (mode 0777)")
        assert "use a sticky directory such as /tmp or /dev/shm, or a directory only you can write to" in msg
    os.chmod(hostile, 0o1777)     # with the sticky bit, only the owner may rename its entries
    assert check_profile(str(write(tmp_path, one_tier(tmp_path, path=str(hostile))))).tiers[0].path == str(hostile)


def test_an_optional_tier_under_a_hostile_parent_is_dropped_with_a_warning(tmp_path, caplog):
    hostile = tmp_path / "shared"
    hostile.mkdir()
    os.chmod(hostile, 0o757)
    text = one_tier(tmp_path) + f"  - {{name: ssd, kind: filesystem, path: {hostile}, capacity: 1MiB, optional: true}}\n"
    with caplog.at_level("WARNING", logger="tiering"):
        p = check_profile(str(write(tmp_path, text)))
    assert [t.name for t in p.tiers] == ["disk"]
    assert p.notes == (f"tier 'ssd' dropped: path {hostile} is not safe for a private directory: {hostile} is "
                       "writable by other users and has no sticky bit (mode 0757)",)
    assert [r.getMessage() for r in caplog.records] == [f"{p.notes[0]}; {rundirs.SAFE_PARENT_FIX}"]


def test_profile_check_with_data_reports_a_tier_inside_a_data_root(tmp_path):
    from click.testing import CliRunner

    from tiering.cli import main
    data = tmp_path / "pfs"
    (data / "cache").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    text = (one_tier(tmp_path, path=str(data / "cache"))
            + f"  - {{name: whole, kind: filesystem, path: {data}, capacity: 1MiB}}\n")
    path = write(tmp_path, text)
    r = CliRunner().invoke(main, ["profile", "check", str(path), "--data", str(tmp_path / "elsewhere"),
                                  "--data", str(data)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if "data root" in ln]
    assert lines == [f"Error: {path}: tier 'disk': path {data / 'cache'} is inside the data root {data}: tier-run's "
                     "directory there, and the copies in it, would be part of the data set (COMMAND would list "
                     "them); put the tier's path outside every --data directory, or give --data a directory that "
                     "does not hold it",
                     f"{path}: tier 'whole': path {data} is the data root {data}: tier-run's "
                     "directory there, and the copies in it, would be part of the data set (COMMAND would list "
                     "them); put the tier's path outside every --data directory, or give --data a directory that "
                     "does not hold it"]
    assert "OK" not in r.output
    # a data root inside a tier path is another matter: the tier's directory is made beside it
    r = CliRunner().invoke(main, ["profile", "check", str(path), "--data", str(data / "cache" / ".." / "..")])
    assert r.exit_code == 2 and "is inside the data root" in r.output
    (data / "cache" / "mydata").mkdir()
    r = CliRunner().invoke(main, ["profile", "check", str(path), "--data", str(data / "cache" / "mydata")])
    assert r.exit_code == 0 and r.output.endswith(f"{path}: OK\n"), r.output
    # without --data there is nothing to compare the tiers with
    r = CliRunner().invoke(main, ["profile", "check", str(path)])
    assert r.exit_code == 0 and r.output.endswith(f"{path}: OK\n"), r.output


@pytest.mark.parametrize("name", SHIPPED)
def test_profile_check_takes_a_shipped_name_as_profile_show_does(name, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from tiering.cli import main
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert check_profile(name).name == name
    r = CliRunner().invoke(main, ["profile", "check", name])
    assert r.exit_code == 0, r.output
    assert r.output.endswith(f"{name}: OK\n") and f"profile {name}" in r.output
    # a file of that name is taken by its path
    (tmp_path / "mine").write_text(one_tier(tmp_path))
    assert check_profile("mine").source == "mine" and load_profile("./mine").name == "test"
    with pytest.raises(ProfileError, match="unknown profile 'nosuch'"):
        check_profile("nosuch")


# a container's /dev/shm (64 MiB) and TMPDIR on tmpfs, faked in tier-run's process
SMALL_NODE = """
import shutil
from tiering.profile import node
_usage, _fstype = shutil.disk_usage, node.filesystem_type
node.shutil.disk_usage = lambda p: (_usage(p)._replace(total=64 << 20, used=1 << 20, free=63 << 20)
                                    if str(p).startswith("/dev/shm") else _usage(p))
node.filesystem_type = lambda p: _fstype(p) if str(p).startswith("/dev/shm") else "tmpfs"
"""


def test_with_no_usable_tier_command_runs_unchanged_and_tier_run_says_why_once(tmp_path, reliability):
    import subprocess
    import sys

    from helpers import leftovers, make_data, patched_tier_run
    data = tmp_path / "pfs"
    make_data(data)
    before = leftovers()
    show = "import os, sys; print(os.environ.get('LD_PRELOAD'), os.environ.get('TIERING_INDEX')); sys.exit(5)"
    r = subprocess.run([sys.executable, "-c", patched_tier_run(SMALL_NODE), "--data", str(data),
                        "--stats-json", str(tmp_path / "s.json"), "--", sys.executable, "-c", show],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 5, r.stderr
    assert r.stdout == "None None\n"                       # no shim, no index: COMMAND as without tier-run
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tier-run: running COMMAND without tiering"), r.stderr
    assert "tier 'ram' dropped" in lines[0] and "tier 'ssd' dropped" in lines[0] and "tmpfs" in lines[0]
    assert "--profile FILE" in lines[0] and "s.json is written" in lines[0]
    assert not (tmp_path / "s.json").exists() and leftovers() == before
    reliability.survived("no usable tier (64 MiB /dev/shm, TMPDIR on tmpfs): COMMAND ran unchanged, its status kept")


def test_with_no_usable_tier_a_command_not_found_is_still_127(tmp_path):
    import subprocess
    import sys

    from helpers import make_data, patched_tier_run
    data = tmp_path / "pfs"
    make_data(data)
    r = subprocess.run([sys.executable, "-c", patched_tier_run(SMALL_NODE), "--data", str(data), "--",
                        "no-such-command-here"], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == 127 and "not found on PATH" in r.stderr and "Traceback" not in r.stderr, r.stderr
