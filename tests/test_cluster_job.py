"""tier-run in multi-node and multi-rank jobs, with real processes.

Launch form 2: three tier-runs on one node (Slurm's variables of a step with
three tasks on the node) share one detached service, one index and one set
of tiers; each COMMAND reads the same bytes and exits with its own status; a
rank that exits early or is SIGKILLed changes nothing for the others; the
tiers go with the last member.  Launch form 1 across two emulated nodes
(network namespaces): the tier-runs meet through the job directory and serve
each other's published copies to holders of the job's secret only.  A
rendezvous that cannot complete is one warning and COMMAND's own status.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

import netns
from helpers import PYTHON, USER, wait_for
from tiering.cluster import nodelock
from tiering.cluster.identity import NodeIdentity
from tiering.cluster.rendezvous import JobDirectory
from tiering.profile import ProfileError, check_profile, format_profile
from tiering.rundirs import start_ticks

NODE = Path(__file__).resolve().parent / "cluster_node.py"
N = 40

# COMMAND of the tests: says it is ready, waits for its go file (or for none),
# reads every file of the data set, writes the digest of what it read, waits
# for its end file when told to hold, exits.
WORKLOAD = r"""
import hashlib, os, sys, time
data, flags, name, code = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
open(os.path.join(flags, "ready-" + name), "w").close()
deadline = time.monotonic() + 300
while not os.path.exists(os.path.join(flags, "go-" + name)):
    if time.monotonic() > deadline:
        sys.exit(99)
    time.sleep(0.02)
h = hashlib.sha256()
for d, dirs, files in os.walk(data):
    dirs.sort()
    for f in sorted(files):
        h.update(f.encode() + b"\0" + open(os.path.join(d, f), "rb").read())
open(os.path.join(flags, "digest-" + name), "w").write(h.hexdigest())
while len(sys.argv) > 5 and not os.path.exists(os.path.join(flags, "end-" + name)):
    if time.monotonic() > deadline:
        sys.exit(98)
    time.sleep(0.02)
sys.exit(code)
"""


def make_data(root: Path) -> str:
    h = hashlib.sha256()
    files = {f"c{i % 3}/f{i:03d}.bin": os.urandom(500 + 97 * i) for i in range(N)}
    for rel in sorted(files):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(files[rel])
    for rel in sorted(files):   # the order os.walk with sorted names gives
        h.update(rel.split("/")[1].encode() + b"\0" + files[rel])
    return h.hexdigest()


def write_profile(path: Path, tiers: Path, network: str = "") -> Path:
    tiers.mkdir(exist_ok=True)
    path.write_text(f"""name: test
tiers:
  - {{name: disk, kind: filesystem, path: {tiers}, capacity: 100MiB, threads: 2}}
pfs: {{read_threads: 2}}
{network}""")
    return path


def tier_dirs(tiers: Path) -> list[str]:
    return sorted(p.name for p in tiers.iterdir() if p.name.startswith(f"tiering-{USER}-"))


def copies(tiers: Path) -> int:
    return sum(len(f) for d in tier_dirs(tiers) for _, _, f in os.walk(tiers / d / "data"))


@pytest.fixture
def job(tmp_path: Path):
    data, flags = tmp_path / "data", tmp_path / "flags"
    data.mkdir()
    flags.mkdir()
    (tmp_path / "cmd.py").write_text(WORKLOAD)
    return data, flags, make_data(data), write_profile(tmp_path / "p.yaml", tmp_path / "tiers")


# -- launch form 2: several tier-runs on one node ------------------------------------

def slurm_env(job_id: str, local: int, tasks: int = 3) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_"))}
    env.update(SLURM_JOB_ID=job_id, SLURM_STEP_ID="0", SLURM_NODEID="0", SLURM_NNODES="1",
               SLURM_LOCALID=str(local), SLURM_TASKS_PER_NODE=str(tasks))
    return env


def start_member(tmp: Path, rank: int, code: int, job_id: str) -> subprocess.Popen[str]:
    data, flags, prof = tmp / "data", tmp / "flags", tmp / "p.yaml"
    return subprocess.Popen([PYTHON, "-m", "tiering", "run", "--profile", str(prof), "--data", str(data),
                             "--policy", "first-touch", "--stats-json", str(tmp / f"stats-{rank}.json"), "--",
                             PYTHON, str(tmp / "cmd.py"), str(data), str(flags), str(rank), str(code)],
                            env=slurm_env(job_id, rank), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(p: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = p.communicate(timeout=300)
    return p.returncode, err


def node_dir_of(tmp: Path, job_id: str) -> Path:
    """The node directory of the members' key: user, job id of the Slurm step, data root."""
    return nodelock.node_dir(nodelock.NodeKey(USER, f"slurm-{job_id}.0", (str(tmp / "data"),)))


