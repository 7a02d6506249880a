"""The launch side of a cluster: which submitit executor starts the tasks, and with what.

One subclass per backend (``cluster.backend``), registered by subclassing. A subclass builds a
configured submitit executor and says exactly what it would submit (for dry runs and for the
copy saved in the run dir); the task callable is the same everywhere.
"""

from __future__ import annotations

import importlib
import pkgutil
import shlex
import socket
from pathlib import Path
from typing import ClassVar

import submitit
from omegaconf import DictConfig

from launcher.errors import UserError


class Cluster:
    backend: ClassVar[str] = ""
    submission_name: ClassVar[str] = "submission.sh"  # what the run dir keeps of the submission
    _registry: ClassVar[dict[str, type["Cluster"]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.backend:
            Cluster._registry[cls.backend] = cls

    def __init__(self, cfg: DictConfig, run_dir: Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.folder = self.run_dir / "submitit"

    @classmethod
    def for_config(cls, cfg: DictConfig, run_dir: Path) -> "Cluster":
        import launcher.clusters as pkg

        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"launcher.clusters.{info.name}")
        backend = cfg.cluster.backend
        backend = getattr(backend, "value", backend)
        if backend not in cls._registry:
            raise UserError(f"cluster.backend={backend}: no such backend (known: {', '.join(sorted(cls._registry))})")
        return cls._registry[backend](cfg, run_dir)

    # -- what subclasses provide -------------------------------------------------------------
    def executor(self) -> submitit.Executor:
        raise NotImplementedError

    def submission_text(self, executor: submitit.Executor) -> str:
        """Exactly what would be submitted or executed (an sbatch script, a command line...)."""
        raise NotImplementedError

    def coordinator_port(self) -> int:
        """The jax.distributed port, fixed at submission (0: each task derives it from its job id)."""
        return self.cfg.launcher.coordinator_port

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
