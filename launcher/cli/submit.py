"""From a composed config to a submitted job, and (with launcher.wait) to its result."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from omegaconf import DictConfig, OmegaConf

from launcher import modes
from launcher.cli import console
from launcher.cli.console import progress_line
from launcher.cli.jobs import JOB_FILE, after_of, never_started, waited_for
from launcher.clusters.base import Cluster, UserCode, requeuing_backends
from launcher.clusters.containers import WRAPPER_NAME
from launcher.errors import UserError
from launcher.runtime import preflight, requeue, status, straggler
from launcher.runtime.context import Launch
from launcher.runtime.task import Task
from launcher.runtime.watch import JobWatch, Watch



class JobFailed(Exception):
    """The job ran and failed; the message names the rank and its log."""


class JobInterrupted(JobFailed):
    """The launcher was stopped (Ctrl-C, SIGTERM) while it owned the job, which it cancelled."""


def git_commit(where: Path) -> str:
    """The commit the code at ``where`` is (``-dirty`` where it has changes), "" where it is in no
    git repository or git is missing."""
    try:
        out = subprocess.run(["git", "-C", str(where), "describe", "--always", "--dirty", "--abbrev=40"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def launch(cfg: DictConfig, run_dir: Path) -> dict[str, Any] | None:
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
    if cfg.mode.get("predict"):  # plans for nodes one does not have: computed here, nothing submitted
        from launcher.sharding.ahead.command import run_prediction  # noqa: PLC0415 - only for this

        try:
            run_prediction(cfg, run_dir)
        except RuntimeError as e:
            raise JobFailed(str(e)) from None
        return None
    mode = modes.find(cfg.mode)
    code = mode.code(cfg.mode)  # the user's code its tasks run (mode=run), which the backend ships or binds
    cluster = Cluster.for_config(cfg, run_dir, coordinator_port(cfg), UserCode(code[0], tuple(code[1])) if code else None)
    cluster.check_run_dir()
    after = after_of(str(cfg.launcher.after), cluster) if cfg.launcher.get("after") else None
    cluster.after = after[0] if after else ""
    launched = Launch(cluster.coordinator_port, mode.run, modes.code_of(cfg.mode), cluster.shares_filesystem,
                      cluster.requeues, requeuing_backends(), git_commit(Path(code[0]) if code else Path.cwd()))
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
    submitted = {"job": executor.submit(Task(cfg, run_dir, launched)), "restarts": 0, "excluded": set()}
    # From here the launcher owns a job: stopped at any point until the job is left to run on
    # its own (launcher.wait=false) or has ended, it stops the job (a stop a moment after the
    # "submitted" line, as a test's or a script's is, included), and the run dir keeps what was
    # done (logs, stored profiles).
    try:
        # What `xlaunch status|logs|cancel|runs` find the job by, from any shell (launcher/cli/jobs.py).
        record = {"job_id": str(submitted["job"].job_id), "backend": cluster.backend, "submitted": time.time(),
                  "host": socket.gethostname(), "run_dir": str(run_dir), "mode": cfg.mode.name,
                  "cluster": cfg.cluster.name, "ranks": expected_ranks(cfg)}
        if after:  # xlaunch runs shows the chain
            record["after"] = {"job_id": after[0], **({"run_dir": str(after[1])} if after[1] else {})}
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
            task = Task(cfg, run_dir, launched)
            task.attempt, task.restart_reason = attempt, why
            # The nodes the preflight found slow or failing stay out of every later attempt.
            submitted["excluded"].update(preflight.excluded(run_dir))
            preflight.clear(run_dir)
            cluster.prepare_restart(executor, tuple(sorted(submitted["excluded"])))
            submitted["job"] = executor.submit(task)
            record.update(job_id=str(submitted["job"].job_id), restarts=submitted["restarts"])
            (run_dir / JOB_FILE).write_text(json.dumps(record) + "\n")
            return submitted["job"]

        return wait(submitted["job"], cluster, cfg, run_dir, restart)
    except KeyboardInterrupt:
        with _deaf_while_cancelling(submitted["job"].job_id):
            cluster.cancel(submitted["job"])
        raise JobInterrupted(f"interrupted: job {submitted['job'].job_id} cancelled; what it wrote is in {run_dir}") \
            from None


@contextlib.contextmanager
def _deaf_while_cancelling(job_id: str) -> Iterator[None]:
    """Ctrl-C or SIGTERM again while the job is being cancelled is said, not obeyed: a cancel
    cut short leaves ranks running with nobody to stop them (a second SIGTERM, which `kill` and
    `pkill` send as readily as an impatient second Ctrl-C, once left a local search's two ranks
    computing for twenty minutes). A cancel ends within seconds: a local job's ranks get SIGKILL
    10 s after SIGINT."""
    if threading.current_thread() is not threading.main_thread():   # signal handlers: the main thread's
        yield
        return

    def again(signum: int, frame: Any) -> None:
        print(f"still cancelling job {job_id}: its ranks are being stopped (killed within seconds); "
              "wait for it to end", file=sys.stderr)

    before = {s: signal.signal(s, again) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


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
    """Polls the job and its watch (``runtime/watch.py``: one file a poll, whatever the job's
    size) until the job ends; fails fast on a bad rank. A job that fails or hangs is started
    again by ``restart`` (the next job, or None when no restart is left: launcher.max_restarts)."""
    lc = cfg.launcher
    n = expected_ranks(cfg)
    watch = {"first_seen": None, "attempt": 0, "clock": status.StallClock(), "all_done": None}
    ranks = JobWatch(run_dir, n, lc.peer_timeout_s, lc.init_timeout_s, lc.straggler.factor)
    warned: set[int] = set()   # the ranks named slow so far: each once

    def again(reason: str) -> Any:
        """The restarted job, or None: bad input is not retried (it would fail the same way)."""
        if restart is None or status.refusal(run_dir):
            return None
        bad = tuple(preflight.excluded(run_dir))
        nxt = restart(reason)
        if nxt is not None:
            watch.update(first_seen=None, clock=status.StallClock(),
                         attempt=status.read_attempt(run_dir).get("attempt", 0))
            view.note(f"job {job.job_id} failed ({reason.splitlines()[0]}); restarted as job {nxt.job_id} "
                      f"(restart {watch['attempt']} of at most launcher.max_restarts={lc.max_restarts}), "
                      f"resuming from {run_dir}" + _left_out(cluster, bad))
        return nxt

    # The ranks' watch changes once a beat: it is read twice a beat, and the attempt and a
    # cancellation (rare) once a beat and whenever the job seems to fail, whatever the poll.
    due = {"watch": 0.0, "rare": 0.0}
    with _ProgressView(job.job_id, lc.progress_every_s) as view:
        while True:
            now = time.monotonic()
            if now < due["watch"] and not cluster.ended(job):
                time.sleep(lc.poll_interval_s)
                continue
            rare = now >= due["rare"]
            due["watch"] = now + max(lc.poll_interval_s, status.HEARTBEAT_S / 2)
            due["rare"] = now + status.HEARTBEAT_S if rare else due["rare"]
            awake_since = watch["clock"].tick()
            requeued = status.read_attempt(run_dir) if rare else {"attempt": watch["attempt"]}
            if requeued.get("attempt", 0) != watch["attempt"]:
                # SLURM requeued the job (runtime/requeue.py): the last attempt's ranks ended on
                # purpose, and the time it waits in the queue again does not count.
                watch.update(attempt=requeued["attempt"], first_seen=None)
                key, limit = requeue.limit_of(cfg)
                view.note(f"job {job.job_id} requeued ({requeued.get('reason', '')}): restart {watch['attempt']} of "
                          f"at most {key}={limit}; it resumes when it runs again")
            seen = ranks.read(watch["attempt"], awake_since)
            if seen.present and watch["first_seen"] is None:
                watch["first_seen"] = time.time()  # the job is running: queueing time does not count
            reason = _failing(lc, n, seen, watch["first_seen"], awake_since)
            cancelled = status.read_cancelled(run_dir) if reason or rare else None
            if cancelled:  # `xlaunch cancel` from another shell: the ranks' ends are its doing
                raise JobFailed(f"job {job.job_id} was cancelled ({cancelled.get('by', 'xlaunch cancel')}); "
                                f"what it wrote is in {run_dir}")
            if reason:
                reason = _settled(reason, lambda woke=awake_since: _failing(lc, n, ranks.scan(watch["attempt"], woke),
                                                                            watch["first_seen"], woke),
                                  lambda: ranks.read(watch["attempt"], fallback=False), lc.poll_interval_s)
                cluster.cancel(job)
                nxt = again(reason)
                if nxt is not None:
                    job = nxt
                    continue
                _raise_refusal(run_dir)
                raise JobFailed(_with_log_tail(reason, run_dir))
            _name_slow_ranks(seen, warned, lc, lambda line, j=job.job_id: view.note(
                f"{time.strftime('%H:%M:%S')} job {j}: {line}"))
            phase = _phase(seen, n, watch["attempt"])
            if cluster.after and not seen.present:   # held in the queue for another job (launcher.after)
                phase = f"waits in the queue for job {cluster.after} to end well (launcher.after)"
            view.update(seen.progress or None, phase)
            # Where the ranks work in the run dir itself: a TPU job goes on after its ranks, copying
            # their run dirs back.
            if cluster.shares_filesystem and _stuck_exiting(watch, seen, n, lc.exit_timeout_s, run_dir):
                view.note(f"every rank of job {job.job_id} said it was done {lc.exit_timeout_s:g} s ago, but "
                          f"{'its process has' if n == 1 else 'their processes have'} not all exited (stuck while "
                          "exiting: tearing down collectives, say): the job is ended, and its result stands "
                          "(launcher.exit_timeout_s)")
                cluster.cancel(job)
                # Not submitit's results: a backend may hold none for tasks ended so (Ray's).
                return json.loads((run_dir / "result.json").read_text())
            if cluster.ended(job):
                restartable = restart is not None and lc.max_restarts > 0 and not status.read_cancelled(run_dir)
                reason = _ended_badly(job, cluster, cfg, run_dir)[0] if restartable else ""
                nxt = again(reason) if reason else None
                if nxt is None:
                    break
                job = nxt
            time.sleep(lc.poll_interval_s)
    return _result(job, cluster, cfg, run_dir)


def _left_out(cluster: Cluster, nodes: tuple[str, ...]) -> str:
    """What a restart does with the nodes the preflight found bad, as the end of its line."""
    if not nodes:
        return ""
    how = cluster.leaves_out(nodes)
    which = f"node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}"
    if how:
        return f", without {which} ({how})"
    return (f"; cluster={cluster.cfg.cluster.name} cannot leave {which} out of a restart (only SLURM's --exclude "
            "can here): it restarts on the nodes it is given")


def _name_slow_ranks(seen: Watch, warned: set[int], lc: DictConfig, note: Callable[[str], None]) -> None:
    """One line for each rank the job's watch finds slow, once (``warned``: those named so far)."""
    for s in seen.stragglers.get("slow", []):
        if s["rank"] not in warned:
            warned.add(s["rank"])
            note(straggler.warning(s, seen.stragglers["median_host_s"], lc.straggler.factor, lc.straggler.steps))


