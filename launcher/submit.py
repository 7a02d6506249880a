"""From a composed config to a submitted job, and (with launcher.wait) to its result."""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig, OmegaConf

from launcher import console
from launcher.clusters.base import Cluster
from launcher.console import seconds
from launcher.containers import WRAPPER_NAME
from launcher.errors import UserError
from launcher.runtime import requeue, status
from launcher.runtime.task import Task

JOB_FILE = "job.json"  # the submitted job's record in its run dir


class JobFailed(Exception):
    """The job ran and failed; the message names the rank and its log."""


class JobInterrupted(JobFailed):
    """The launcher was stopped (Ctrl-C, SIGTERM) while it owned the job, which it cancelled."""


def launch(cfg: DictConfig, run_dir: Path) -> dict[str, Any] | None:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    cluster = Cluster.for_config(cfg, run_dir, coordinator_port(cfg))
    executor = cluster.executor()
    text = cluster.submission_text(executor)
    saved = run_dir / cluster.submission_name
    saved.write_text(text)
    if cfg.launcher.dry_run:
        print(text, end="")
        print(f"# dry run: nothing submitted; saved to {saved}", file=sys.stderr)

        if (run_dir / WRAPPER_NAME).exists():
            print(f"# the tasks' python runs in the container through {run_dir / WRAPPER_NAME}", file=sys.stderr)
        return None

    # A reused run dir must not show the last run's ranks to this run's watchers.
    shutil.rmtree(run_dir / status.STATUS_DIR, ignore_errors=True)
    submitted = {"job": executor.submit(Task(cfg, run_dir, cluster.coordinator_port)), "restarts": 0}
    # From here the launcher owns a job: stopped at any point until the job is left to run on
    # its own (launcher.wait=false) or has ended, it stops the job (a stop a moment after the
    # "submitted" line, as a test's or a script's is, included), and the run dir keeps what was
    # done (logs, stored profiles).
    try:
        # What `xlaunch status|logs|cancel|runs` find the job by, from any shell (launcher/jobs.py).
        record = {"job_id": str(submitted["job"].job_id), "backend": cluster.backend, "submitted": time.time(),
                  "host": socket.gethostname(), "run_dir": str(run_dir), "mode": cfg.mode.name,
                  "cluster": cfg.cluster.name, "ranks": expected_ranks(cfg)}
        (run_dir / JOB_FILE).write_text(json.dumps(record) + "\n")
        print(f"submitted job {submitted['job'].job_id} ({cfg.mode.name} on {cfg.cluster.name}); run dir {run_dir}",
              file=sys.stderr)
        if not cfg.launcher.wait:
            return None

        def restart(reason: str) -> Any:
            """The job again, in the same run dir, one restart on (None once launcher.max_restarts
            are spent): it resumes from what the run dir holds, as a requeued SLURM job does."""
            # One count for restarts and SLURM's requeues (launcher/runtime/requeue.py: limit_of).
            attempt = status.read_attempt(run_dir).get("attempt", 0) + 1
            if attempt > cfg.launcher.max_restarts:
                return None
            submitted["restarts"] += 1
            why = f"restarted after: {reason.splitlines()[0][:200]}"
            status.write_attempt(run_dir, attempt, why)  # the failed attempt's ranks are not this one's
            shutil.rmtree(run_dir / status.STATUS_DIR / status.STACKS_DIR, ignore_errors=True)
            task = Task(cfg, run_dir, cluster.coordinator_port)
            task.attempt, task.restart_reason = attempt, why
            cluster.prepare_restart(executor)
            submitted["job"] = executor.submit(task)
            record.update(job_id=str(submitted["job"].job_id), restarts=submitted["restarts"])
            (run_dir / JOB_FILE).write_text(json.dumps(record) + "\n")
            return submitted["job"]

        return wait(submitted["job"], cluster, cfg, run_dir, restart)
    except KeyboardInterrupt:
        cluster.cancel(submitted["job"])
        raise JobInterrupted(f"interrupted: job {submitted['job'].job_id} cancelled; what it wrote is in {run_dir}") \
            from None


