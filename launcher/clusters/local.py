"""cluster=local: submitit's LocalExecutor starts tasks_per_node processes on this host."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import submitit

from launcher.clusters.base import Cluster
from launcher.errors import UserError
from launcher.runtime import status
from launcher.schema import Backend, ClusterConfig


@dataclass
class Config(ClusterConfig):
    """cluster.backend=local: no keys beyond the common ones."""

    backend: Backend = Backend.local

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cluster
        if c.nodes != 1:
            raise UserError(f"cluster.nodes={c.nodes}: cluster={c.name} runs on this host only; use cluster.nodes=1 "
                            "or a cluster with several nodes (cluster=slurm)")


class LocalCluster(Cluster):
    backend = "local"
    submission_name = "submission.txt"

    def executor(self) -> submitit.LocalExecutor:
        c = self.cfg.cluster
        # The task refuses to be requeued here (runtime/requeue.py); the bound is checked all the same.
        ex = submitit.LocalExecutor(folder=self.folder, python=self.python(), max_num_timeout=self.max_requeues())
        ex.update_parameters(tasks_per_node=c.tasks_per_node, nodes=1, timeout_min=c.timeout_min,
                             gpus_per_node=c.gpus_per_node, setup=self.setup_lines())
        return ex

    def cancel(self, job: submitit.Job) -> None:
        """Stops the tasks themselves: the controller then exits as after any ending.

        submitit's own cancel interrupts the controller, which prints a KeyboardInterrupt
        traceback on the user's console, and does nothing where SIGINT is ignored (a launcher
        started by `nohup ... &`). The ranks' pids are in their status files; a task that has
        not written one yet is the controller's child.
        """
        controller = getattr(job, "_process", None)

        def tasks() -> set[int]:
            pids = {st.pid for st, _ in status.read_statuses(self.run_dir).values()
                    if st.host == socket.gethostname()}
            return pids | (set(_children(controller.pid)) if controller is not None else set())

        # SIGINT lets a rank record that it was stopped; one stuck inside XLA gets SIGKILL.
        for sig in (signal.SIGINT, signal.SIGKILL):
            _signal(tasks(), sig)
            deadline = time.time() + 1
            while time.time() < deadline and not job.done():
                time.sleep(0.05)
            if job.done():
                return
        if controller is None:
            job.cancel(check=False)
            return
        # Still running: the controller started tasks after we looked. Stopped, it starts no
        # more; left alive, it would keep the launcher's stderr (which it holds) open.
        _signal({controller.pid}, signal.SIGSTOP)
        _signal(tasks(), signal.SIGKILL)
        _signal({controller.pid}, signal.SIGKILL)
        with contextlib.suppress(Exception):
            controller.wait(timeout=10)

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
