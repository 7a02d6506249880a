"""Turns the environment a task was started in into rank information.

One small class per environment behind one interface, registered by subclassing (the shape of
``jax/_src/clusters``). Unlike JAX's auto-detection we never guess device ids from local ranks:
device visibility is set separately (``launcher.runtime.devices``) and ``jax.distributed`` is
given explicit arguments.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass
from typing import ClassVar, Mapping

from launcher.errors import UserError


@dataclass(frozen=True)
class RankInfo:
    process_id: int
    num_processes: int
    local_rank: int
    local_size: int
    node_rank: int
    coordinator: str  # "host:port" of the jax.distributed coordinator (rank 0)
    source: str  # which environment the numbers came from


class RankEnv:
    """Reads one kind of launcher's environment variables. Subclasses register themselves."""

    name: ClassVar[str]
    priority: ClassVar[int]  # higher is tried first: mpirun inside a SLURM job is MPI, not SLURM
    _registry: ClassVar[list[type["RankEnv"]]] = []

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        RankEnv._registry.append(cls)
        RankEnv._registry.sort(key=lambda c: -c.priority)

    def __init__(self, env: Mapping[str, str]):
        self.env = env

    def present(self) -> bool:
        raise NotImplementedError

    def info(self, port: int) -> RankInfo:
        raise NotImplementedError

    def _int(self, key: str, default: int | None = None) -> int:
        value = self.env.get(key)
        if value is None:
            if default is None:
                raise UserError(f"{self.name}: environment variable {key} is not set")
            return default
        return int(value)


class ExplicitEnv(RankEnv):
    """XLAUNCH_* variables: a user (or a wrapper script) states the ranks outright."""

    name, priority = "explicit", 100

    def present(self) -> bool:
        return "XLAUNCH_PROCESS_ID" in self.env

    def info(self, port: int) -> RankInfo:
        coordinator = self.env.get("XLAUNCH_COORDINATOR") or f"127.0.0.1:{port}"
        return RankInfo(
            process_id=self._int("XLAUNCH_PROCESS_ID"),
            num_processes=self._int("XLAUNCH_NUM_PROCESSES"),
            local_rank=self._int("XLAUNCH_LOCAL_RANK", self._int("XLAUNCH_PROCESS_ID")),
            local_size=self._int("XLAUNCH_LOCAL_SIZE", self._int("XLAUNCH_NUM_PROCESSES")),
            node_rank=self._int("XLAUNCH_NODE_RANK", 0),
            coordinator=coordinator,
            source=self.name,
        )


class OpenMpiEnv(RankEnv):
    """mpirun (Open MPI / PRRTE). Rank 0's host is shared over MPI itself when mpi4py is there."""

    name, priority = "openmpi", 80

    def present(self) -> bool:
        return "OMPI_COMM_WORLD_RANK" in self.env

    def info(self, port: int) -> RankInfo:
        host = self.env.get("XLAUNCH_COORDINATOR_HOST") or _mpi_rank0_host()
        return RankInfo(
            process_id=self._int("OMPI_COMM_WORLD_RANK"),
            num_processes=self._int("OMPI_COMM_WORLD_SIZE"),
            local_rank=self._int("OMPI_COMM_WORLD_LOCAL_RANK", 0),
            local_size=self._int("OMPI_COMM_WORLD_LOCAL_SIZE", 1),
            # OMPI_COMM_WORLD_NODE_RANK is the rank within the node, not the node's index.
            node_rank=self._int("OMPI_COMM_WORLD_RANK") // max(self._int("OMPI_COMM_WORLD_LOCAL_SIZE", 1), 1),
            coordinator=f"{host}:{port}",
            source=self.name,
        )


