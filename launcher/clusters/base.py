"""The launch side of a cluster: which submitit executor starts the tasks, and with what.

One subclass per backend (``cluster.backend``), registered by subclassing. A subclass builds a
configured submitit executor and says exactly what it would submit (for dry runs and for the
copy saved in the run dir); the task callable is the same everywhere.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import shlex
import socket
from pathlib import Path
from typing import ClassVar

import submitit
from omegaconf import DictConfig
from submitit.core import job_environment

from launcher.errors import UserError
from launcher.runtime import ranks


class Cluster:
    backend: ClassVar[str] = ""
    submission_name: ClassVar[str] = "submission.sh"  # what the run dir keeps of the submission
    _registry: ClassVar[dict[str, type["Cluster"]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.backend:
            Cluster._registry[cls.backend] = cls

    def __init__(self, cfg: DictConfig, run_dir: Path, coordinator_port: int = 0):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.folder = self.run_dir / "submitit"
        # Decided at submission by launcher.submit.coordinator_port; the Task gets the same.
        self.coordinator_port = coordinator_port

    @classmethod
    def for_config(cls, cfg: DictConfig, run_dir: Path, coordinator_port: int = 0) -> "Cluster":
        import launcher.clusters as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"launcher.clusters.{info.name}")
        backend = cfg.cluster.backend
        backend = getattr(backend, "value", backend)
        if backend not in cls._registry:
            raise UserError(f"cluster.backend={backend}: no such backend (known: {', '.join(sorted(cls._registry))})")
        return cls._registry[backend](cfg, run_dir, coordinator_port)

    # -- what subclasses provide -------------------------------------------------------------
    def executor(self) -> submitit.Executor:
        raise NotImplementedError

    def submission_text(self, executor: submitit.Executor) -> str:
        """Exactly what would be submitted or executed (an sbatch script, a command line...)."""
        raise NotImplementedError

    # -- shared pieces ------------------------------------------------------------------------
    def python(self) -> str:
        """The python command the tasks run: the host's, or one inside the configured container."""
        from launcher.containers import python_command

        return python_command(self.cfg, self.run_dir)

    def setup_lines(self) -> list[str]:
        """Shell lines run before the tasks start: cluster.env exported (quoted), then cluster.setup."""
        exports = [f"export {_env_name(k)}={shlex.quote(str(v))}" for k, v in self.cfg.cluster.env.items()]
        return exports + list(self.cfg.cluster.setup)

    def cancel(self, job: submitit.Job) -> None:
        """Ends a job that can no longer succeed."""
        job.cancel(check=False)

    def max_requeues(self) -> int:
        """``cluster.max_requeues``, checked: how often a timed-out or preempted job may be requeued."""
        n = self.cfg.cluster.max_requeues
        if n < 0:
            raise UserError(f"cluster.max_requeues={n}: must be 0 (never requeue) or more")
        return int(n)


def _env_name(name: str) -> str:
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise UserError(f"cluster.env: {name!r} is not a valid environment variable name")
    return name


def free_port() -> int:
    # Bound then released: another program could take it before rank 0 does, but a port the
    # kernel just handed out is unlikely to be reused within the second it takes to start.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankJobEnvironment(job_environment.JobEnvironment):
    """A submitit job environment of our executors (mpi, tpu) that takes its numbers from the
    rank reader the Task uses (``launcher.runtime.ranks``), so both always agree. ``_env`` still
    names the job id's variable (``SUBMITIT_<EXECUTOR>_JOB_ID``)."""

    reader: ClassVar[type[ranks.RankEnv]]

    def _numbers(self) -> ranks.RankInfo:
        return self.reader(os.environ).numbers()

    @property
    def num_tasks(self) -> int:
        return self._numbers().num_processes

    @property
    def num_nodes(self) -> int:
        return self._numbers().num_nodes

    @property
    def node(self) -> int:
        return self._numbers().node_rank

    @property
    def global_rank(self) -> int:
        return self._numbers().process_id

    @property
    def local_rank(self) -> int:
        return self._numbers().local_rank