def service_pids(members: list[subprocess.Popen[str]]) -> set[int]:
    """The pids of the services the members' COMMANDs are attached to (the
    tier directories' owner: tiering-<user>-<pid>-...)."""
    pids = set()
    for m in members:
        for c in psutil.Process(m.pid).children():
            env = c.environ()
            pids.add(int(Path(env["TIERING_INDEX"]).parent.name.split("-")[-2]))
    return pids


@pytest.mark.slow
def test_three_ranks_share_one_service_and_exit_with_their_own_status(tmp_path: Path, job):
    data, flags, want, _ = job
    job_id = f"f2a{os.getpid()}"
    members = [start_member(tmp_path, r, code, job_id) for r, code in ((0, 3), (1, 0), (2, 5))]
    wait_for(lambda: all((flags / f"ready-{r}").exists() for r in range(3)), "three COMMANDs started")
    [service] = service_pids(members)
    assert len(tier_dirs(tmp_path / "tiers")) == 1          # one set of tiers
    (flags / "go-0").touch()                                # rank 0 reads, then exits early with 3
    assert finish(members[0])[0] == 3
    assert (flags / "digest-0").read_text() == want
    wait_for(lambda: copies(tmp_path / "tiers") == N, "rank 0's reads copied to the tier")
    assert psutil.pid_exists(service) and len(tier_dirs(tmp_path / "tiers")) == 1
    (flags / "go-1").touch()
    (flags / "go-2").touch()
    codes = [finish(m) for m in members[1:]]
    assert [c for c, _ in codes] == [0, 5], codes
    assert all((flags / f"digest-{r}").read_text() == want for r in range(3))
    stats = [json.loads((tmp_path / f"stats-{r}.json").read_text()) for r in range(3)]
    assert [s["exit_code"] for s in stats] == [3, 0, 5]
    assert {s["node_service"]["pid"] for s in stats} == {service}
    assert sum(s["node_service"]["started_here"] for s in stats) == 1
    # node-wide counters: the last snapshot holds every rank's opens, ranks 1 and 2 from the tier
    assert max(s["opens"]["total"] for s in stats) == 3 * N
    assert max(s["opens"]["by_tier"]["disk"] for s in stats) == 2 * N
    assert "COMMAND exited 5" in codes[1][1]
    # the last member waited for the service's clean-up
    assert not psutil.pid_exists(service) or psutil.Process(service).status() == psutil.STATUS_ZOMBIE
    assert tier_dirs(tmp_path / "tiers") == []
    assert not node_dir_of(tmp_path, job_id).exists()


