"""Who this node is in which job: job id, node rank, node count, node names,
and this tier-run's place among the tier-runs of its node.

Sources, first match wins (NOTE [node identity] in docs/design.md):
explicit values (``--nodes N --node-rank R``), torchrun, Slurm (inside an
``srun`` step only), Open MPI / PMIx / PMI, else a single node.  Each source
is read as a whole and checked: inconsistent values are an IdentityError
that names the variables and says what to give instead.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..clairvoyant.launcher import parse_slurm_tasks_per_node
from ..clairvoyant.samplers import OrderError


class IdentityError(Exception):
    """The launcher's variables or the explicit options contradict each other."""


@dataclass(frozen=True)
class NodeIdentity:
    job_id: str                      # the same on every node and rank of the job; "" for a single node
    node_rank: int
    node_count: int
    local_rank: int = 0              # this tier-run among the tier-runs of its node
    local_world: int = 1             # tier-runs on this node (launch form 2 when > 1)
    node_names: tuple[str, ...] = () # by node rank, when the launcher says (Slurm)
    source: str = "single"           # explicit | torchrun | slurm | mpi | single
    rendezvous: str | None = None    # explicit --rendezvous, else None (the default applies)

    @property
    def multi_node(self) -> bool:
        return self.node_count > 1

    @property
    def shared_node(self) -> bool:
        """Several tier-runs on this node share one placement service."""
        return self.local_world > 1

    def name_of(self, rank: int) -> str:
        """A node's name for messages: its host name when known."""
        if 0 <= rank < len(self.node_names):
            return f"node {rank} ({self.node_names[rank]})"
        return f"node {rank}"


SINGLE = NodeIdentity(job_id="", node_rank=0, node_count=1)


@dataclass(frozen=True)
class Explicit:
    """``--nodes N --node-rank R --rendezvous SPEC [--job-id ID]``."""
    nodes: int | None = None
    node_rank: int | None = None
    rendezvous: str | None = None
    job_id: str | None = None


# -- the Slurm host list ----------------------------------------------------------

def expand_nodelist(spec: str) -> list[str]:
    """Slurm's compressed host list, in order: ``gpu[001-004,010],login1`` ->
    gpu001 .. gpu004, gpu010, login1; several bracket groups in one name
    (``r[1-2]n[01-02]``) give every combination, the last group varying fastest."""
    names: list[str] = []
    for part in _split_top_level(spec):
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices = [_expand_bracket(p, spec) if p.startswith("[") else [p] for p in pieces]
        names.extend("".join(combo) for combo in itertools.product(*choices))
    if not names:
        raise IdentityError(f"SLURM node list {spec!r} names no node")
    return names


