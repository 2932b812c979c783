"""Node identity from Slurm, torchrun, MPI or explicit options."""
from __future__ import annotations

import pytest

from tiering.cluster.identity import SINGLE, Explicit, IdentityError, expand_nodelist, node_identity

SRUN = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURM_NNODES": "5", "SLURM_NODEID": "4",
        "SLURM_STEP_NODELIST": "gpu[001-002,010],login[1-2]", "SLURM_LOCALID": "2",
        "SLURM_STEP_TASKS_PER_NODE": "4(x4),3", "SLURMD_NODENAME": "login2"}
TORCHRUN = {"WORLD_SIZE": "8", "RANK": "5", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "gpu001", "MASTER_PORT": "29500",
            "TORCHELASTIC_RUN_ID": "abc"}


@pytest.mark.parametrize("spec, names", [
    ("gpu[001-004,010],login1", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu010", "login1"]),
    ("n1", ["n1"]),
    ("a[8-11]", ["a8", "a9", "a10", "a11"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("x[7],y[09-10].ib", ["x7", "y09.ib", "y10.ib"]),
])
def test_slurm_node_lists_expand_in_order(spec, names):
    assert expand_nodelist(spec) == names


@pytest.mark.parametrize("spec, words", [
    ("gpu[001-004", "unbalanced"), ("gpu[4-1]", "backwards"), ("gpu[a-b]", "cannot read"),
    ("a,,b", "empty name"), ("a[[1]]", "unbalanced"),
])
def test_malformed_node_lists_are_clear_errors(spec, words):
    with pytest.raises(IdentityError, match=words):
        expand_nodelist(spec)


def test_nothing_set_is_a_single_node():
    assert node_identity({}) == SINGLE
    assert not SINGLE.multi_node and not SINGLE.shared_node


def test_slurm_step():
    ident = node_identity(SRUN)
    assert (ident.job_id, ident.node_rank, ident.node_count) == ("slurm-4711.0", 4, 5)
    assert ident.node_names == ("gpu001", "gpu002", "gpu010", "login1", "login2")
    assert (ident.local_rank, ident.local_world, ident.source) == (2, 3, "slurm")
    assert ident.multi_node and ident.shared_node
    assert ident.name_of(0) == "node 0 (gpu001)"


def test_a_slurm_batch_script_without_a_step_is_one_node():
    env = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_ID"}
    assert node_identity(env) == SINGLE


@pytest.mark.parametrize("change, words", [
    ({"SLURM_NODEID": "5"}, r"node rank 5 is outside 0\.\.4"),
    ({"SLURM_NNODES": "4"}, "names 5 nodes, but the step has 4"),
    ({"SLURM_LOCALID": "3"}, r"local rank 3 is outside 0\.\.2"),
    ({"SLURMD_NODENAME": "gpu001"}, "SLURMD_NODENAME='gpu001' but SLURM_STEP_NODELIST puts 'login2'"),
    ({"SLURM_NODEID": "four"}, "SLURM_NODEID='four' is not an integer"),
    ({"SLURM_STEP_TASKS_PER_NODE": "4(y2)"}, "SLURM_STEP_TASKS_PER_NODE='4\\(y2\\)': cannot read"),
])
def test_inconsistent_slurm_values_are_clear_errors(change, words):
    with pytest.raises(IdentityError, match=words) as e:
        node_identity({**SRUN, **change})
    assert "explicitly" in str(e.value) or "cannot read" in str(e.value) or "integer" in str(e.value)


def test_torchrun_wins_over_slurm_and_keeps_the_slurm_job():
    ident = node_identity({**SRUN, **TORCHRUN})
    assert (ident.node_rank, ident.node_count, ident.local_rank, ident.local_world) == (1, 2, 1, 4)
    assert ident.job_id == "slurm-4711.0/torchrun-abc@gpu001:29500"
    assert ident.source == "torchrun" and ident.node_names == ()


def test_torchrun_without_group_variables_derives_the_node():
    env = {k: v for k, v in TORCHRUN.items() if k not in ("GROUP_RANK", "GROUP_WORLD_SIZE")}
    ident = node_identity(env)
    assert (ident.node_rank, ident.node_count) == (1, 2)
    with pytest.raises(IdentityError, match="WORLD_SIZE=2, LOCAL_WORLD_SIZE=4"):
        node_identity({**TORCHRUN, "WORLD_SIZE": "2"})
    with pytest.raises(IdentityError, match="node rank 2 is outside"):
        node_identity({**TORCHRUN, "GROUP_RANK": "2"})


def test_open_mpi_and_hydra():
    ompi = {"OMPI_COMM_WORLD_SIZE": "12", "OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_LOCAL_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PMIX_NAMESPACE": "prterun-h-123@1"}
    ident = node_identity(ompi)
    assert (ident.job_id, ident.node_rank, ident.node_count, ident.local_rank, ident.local_world) == \
        ("mpi-prterun-h-123@1", 1, 3, 3, 4)
    hydra = {"PMI_SIZE": "4", "PMI_RANK": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_JOBID": "9"}
    assert node_identity(hydra).node_rank == 1
    with pytest.raises(IdentityError, match="not a block placement"):
        node_identity({**ompi, "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    with pytest.raises(IdentityError, match="no job id"):
        node_identity({k: v for k, v in ompi.items() if k != "PMIX_NAMESPACE"})


def test_explicit_values_win():
    ident = node_identity(SRUN, Explicit(nodes=3, node_rank=2, rendezvous="/shared/job"))
    assert (ident.node_rank, ident.node_count, ident.source, ident.rendezvous) == (2, 3, "explicit", "/shared/job")
    assert ident.job_id == "slurm-4711.0" and ident.local_world == 3 and ident.node_names == ()
    alone = node_identity({}, Explicit(nodes=2, node_rank=1, rendezvous="/shared/job"))
    assert alone.job_id.startswith("rdzv-") and alone.job_id == node_identity(
        {}, Explicit(nodes=2, node_rank=0, rendezvous="/shared/job")).job_id
    assert node_identity({}, Explicit(nodes=2, node_rank=0, job_id="run7")).job_id == "run7"


@pytest.mark.parametrize("explicit, words", [
    (Explicit(nodes=2), "go together"),
    (Explicit(node_rank=0), "go together"),
    (Explicit(nodes=2, node_rank=2, job_id="j"), "node rank 2 is outside"),
    (Explicit(nodes=0, node_rank=0, job_id="j"), "node count 0"),
    (Explicit(nodes=2, node_rank=0), "needs --rendezvous"),
])
def test_inconsistent_explicit_values(explicit, words):
    with pytest.raises(IdentityError, match=words):
        node_identity({}, explicit)