def _stuck_exiting(watch: dict, seen: Watch, n: int, timeout_s: float, run_dir: Path) -> bool:
    """Whether every rank said it was done (and the result is written) over ``timeout_s`` ago
    while the job goes on: a rank process that does not exit (``launcher.exit_timeout_s``)."""
    if seen.count("done") < n or not (run_dir / "result.json").exists():
        watch["all_done"] = None
        return False
    watch["all_done"] = watch["all_done"] or time.monotonic()
    return time.monotonic() - watch["all_done"] > timeout_s


def _settled(reason: str, failing: Callable[[], str], published: Callable[[], Watch | None], poll_s: float) -> str:
    """The failure's last word, a moment after it is first seen (``failing``: every rank's file
    read again): a hang once every rank has said it (they say so a moment apart); a rank found
    dead once its backend has had a moment to say how it ended ("killed by signal 9 on Ray node
    ..."); a rank that lost its connection to a peer once the dead peer had a moment to be found."""
    if reason.startswith("the job hung"):
        status.wait_until(lambda: (lambda w: w is None or w.ending or not w.count("joined"))(published()), 5, 0.25)
        return reason

    def unsettled(why: str) -> bool:
        return status.died_silently(why) or ("; then " not in why and status.lost_peer(why))

    deadline = time.monotonic() + 2 * poll_s + 1 + 2 * status.HEARTBEAT_S
    while unsettled(reason) and time.monotonic() < deadline:
        time.sleep(poll_s)
        reason = failing() or reason
    return reason