@pytest.mark.slow
def test_a_killed_member_changes_nothing_for_the_others(tmp_path: Path, job):
    data, flags, want, _ = job
    members = [start_member(tmp_path, r, 0, f"f2b{os.getpid()}") for r in range(3)]
    wait_for(lambda: all((flags / f"ready-{r}").exists() for r in range(3)), "three COMMANDs started")
    [service] = service_pids(members)
    members[1].send_signal(signal.SIGKILL)
    assert finish(members[1])[0] == -signal.SIGKILL
    for r in (0, 2):
        (flags / f"go-{r}").touch()
    assert [finish(members[r])[0] for r in (0, 2)] == [0, 0]
    assert [(flags / f"digest-{r}").read_text() for r in (0, 2)] == [want, want]
    assert not (flags / "digest-1").exists()       # its COMMAND died with it (PR_SET_PDEATHSIG)
    wait_for(lambda: not psutil.pid_exists(service) or psutil.Process(service).status() == psutil.STATUS_ZOMBIE,
             "the service's exit")
    assert tier_dirs(tmp_path / "tiers") == []
    assert not node_dir_of(tmp_path, f"f2b{os.getpid()}").exists()


@pytest.mark.slow
def test_a_service_that_cannot_start_is_a_clear_error(tmp_path: Path, job):
    data, flags, _, _ = job
    # clairvoyant without an order: the service's set-up refuses, the member says why
    r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(tmp_path / "p.yaml"), "--data", str(data),
                        "--policy", "clairvoyant", "--no-hook", "--", "true"],
                       env=slurm_env(f"f2c{os.getpid()}", 0, 2), capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert "exited before it was ready" in r.stderr and "--policy clairvoyant needs the order" in r.stderr
    assert not node_dir_of(tmp_path, f"f2c{os.getpid()}").exists()     # nothing left of the failed start


# -- node directories of dead services ------------------------------------------------

def _node_dir(parent: Path, name: str, service_pid: int | None) -> Path:
    d = parent / f"tiering.node-{USER}-{name}"
    d.mkdir(mode=0o700)
    for f in ("elect.lock", "members.lock", "job.json", "service.log"):
        (d / f).write_text("")
    if service_pid is not None:
        rec = {"pid": service_pid, "start": start_ticks(service_pid), "ready": True}
        (d / "service.json").write_text(json.dumps(rec))
    return d


