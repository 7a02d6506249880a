"""The launch side of a cluster: which submitit executor starts the tasks, and with what.

One subclass per backend (``cluster.backend``), registered by subclassing, holding every fact
of its backend that the rest of the launcher asks about: its keys (``config``), which submitit
executor starts its tasks and exactly what it would submit (for dry runs and for the copy saved
in the run dir), which rank environment its tasks read, its coordinator port, whether its tasks
see this machine's files, whether it can requeue a job. Nothing outside a backend's own module
branches on its name; adding a backend is one module and one yaml (docs/architecture.md). The
task callable is the same everywhere.

A job submitted earlier is found again by its id alone (``xlaunch status|cancel``, from any
shell; ``launcher/cli/jobs.py``): ``scheduled`` asks where it is and ``cancel_id`` ends it. Here,
for the backends whose job is a process on the submitting host (local: submitit's controller;
mpi and tpu: the job script), the id is that process's pid; SLURM asks its scheduler.
"""

from __future__ import annotations

import contextlib
import os
import random
import shlex
import signal
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import submitit
from omegaconf import DictConfig
from submitit.core import job_environment

from launcher import clusters
from launcher.clusters._code import UserCode
from launcher.clusters.config import ClusterConfig
from launcher.clusters.containers import python_command
from launcher.errors import UserError
from launcher.plugins import import_all
from launcher.runtime import ranks, status
from launcher.runtime.status import wait_until


# Names the module of a backend outside the package in its tasks' environment.
BACKEND_MODULE_ENV = "XLAUNCH_BACKEND_MODULE"


@dataclass(frozen=True)
class Scheduled:
    """Where the scheduler has a job: ``queued``, ``running``, ``ended``, ``cancelled`` (by the
    scheduler, e.g. scancel) or ``unknown`` (no record of it); ``detail`` in its own words."""

    state: str
    detail: str = ""