def _failing(lc: DictConfig, n: int, seen: Watch, first_seen: float | None, awake_since: float) -> str:
    """Why the running job cannot go on ("" if it can): a rank failed, went silent, hung, or
    never started within launcher.init_timeout_s of the first."""
    reason = seen.verdict
    if not reason and first_seen is not None and time.time() - max(first_seen, awake_since) > lc.init_timeout_s + 5:
        missing = sorted(set(range(n)) - seen.present)
        if missing:
            reason = (f"{status.ranks_text(missing)} never started within "
                      f"launcher.init_timeout_s={lc.init_timeout_s} s of the first rank")
    return reason


def _result(job: Any, cluster: Cluster, cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """The ended job's result.json, or JobFailed (UserError for bad input) saying why there is none."""
    reason, ran = _ended_badly(job, cluster, cfg, run_dir)
    if reason and ran:  # submitit says the job failed: a task's bad input, or the rank named with its log
        _raise_refusal(run_dir)
        reason = _with_log_tail(reason, run_dir)
    if reason:
        raise JobFailed(reason)
    return json.loads((run_dir / "result.json").read_text())


def _ended_badly(job: Any, cluster: Cluster, cfg: DictConfig, run_dir: Path) -> tuple[str, bool]:
    """Why a job that has ended has no result ("" if it has one), and whether its tasks ran and
    failed (False: none started, or they ended without a result.json)."""
    # A job that ended before any rank started (an image that cannot start) has no result for
    # submitit to wait for (it waits about 15 s for one): say why at once.
    reason = never_started(cfg, run_dir)
    if reason:
        return reason, False
    if cfg.launcher.get("after") and not status.any_status(run_dir):
        # Never ran: the job it was to run after failed, and the scheduler ended it.
        why = waited_for(str(cfg.launcher.after), cluster)
        if why:
            return (f"job {job.job_id} did not run: the job it was to run after (launcher.after="
                    f"{cfg.launcher.after}) did not end well: {why}"), False
    try:
        job.results()
    except Exception as e:  # noqa: BLE001 - any failure submitit reports is a failed job: name the rank if we can
        return status.peer_failure(run_dir, float("inf"), float("inf")) or f"job {job.job_id} failed: {e}", True
    result_path = run_dir / "result.json"
    if not result_path.exists():
        return f"job {job.job_id} finished but wrote no {result_path}; see the logs in {run_dir / 'logs'}", False
    return "", False


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
    # How the other ranks ended (read once, at the job's end): a rank the watchdog stopped says
    # which peer it gave up on. Ranks that ended alike are one clause, however many they are.
    alike: dict[str, list[int]] = {}
    for r, (st, _) in sorted(status.read_statuses(run_dir).items()):
        if r != named and st.state != "done":
            alike.setdefault(st.state + (f" ({st.message})" if st.message else ""), []).append(r)
    if alike:
        reason += "\nthe other ranks: " + "; ".join(f"{status.ranks_text(rs)}: {how}" for how, rs in alike.items())
    log = status.rank_log(run_dir, named) if named is not None else None
    if log is None or not log.exists():
        return reason
    tail = log.read_text(errors="replace").splitlines()[-lines:]
    return reason + f"\n--- last lines of {log} ---\n" + "\n".join(tail)


def _phase(seen: Watch, n: int, attempt: int) -> str:
    """Where the job is before rank 0 publishes progress, in a few words."""
    restart = f" (restart {attempt})" if attempt else ""
    started = len(seen.present)
    if not started:
        return f"submitted, no rank started yet{restart}"
    joined = seen.count("joined", "done")
    if joined < n:
        return f"{started} of {n} ranks started, {joined} joined{restart}"
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


def summarize(result: dict[str, Any], run_dir: Path) -> None:
    """The run's answer on the console (``launcher/cli/console.py``), then where the rest is."""

    print(console.summarize(result, run_dir), flush=True)


__all__ = ["launch", "wait", "JobFailed", "JobInterrupted", "UserError", "summarize"]