def coordinator_port(cfg: DictConfig) -> int:
    """The jax.distributed coordinator port: decided here, once per job, at submission, and
    handed to the Cluster (whose dry run shows it) and to the Task (every rank gets the same).
    ``launcher.coordinator_port`` when set; else the backend's choice
    (``Cluster.choose_coordinator_port``: a port free here when rank 0 runs here, JAX's own
    default on Cloud TPU, a random one where rank 0's node is not known before the job starts).
    """
    if cfg.launcher.coordinator_port:
        return int(cfg.launcher.coordinator_port)
    return Cluster.of(cfg.cluster).choose_coordinator_port(cfg)


def wait(job: Any, cluster: Cluster, cfg: DictConfig, run_dir: Path,
         restart: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Polls the job and the ranks' status files until the job ends; fails fast on a bad rank.
    A job that fails or hangs is started again by ``restart`` (the next job, or None when no
    restart is left: launcher.max_restarts)."""
    lc = cfg.launcher
    n = expected_ranks(cfg)
    watch = {"first_seen": None, "attempt": 0, "clock": status.StallClock()}

    def again(reason: str) -> Any:
        """The restarted job, or None: bad input is not retried (it would fail the same way)."""
        if restart is None or status.refusal(run_dir):
            return None
        nxt = restart(reason)
        if nxt is not None:
            watch.update(first_seen=None, clock=status.StallClock(),
                         attempt=status.read_attempt(run_dir).get("attempt", 0))
            view.note(f"job {job.job_id} failed ({reason.splitlines()[0]}); restarted as job {nxt.job_id} "
                      f"(restart {watch['attempt']} of at most launcher.max_restarts={lc.max_restarts}), "
                      f"resuming from {run_dir}")
        return nxt

    with _ProgressView(job.job_id, lc.progress_every_s) as view:
        while True:
            awake_since = watch["clock"].tick()
            requeued = status.read_attempt(run_dir)
            if requeued.get("attempt", 0) != watch["attempt"]:
                # SLURM requeued the job (runtime/requeue.py): the last attempt's ranks ended on
                # purpose, and the time it waits in the queue again does not count.
                watch.update(attempt=requeued["attempt"], first_seen=None)
                key, limit = requeue.limit_of(cfg)
                view.note(f"job {job.job_id} requeued ({requeued.get('reason', '')}): restart {watch['attempt']} of "
                          f"at most {key}={limit}; it resumes when it runs again")
            statuses = status.read_statuses(run_dir)
            if statuses and watch["first_seen"] is None:
                watch["first_seen"] = time.time()  # the job is running: queueing time does not count
            reason = _failing(run_dir, lc, n, statuses, watch["first_seen"], awake_since)
            cancelled = status.read_cancelled(run_dir)
            if cancelled:  # `xlaunch cancel` from another shell: the ranks' ends are its doing
                raise JobFailed(f"job {job.job_id} was cancelled ({cancelled.get('by', 'xlaunch cancel')}); "
                                f"what it wrote is in {run_dir}")
            if reason:
                if reason.startswith("the job hung"):  # each rank says so itself, a moment apart: let them
                    status.wait_until(lambda: all(st.state != "joined" for st, _ in status.read_statuses(run_dir).values()), 5)
                elif status.died_silently(reason):
                    # Seen dead here first; the backend that ran it may say how it ended ("killed by
                    # signal 9 on Ray node ..."), a poll or two later: a moment for its word.
                    status.wait_until(lambda: any(st.state == "failed" for st, _ in status.read_statuses(run_dir).values()),
                                      2 * lc.poll_interval_s + 1)
                    reason = _failing(run_dir, lc, n, status.read_statuses(run_dir), watch["first_seen"],
                                      awake_since) or reason
                cluster.cancel(job)
                nxt = again(reason)
                if nxt is not None:
                    job = nxt
                    continue
                _raise_refusal(run_dir)
                raise JobFailed(_with_log_tail(reason, run_dir))
            view.update(status.read_progress(run_dir), _phase(statuses, n, watch["attempt"]))
            if cluster.ended(job):
                restartable = restart is not None and lc.max_restarts > 0 and not status.read_cancelled(run_dir)
                reason = _ended_badly(job, cfg, run_dir)[0] if restartable else ""
                nxt = again(reason) if reason else None
                if nxt is None:
                    break
                job = nxt
            time.sleep(lc.poll_interval_s)
    return _result(job, cfg, run_dir)


def _failing(run_dir: Path, lc: DictConfig, n: int, statuses: dict, first_seen: float | None,
             awake_since: float) -> str:
    """Why the running job cannot go on ("" if it can): a rank failed, went silent, hung, or
    never started within launcher.init_timeout_s of the first."""
    reason = status.peer_failure(run_dir, lc.peer_timeout_s, lc.init_timeout_s, awake_since=awake_since,
                                 statuses=statuses)
    if not reason and first_seen is not None and time.time() - max(first_seen, awake_since) > lc.init_timeout_s + 5:
        missing = sorted(set(range(n)) - set(statuses))
        if missing:
            reason = (f"rank(s) {', '.join(map(str, missing))} never started within "
                      f"launcher.init_timeout_s={lc.init_timeout_s} s of the first rank")
    return reason


def _result(job: Any, cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The ended job's result.json, or JobFailed (UserError for bad input) saying why there is none."""
    reason, ran = _ended_badly(job, cfg, run_dir)
    if reason and ran:  # submitit says the job failed: a task's bad input, or the rank named with its log
        _raise_refusal(run_dir)
        reason = _with_log_tail(reason, run_dir)
    if reason:
        raise JobFailed(reason)
    return json.loads((run_dir / "result.json").read_text())


def _ended_badly(job: Any, cfg: DictConfig, run_dir: Path) -> tuple[str, bool]:
    """Why a job that has ended has no result ("" if it has one), and whether its tasks ran and
    failed (False: none started, or they ended without a result.json)."""
    # A job that ended before any rank started (an image that cannot start) has no result for
    # submitit to wait for (it waits about 15 s for one): say why at once.
    reason = never_started(cfg, run_dir)
    if reason:
        return reason, False
    try:
        job.results()
    except Exception as e:  # noqa: BLE001 - any failure submitit reports is a failed job: name the rank if we can
        return status.peer_failure(run_dir, float("inf"), float("inf")) or f"job {job.job_id} failed: {e}", True
    result_path = run_dir / "result.json"
    if not result_path.exists():
        return f"job {job.job_id} finished but wrote no {result_path}; see the logs in {run_dir / 'logs'}", False
    return "", False


def never_started(cfg: DictConfig, run_dir: Path) -> str:
    """Why no rank ever started ("" if one did): the first error its command printed before
    xlaunch's task could open the rank's log, read from submitit's task output. In a container
    that is almost always the runtime failing to start the image."""
    if status.read_statuses(run_dir):
        return ""
    outputs = sorted((Path(run_dir) / "submitit").glob("*_log.err")) + \
        sorted((Path(run_dir) / "submitit").glob("*_log.out"))
    lines = [(p, line.strip()) for p in outputs for line in p.read_text(errors="replace").splitlines()
             if line.strip()]
    if not lines:
        return ""
    errors = [(p, line) for p, line in lines if re.match(r"(error|fatal)\b", line, re.IGNORECASE)]
    path, line = errors[0] if errors else lines[-1]
    runtime = getattr(cfg.container.runtime, "value", cfg.container.runtime)
    if runtime != "none":
        return (f"container image {cfg.container.image} could not be started by {runtime}: {line} "
                f"(the task's output: {path})")
    return f"no rank started: the task's command failed before xlaunch's task began: {line} (see {path})"


def _raise_refusal(run_dir: Path) -> None:
    """A task that stopped on bad input (an image's JAX too old, a plan file that does not fit)
    is reported as bad input is before submission: one line, exit status 2."""
    message = status.refusal(run_dir)
    if message:
        raise UserError(message)


def expected_ranks(cfg: DictConfig) -> int:
    return cfg.cluster.nodes * cfg.cluster.tasks_per_node


def _with_log_tail(reason: str, run_dir: Path, lines: int = 15) -> str:
    if reason.startswith("the job hung"):  # every rank's stacks are in its log; the reason says where each was
        return reason + f"\n(each rank's stacks, every thread's, are in its log: {status.rank_log(run_dir, 0).parent}/)"
    m = re.search(r"rank (\d+)", reason)
    named = int(m.group(1)) if m else None
    # How the other ranks ended: a rank the watchdog stopped says which peer it gave up on.
    others = [f"rank {r}: {st.state}" + (f" ({st.message})" if st.message else "")
              for r, (st, _) in sorted(status.read_statuses(run_dir).items()) if r != named and st.state != "done"]
    if others:
        reason += "\nthe other ranks: " + "; ".join(others)
    log = status.rank_log(run_dir, named) if named is not None else None
    if log is None or not log.exists():
        return reason
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return reason + f"\n--- last lines of {log} ---\n" + "\n".join(tail)


def _phase(statuses: dict, n: int, attempt: int) -> str:
    """Where the job is before rank 0 publishes progress, in a few words."""
    restart = f" (restart {attempt})" if attempt else ""
    if not statuses:
        return f"submitted, no rank started yet{restart}"
    joined = sum(st.state in ("joined", "done") for st, _ in statuses.values())
    if joined < n:
        return f"{len(statuses)} of {n} ranks started, {joined} joined{restart}"
    return f"running on {n} ranks{restart}"


class _ProgressView:
    """Shows that the job is alive while the launcher waits on it.

    On a terminal, rank 0's published progress is a live bar. Without one (``nohup``, CI, a
    SLURM batch step) a plain line goes to stderr instead: what, how far, elapsed and ETA (or,
    before any progress, where the job is), every ``every_s`` seconds while it changes and every
    ``5 * every_s`` while it does not, so a log shows the job alive without filling up.
    """

    QUIET_FACTOR = 5

    def __init__(self, job_id: Any, every_s: float) -> None:
        self.job_id, self.every_s = job_id, every_s
        self.bar = self.task = None
        self.since = time.time()
        self.last_time, self.last_key = self.since, None

    def __enter__(self) -> "_ProgressView":
        if sys.stderr.isatty():
            from rich.progress import (  # noqa: PLC0415  import cost: only a terminal draws the bar
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), TimeRemainingColumn(), transient=True)
            self.bar.start()
        return self

    def note(self, line: str) -> None:
        """A line on the user's terminal, above the bar while one is drawn."""
        if self.bar is not None:
            self.bar.console.print(line, markup=False, highlight=False)
        else:
            print(line, file=sys.stderr, flush=True)

    def update(self, progress: dict | None, phase: str = "") -> None:
        if self.bar is not None:
            if not progress:
                return
            if self.task is None:
                self.task = self.bar.add_task(progress["description"], total=progress["total"])
            self.bar.update(self.task, completed=progress["completed"], total=progress["total"],
                            description=progress["description"])
            return
        now = time.time()
        key = (progress["description"], progress["completed"]) if progress else phase
        quiet = now - self.last_time
        if quiet < self.every_s or (key == self.last_key and quiet < self.QUIET_FACTOR * self.every_s):
            return
        self.last_time, self.last_key = now, key
        self.note(f"{time.strftime('%H:%M:%S')} job {self.job_id}: " + progress_line(progress, phase, self.since, now))

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def progress_line(progress: dict | None, phase: str, since: float, now: float) -> str:
    """``what: done/total (pct), elapsed ..., eta ...`` from a progress.json, else the phase."""

    if not progress:
        return f"{phase}, {seconds(now - since)} since submission"
    done, total = progress["completed"], max(progress["total"], 1)
    elapsed = now - (progress.get("started") or since)
    eta = seconds(elapsed / done * (total - done)) if done else "unknown"
    return (f"{progress['description']}: {done:g}/{total:g} ({100 * done / total:.0f}%), "
            f"elapsed {seconds(elapsed)}, eta {eta}")


def summarize(result: dict[str, Any], run_dir: Path) -> None:
    """The run's answer on the console (``launcher/console.py``), then where the rest is."""

    print(console.summarize(result, run_dir), flush=True)


__all__ = ["launch", "wait", "JobFailed", "JobInterrupted", "UserError", "summarize"]