class Cluster:
    backend: ClassVar[str] = ""
    # Its keys: ClusterConfig's and its own, with its checks (Config.check), typed at composition.
    config: ClassVar[type[ClusterConfig]] = ClusterConfig
    # What the messages call it ("SLURM"); the backend's name when not given.
    display_name: ClassVar[str] = ""
    submission_name: ClassVar[str] = "submission.sh"  # what the run dir keeps of the submission
    # The job is a process on the submitting host (its pid is the job id): only that host can
    # see or signal it.
    runs_on_submitting_host: ClassVar[bool] = True
    # The tasks read this machine's files (input files are checked here, mode=run's code runs in
    # place); False: they run elsewhere, and mode=run's code is copied to them.
    shares_filesystem: ClassVar[bool] = True
    # The tasks run the launcher's own python when no container is configured (so its JAX is
    # checked here, before submission).
    runs_this_python: ClassVar[bool] = True
    # Whether a job warned of its time limit or preempted can be requeued in its run dir
    # (launcher/runtime/requeue.py), cluster.max_requeues times at most.
    requeues: ClassVar[bool] = False
    # Where the tasks' rank numbers come from (launcher/runtime/ranks.py). With an executor of
    # ours, submitit reads them there too (RankJobEnvironment).
    rank_env: ClassVar[type[ranks.RankEnv] | None] = None
    # Whether its scheduler can hold a job until another of its jobs has ended well
    # (launcher.after): then ``after`` is that job's id when the job is submitted.
    waits_in_queue: ClassVar[bool] = False
    after: str = ""
    _registry: ClassVar[dict[str, type["Cluster"]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.backend:
            Cluster._registry[cls.backend] = cls

    def __init__(self, cfg: DictConfig, run_dir: Path, coordinator_port: int = 0, code: UserCode | None = None):
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.folder = self.run_dir / "submitit"
        # Decided at submission by launcher.cli.submit.coordinator_port; the Task gets the same.
        self.coordinator_port = coordinator_port
        # The user's code the tasks run, as the job's mode says (mode=run): bound into containers,
        # copied to workers that share no file system.
        self.code = code

    @classmethod
    def for_config(cls, cfg: DictConfig, run_dir: Path, coordinator_port: int = 0,
                   code: UserCode | None = None) -> "Cluster":
        return cls.of(cfg.cluster)(cfg, run_dir, coordinator_port, code)

    @staticmethod
    def of(cluster: Any) -> type["Cluster"]:
        """The class of a cluster config's backend (``cluster.backend``), its module imported
        first when it lives outside launcher/clusters (``cluster.module``)."""
        module = cluster.get("module")
        registry = backends(module)
        backend = cluster.get("backend")
        if backend not in registry:
            where = f" (cluster.module={module} defines none by that name)" if module else ""
            raise UserError(f"cluster.backend={backend}: no such backend{where}; known: {', '.join(sorted(registry))}")
        return registry[backend]

    @classmethod
    def label(cls) -> str:
        return cls.display_name or cls.backend

    @classmethod
    def choose_coordinator_port(cls, cfg: DictConfig) -> int:  # noqa: ARG003 - subclasses read it
        """The jax.distributed coordinator port when ``launcher.coordinator_port`` does not say
        (``launcher.cli.submit.coordinator_port``). Here: a random one of ``ranks.PORTS``, since
        rank 0's node is not known before the job starts."""
        return random.SystemRandom().choice(ranks.PORTS)

    # -- what subclasses provide -------------------------------------------------------------
    def executor(self) -> submitit.Executor:
        raise NotImplementedError

    def submission_text(self, executor: submitit.Executor) -> str:
        """Exactly what would be submitted or executed (an sbatch script, a command line...)."""
        raise NotImplementedError

    # -- shared pieces ------------------------------------------------------------------------
    def python(self) -> str:
        """The python command the tasks run: the host's, or one inside the configured container."""
        return python_command(self.cfg, self.run_dir, self.code.dir if self.code else None)

    def setup_lines(self) -> list[str]:
        """Shell lines run before the tasks start: cluster.env exported (quoted), then cluster.setup.
        A backend defined outside the package exports its module too (``active_job_environment``)."""
        exports = [f"export {_env_name(k)}={shlex.quote(str(v))}" for k, v in self.cfg.cluster.env.items()]
        if self.cfg.cluster.get("module"):
            exports.insert(0, f"export {BACKEND_MODULE_ENV}={shlex.quote(self.cfg.cluster.module)}")
        return exports + list(self.cfg.cluster.setup)

    def ended(self, job: submitit.Job) -> bool:
        """Whether the job has ended (every task's result written, or the scheduler done with
        it). Here: submitit's word."""
        return job.done()

    def cancel(self, job: submitit.Job) -> None:
        """Ends a job that can no longer succeed."""
        job.cancel(check=False)

    def other_hosts(self) -> list[str] | None:
        """The hosts other than this one that the job's ranks may run on, where that is known
        before submission (None: it is not). Here: none, every rank runs on this host."""
        return []

    def check_run_dir(self) -> None:
        """A run dir that only this host sees cannot serve ranks on other hosts (their status
        files, logs and result would never reach the launcher): refused before submission, where
        both are known (``other_hosts``, ``node_local_filesystem``)."""
        if not self.shares_filesystem:  # its ranks work in copies of the run dir (TPU)
            return
        others = self.other_hosts()
        local = node_local_filesystem(self.run_dir) if others else ""
        if local:
            shown = ", ".join(others[:4]) + (f" and {len(others) - 4} more" if len(others) > 4 else "")
            raise UserError(f"the run dir {self.run_dir} is on {local}, which only this host sees, but "
                            f"cluster={self.cfg.cluster.name} may run ranks on {shown}: put it on a file system "
                            f"every node mounts (hydra.run.dir=/path/on/shared/fs/...; on LUMI, /scratch/<project>)")

    def prepare_restart(self, executor: submitit.Executor, exclude: tuple[str, ...] = ()) -> None:
        """Called before the job is submitted again (launcher.max_restarts), with the nodes the
        preflight found slow or failing (``leaves_out`` says whether it can). Here: nothing."""

    def leaves_out(self, nodes: tuple[str, ...]) -> str:
        """How a restart leaves ``nodes`` out ("" where this backend cannot: it restarts on the
        nodes it is given). Here: it cannot."""
        return ""

    def stacks(self, num_ranks: int, timeout_s: float) -> dict[int, dict]:
        """Asks the running job's ranks for their stacks (``xlaunch stacks``) and returns their
        answers, by rank. Here: through the run dir, which the ranks see."""
        asked = status.request_stacks(self.run_dir)
        return status.wait_for_stacks(self.run_dir, asked, num_ranks, timeout_s)

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
        """How often a timed-out or preempted job may be requeued: ``cluster.max_requeues``,
        checked, or ``launcher.max_restarts`` where that is set (the two then share one count)."""
        n = self.cfg.cluster.max_requeues
        if n < 0:
            raise UserError(f"cluster.max_requeues={n}: must be 0 (never requeue) or more")
        restarts = (self.cfg.get("launcher") or {}).get("max_restarts") or 0
        return int(restarts or n)


def backends(module: str | None = None) -> dict[str, type[Cluster]]:
    """Every registered backend, by name: launcher/clusters' modules, and ``module`` (a backend
    defined outside the package, named by its cluster yaml's ``module`` key)."""
    import_all(clusters, module, "cluster.module")
    return dict(Cluster._registry)


def requeuing_backends() -> str:
    """The backends that can requeue a job in its run dir, as messages name them ("SLURM")."""
    return " and ".join(sorted(c.label() for c in backends().values() if c.requeues))


def _env_name(name: str) -> str:
    if not name.replace("_", "a").isalnum() or name[0].isdigit():
        raise UserError(f"cluster.env: {name!r} is not a valid environment variable name")
    return name


def job_process_alive(pid: int, run_dir: Path) -> bool:
    """Whether process ``pid`` runs and is this run's job: its command line names the run dir
    (submitit's controller, the mpirun and TPU scripts all do), so a reused pid is not taken
    for the job. A zombie (ended, not yet reaped by a parent that lives on) has ended."""
    if not Path("/proc").is_dir():  # not Linux: the pid is all there is to go on
        return status.pid_alive(pid)
    proc = Path("/proc") / str(pid)
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X") and str(run_dir) in cmdline


# File systems that belong to one machine: a run dir on one is seen by no other host.
_NODE_LOCAL = {"tmpfs", "ramfs", "devtmpfs", "overlay", "ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "zfs",
               "vfat", "exfat"}


def node_local_filesystem(path: Path) -> str:
    """The type and mount point of the file system ``path`` is on when it belongs to this machine
    alone (``"tmpfs at /tmp"``), else "" (a network file system, or not known)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return ""
    target = str(Path(path).resolve())
    best = max((m for m in mounts if target == m[0] or target.startswith(m[0].rstrip("/") + "/")),
               key=lambda m: len(m[0]), default=None)
    return f"{best[1]} at {best[0]}" if best and best[1] in _NODE_LOCAL else ""


def free_port() -> int:
    # Bound then released: another program could take it before rank 0 does, but a port the
    # kernel just handed out is unlikely to be reused within the second it takes to start.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankJobEnvironment(job_environment.JobEnvironment):
    """A submitit job environment of our executors (mpi, tpu, ray) that takes its numbers from
    the rank reader the Task uses (``launcher.runtime.ranks``), so both always agree. One
    subclass per executor, in its backend's module, registered by subclassing; submitit's one
    entry-point slot (pyproject.toml) holds ``active_job_environment`` below, which hands submitit the
    one its task runs under. ``_env`` names the job id's variable (``SUBMITIT_<EXECUTOR>_JOB_ID``)."""

    reader: ClassVar[type[ranks.RankEnv]]
    _registry: ClassVar[dict[str, type["RankJobEnvironment"]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        RankJobEnvironment._registry[cls.name()] = cls

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


def active_job_environment() -> job_environment.JobEnvironment:
    """submitit's ``job_environment`` entry point: the job environment of the executor this
    process runs under (``SUBMITIT_EXECUTOR``), among every backend's (a backend outside the
    package is imported from ``XLAUNCH_BACKEND_MODULE``, which its job script exports);
    elsewhere, the MPI one, which submitit then lists for this distribution."""
    backends(os.environ.get(BACKEND_MODULE_ENV) or None)
    name = os.environ.get("SUBMITIT_EXECUTOR", "")
    return RankJobEnvironment._registry.get(name, RankJobEnvironment._registry["mpi"])()
