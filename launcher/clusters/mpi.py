"""cluster=mpi-local (backend mpi): ``mpirun -np N`` runs the submitit task once per rank.

A submitit plugin (``[project.entry-points.submitit]`` in pyproject.toml), so the task code is
the same as everywhere else: ``MpiExecutor`` pickles the task and starts mpirun;
``MpiJobEnvironment`` tells submitit, inside each rank, which task it is (Open MPI's
``OMPI_COMM_WORLD_*``). The job is a small bash script kept in the submitit folder (and printed
by a dry run); its process id is the job id, as for submitit's own local jobs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import sys
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from launcher.clusters._script import ScriptExecutor
from launcher.clusters._shell import env_name, one_line, operand
from launcher.clusters.base import Cluster, RankJobEnvironment, free_port
from launcher.clusters.config import ClusterConfig
from launcher.errors import UserError
from launcher.runtime.ranks import OpenMpiEnv


@dataclass
class Config(ClusterConfig):
    """cluster.backend=mpi (cluster=mpi-local): how mpirun is called, and on which hosts."""

    backend: str = "mpi"
    mpirun: str = "mpirun"
    mpirun_args: List[str] = field(default_factory=list)
    hosts: List[str] = field(default_factory=list)  # one per node; empty: every rank on this host

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cluster
        if c.hosts and len(c.hosts) != c.nodes:
            raise UserError(f"cluster.hosts has {len(c.hosts)} host(s) but cluster.nodes={c.nodes}: "
                            f"list one host per node (or set cluster.nodes={len(c.hosts)})")
        if not c.hosts and c.nodes != 1:
            raise UserError(f"cluster.nodes={c.nodes}: without cluster.hosts mpirun starts every rank on "
                            "this host; use cluster.nodes=1 or list the hosts: cluster.hosts=[h1,h2]")


class MpiCluster(Cluster):
    backend = "mpi"
    submission_name = "submission.sh"
    config = Config
    rank_env = OpenMpiEnv

    @classmethod
    def choose_coordinator_port(cls, cfg) -> int:
        return free_port()  # rank 0 runs here, or on the first of cluster.hosts

    def executor(self) -> "MpiExecutor":
        c = self.cfg.cluster
        # mpirun cannot requeue (runtime/requeue.py says so in the task); the bound is checked all the same.
        ex = MpiExecutor(self.folder, python=self.python(), mpirun=c.mpirun, max_num_timeout=self.max_requeues())
        ex.update_parameters(nodes=c.nodes, tasks_per_node=c.tasks_per_node, timeout_min=c.timeout_min,
                             hosts=list(c.hosts), mpirun_args=list(c.mpirun_args), setup=self.setup_lines(),
                             env_names=list(c.env))
        return ex

    def other_hosts(self) -> list[str]:
        """cluster.hosts that are not this one."""
        here = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost", "127.0.0.1"}
        return [h for h in self.cfg.cluster.hosts if h not in here]

    def submission_text(self, executor: "MpiExecutor") -> str:
        return executor._make_submission_file_text(executor._submitit_command_str, uid="")


class MpiJobEnvironment(RankJobEnvironment):
    """Inside a rank started by MpiExecutor (SUBMITIT_EXECUTOR=mpi): the numbers are Open MPI's
    ``OMPI_COMM_WORLD_*``, read by ``launcher.runtime.ranks.OpenMpiEnv`` as the Task reads them."""

    reader = OpenMpiEnv
    _env = {"job_id": "SUBMITIT_MPI_JOB_ID"}


class MpiExecutor(ScriptExecutor):
    """Runs a submitit job as ``mpirun -np <nodes x tasks_per_node> <python> -u -m submitit...``.

    Parameters (``update_parameters``): nodes, tasks_per_node, timeout_min, hosts (one per node;
    empty: all ranks on this host), mpirun_args, setup (shell lines run before mpirun),
    env_names (variables mpirun must pass on to ranks on other hosts).
    """

    defaults = {"nodes": 1, "tasks_per_node": 1, "timeout_min": 60, "hosts": [], "mpirun_args": [], "setup": [],
                "env_names": []}

    def __init__(self, folder: tp.Union[str, Path], python: tp.Optional[str] = None, mpirun: str = "mpirun",
                 **kwargs: tp.Any) -> None:
        super().__init__(folder, **kwargs)
        self.python = shlex.quote(sys.executable) if python is None else python
        self.mpirun = mpirun

    @classmethod
    def affinity(cls) -> int:
        # Available, never chosen by AutoExecutor unless asked for (cluster="mpi").
        return 0 if shutil.which("mpirun") else -1

    def _check_available(self) -> None:
        if shutil.which(self.mpirun) is None:
            raise UserError(f"cluster.mpirun={self.mpirun}: not found on PATH; install Open MPI "
                            "(apt-get install openmpi-bin) or give its path")

    @property
    def _submitit_command_str(self) -> str:
        return " ".join([self.python, "-u -m submitit.core._submit", shlex.quote(str(self.folder))])

    def _num_tasks(self) -> int:
        return self.parameters["nodes"] * self.parameters["tasks_per_node"]

    def mpirun_argv(self, command: str) -> list[str]:
        p = self.parameters
        n = self._num_tasks()
        argv = [operand("cluster.mpirun", self.mpirun), "-np", str(n)]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")  # containers and CI machines often run as root
        if p["hosts"]:
            hosts = [operand("cluster.hosts", h) for h in p["hosts"]]
            argv += ["--host", ",".join(f"{h}:{p['tasks_per_node']}" for h in hosts)]
        elif n > (os.cpu_count() or 1):
            argv.append("--oversubscribe")  # Open MPI allots one slot per core
        argv += ["--timeout", str(int(60 * p["timeout_min"]))]
        for name in ["SUBMITIT_EXECUTOR", "SUBMITIT_MPI_JOB_ID", "SUBMITIT_MPI_NUM_NODES", *p["env_names"]]:
            argv += ["-x", env_name("cluster.env", name)]
        argv += [one_line("cluster.mpirun_args", a) for a in p["mpirun_args"]]
        return argv + shlex.split(command)

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        p = self.parameters
        return "\n".join([
            "#!/bin/bash",
            f"# submitit job: mpirun starts {self._num_tasks()} rank(s) ({p['nodes']} node(s) x "
            f"{p['tasks_per_node']}), each running the pickled task.",
            "# The job id is this script's process id, as for submitit's local jobs.",
            "export SUBMITIT_EXECUTOR=mpi",
            "export SUBMITIT_MPI_JOB_ID=$$",
            f"export SUBMITIT_MPI_NUM_NODES={int(p['nodes'])}",
            *p["setup"],
            "exec " + shlex.join(self.mpirun_argv(command)),
            "",
        ])
