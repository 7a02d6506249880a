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
from dataclasses import dataclass, replace
from typing import ClassVar, Mapping

from launcher.errors import UserError

# Where a coordinator port is picked when nothing names one: below Linux's default ephemeral
# range (32768-60999), where a port an outgoing connection holds at that moment would refuse the
# coordinator's bind and end the job.
PORTS = range(20000, 32768)


@dataclass(frozen=True)
class RankInfo:
    process_id: int
    num_processes: int
    local_rank: int
    local_size: int
    node_rank: int
    coordinator: str  # "host:port" of the jax.distributed coordinator (rank 0)
    source: str  # which environment the numbers came from

    @property
    def num_nodes(self) -> int:
        """Nodes in the job (every launcher here fills nodes evenly, local_size tasks each)."""
        return max(self.num_processes // max(self.local_size, 1), 1)


class RankEnv:
    """Reads one kind of launcher's environment variables. Subclasses register themselves.

    This is the one place that reads rank numbers: ``detect`` (the Task) and the submitit job
    environments of our executors (``launcher.clusters.base.RankJobEnvironment``: mpi, tpu)
    both call ``numbers``. ``info`` adds the coordinator's address, which may need talking to
    the other ranks (Open MPI), so only the Task asks for it, once.
    """

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

    def numbers(self) -> RankInfo:
        """This process's place in the job; ``coordinator`` without a port ("host:")."""
        raise NotImplementedError

    def coordinator_host(self) -> str:
        return "127.0.0.1"

    def info(self, port: int) -> RankInfo:
        return replace(self.numbers(), coordinator=f"{self.coordinator_host()}:{port}")

    def _int(self, key: str, default: int | None = None) -> int:
        value = self.env.get(key)
        if value is None:
            if default is None:
                raise UserError(f"{self.name}: environment variable {key} is not set")
            return default
        return int(value)

    def _info(self, process_id: int, num_processes: int, local_rank: int, local_size: int,
              node_rank: int) -> RankInfo:
        return RankInfo(process_id, num_processes, local_rank, local_size, node_rank, "", self.name)


class ExplicitEnv(RankEnv):
    """XLAUNCH_* variables: a user (or a wrapper script) states the ranks outright."""

    name, priority = "explicit", 100

    def present(self) -> bool:
        return "XLAUNCH_PROCESS_ID" in self.env

    def numbers(self) -> RankInfo:
        return self._info(
            process_id=self._int("XLAUNCH_PROCESS_ID"),
            num_processes=self._int("XLAUNCH_NUM_PROCESSES"),
            local_rank=self._int("XLAUNCH_LOCAL_RANK", self._int("XLAUNCH_PROCESS_ID")),
            local_size=self._int("XLAUNCH_LOCAL_SIZE", self._int("XLAUNCH_NUM_PROCESSES")),
            node_rank=self._int("XLAUNCH_NODE_RANK", 0),
        )

    def info(self, port: int) -> RankInfo:
        coordinator = self.env.get("XLAUNCH_COORDINATOR") or f"127.0.0.1:{port}"
        return replace(self.numbers(), coordinator=coordinator)


class OpenMpiEnv(RankEnv):
    """mpirun (Open MPI / PRRTE). Rank 0's host is shared over MPI itself when mpi4py is there."""

    name, priority = "openmpi", 80

    def present(self) -> bool:
        return "OMPI_COMM_WORLD_RANK" in self.env

    def numbers(self) -> RankInfo:
        local_size = self._int("OMPI_COMM_WORLD_LOCAL_SIZE", 1)
        return self._info(
            process_id=self._int("OMPI_COMM_WORLD_RANK"),
            num_processes=self._int("OMPI_COMM_WORLD_SIZE"),
            local_rank=self._int("OMPI_COMM_WORLD_LOCAL_RANK", 0),
            local_size=local_size,
            # OMPI_COMM_WORLD_NODE_RANK is the rank within the node, not the node's index; hosts
            # are filled slot by slot, local_size each, so the node is a quotient.
            node_rank=self._int("OMPI_COMM_WORLD_RANK") // max(local_size, 1),
        )

    def coordinator_host(self) -> str:
        return self.env.get("XLAUNCH_COORDINATOR_HOST") or _mpi_rank0_host()


class SlurmEnv(RankEnv):
    """srun tasks (also under --mpi=pmix, where ranks get SLURM_* but no OMPI_*)."""

    name, priority = "slurm", 60

    def present(self) -> bool:
        return "SLURM_PROCID" in self.env and "SLURM_STEP_ID" in self.env

    def numbers(self) -> RankInfo:
        ntasks = self._int("SLURM_STEP_NUM_TASKS", self._int("SLURM_NTASKS", 1))
        nnodes = self._int("SLURM_STEP_NUM_NODES", self._int("SLURM_NNODES", 1))
        return self._info(
            process_id=self._int("SLURM_PROCID"),
            num_processes=ntasks,
            local_rank=self._int("SLURM_LOCALID", 0),
            local_size=ntasks // max(nnodes, 1),
            node_rank=self._int("SLURM_NODEID", 0),
        )

    def coordinator_host(self) -> str:
        nodelist = self.env.get("SLURM_STEP_NODELIST") or self.env["SLURM_JOB_NODELIST"]
        return _slurm_node_address(expand_nodelist(nodelist)[0])


class TpuEnv(RankEnv):
    """A TPU VM pod worker: the worker id and the pod's hostnames, as GKE and our executor set them."""

    name, priority = "tpu", 40

    def present(self) -> bool:
        return "TPU_WORKER_ID" in self.env and "TPU_WORKER_HOSTNAMES" in self.env

    def hosts(self) -> list[str]:
        """Every worker's address, in worker order."""
        return [h for h in self.env["TPU_WORKER_HOSTNAMES"].split(",") if h]

    def numbers(self) -> RankInfo:
        return self._info(
            process_id=self._int("TPU_WORKER_ID"),
            num_processes=len(self.hosts()),
            local_rank=0,
            local_size=1,
            node_rank=self._int("TPU_WORKER_ID"),
        )

    def coordinator_host(self) -> str:
        return self.hosts()[0]


class SubmititLocalEnv(RankEnv):
    """submitit's LocalExecutor: every task on this host."""

    name, priority = "submitit-local", 20

    def present(self) -> bool:
        return "SUBMITIT_LOCAL_GLOBALID" in self.env

    def numbers(self) -> RankInfo:
        n = self._int("SUBMITIT_LOCAL_NTASKS")
        return self._info(
            process_id=self._int("SUBMITIT_LOCAL_GLOBALID"),
            num_processes=n,
            local_rank=self._int("SUBMITIT_LOCAL_LOCALID", 0),
            local_size=n,
            node_rank=0,
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
    without talking: derived from the scheduler's job id. The launcher does not use it (its Task
    gets the port decided at submission, ``launcher.cli.submit.coordinator_port``); it is for scripts
    that call ``detect`` on their own."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID") or env.get("OMPI_MCA_orte_jobfam_session_id")
    digits = int(re.sub(r"\D", "", job or "") or 0)
    return PORTS.start + digits % len(PORTS)


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
        from mpi4py import MPI  # noqa: PLC0415  optional dependency (the mpi extra)
    except ImportError:
        return "127.0.0.1"  # without mpi4py only single-host mpirun is supported
    host = socket.gethostname() if MPI.COMM_WORLD.Get_rank() == 0 else None
    host = MPI.COMM_WORLD.bcast(host, root=0)
    return "127.0.0.1" if host == socket.gethostname() else host
