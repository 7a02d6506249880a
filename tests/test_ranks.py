"""Rank detection and device visibility: each environment's variables as its launcher sets them."""

import pytest

from launcher.runtime import devices, ranks
from launcher.cli.schema import ClusterConfig
from launcher.clusters.mpi import MpiJobEnvironment
from launcher.clusters.tpu import TpuJobEnvironment


def test_slurm_environment():
    env = {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NUM_NODES": "2",
           "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_STEP_NODELIST": "localhost,node9"}
    info = ranks.detect(1234, env)
    assert (info.process_id, info.num_processes, info.local_rank, info.local_size, info.node_rank) == (3, 4, 1, 2, 1)
    assert info.coordinator == "localhost:1234" and info.source == "slurm"


def test_mpirun_inside_slurm_is_mpi():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_NODE_RANK": "1", "XLAUNCH_COORDINATOR_HOST": "n0",
           "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}
    info = ranks.detect(99, env)
    assert info.source == "openmpi"
    assert (info.process_id, info.num_processes, info.local_rank, info.node_rank) == (2, 4, 0, 1)  # 2 // 2
    assert info.coordinator == "n0:99"


def test_tpu_and_submitit_local_and_explicit():
    tpu = ranks.detect(8476, {"TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"})
    assert (tpu.process_id, tpu.num_processes, tpu.coordinator) == (1, 4, "t0:8476")
    local = ranks.detect(5, {"SUBMITIT_LOCAL_GLOBALID": "1", "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "2"})
    assert (local.process_id, local.num_processes, local.coordinator) == (1, 2, "127.0.0.1:5")
    # Explicit variables win over whatever launcher started the process.
    explicit = ranks.detect(5, {"XLAUNCH_PROCESS_ID": "0", "XLAUNCH_NUM_PROCESSES": "3",
                                "XLAUNCH_COORDINATOR": "h:7", "SUBMITIT_LOCAL_GLOBALID": "1",
                                "SUBMITIT_LOCAL_NTASKS": "2"})
    assert (explicit.process_id, explicit.num_processes, explicit.coordinator) == (0, 3, "h:7")
    assert ranks.detect(5, {}).num_processes == 1


def test_nodelist_expansion():
    assert ranks.expand_nodelist("nid[001234-001236,001240],gpu7") == [
        "nid001234", "nid001235", "nid001236", "nid001240", "gpu7"]
    assert ranks.expand_nodelist("node[1-2]") == ["node1", "node2"]


def test_default_port_is_agreed_from_the_job_id():
    a = ranks.default_port({"SLURM_JOB_ID": "123456"})
    assert a == ranks.default_port({"SLURM_JOB_ID": "123456"}) != ranks.default_port({"SLURM_JOB_ID": "123457"})
    assert a in ranks.PORTS and ranks.PORTS.stop <= 32768  # below Linux's ephemeral ports


@pytest.mark.parametrize("accelerator,var,expected", [
    ("rocm", "ROCR_VISIBLE_DEVICES", "2"),
    ("cuda", "CUDA_VISIBLE_DEVICES", "2"),
])
def test_one_device_per_local_rank(accelerator, var, expected):
    cluster = ClusterConfig(name="x", backend="slurm", tasks_per_node=8, gpus_per_node=8)
    rank = ranks.RankInfo(10, 16, 2, 8, 1, "h:1", "slurm")
    env = {}
    devices.set_visibility(accelerator, cluster, rank, env=env)
    assert env[var] == expected
    if accelerator == "rocm":
        assert env["HIP_VISIBLE_DEVICES"] == "0"  # renumbered inside what ROCR leaves visible
    assert devices.jax_local_device_ids(accelerator, cluster) == [0]


def test_two_gpus_per_task():
    assert devices.local_devices(gpus_per_node=8, tasks_per_node=4, local_rank=3) == [6, 7]


def test_job_environments_read_ranks_as_the_task_does(monkeypatch):

    for k, v in {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                 "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "TPU_WORKER_ID": "1", "TPU_WORKER_HOSTNAMES": "t0,t1"}.items():
        monkeypatch.setenv(k, v)
    mpi = MpiJobEnvironment()
    assert (mpi.global_rank, mpi.num_tasks, mpi.local_rank, mpi.node, mpi.num_nodes) == (3, 4, 1, 1, 2)
    tpu = TpuJobEnvironment()
    assert (tpu.global_rank, tpu.num_tasks, tpu.local_rank, tpu.node, tpu.hostnames) == (1, 2, 0, 1, ["t0", "t1"])
