"""A data-parallel torchrun training (gloo) across emulated nodes, with or
without tier-run: what the multi-node tests and `make bench-multinode` run.

Each node is a network namespace on one bridge (tests/netns.py) with its own
tier directory; every node reads the same PFS directory (a slowfs mount or a
plain directory).  Launch form 1: on each node one tier-run wraps
`torchrun --nnodes N --node-rank R --nproc-per-node 1`; form 2: one tier-run
per rank wraps the training itself, started with the variables torchrun
would set (no torchrun).

    with netns.emulated_nodes(2) as net:
        result = run_job(JobSpec(data, work, nodes=2, mode="peers", capacity=1 << 20), net)
        result.ranks[0]["weights"], result.stats[0]["peer"]["bytes"]

Modes: "pfs" (the training alone, no tier-run), "local" (a clairvoyant
tier-run per node, each on its own: no peers), "peers" (the same, the nodes
of one job: the peer tier with the node-aware plan).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import netns

PYTHON = sys.executable
TRAIN = Path(__file__).resolve().parent / "workloads" / "train_ddp.py"
MODES = ("pfs", "lower-bound", "local", "peers")
UNWRAPPED = ("pfs", "lower-bound")   # modes without tier-run (lower-bound: each node reads data_per_node)


@dataclass
class JobSpec:
    data: Path                  # the PFS directory every node reads
    work: Path                  # scratch: tiers, job directory, outputs (made here)
    nodes: int
    mode: str = "peers"         # pfs | local | peers | lower-bound (no tier-run; each node reads data_per_node)
    capacity: int = 1 << 20     # bytes of each node's one tier
    capacities: list[int] | None = None   # per node, instead of capacity
    epochs: int = 3
    batch: int = 8
    seed: int = 11
    step_ms: float = 0.0        # compute per step
    ranks_per_node: int = 1
    form: int = 1               # launch form: 1 (tier-run around torchrun) or 2 (tier-run per rank)
    job_id: str = "mnjob"
    port: int = 29500
    pfs_mb_s: float = 50.0      # the profile's PFS rate per stream and latency: the peer is asked
    pfs_latency_ms: float = 2.0  # when the network is faster
    tier_run_args: list[str] = field(default_factory=list)
    timeout: float = 600.0
    data_per_node: list[Path] | None = None   # the directory each node's training reads (default: data)

    def __post_init__(self) -> None:
        if (self.mode == "lower-bound") != (self.data_per_node is not None):
            raise ValueError("data_per_node is given with mode lower-bound, and only then")


@dataclass
class JobResult:
    codes: list[int]                 # exit status of each node's process (form 2: of each rank's)
    ranks: list[dict[str, Any]]      # each rank's train_ddp.py record
    stats: list[dict[str, Any]]      # each node's --stats-json (tier-run modes)
    errors: list[str]                # each node's stderr
    seconds: float


def profile_text(spec: JobSpec, node: int) -> str:
    tiers = spec.work / f"tiers{node}"
    tiers.mkdir(parents=True, exist_ok=True)
    capacity = spec.capacities[node] if spec.capacities else spec.capacity
    return (f"name: node{node}\n"
            "tiers:\n"
            f"  - {{name: ssd, kind: filesystem, path: {tiers}, capacity: {capacity}, threads: 2}}\n"
            f"pfs: {{read_threads: 2, bandwidth: {{1: {spec.pfs_mb_s}}}, latency_ms: {spec.pfs_latency_ms}}}\n"
            "network: {bandwidth: 1000, latency_ms: 0.1, interface: eth0}\n")


def tier_run_argv(spec: JobSpec, node: int, rank: int) -> list[str]:
    """tier-run of node `node` (form 2: of global rank `rank`); its --stats-json is stats-<rank>.json."""
    prof = spec.work / f"node{node}.yaml"
    prof.write_text(profile_text(spec, node))
    argv = [PYTHON, "-m", "tiering", "run", "--profile", str(prof), "--data", str(spec.data),
            "--policy", "clairvoyant", "--sampler", "distributed", "--seed", str(spec.seed),
            "--epochs", str(spec.epochs), "--layout", "sorted", "--stats-json", str(spec.work / f"stats-{rank}.json"),
            *spec.tier_run_args]
    if spec.form == 1:   # outside torchrun: the ranks and the node are given
        argv += ["--world-size", str(spec.nodes * spec.ranks_per_node), "--rank", str(rank),
                 "--local-world-size", str(spec.ranks_per_node)]
        if spec.mode == "peers":
            argv += ["--nodes", str(spec.nodes), "--node-rank", str(node), "--job-id", spec.job_id]
    if spec.mode == "peers":
        argv += ["--rendezvous", str(spec.work / "rdzv")]
    return argv + ["--"]


def train_argv(spec: JobSpec, node: int) -> list[str]:
    data = spec.data_per_node[node] if spec.data_per_node else spec.data
    return [str(TRAIN), "--data", str(data), "--out-dir", str(spec.work / "out"), "--epochs", str(spec.epochs),
            "--batch-size", str(spec.batch), "--seed", str(spec.seed), "--step-ms", str(spec.step_ms)]


def _base_env(spec: JobSpec, net: netns.Network, node: int) -> dict[str, str]:
    """The node's environment: no launcher's variables of the caller, and a
    TMPDIR of the node's own under spec.work (torchrun leaves its
    torchelastic_* directories there, not in /tmp)."""
    tmp = spec.work / f"tmp{node}"
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_", "PMI_", "TORCHELASTIC_"))}
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
              "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update(GLOO_SOCKET_IFNAME=net.node(node).iface, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TMPDIR=str(tmp))
    return env


def launches(spec: JobSpec, net: netns.Network) -> list[tuple[str, list[str], dict[str, str]]]:
    """(name, argv, environment) of every process to start: one per node
    (form 1, torchrun) or one per rank (form 2, torchrun's variables)."""
    if spec.form == 2 and spec.mode == "local":
        raise ValueError("form 2 takes the nodes from torchrun's variables: there is no tier-run per node alone")
    master, k = net.node(0).address, spec.ranks_per_node
    out = []
    for node in range(spec.nodes):
        env = _base_env(spec, net, node)
        if spec.form == 1:
            wrap = [] if spec.mode in UNWRAPPED else tier_run_argv(spec, node, node * k)
            cmd = [PYTHON, "-m", "torch.distributed.run", "--nnodes", str(spec.nodes), "--node-rank", str(node),
                   "--nproc-per-node", str(k), "--master-addr", master, "--master-port", str(spec.port),
                   *train_argv(spec, node)]
            out.append((f"node{node}", net.node(node).argv(wrap + cmd), env))
            continue
        ranks = []
        for local in range(k):
            rank = node * k + local
            renv = dict(env, WORLD_SIZE=str(spec.nodes * k), RANK=str(rank), LOCAL_RANK=str(local),
                        LOCAL_WORLD_SIZE=str(k), GROUP_RANK=str(node), GROUP_WORLD_SIZE=str(spec.nodes),
                        MASTER_ADDR=master, MASTER_PORT=str(spec.port), TORCHELASTIC_RUN_ID=spec.job_id)
            wrap = [] if spec.mode in UNWRAPPED else tier_run_argv(spec, node, rank)
            ranks.append({"argv": wrap + [PYTHON, *train_argv(spec, node)], "env": renv,
                          "log": str(spec.work / f"rank{rank}.err")})
        # the node's ranks in one mount namespace with a /dev/shm of the node's own (the node
        # service's directory is there): one process starts them and records their exit codes
        plan, shm = spec.work / f"node{node}.json", spec.work / f"shm{node}"
        shm.mkdir(exist_ok=True)
        shm.chmod(0o1777)
        plan.write_text(json.dumps(ranks))
        out.append((f"node{node}", net.node(node).argv(
            ["sh", "-c", 'mount --bind "$0" /dev/shm && exec "$@"', str(shm), PYTHON, __file__, "spawn",
             str(plan)]), env))
    return out


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    """SIGKILL to each process group this harness started (each node's)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def run_job(spec: JobSpec, net: netns.Network,
            during: Callable[[list[subprocess.Popen[str]]], None] | None = None) -> JobResult:
    """The job on spec.nodes emulated nodes; every process still running
    after spec.timeout is killed (its code: -9).  during(), when given, runs
    in a thread once every process is started, with the processes (a fault
    to inject)."""
    (spec.work / "out").mkdir(parents=True, exist_ok=True)
    if spec.mode == "peers":
        (spec.work / "rdzv").mkdir(mode=0o700, exist_ok=True)
    todo = launches(spec, net)
    logs = [open(spec.work / f"{name}.err", "w+") for name, _, _ in todo]
    procs: list[subprocess.Popen[str]] = []
    t0 = time.monotonic()
    try:
        for (_, argv, env), log in zip(todo, logs):
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True,
                                          start_new_session=True))
        if during is not None:
            thread = threading.Thread(target=during, args=(procs,), daemon=True)
            thread.start()
        deadline = t0 + spec.timeout
        for p in procs:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
    finally:
        _stop(procs)
    seconds = time.monotonic() - t0
    errors = []
    for f in logs:
        f.seek(0)
        errors.append(f.read())
        f.close()
    world = spec.nodes * spec.ranks_per_node
    ranks = [_load(spec.work / "out" / f"rank-{r}.json") for r in range(world)]
    per = spec.ranks_per_node if spec.form == 1 else 1
    stats = [_load(spec.work / f"stats-{r}.json") for r in range(0, world, per)] if spec.mode not in UNWRAPPED else []
    codes = [p.returncode for p in procs]
    if spec.form == 2:   # each rank's, as its node's spawn recorded them (-9: killed with its node)
        spawned = [_load(spec.work / f"node{n}.json.codes").get("codes") for n in range(spec.nodes)]
        codes = [c for n, got in enumerate(spawned) for c in (got or [-9] * spec.ranks_per_node)]
        errors += [Path(spec.work / f"rank{r}.err").read_text() for r in range(world)]
    return JobResult(codes, ranks, stats, errors, seconds)


def _load(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def tier_files(work: Path, node: int) -> int:
    """Files left in node `node`'s tier directory (tier-run removes its own at exit)."""
    return sum(len(files) for _, _, files in os.walk(work / f"tiers{node}"))


def torchelastic_dirs(work: Path, node: int) -> list[Path]:
    """The directories torchrun made in node `node`'s TMPDIR."""
    return sorted((work / f"tmp{node}").glob("torchelastic_*"))


def expected_samples(root: Path, world: int, epochs: int, seed: int) -> list[list[tuple[int, str]]]:
    """What train_ddp.py's ranks must record (samples, digest) per rank per
    epoch: the DistributedSampler's shares, with the bytes of the files."""
    import hashlib

    from torch.utils.data import DistributedSampler
    paths = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs)
    out = []
    for rank in range(world):
        sampler = DistributedSampler(range(len(paths)), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        per_epoch = []
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            h, n = hashlib.sha256(), 0
            for i in sampler:
                data = Path(paths[i]).read_bytes()
                h.update(f"{i}\0{len(data)}\0".encode() + data)
                n += 1
            per_epoch.append((n, h.hexdigest()))
        out.append(per_epoch)
    return out


def spawn(plan: Path) -> int:
    """Starts the processes of plan ([{argv, env, log}]), waits for all of
    them, writes {"codes": [...]} to PLAN.codes."""
    todo = json.loads(plan.read_text())
    procs = []
    for p in todo:
        with open(p["log"], "w") as log:
            procs.append(subprocess.Popen(p["argv"], env=p["env"], stdout=subprocess.DEVNULL, stderr=log))
    codes = [p.wait() for p in procs]
    Path(f"{plan}.codes").write_text(json.dumps({"codes": codes}))
    return 0


if __name__ == "__main__":
    sys.exit(spawn(Path(sys.argv[2])) if sys.argv[1:2] == ["spawn"] else 2)