class SlurmEnv(RankEnv):
    """srun tasks (also under --mpi=pmix, where ranks get SLURM_* but no OMPI_*)."""

    name, priority = "slurm", 60

    def present(self) -> bool:
        return "SLURM_PROCID" in self.env and "SLURM_STEP_ID" in self.env

    def info(self, port: int) -> RankInfo:
        nodelist = self.env.get("SLURM_STEP_NODELIST") or self.env["SLURM_JOB_NODELIST"]
        first = expand_nodelist(nodelist)[0]
        ntasks = self._int("SLURM_STEP_NUM_TASKS", self._int("SLURM_NTASKS", 1))
        nnodes = self._int("SLURM_STEP_NUM_NODES", self._int("SLURM_NNODES", 1))
        return RankInfo(
            process_id=self._int("SLURM_PROCID"),
            num_processes=ntasks,
            local_rank=self._int("SLURM_LOCALID", 0),
            local_size=ntasks // max(nnodes, 1),
            node_rank=self._int("SLURM_NODEID", 0),
            coordinator=f"{_slurm_node_address(first)}:{port}",
            source=self.name,
        )


class TpuEnv(RankEnv):
    """A TPU VM pod worker: the worker id and the pod's hostnames, as GKE and our executor set them."""

    name, priority = "tpu", 40

    def present(self) -> bool:
        return "TPU_WORKER_ID" in self.env and "TPU_WORKER_HOSTNAMES" in self.env

    def info(self, port: int) -> RankInfo:
        hosts = [h for h in self.env["TPU_WORKER_HOSTNAMES"].split(",") if h]
        return RankInfo(
            process_id=self._int("TPU_WORKER_ID"),
            num_processes=len(hosts),
            local_rank=0,
            local_size=1,
            node_rank=self._int("TPU_WORKER_ID"),
            coordinator=f"{hosts[0]}:{port}",
            source=self.name,
        )


class SubmititLocalEnv(RankEnv):
    """submitit's LocalExecutor: every task on this host."""

    name, priority = "submitit-local", 20

    def present(self) -> bool:
        return "SUBMITIT_LOCAL_GLOBALID" in self.env

    def info(self, port: int) -> RankInfo:
        n = self._int("SUBMITIT_LOCAL_NTASKS")
        return RankInfo(
            process_id=self._int("SUBMITIT_LOCAL_GLOBALID"),
            num_processes=n,
            local_rank=self._int("SUBMITIT_LOCAL_LOCALID", 0),
            local_size=n,
            node_rank=0,
            coordinator=f"127.0.0.1:{port}",
            source=self.name,
        )


def detect(port: int, env: Mapping[str, str] | None = None) -> RankInfo:
    """Rank info from the first environment that is present; a lone process is rank 0 of 1."""
    env = os.environ if env is None else env
    for cls in RankEnv._registry:
        source = cls(env)
        if source.present():
            return source.info(port)
    return RankInfo(0, 1, 0, 1, 0, f"127.0.0.1:{port}", "single")


def default_port(env: Mapping[str, str] | None = None) -> int:
    """A coordinator port that differs between concurrent jobs on one node, agreed by all ranks
    without talking: derived from the scheduler's job id."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or env.get("OMPI_MCA_orte_jobfam_session_id")
    digits = int(re.sub(r"\D", "", job or "") or 0)
    return 20000 + digits % 20000


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed node list ("nid[001234-001236,001240],gpu7") as names, in order."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[\]]+)\[([^\]]*)\]|([^,\[\]]+)", nodelist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                names.append(prefix + lo)
            else:
                names.extend(f"{prefix}{i:0{len(lo)}d}" for i in range(int(lo), int(hi) + 1))
    return names


def _slurm_node_address(node: str) -> str:
    """A node's address. Node names normally resolve; on single-host test clusters they are
    aliases whose address only slurm.conf knows, so ask scontrol then."""
    try:
        socket.getaddrinfo(node, None)
        return node
    except OSError:
        pass
    try:
        out = subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    m = re.search(r"\bNodeAddr=(\S+)", out)
    return m.group(1) if m else node


def _mpi_rank0_host() -> str:
    try:
        from mpi4py import MPI
    except ImportError:
        return "127.0.0.1"  # without mpi4py only single-host mpirun is supported
    host = socket.gethostname() if MPI.COMM_WORLD.Get_rank() == 0 else None
    host = MPI.COMM_WORLD.bcast(host, root=0)
    return "127.0.0.1" if host == socket.gethostname() else host
