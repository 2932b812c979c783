"""Ranks from the launcher: world size, rank and local ranks as torchrun or
Slurm put them in the environment, and which ranks one node serves."""
from __future__ import annotations

import re
from collections.abc import Mapping

from .samplers import OrderError, positive_int


def ranks_from_env(env: Mapping[str, str]) -> tuple[int, int, int, int]:
    """(world_size, rank, local_world_size, node_rank) of the process this environment
    belongs to.

    torchrun (WORLD_SIZE present) wins over Slurm: WORLD_SIZE, RANK, LOCAL_WORLD_SIZE,
    node rank GROUP_RANK, else (RANK - LOCAL_RANK) // LOCAL_WORLD_SIZE.
    Slurm (SLURM_PROCID present): SLURM_NTASKS, SLURM_PROCID, SLURM_NTASKS_PER_NODE or
    this node's entry of SLURM_TASKS_PER_NODE ("4(x2),3"), node rank SLURM_NODEID.
    Missing values default to (1, 0, 1, 0). Note: under `srun tier-run -- torchrun ...`
    the Slurm values describe the tier-run tasks, not the training ranks."""
    if "WORLD_SIZE" in env:
        world = _env_int(env, "WORLD_SIZE", 1)
        rank = _env_int(env, "RANK", 0)
        local = _env_int(env, "LOCAL_WORLD_SIZE", 1)
        if "GROUP_RANK" in env:
            node = _env_int(env, "GROUP_RANK", 0)
        else:
            node = (rank - _env_int(env, "LOCAL_RANK", rank % local)) // local
    elif "SLURM_PROCID" in env:
        world = _env_int(env, "SLURM_NTASKS", 1)
        rank = _env_int(env, "SLURM_PROCID", 0)
        node = _env_int(env, "SLURM_NODEID", 0)
        local = _slurm_local_world(env, node)
    else:
        return 1, 0, 1, 0
    if world < 1 or not 0 <= rank < world or not 1 <= local <= world or node < 0:
        raise OrderError(f"inconsistent launcher environment: world size {world}, rank {rank}, "
                         f"local world size {local}, node {node}; give --world-size/--rank instead")
    return world, rank, local, node


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise OrderError(f"environment variable {name}={value!r} is not an integer") from None


def _slurm_local_world(env: Mapping[str, str], node: int) -> int:
    if env.get("SLURM_NTASKS_PER_NODE", "").strip():
        return _env_int(env, "SLURM_NTASKS_PER_NODE", 1)
    spec = env.get("SLURM_TASKS_PER_NODE", "").strip()
    if not spec:
        return 1
    counts = parse_slurm_tasks_per_node(spec)
    if node >= len(counts):
        raise OrderError(f"SLURM_TASKS_PER_NODE={spec!r} lists {len(counts)} nodes, but "
                         f"SLURM_NODEID is {node}")
    return counts[node]


def parse_slurm_tasks_per_node(spec: str) -> list[int]:
    """Slurm's compressed tasks-per-node list, one count per node: "4(x2),3" -> [4, 4, 3]."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise OrderError(f"SLURM_TASKS_PER_NODE={spec!r}: cannot read {part!r} "
                             f"(expected forms like 4 or 4(x2), comma-separated)")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def local_ranks(world_size: int, rank: int, local_world_size: int) -> list[int]:
    """The global ranks on this process's node, under block placement (torchrun, Slurm's
    default): node k holds ranks k*L .. k*L+L-1 (fewer on a last, partial node).
    Uneven Slurm layouts ("4,3") are not block-regular; pass the ranks explicitly then."""
    if not positive_int(world_size) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise OrderError(f"rank {rank!r} is outside world size {world_size!r}")
    if not positive_int(local_world_size) or local_world_size > world_size:
        raise OrderError(f"local world size {local_world_size!r} must be between 1 and the "
                         f"world size {world_size}")
    first = rank // local_world_size * local_world_size
    return list(range(first, min(first + local_world_size, world_size)))
