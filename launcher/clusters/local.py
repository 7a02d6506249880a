"""cluster=local: submitit's LocalExecutor starts tasks_per_node processes on this host."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import submitit
import submitit.local.local

from launcher.clusters.base import Cluster, free_port, job_process_alive, wait_until
from launcher.clusters.config import ClusterConfig
from launcher.errors import UserError
from launcher.runtime import status
from launcher.runtime.ranks import SubmititLocalEnv

# How long a cancelled rank has to end after SIGINT before it gets SIGKILL: `docker stop`'s 10 s
# (SLURM's KillWait is 30). 5 s was too few in CI: a rank that saves for 2 s read as killed.
_INTERRUPT_GRACE_S = 10.0


@dataclass
class Config(ClusterConfig):
    """cluster.backend=local: no keys beyond the common ones."""

    backend: str = "local"

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cluster
        if c.nodes != 1:
            raise UserError(f"cluster.nodes={c.nodes}: cluster={c.name} runs on this host only; use cluster.nodes=1 "
                            "or a cluster with several nodes (cluster=slurm)")


class LocalCluster(Cluster):
    backend = "local"
    submission_name = "submission.txt"
    config = Config
    rank_env = SubmititLocalEnv

    @classmethod
    def choose_coordinator_port(cls, cfg) -> int:
        return free_port()  # rank 0 runs on this host

    def executor(self) -> submitit.LocalExecutor:
        c = self.cfg.cluster
        # The task refuses to be requeued here (runtime/requeue.py); the bound is checked all the same.
        cls = submitit.LocalExecutor if self.cfg.launcher.wait else _DetachedLocalExecutor
        ex = cls(folder=self.folder, python=self.python(), max_num_timeout=self.max_requeues())
        ex.update_parameters(tasks_per_node=c.tasks_per_node, nodes=1, timeout_min=c.timeout_min,
                             gpus_per_node=c.gpus_per_node, setup=self.setup_lines())
        return ex

    def cancel(self, job: submitit.Job) -> None:
        """Stops the tasks themselves: the controller then exits as after any ending.

        submitit's own cancel interrupts the controller, which prints a KeyboardInterrupt
        traceback on the user's console, and does nothing where SIGINT is ignored (a launcher
        started by `nohup ... &`).
        """
        controller = getattr(job, "_process", None)
        if controller is None:
            job.cancel(check=False)
            return
        self._stop(controller.pid, job.done)
        with contextlib.suppress(Exception):
            controller.wait(timeout=10)

    def cancel_id(self, job_id: str, grace_s: float = 30.0) -> None:
        """The same for a job submitted earlier: the controller's pid is the job id."""
        pid = int(job_id)
        self._stop(pid, lambda: not job_process_alive(pid, self.run_dir))
        wait_until(lambda: not job_process_alive(pid, self.run_dir), 10)

    def _stop(self, controller: int, done: Callable[[], bool]) -> None:
        # The ranks' pids are in their status files; a task that has not written one yet is the
        # controller's child.
        def here() -> dict[int, status.RankStatus]:
            return {r: st for r, (st, _) in status.read_statuses(self.run_dir).items()
                    if st.host == socket.gethostname()}

        def tasks(ranks: dict[int, status.RankStatus]) -> set[int]:
            return {st.pid for st in ranks.values()} | set(_children(controller))

        # SIGINT lets a rank record that it was stopped; one stuck inside XLA gets SIGKILL, and is
        # recorded as stopped by it (on a machine busy enough, a rank that had not yet said so
        # would otherwise read as one that died on its own). The grace is seconds, not one: on a
        # busy machine a rank took over a second to say "stopped".
        for sig, grace_s in ((signal.SIGINT, _INTERRUPT_GRACE_S), (signal.SIGKILL, 1.0)):
            ranks = here()   # one read of the statuses: whom to signal, and who had not ended
            _signal(tasks(ranks), sig)
            if sig == signal.SIGKILL:
                for rank in (r for r, st in ranks.items() if st.state not in status.ENDED):
                    status.mark_stopped(self.run_dir, rank, f"interrupted (killed: still running "
                                                            f"{_INTERRUPT_GRACE_S:g} s after SIGINT)")
            if wait_until(done, grace_s, 0.05):
                return
        # Still running: the controller started tasks after we looked. Stopped, it starts no
        # more; left alive, it would keep a waiting launcher's stderr (which it holds) open.
        _signal({controller}, signal.SIGSTOP)
        _signal(tasks(here()), signal.SIGKILL)
        _signal({controller}, signal.SIGKILL)

    def submission_text(self, executor: submitit.LocalExecutor) -> str:
        c = self.cfg.cluster
        setup = self.setup_lines()
        controller = shlex.join([sys.executable, "-m", "submitit.local._local", str(self.folder)])
        lines = [
            "# cluster=local: submitit's local controller starts one process per task on this host",
            f"# tasks: {c.tasks_per_node} x {c.cpu_devices_per_task} virtual CPU devices"
            if c.accelerator.value == "cpu" else f"# tasks: {c.tasks_per_node}",
            f"# coordinator: 127.0.0.1:{self.coordinator_port}",
            *setup,
            f"SUBMITIT_LOCAL_NTASKS={c.tasks_per_node} {controller}",
            f"# each task runs: {executor._submitit_command_str}",
        ]
        return "\n".join(lines) + "\n"


class _DetachedLocalExecutor(submitit.LocalExecutor):
    """launcher.wait=false: nobody waits, so the controller must not hold the launcher's
    output. It inherits its stdout and stderr when started (submitit gives it no files of its
    own), and a caller reading them (``out=$(xlaunch ... launcher.wait=false)``, CI, a test)
    would wait for the job's end; they go to ``<submitit folder>/controller.log`` instead."""

    def _submit_command(self, command: str) -> submitit.local.local.LocalJob:
        log = Path(self.folder) / "controller.log"
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            with open(log, "ab") as f:
                os.dup2(f.fileno(), 1)
                os.dup2(f.fileno(), 2)
            return super()._submit_command(command)
        finally:
            for fd, copy in zip((1, 2), saved, strict=True):
                os.dup2(copy, fd)
                os.close(copy)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux /proc; none elsewhere)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
    return out


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