def test_node_directories_of_dead_services_are_swept(tmp_path: Path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone = _node_dir(tmp_path, "gone", None)
    (gone / "service.json").write_text(json.dumps({"pid": dead.pid, "start": 1, "ready": True}))
    alive = _node_dir(tmp_path, "alive", os.getpid())
    members = _node_dir(tmp_path, "members", None)
    held = os.open(members / "members.lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_SH)                   # a member still runs on a dead service's copies
    joining = _node_dir(tmp_path, "joining", None)
    elect = os.open(joining / "elect.lock", os.O_RDWR)
    fcntl.flock(elect, fcntl.LOCK_EX)                  # a tier-run is joining
    other = tmp_path / "tiering.node-someoneelse-x"
    other.mkdir()
    try:
        assert nodelock.sweep_node_dirs(USER, str(tmp_path)) == [gone]
    finally:
        os.close(held)
        os.close(elect)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [alive.name, members.name, joining.name, other.name])
    assert sorted(nodelock.sweep_node_dirs(USER, str(tmp_path))) == sorted([members, joining])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


# -- options and profile ---------------------------------------------------------------

@pytest.mark.slow
def test_inconsistent_node_options_exit_2_before_command(tmp_path: Path, job):
    data, flags, _, prof = job
    marker = tmp_path / "ran"
    for args, said in ((["--nodes", "2"], "--nodes and --node-rank go together"),
                       (["--nodes", "2", "--node-rank", "2", "--job-id", "j"], "node rank 2 is outside 0..1"),
                       (["--nodes", "2", "--node-rank", "1"], "needs --rendezvous")):
        r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(prof), "--data", str(data), *args,
                            "--", "touch", str(marker)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and said in r.stderr, r.stderr
        assert not marker.exists()
    env = {**os.environ, "SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "SLURM_NODEID": "3", "SLURM_NNODES": "2"}
    r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(prof), "--data", str(data), "--",
                        "touch", str(marker)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "give --nodes and --node-rank explicitly" in r.stderr, r.stderr
    assert not marker.exists()
    # --warm where the tier-runs of a node share one service (form 2): refused, not ignored
    r = subprocess.run([PYTHON, "-m", "tiering", "run", "--profile", str(prof), "--data", str(data), "--warm",
                        "--", "touch", str(marker)], capture_output=True, text=True, timeout=120,
                       env=slurm_env(f"w{os.getpid()}", 0))
    assert r.returncode == 2 and "--warm" in r.stderr and "one tier-run per node" in r.stderr, r.stderr
    assert not marker.exists()


def test_every_job_option_is_passed_to_the_node_service_kept_by_the_member_or_refused(tmp_path: Path):
    """Launch form 2 hands the job's options to the service through job.json:
    each field of JobOptions is passed (and arrives as it was), kept by each
    member, or refused before COMMAND; a new option must say which."""
    from dataclasses import fields, replace

    from tiering.clairvoyant.options import OrderOptions
    from tiering.cluster import service
    from tiering.job import JobOptions
    from tiering.observe.live import Display
    from tiering.profile import load_profile
    names = {f.name for f in fields(JobOptions)}
    passed, kept, refused = set(service.passed_options()), set(service.MEMBER_ONLY), set(service.REFUSED)
    assert passed | kept | refused == names and not (passed & kept or passed & refused or kept & refused)
    prof = load_profile(str(write_profile(tmp_path / "p.yaml", tmp_path / "tiers")))
    other = load_profile(str(write_profile(tmp_path / "q.yaml", tmp_path / "tiers2")))
    opts = JobOptions(["/pfs/a", "/pfs/b"], ["python", "t.py"], prof, policy="lru",
                      order=OrderOptions("random", 3, 2, 8, 1, 4, 32, True, tmp_path / "o.txt", "sorted",
                                         tmp_path / "m.txt", (".jpg",), tmp_path / "root"),
                      hook=False, window=7, scan_cache=tmp_path / "cache", stats_json=tmp_path / "s.json",
                      keep=True, verbose=2, scan_threads=3, warm=50, auto_warm=False, display=Display("bar", 1.0),
                      node=NodeIdentity("j", 1, 2, 1, 2, ("a", "b"), "slurm", "/r"), rendezvous_timeout=12.5)
    defaults = JobOptions([], [], other)
    assert [n for n in names if getattr(opts, n) == getattr(defaults, n)] == []   # every option set
    back = service.options_from_json(json.loads(json.dumps(service.options_to_json(opts))))
    assert {n: getattr(back, n) for n in passed} == {n: getattr(opts, n) for n in passed}
    assert back.display.mode == "off" and (back.stats_json, back.warm) == (None, None)
    why = service.form2_refusal(opts)
    assert why is not None and why.startswith("--warm is not supported") and "one tier-run per node" in why
    assert service.form2_refusal(replace(opts, warm=None)) is None


def test_profile_network_key(tmp_path: Path):
    tiers = tmp_path / "tiers"
    good = write_profile(tmp_path / "good.yaml", tiers, "network: {bandwidth: 12000, latency_ms: 0.02, interface: lo}\n")
    p = check_profile(str(good))
    assert (p.network.bandwidth, p.network.latency_ms, p.network.interface) == (12000.0, 0.02, "lo")
    assert "interface:    lo" in format_profile(p) and "12000 MB/s" in format_profile(p)
    assert check_profile(str(write_profile(tmp_path / "none.yaml", tiers))).network is None
    bad = write_profile(tmp_path / "bad.yaml", tiers,
                        "network: {latency_ms: -1, interface: nosuchif0, bandwith: 3}\n")
    with pytest.raises(ProfileError) as e:
        check_profile(str(bad))
    text = str(e.value)
    assert "network.bandwith: unknown key; did you mean 'bandwidth'?" in text
    assert "network.bandwidth: required key is missing" in text
    assert "network.latency_ms: must be a number of milliseconds >= 0" in text
    assert "network.interface: no interface 'nosuchif0' on this node" in text


# -- the peer tier -----------------------------------------------------------------------

def peer_run(tmp: Path, rank: int, rdzv: Path, prof: Path, extra: list[str], command: list[str],
             node: netns.Node | None = None) -> subprocess.Popen[str]:
    argv = [PYTHON, "-m", "tiering", "run", "--profile", str(prof), "--data", str(tmp / "data"), "--policy",
            "first-touch", "--nodes", "2", "--node-rank", str(rank), "--rendezvous", str(rdzv), "--job-id",
            f"peerjob{os.getpid()}", "--stats-json", str(tmp / f"stats-{rank}.json"), *extra, "--", *command]
    return subprocess.Popen(node.argv(argv) if node else argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.mark.slow
def test_a_rendezvous_that_cannot_complete_leaves_the_job_on_one_node(tmp_path: Path, job):
    data, flags, _, _ = job
    prof = write_profile(tmp_path / "lo.yaml", tmp_path / "tiers", "network: {bandwidth: 1000, interface: lo}\n")
    rdzv = tmp_path / "rdzv"
    jobdir = JobDirectory(rdzv, NodeIdentity(f"peerjob{os.getpid()}", 0, 2)).path
    # COMMAND: waits until node 0 has given up (its job directory made, then removed), exits 7
    wait_gone = ("import os, sys, time\n"
                 f"p = {str(jobdir)!r}\n"
                 "t = time.monotonic() + 300\n"
                 "while not os.path.exists(p) and time.monotonic() < t: time.sleep(0.02)\n"
                 "while os.path.exists(p) and time.monotonic() < t: time.sleep(0.02)\n"
                 "sys.exit(7)\n")
    p = peer_run(tmp_path, 0, rdzv, prof, ["--rendezvous-timeout", "2"], [PYTHON, "-c", wait_gone])
    code, err = finish(p)
    assert code == 7, err
    warnings = [line for line in err.splitlines() if "peer tier off" in line]
    assert len(warnings) == 1 and "node 1" in warnings[0], err
    peer = json.loads((tmp_path / "stats-0.json").read_text())["peer"]
    assert peer["met"] is False and peer["secret"] is False and "node 1" in peer["error"]
    assert not jobdir.exists()


REASON = netns.unavailable()


@pytest.mark.slow
@pytest.mark.skipif(REASON is not None, reason=f"no emulated nodes: {REASON}")
def test_two_nodes_meet_and_serve_copies_to_the_job_only(tmp_path: Path, job):
    data, flags, want, _ = job
    rdzv = tmp_path / "rdzv"
    rdzv.mkdir(mode=0o700)
    with netns.emulated_nodes(2) as net:
        profs = [write_profile(tmp_path / f"n{r}.yaml", tmp_path / f"tiers{r}",
                               "network: {bandwidth: 1000, latency_ms: 0.1, interface: eth0}\n") for r in range(2)]
        runs = [peer_run(tmp_path, r, rdzv, profs[r], [],
                         [PYTHON, str(tmp_path / "cmd.py"), str(data), str(flags), str(r), "0", "hold"],
                         net.node(r))
                for r in range(2)]
        (flags / "go-0").touch()          # node 0 reads the data set: its copies get published
        jobdir = JobDirectory(rdzv, NodeIdentity(f"peerjob{os.getpid()}", 0, 2)).path

        def met() -> list[dict] | None:
            try:
                entries = [json.loads((jobdir / f"node-{r}.json").read_text()) for r in range(2)]
            except (OSError, ValueError):
                return None
            return entries if all(e["proof"] for e in entries) else None

        entries = wait_for(met, "both nodes in the job directory with a proof")
        assert [e["address"].rsplit(":", 1)[0] for e in entries] == [net.node(0).address, net.node(1).address]
        wait_for(lambda: copies(tmp_path / "tiers0") == N, "node 0's copies")
        secret = tmp_path / "secret"
        secret.write_text((jobdir / "secret").read_text())
        dest = tmp_path / "dest"
        dest.mkdir()
        rel = "c1/f001.bin"
        fetch = [PYTHON, str(NODE), "fetch", "--address", entries[0]["address"], "--src", str(data),
                 "--dest-dir", str(dest), "--timeout", "60", rel]
        ok = subprocess.run(net.node(1).argv(fetch[:3] + fetch[3:5] + ["--secret-file", str(secret)] + fetch[5:]),
                            capture_output=True, text=True, timeout=120)
        assert json.loads(ok.stdout)["results"] == [{"ok": (data / rel).stat().st_size}], ok.stderr
        assert (dest / "c1_f001.bin.part").read_bytes() == (data / rel).read_bytes()
        no = subprocess.run(net.node(1).argv(fetch[:5] + ["--no-secret"] + fetch[5:]),
                            capture_output=True, text=True, timeout=120)
        assert [r["reason"] for r in json.loads(no.stdout)["results"]] == ["refused"], no.stderr
        for f in ("go-1", "end-0", "end-1"):
            (flags / f).touch()
        results = [finish(p) for p in runs]
        assert [c for c, _ in results] == [0, 0], results
    assert [(flags / f"digest-{r}").read_text() for r in range(2)] == [want, want]
    peers = [json.loads((tmp_path / f"stats-{r}.json").read_text())["peer"] for r in range(2)]
    for r, p in enumerate(peers):
        assert (p["met"], p["secret"], p["node_rank"], p["nodes"]) == (True, True, r, 2)
        assert p["address"] == entries[r]["address"]
    assert peers[0]["server"] == {"served": 1, "bytes": (data / rel).stat().st_size, "absent": 0, "early": 0,
                                  "refused": 1, "errors": 0}
    assert not jobdir.exists()                           # node 0 removed it at exit
    assert "peers    node 0 of 2" in results[0][1]
    wait_for(lambda: tier_dirs(tmp_path / "tiers0") == [] and tier_dirs(tmp_path / "tiers1") == [],
             "both nodes' tiers removed (in the background, after the job)")


def test_the_peer_lookup_finds_published_copies_through_the_index(tmp_path: Path):
    from tiering.catalog import scan
    from tiering.cluster.peering import index_lookup
    from tiering.placement.index import Root, SharedIndex, lib
    from tiering.placement.tiers import TierState
    root = tmp_path / "data"
    want = make_data(root)
    assert want
    cat = scan([str(root)], cache_dir=None)
    tier_root = tmp_path / "tier"
    tier_root.mkdir(mode=0o700)
    tier = TierState("disk", "filesystem", tier_root, 1 << 30, 1)
    (tmp_path / "run").mkdir(mode=0o700)
    index, slots = SharedIndex.for_catalog(tmp_path / "run" / "index", [Root(cat.roots[0], 0)], [str(tier.data)],
                                           cat)
    lookup = index_lookup(index, cat, [tier])
    k = next(i for i, f in enumerate(cat.files) if f.rel == "c1/f004.bin")
    f = cat.files[k]
    assert lookup(0, f.rel) is None                          # catalogued, not published
    assert index.cas_state(slots[k], lib.TIERING_STATE_NONE, 1)
    pub = lookup(0, f.rel)
    assert pub is not None and (pub.path, pub.size, pub.mtime_ns) == (str(tier.data / "0" / f.rel), f.size,
                                                                       f.mtime_ns)
    assert lookup(1, f.rel) is None and lookup(0, "c1/missing.bin") is None and lookup(0, "c1") is None
    assert index.cas_state(slots[k], 1, lib.TIERING_STATE_INVALID)
    assert lookup(0, f.rel) is None                          # written to during the job: never served
    index.close()
