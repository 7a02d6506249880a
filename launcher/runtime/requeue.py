"""Requeue on timeout and preemption: which jobs can be, and how a run knows it is a restart.

SLURM warns a job before its time limit (``#SBATCH --signal=USR2@90``, from submitit) and a
preempting scheduler sends the same signal. submitit's handler, in rank 0, calls the task's
``checkpoint`` (``launcher.runtime.task.Task.checkpoint``), saves what it returns as the job's
new pickle and runs ``scontrol requeue``: SLURM stops every rank and starts the same job id
again, in the same run dir. Nothing is carried in the pickle but the attempt number: what a run
resumes from is already on disk as it is computed (mode=train's checkpoints, the CFP profile
store, which mode=profile and mode=search read before measuring anything), and mode=check and
mode=hlo_replay simply run again.

Only SLURM requeues (the backends whose class says ``requeues``, launcher/clusters/; the launcher
hands the task that fact, ``launcher.runtime.task.Launch``).
submitit's local controller restarts tasks that exit with its own code,
but the job would keep neither its time limit nor its place; ``mpirun`` and the TPU script
cannot at all. Those backends say so and end, keeping what the run dir holds: the same command
with ``hydra.run.dir=<run dir>`` resumes from it.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any, Mapping

from submitit.core.job_environment import JobEnvironment

if TYPE_CHECKING:
    from omegaconf import DictConfig


def signal_name() -> str:
    """The signal submitit requeues on (``SIGUSR2`` unless ``SUBMITIT_PREEMPT_SIGNAL`` says)."""
    return "SIG" + JobEnvironment.USR_SIG


def why_not(cfg: DictConfig, run_dir: Any, attempt: int, requeues: bool, requeuers: str = "SLURM") -> str:
    """Why this job cannot be requeued now ("" if it can): its backend cannot (``requeues``, as
    the launcher said at submission; ``requeuers``: the backends that can), or it was requeued
    ``cluster.max_requeues`` times already."""
    keep = (f"what it computed stays in {run_dir}: run the same command again with "
            f"hydra.run.dir={run_dir} to resume from it")
    if not requeues:
        return (f"{signal_name()} (time limit near, or preempted): cluster={cfg.cluster.name} cannot requeue a "
                f"job (only {requeuers} can); {keep}")
    key, limit = limit_of(cfg)
    if attempt >= limit:
        return (f"{signal_name()} (time limit near, or preempted): not requeued again, {key}={limit} reached; {keep}")
    return ""


def limit_of(cfg: DictConfig) -> tuple[str, int]:
    """(the key, its value) that bounds a job's requeues: ``launcher.max_restarts`` where it is set
    (requeues and restarts then share its count), else ``cluster.max_requeues``."""
    launcher = cfg.get("launcher") or {}
    if launcher.get("max_restarts"):
        return "launcher.max_restarts", int(launcher["max_restarts"])
    return "cluster.max_requeues", int(cfg.cluster.max_requeues)


def attempt_of(pickled: int, env: Mapping[str, str] | None = None) -> tuple[int, str]:
    """(attempt, why it restarted) of this run: the attempt the requeueing rank wrote into the
    pickle, or SLURM's restart count when SLURM requeued the job by itself (a node failure with
    ``--requeue``), whichever is larger."""
    env = os.environ if env is None else env
    try:
        slurm = int(env.get("SLURM_RESTART_COUNT", "0"))
    except ValueError:
        slurm = 0
    if slurm > pickled:
        return slurm, "requeued by SLURM"
    return pickled, f"requeued after {signal_name()}" if pickled else ""


def ended_by_requeue(error: BaseException, attempt: int, requeued_here: bool, now_on: Mapping[str, Any]) -> bool:
    """Whether ``error``, which ends this rank's run of ``attempt``, is the job being requeued
    rather than a failure: submitit's exit after ``scontrol requeue`` where this rank asked for
    it (``requeued_here``); that ``scontrol`` killed by the requeue it asked for, since it runs
    inside the job step SLURM stops (seen in the suite: submitit then wrote a failed result for
    rank 0 which, with the other rank's, made the launcher take the job for ended while SLURM
    was starting it again); or, on the other ranks, whatever their peers' going does to them
    once the run dir's attempt (``now_on``, ``status.read_attempt``) is a requeued later one."""
    if requeued_here:
        return isinstance(error, SystemExit) or (isinstance(error, subprocess.CalledProcessError)
                                                 and error.returncode < 0)
    return now_on.get("attempt", 0) > attempt and str(now_on.get("reason", "")).startswith("requeued")


def restart_line(attempt: int, reason: str) -> str:
    """The line that marks a restart in each rank's log (which a requeued job appends to)."""
    return f"=== restart {attempt} ({reason}) ==="
