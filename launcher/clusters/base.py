"""The launch side of a cluster: which submitit executor starts the tasks, and with what.

One subclass per backend (``cluster.backend``), registered by subclassing. A subclass builds a
configured submitit executor and says exactly what it would submit (for dry runs and for the
copy saved in the run dir); the task callable is the same everywhere.

A job submitted earlier is found again by its id alone (``xlaunch status|cancel``, from any
shell; ``launcher/jobs.py``): ``scheduled`` asks where it is and ``cancel_id`` ends it. Here,
for the backends whose job is a process on the submitting host (local: submitit's controller;
mpi and tpu: the job script), the id is that process's pid; SLURM asks its scheduler.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pkgutil
import shlex
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import submitit
from omegaconf import DictConfig
from submitit.core import job_environment

from launcher import clusters
from launcher.containers import python_command
from launcher.errors import UserError
from launcher.runtime import ranks


@dataclass(frozen=True)
class Scheduled:
    """Where the scheduler has a job: ``queued``, ``running``, ``ended``, ``cancelled`` (by the
    scheduler, e.g. scancel) or ``unknown`` (no record of it); ``detail`` in its own words."""

    state: str
    detail: str = ""


class Cluster:
    backend: ClassVar[str] = ""
    submission_name: ClassVar[str] = "submission.sh"  # what the run dir keeps of the submission
    # The job is a process on the submitting host (its pid is the job id): only that host can
    # see or signal it.
    runs_on_submitting_host: ClassVar[bool] = True
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
        for info in pkgutil.iter_modules(clusters.__path__):
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
        return python_command(self.cfg, self.run_dir)

    def setup_lines(self) -> list[str]:
        """Shell lines run before the tasks start: cluster.env exported (quoted), then cluster.setup."""
        exports = [f"export {_env_name(k)}={shlex.quote(str(v))}" for k, v in self.cfg.cluster.env.items()]
        return exports + list(self.cfg.cluster.setup)

    def cancel(self, job: submitit.Job) -> None:
        """Ends a job that can no longer succeed."""
        job.cancel(check=False)

    # -- a job submitted earlier, by its id ---------------------------------------------------
    def scheduled(self, job_id: str) -> Scheduled:
        """Where the job is now. Here: whether its process (pid = job id) still runs."""
        pid = int(job_id)
        if job_process_alive(pid, self.run_dir):
            return Scheduled("running", f"process {pid} running")
        return Scheduled("ended", f"process {pid} has ended")

    def cancel_id(self, job_id: str, grace_s: float = 30.0) -> None:
        """Ends the job. Here: SIGTERM to its script (mpirun passes it to the ranks; the TPU
        script stops the workers and copies their run dirs back), then, after ``grace_s``,
        SIGKILL to its process group (the script started a session of its own)."""
        pid = int(job_id)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if wait_until(lambda: not job_process_alive(pid, self.run_dir), grace_s):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: not job_process_alive(pid, self.run_dir), 10)

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


def job_process_alive(pid: int, run_dir: Path) -> bool:
    """Whether process ``pid`` runs and is this run's job: its command line names the run dir
    (submitit's controller, the mpirun and TPU scripts all do), so a reused pid is not taken
    for the job. A zombie (ended, not yet reaped by a parent that lives on) has ended."""
    if not Path("/proc").is_dir():  # not Linux: the pid is all there is to go on
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    proc = Path("/proc") / str(pid)
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and str(run_dir) in cmdline


def wait_until(predicate, timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


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
