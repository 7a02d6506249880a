"""cluster=slurm (and lumi, which is slurm with LUMI's settings): submitit's SlurmExecutor.

One sbatch job of ``cluster.nodes`` x ``cluster.tasks_per_node`` tasks; ``srun`` starts one task
per process. The script kept in the run dir (and printed by a dry run) is made by the same
submitit function, from the same parameters, as the one handed to sbatch.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import submitit
from submitit.core.utils import FailedJobError

from launcher.clusters._shell import one_line
from launcher.clusters.base import Cluster, Scheduled, wait_until
from launcher.clusters.config import ClusterConfig
from launcher.errors import UserError
from launcher.runtime.ranks import SlurmEnv


@dataclass
class Config(ClusterConfig):
    """cluster.backend=slurm (cluster=slurm, lumi): the sbatch and srun options."""

    backend: str = "slurm"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpus_per_task: Optional[int] = None
    mem: Optional[str] = None
    mem_per_gpu: Optional[str] = None
    exclusive: bool = False
    cpu_bind: Optional[str] = None
    srun_args: List[str] = field(default_factory=list)
    sbatch_args: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cluster
        if c.cpus_per_task is not None and c.cpus_per_task < 1:
            raise UserError(f"cluster.cpus_per_task={c.cpus_per_task}: must be at least 1 (or null: SLURM's default)")
        for key in c.sbatch_args:
            if not _SBATCH_KEY.fullmatch(key):
                raise UserError(f"cluster.sbatch_args: {key!r} is not an sbatch option name (e.g. mail-type)")


# Cluster fields that become "#SBATCH --<name>=<value>" lines when set.
_SBATCH_FIELDS = ("partition", "account", "qos", "cpus_per_task", "mem", "mem_per_gpu")
_SBATCH_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


class SlurmCluster(Cluster):
    backend = "slurm"
    submission_name = "submission.sh"
    runs_on_submitting_host = False
    config = Config
    display_name = "SLURM"
    requeues = True
    rank_env = SlurmEnv
    waits_in_queue = True

    def executor(self) -> "SlurmExecutor":
        # submitit counts the job's timeouts against max_num_timeout; the task counts every
        # requeue, preemptions too, against the same cluster.max_requeues (runtime/requeue.py).
        ex = SlurmExecutor(folder=self.folder, python=self.python(), max_num_timeout=self.max_requeues())
        ex.update_parameters(**self.parameters())
        return ex

    def parameters(self) -> dict[str, Any]:
        """submitit SlurmExecutor parameters for this config (each is one sbatch/srun option)."""
        c = self.cfg.cluster
        params: dict[str, Any] = {
            "job_name": f"xlaunch-{one_line('mode.name', self.cfg.mode.name)}",
            "nodes": c.nodes,
            "ntasks_per_node": c.tasks_per_node,
            "time": c.timeout_min,
            "srun_args": self.srun_args(),
        }
        setup = self.setup_lines()
        if setup:
            params["setup"] = setup
        for name in _SBATCH_FIELDS:
            value = c[name]
            if value is not None:
                params[name] = one_line(f"cluster.{name}", value)
        if c.gpus_per_node:
            params["gpus_per_node"] = c.gpus_per_node
        if c.exclusive:
            params["exclusive"] = True
        extra = {}
        for key, value in c.sbatch_args.items():
            if not _SBATCH_KEY.fullmatch(key):
                raise UserError(f"cluster.sbatch_args: {key!r} is not an sbatch option name (e.g. mail-type)")
            extra[key] = one_line(f"cluster.sbatch_args.{key}", value)
        if self.after:
            # launcher.after: it starts once that job has completed; SLURM cancels it at once
            # if that job fails (else it would wait forever, "DependencyNeverSatisfied").
            extra["dependency"] = f"afterok:{one_line('launcher.after', self.after)}"
            extra["kill-on-invalid-dep"] = "yes"
        if extra:
            params["additional_parameters"] = extra
        return params

    def prepare_restart(self, executor: "SlurmExecutor", exclude: tuple[str, ...] = ()) -> None:
        if exclude:  # the preflight's slow or failing nodes: the restart runs elsewhere
            executor.update_parameters(exclude=",".join(one_line("the preflight's nodes", n) for n in exclude))

    def leaves_out(self, nodes: tuple[str, ...]) -> str:
        return f"sbatch --exclude={','.join(nodes)}"

    def srun_args(self) -> list[str]:
        c = self.cfg.cluster
        # One dead rank ends the whole step at once, instead of leaving the others blocked in a
        # collective until JAX's heartbeat timeout.
        args = ["--kill-on-bad-exit=1"]
        if c.cpu_bind:
            args.append(f"--cpu-bind={one_line('cluster.cpu_bind', c.cpu_bind)}")
        args += [one_line("cluster.srun_args", a) for a in c.srun_args]
        return args

    def other_hosts(self) -> list[str] | None:
        """The partition's nodes that are not this host (sinfo's node hostnames), or None where
        SLURM cannot be asked (a dry run on a laptop)."""
        if shutil.which("sinfo") is None:
            return None
        partition = self.cfg.cluster.partition
        argv = ["sinfo", "-h", "-N", "-o", "%n", *(["-p", partition] if partition else [])]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        here = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost"}
        hosts = sorted(set(proc.stdout.split()) - here) if proc.returncode == 0 else None
        return hosts

    def submission_text(self, executor: "SlurmExecutor") -> str:
        # The uid only names submitit's temporary copy of the file; the text does not use it.
        return executor._make_submission_file_text(executor._submitit_command_str, uid="")

    def scheduled(self, job_id: str) -> Scheduled:
        """SLURM's word on the job: squeue while it knows the job (MinJobAge after its end),
        then the accounting database (sacct)."""
        out = _slurm("squeue", "-h", "-j", job_id, "--states=all", "-o", "%T|%r")
        if out:
            state, _, reason = out.splitlines()[0].partition("|")
            detail = f"SLURM {state}" + (f" ({reason})" if reason and reason != "None" else "")
        else:
            out = _slurm("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State")
            if not out:
                return Scheduled("unknown", f"SLURM has no job {job_id} (neither squeue nor sacct knows it)")
            state = out.splitlines()[0].split()[0]  # "CANCELLED by 0"
            detail = f"SLURM {out.splitlines()[0].strip()}"
        return Scheduled(_SLURM_STATES.get(state, "ended"), detail)

    def ended(self, job: submitit.Job) -> bool:
        """submitit's word, checked against SLURM's own (``scheduled``, squeue first): submitit
        takes a result file from every task for the job's end, and an attempt the job was
        requeued from may have left one per task (its ranks failing as SLURM stopped them);
        a job SLURM holds or runs again has not ended."""
        return job.done() and self.scheduled(str(job.job_id)).state not in ("queued", "running")

    def cancel_id(self, job_id: str, grace_s: float = 30.0) -> None:
        """scancel, then wait (``grace_s``) until SLURM no longer runs it."""
        if shutil.which("scancel") is None:
            raise UserError("scancel is not on PATH: cancel from a SLURM login node")
        proc = subprocess.run(["scancel", job_id], capture_output=True, text=True)
        if proc.returncode != 0:
            raise UserError(f"scancel {job_id} refused: {proc.stderr.strip() or proc.stdout.strip()}")
        wait_until(lambda: self.scheduled(job_id).state not in ("queued", "running"), grace_s, 0.5)


# SLURM's job states (squeue %T, sacct State) as Scheduled states; any other is an ending.
_SLURM_STATES = {
    **dict.fromkeys(("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD",
                     "SUSPENDED", "STOPPED", "RESIZING"), "queued"),
    **dict.fromkeys(("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"), "running"),
    "CANCELLED": "cancelled",
}


def _slurm(*argv: str) -> str:
    """A SLURM client's output ("" when it knows nothing, e.g. squeue on a job it has forgotten)."""
    if shutil.which(argv[0]) is None:
        raise UserError(f"{argv[0]} is not on PATH: ask from a SLURM login node")
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else ""


class SlurmExecutor(submitit.SlurmExecutor):
    """submitit's SlurmExecutor, with two changes: it can be built where SLURM is not installed
    (a dry run on a laptop prints the exact script), and a refused submission is a UserError
    carrying sbatch's own message."""

    @classmethod
    def affinity(cls) -> int:
        return 2  # submitit refuses to build an executor without srun; we check sbatch at submission

    def _submit_command(self, command: str) -> submitit.Job:
        if shutil.which("sbatch") is None:
            raise UserError("cluster.backend=slurm: sbatch is not on PATH; submit from a SLURM login node "
                            "(or preview the job script with launcher.dry_run=true)")
        try:
            return super()._submit_command(command)
        except FailedJobError as e:
            raise UserError(f"sbatch refused the job: {e}") from None