def _split_top_level(spec: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in spec.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if depth < 0 or depth > 1:
            raise IdentityError(f"SLURM node list {spec!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise IdentityError(f"SLURM node list {spec!r}: unbalanced brackets")
    parts.append(cur)
    if any(not p for p in parts):
        raise IdentityError(f"SLURM node list {spec!r}: empty name")
    return parts


def _expand_bracket(group: str, spec: str) -> list[str]:
    out: list[str] = []
    for item in group[1:-1].split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not m:
            raise IdentityError(f"SLURM node list {spec!r}: cannot read {item!r} in {group} "
                                "(expected numbers or ranges like 001-004)")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise IdentityError(f"SLURM node list {spec!r}: range {item!r} runs backwards")
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


# -- sources ----------------------------------------------------------------------

def _int(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise IdentityError(f"environment variable {name}={value!r} is not an integer") from None


def _need(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    value = _int(env, name)
    if value is None:
        if default is None:
            raise IdentityError(f"{name} is not set, but other variables of its launcher are; "
                                "give --nodes and --node-rank explicitly")
        return default
    return value


def _first(env: Mapping[str, str], *names: str) -> str | None:
    for n in names:
        if env.get(n, "").strip():
            return n
    return None


def _slurm_job_part(env: Mapping[str, str]) -> str | None:
    job = env.get("SLURM_JOB_ID", "").strip() or env.get("SLURM_JOBID", "").strip()
    if not job:
        return None
    step = env.get("SLURM_STEP_ID", "").strip() or env.get("SLURM_STEPID", "").strip()
    return f"slurm-{job}.{step}" if step else f"slurm-{job}"


def _from_torchrun(env: Mapping[str, str]) -> NodeIdentity | None:
    if "GROUP_RANK" not in env and "LOCAL_WORLD_SIZE" not in env:
        return None
    world = _need(env, "WORLD_SIZE")
    local_world = _need(env, "LOCAL_WORLD_SIZE")
    local_rank = _need(env, "LOCAL_RANK")
    if local_world < 1 or world < local_world:
        raise IdentityError(f"torchrun variables disagree: WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local_world}")
    nodes = _int(env, "GROUP_WORLD_SIZE") or -(-world // local_world)
    rank = _need(env, "GROUP_RANK", (_need(env, "RANK", 0) - local_rank) // local_world)
    run = env.get("TORCHELASTIC_RUN_ID", "none").strip() or "none"
    where = f"{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"
    job = "/".join(p for p in (_slurm_job_part(env), f"torchrun-{run}@{where}") if p)
    return _checked(NodeIdentity(job, rank, nodes, local_rank, local_world, source="torchrun"),
                    "GROUP_RANK, GROUP_WORLD_SIZE (or WORLD_SIZE / LOCAL_WORLD_SIZE), LOCAL_RANK")


def _from_slurm(env: Mapping[str, str]) -> NodeIdentity | None:
    job = _slurm_job_part(env)
    if job is None or _first(env, "SLURM_STEP_ID", "SLURM_STEPID") is None:
        # no step: a batch script runs on the first node only; one node serves it
        return None
    nodes = _need(env, _first(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or "SLURM_NNODES")
    rank = _need(env, "SLURM_NODEID")
    names: tuple[str, ...] = ()
    list_var = _first(env, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
    if list_var:
        names = tuple(expand_nodelist(env[list_var]))
        if len(names) != nodes:
            raise IdentityError(f"{list_var}={env[list_var]!r} names {len(names)} nodes, but the step has "
                                f"{nodes}; give --nodes and --node-rank explicitly")
    local_world = 1
    tasks_var = _first(env, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    if tasks_var:
        try:
            counts = parse_slurm_tasks_per_node(env[tasks_var])
        except OrderError as e:
            raise IdentityError(str(e).replace("SLURM_TASKS_PER_NODE", tasks_var)) from None
        if 0 <= rank < len(counts):
            local_world = counts[rank]
    ident = _checked(NodeIdentity(job, rank, nodes, _need(env, "SLURM_LOCALID", 0), local_world,
                                  names, source="slurm"),
                     "SLURM_NODEID, SLURM_NNODES, SLURM_LOCALID, SLURM_TASKS_PER_NODE")
    here = env.get("SLURMD_NODENAME", "").strip()
    if names and here and names[rank] != here:
        raise IdentityError(f"SLURMD_NODENAME={here!r} but {list_var} puts {names[rank]!r} at "
                            f"SLURM_NODEID={rank}; give --nodes and --node-rank explicitly")
    return ident


_MPI = (  # (world, rank, local rank, local world) of Open MPI, PMI/Hydra (MPICH, Intel MPI)
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


def _from_mpi(env: Mapping[str, str]) -> NodeIdentity | None:
    for names in _MPI:
        if names[0] in env:
            world, rank, local_rank, local_world = (_need(env, n) for n in names)
            break
    else:
        return None
    if local_world < 1 or not 0 <= local_rank < local_world or (rank - local_rank) % local_world:
        raise IdentityError(f"{names[1]}={rank}, {names[2]}={local_rank}, {names[3]}={local_world}: "
                            "not a block placement of ranks on nodes; give --nodes and --node-rank explicitly")
    tag = next((env[n].strip() for n in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "PMI_JOBID")
                if env.get(n, "").strip()), None)
    if tag is None:
        raise IdentityError(f"{names[0]} is set but no job id (PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, "
                            "PMI_JOBID); give --job-id")
    job = "/".join(p for p in (_slurm_job_part(env), f"mpi-{tag}") if p)
    return _checked(NodeIdentity(job, rank // local_world, -(-world // local_world), local_rank, local_world,
                                 source="mpi"), ", ".join(names))


def _checked(ident: NodeIdentity, variables: str) -> NodeIdentity:
    problem = None
    if ident.node_count < 1:
        problem = f"node count {ident.node_count} is below 1"
    elif not 0 <= ident.node_rank < ident.node_count:
        problem = f"node rank {ident.node_rank} is outside 0..{ident.node_count - 1}"
    elif ident.local_world < 1 or not 0 <= ident.local_rank < ident.local_world:
        problem = f"local rank {ident.local_rank} is outside 0..{ident.local_world - 1}"
    if problem:
        raise IdentityError(f"inconsistent {ident.source} values ({variables}): {problem}; "
                            "give --nodes and --node-rank explicitly")
    return ident


# -- the one entry point ------------------------------------------------------------

def node_identity(env: Mapping[str, str], explicit: Explicit | None = None) -> NodeIdentity:
    """This node's identity from the explicit options, else the first launcher
    whose variables are present, else a single node."""
    explicit = explicit or Explicit()
    found = _from_torchrun(env) or _from_slurm(env) or _from_mpi(env)
    if explicit.nodes is None and explicit.node_rank is None:
        if explicit.job_id is not None or explicit.rendezvous is not None:
            found = found or SINGLE
            return NodeIdentity(explicit.job_id or found.job_id, found.node_rank, found.node_count,
                                found.local_rank, found.local_world, found.node_names, found.source,
                                explicit.rendezvous)
        return found or SINGLE
    if explicit.nodes is None or explicit.node_rank is None:
        raise IdentityError("--nodes and --node-rank go together: give both (or neither, to take them "
                            "from Slurm, torchrun or MPI)")
    job = explicit.job_id or (found.job_id if found else "")
    if not job and explicit.nodes > 1:
        if not explicit.rendezvous:
            raise IdentityError(f"--nodes {explicit.nodes} needs --rendezvous (a job directory on a shared "
                                "file system) or --job-id, the same on every node")
        job = "rdzv-" + hashlib.sha256(explicit.rendezvous.encode()).hexdigest()[:16]
    local_rank, local_world = (found.local_rank, found.local_world) if found else (0, 1)
    names = found.node_names if found and found.node_count == explicit.nodes else ()
    return _checked(NodeIdentity(job, explicit.node_rank, explicit.nodes, local_rank, local_world, names,
                                 "explicit", explicit.rendezvous), "--nodes, --node-rank")
