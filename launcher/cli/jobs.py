"""A submitted job, found again from its run dir: its state, its ranks' logs, cancelling it.

Whoever submits with ``launcher.wait=false`` (a ``-m`` sweep, a long SLURM job) follows the job
later, from any shell, with ``xlaunch status|logs|cancel|runs`` (``launcher/cli/commands.py``). All
they need is in the run dir: ``job.json`` (backend, job id, submitting host), the resolved
config, the ranks' status files and logs (``launcher/runtime/status.py``), ``result.json``.
The job's state joins two views of it:

- the scheduler's (``Cluster.scheduled``): SLURM's ``squeue``/``sacct``, or for the jobs that
  are a process on the submitting host (local, mpi, tpu) whether that process still runs;
- the ranks' own: each rank's last state, the rank that failed first and why, rank 0's
  progress, the attempt a requeued job is on, a cancellation ``xlaunch cancel`` recorded.

Nothing here imports JAX: these commands start in a fraction of a second.
"""

from __future__ import annotations

import getpass
import json
import re
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from omegaconf import DictConfig, OmegaConf

from launcher.clusters.base import Cluster
from launcher.cli.console import headline_text, progress_line, seconds
from launcher.errors import UserError
from launcher.runtime import status, straggler
from launcher.runtime.watch import JobWatch, Watch, read_watch, summarize

JOB_FILE = "job.json"  # the submitted job's record in its run dir (launcher/cli/submit.py writes it)
# Where Hydra puts run dirs by default, relative to the working directory (conf/config.yaml).
RUN_ROOTS = ("outputs", "multirun")
FINAL = ("done", "failed", "cancelled")


@dataclass
class Run:
    """A run dir that holds a submitted job."""

    path: Path
    record: dict  # job.json

    @property
    def job_id(self) -> str:
        return str(self.record["job_id"])

    @property
    def backend(self) -> str:
        return str(self.record.get("backend", "?"))

    @property
    def submitted(self) -> float:
        return float(self.record.get("submitted", 0.0))

    def config(self):
        path = self.path / "resolved_config.yaml"
        if not path.is_file():
            raise UserError(f"{self.path}: its resolved_config.yaml is missing; the run dir is incomplete")
        return OmegaConf.load(path)

    @property
    def mode(self) -> str:
        return self.record.get("mode") or self._configured("mode", "name")

    @property
    def cluster_name(self) -> str:
        return self.record.get("cluster") or self._configured("cluster", "name")

    def _configured(self, group: str, key: str) -> str:
        try:
            return str(self.config()[group][key])
        except (UserError, KeyError, AttributeError):
            return "?"

    @property
    def ranks(self) -> int:
        if "ranks" in self.record:
            return int(self.record["ranks"])
        c = self.config().cluster
        return int(c.nodes) * int(c.tasks_per_node)

    @property
    def nodes(self) -> int:
        """The nodes its allocation holds (``cluster.nodes``; 1 where the config says none)."""
        try:
            return int(self.config().cluster.get("nodes") or 1)
        except (UserError, AttributeError, ValueError):
            return 1

    def devices(self) -> int | None:
        """Its global devices, as its result says (None before there is one)."""
        r = self.result()
        return int(r["global_devices"]) if r and r.get("global_devices") else None

    def cluster(self):
        """The run's Cluster (``launcher/clusters``), which asks its scheduler about the job."""
        # The run dir as the job's processes name it (a link or a relative path given here
        # would not match their command lines).
        return Cluster.for_config(self.config(), Path(self.record.get("run_dir") or self.path))

    def result(self) -> dict | None:
        try:
            return json.loads((self.path / "result.json").read_text())
        except (OSError, ValueError):
            return None


def open_run(path: str | Path) -> Run:
    """The run in ``path``; UserError (one line) when it is not a run dir with a submitted job."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"{path}: no such directory; give a run dir (outputs/<date>/<time>-<mode>-<cluster>) "
                        "or none for the latest run")
    if not (p / JOB_FILE).is_file():
        if (p / "resolved_config.yaml").is_file():
            raise UserError(f"{path}: nothing was submitted from this run dir (a dry run, or a run refused "
                            f"before submission): it has no {JOB_FILE}")
        raise UserError(f"{path}: not a run dir (no {JOB_FILE}); give the run dir a job was submitted from")
    try:
        record = json.loads((p / JOB_FILE).read_text())
        str(record["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        raise UserError(f"{p / JOB_FILE}: not a job record xlaunch wrote (no job_id)") from None
    return Run(p.resolve(), record)


def after_of(spec: str, cluster: Cluster) -> tuple[str, Path | None]:
    """``launcher.after``'s job: its id and its run dir (None for a bare job id). UserError (one
    line) where ``cluster``'s scheduler cannot hold a job for another, or ``spec`` names no job
    of it."""
    if not cluster.waits_in_queue:
        raise UserError(f"launcher.after={spec}: cluster={cluster.cfg.cluster.name} cannot hold a job until another "
                        "has ended (SLURM can: cluster=slurm, lumi); run the two in turn, or leave launcher.after out")
    if spec.isdigit():
        return spec, None
    run = open_run(spec)
    if run.backend != cluster.backend:
        raise UserError(f"launcher.after={spec}: job {run.job_id} ran on {run.backend}, not on {cluster.backend}: "
                        "a job can wait only for one of its own scheduler's")
    return run.job_id, run.path


def waited_for(spec: str, cluster: Cluster) -> str:
    """Why the job ``launcher.after`` names did not end well ("" where it did, or is not known
    to have failed), for a job that ended without running: its state and reason."""
    job_id, path = after_of(spec, cluster)
    try:
        if path is None:
            sched = cluster.scheduled(job_id)
            return "" if sched.state == "done" else f"job {job_id}: {sched.detail}"
        st = job_state(open_run(path))
    except UserError as e:
        return f"job {job_id}: {e}"
    return "" if st.state == "done" else f"job {job_id} ({path}) {st.state}: {st.detail}"


def find_runs(cwd: Path | None = None) -> list[Run]:
    """Every run under ``outputs/`` and ``multirun/`` of ``cwd``, newest submission first."""
    cwd = Path.cwd() if cwd is None else Path(cwd)
    found = set()
    for root in RUN_ROOTS:
        for depth in range(1, 5):  # outputs/<date>/<time>-..., multirun/<date>/<time>/<n>-...
            found.update(p.parent for p in (cwd / root).glob("/".join(["*"] * depth) + "/" + JOB_FILE))
    runs = []
    for d in found:
        try:
            runs.append(open_run(d))
        except UserError:
            continue  # a damaged record: not listed, not fatal
    return sorted(runs, key=lambda r: r.submitted, reverse=True)


def latest_run(cwd: Path | None = None) -> Run:
    runs = find_runs(cwd)
    if not runs:
        where = " or ".join(f"./{r}" for r in RUN_ROOTS)
        raise UserError(f"no submitted run under {where} of {Path.cwd() if cwd is None else cwd}: "
                        "give the run dir (the launcher printed it at submission)")
    return runs[0]


def run_or_latest(path: str | None) -> Run:
    return open_run(path) if path else latest_run()


def never_started(cfg: DictConfig, run_dir: Path) -> str:
    """Why no rank ever started ("" if one did): the first error its command printed before
    xlaunch's task could open the rank's log, read from submitit's task output. In a container
    that is almost always the runtime failing to start the image."""
    if status.any_status(run_dir):
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


# --- state ----------------------------------------------------------------------------------

@dataclass
class RankState:
    rank: int
    state: str  # a rank status's state (runtime/status.py), or "not started"
    host: str = ""
    pid: int = 0
    heartbeat_age_s: float | None = None
    message: str = ""
    ranks: str = ""  # a job too large to list rank by rank: every rank in this state (``0-3,7``)


# A job of more ranks is shown by state, from its watch (one file), not rank by rank (every rank's
# file): ``xlaunch status --ranks`` lists them all.
LISTED_RANKS = 32


@dataclass
class JobState:
    state: str  # queued | running | requeued | done | failed | cancelled
    detail: str  # one line: progress, the failing rank and why, ...
    scheduler: str  # the scheduler's own word on the job
    ranks: list[RankState] = field(default_factory=list)
    attempt: int = 0
    # The ranks' host work per step scored (runtime/straggler.py: the watch's, or result.json's).
    stragglers: dict = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return self.state in FINAL

    def to_json(self) -> dict:
        return {"state": self.state, "detail": self.detail, "scheduler": self.scheduler, "attempt": self.attempt,
                "ranks": [vars(r) for r in self.ranks], "stragglers": self.stragglers}


def _scored(run: Run, seen: Watch, result: dict | None, afresh: bool) -> dict:
    """The ranks' steps scored: the watch's, or result.json's; where ``afresh`` (scored here from
    every rank's file), with the ranks the watcher found slow in the attempt kept."""
    scored = seen.stragglers or (result or {}).get("stragglers") or {}
    if afresh and (w := read_watch(run.path)) is not None and w.attempt == seen.attempt:
        scored = straggler.keep_found(scored, w.stragglers)
    return scored


def job_state(run: Run, every_rank: bool | None = None) -> JobState:
    """The job's state from its scheduler and its run dir. Raises UserError (one line) when
    neither can tell: the scheduler no longer knows a job the run dir shows unfinished, or the
    job is a process on another host. Its ranks are listed one by one (``every_rank``; by
    default up to ``LISTED_RANKS``), else by state from the job's watch."""
    attempt = status.read_attempt(run.path)
    every_rank = run.ranks <= LISTED_RANKS if every_rank is None else every_rank
    factor = _straggler_factor(run)
    if every_rank:
        statuses = status.read_statuses(run.path)
        seen = summarize(statuses, run.ranks, attempt.get("attempt", 0), float("inf"), float("inf"),
                         straggler_factor=factor)
        ranks = _rank_states(run, statuses)
    else:
        seen = JobWatch(run.path, run.ranks, float("inf"), float("inf"), factor).read(attempt.get("attempt", 0))
        ranks = _rank_groups(run, seen)
    result = run.result()
    scored = _scored(run, seen, result, every_rank)

    def state(name: str, detail: str, scheduler: str) -> JobState:
        if name in FINAL:  # a rank still "joined" when the job ended was killed with it
            for r in ranks:
                if r.heartbeat_age_s is not None:
                    r.message = r.message or f"ended with the job, last heartbeat {r.heartbeat_age_s:g} s ago"
                    r.heartbeat_age_s = None
        return JobState(name, detail, scheduler, ranks, attempt.get("attempt", 0), scored)

    # What the run dir alone tells: a finished job needs no scheduler (and may be gone from it).
    ended = _ended(run, result if seen.count("done") == run.ranks else None, seen)
    if ended is not None:
        return state(*ended, "")

    cluster = run.cluster()
    host = run.record.get("host", "")
    if cluster.runs_on_submitting_host and host and host != socket.gethostname():
        raise UserError(f"{run.path}: job {run.job_id} is a process on {host}, not on this host "
                        f"({socket.gethostname()}): ask there")
    sched = cluster.scheduled(run.job_id)
    if sched.state == "unknown":
        raise UserError(f"{run.path}: {sched.detail}; the run dir shows it unfinished "
                        f"({_count(seen, run.ranks)}), so its end is not known")
    if sched.state == "queued":
        if attempt.get("attempt", 0):
            return state("requeued", f"restart {attempt['attempt']} waits in the queue "
                                     f"({attempt.get('reason', 'requeued')})", sched.detail)
        return state("queued", "waiting for resources", sched.detail)
    if sched.state == "running":
        progress = seen.progress or (read_watch(run.path) or Watch()).progress
        if progress and seen.present:
            detail = progress_line(progress, "", run.submitted, time.time())
        else:
            detail = _count(seen, run.ranks)
        if attempt.get("attempt", 0):
            detail += f" (restart {attempt['attempt']}: {attempt.get('reason', 'requeued')})"
        return state("running", detail, sched.detail)
    if sched.state == "cancelled":
        return state("cancelled", f"cancelled outside xlaunch ({sched.detail})", sched.detail)
    # Ended without a result and without a rank that says why.
    why = never_started(run.config(), run.path) or \
        f"the job ended ({sched.detail}) without result.json ({_count(seen, run.ranks)})"
    return state("failed", why, sched.detail)


def _straggler_factor(run: Run) -> float:
    """The job's launcher.straggler.factor (its default for a run dir from before it)."""
    try:
        return float(OmegaConf.select(run.config(), "launcher.straggler.factor", default=1.2))
    except (UserError, OSError, ValueError):
        return 1.2


def _ended(run: Run, result: Any, seen: Watch) -> tuple[str, str] | None:
    """(state, detail) of a job its run dir shows ended (``result``: result.json, where every
    rank is done), or None."""
    if result is not None:
        return "done", headline_text(result)
    cancelled = status.read_cancelled(run.path)
    if cancelled:
        return "cancelled", f"cancelled {_ago(cancelled.get('time', 0.0))} by {cancelled.get('by', '?')}"
    if seen.verdict:  # a rank failed: which first, and whether on bad input (every rank's file, once)
        return "failed", status.refusal(run.path) or seen.verdict
    return None


def _rank_states(run: Run, statuses: dict) -> list[RankState]:
    out = []
    for r in range(max([run.ranks, *[k + 1 for k in statuses]])):
        if r not in statuses:
            out.append(RankState(r, "not started"))
            continue
        st, age = statuses[r]
        live = st.state in ("starting", "joining", "joined")
        out.append(RankState(r, st.state, st.host, st.pid, round(age, 1) if live else None, st.message))
    return out


def _rank_groups(run: Run, seen: Watch) -> list[RankState]:
    """The ranks by state, as the job's watch has them (the first rank of each group stands for it)."""
    out = [RankState(status.parse_ranges(ranks)[0], state, ranks=ranks) for state, ranks in seen.states.items()]
    missing = sorted(set(range(run.ranks)) - seen.present)
    if missing:
        out.append(RankState(missing[0], "not started", ranks=status.rank_ranges(missing)))
    return sorted(out, key=lambda r: r.rank)


def _count(seen: Watch, n: int) -> str:
    return f"{len(seen.present)} of {n} ranks started, {seen.count('joined', 'done')} joined"


def _ago(t: float) -> str:

    return f"{seconds(max(time.time() - t, 0.0))} ago" if t else "at an unknown time"


# --- stacks ---------------------------------------------------------------------------------

def stacks(run: Run, timeout_s: float = 15.0) -> dict[int, dict]:
    """Asks the running job's ranks for their stacks (each rank's heartbeat thread answers
    through its run dir: this machine's, or a TPU worker's copy, asked and read through gcloud)
    and returns the answers, by rank; UserError when the job is not running."""
    st = job_state(run)
    if st.state != "running":
        raise UserError(f"{run.path}: job {run.job_id} is not running ({st.state}" +
                        (f": {st.detail}" if st.detail else "") + "); only a running job's ranks can answer")
    live = sum(len(status.parse_ranges(r.ranks)) if r.ranks else 1 for r in st.ranks if r.state == "joined")
    answers = run.cluster().stacks(live or run.ranks, timeout_s)
    if not answers:
        raise UserError(f"{run.path}: no rank answered within {timeout_s:g} s (a rank answers once it has joined "
                        "jax.distributed; see xlaunch status)")
    return answers


# --- cancel ---------------------------------------------------------------------------------

def cancel(run: Run) -> JobState:
    """Ends the job on its backend and records that it was cancelled; UserError when it has
    already ended (nothing in the run dir changes then)."""
    before = job_state(run)
    if before.finished:
        raise UserError(f"{run.path}: job {run.job_id} has already ended ({before.state}: {before.detail}); "
                        "nothing to cancel")
    # Recorded first: the ranks' ends that follow read as the cancellation they are (to a
    # launcher still waiting on the job, too), not as failures.
    status.write_cancelled(run.path, f"{_user()}@{socket.gethostname()} with xlaunch cancel")
    try:
        run.cluster().cancel_id(run.job_id)
    except BaseException:
        (run.path / status.STATUS_DIR / status.CANCELLED_FILE).unlink(missing_ok=True)
        raise
    return job_state(run)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry and no $USER
        return "?"


# --- logs -----------------------------------------------------------------------------------

# The rank logs' own line format (runtime/task.py): "2026-01-31 12:00:00,123 rank0 INFO ...".
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


class _Tail:
    """The lines a growing log file gained since the last read (whole lines only)."""

    def __init__(self, path: Path, rank: int) -> None:
        self.path, self.rank, self.pos, self.partial, self.stamp = path, rank, 0, b"", ""

    def read(self) -> list[tuple[str, int, str]]:
        """(timestamp, rank, line) per new line; a line without a timestamp of its own (XLA's,
        a traceback's) takes the one before it, so it stays beside its neighbours."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except OSError:
            return []
        self.pos += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        out = []
        for raw in lines:
            line = raw.decode(errors="replace")
            m = _STAMP.match(line)
            if m:
                self.stamp = m.group(1)
            out.append((self.stamp, self.rank, line))
        return out

    def rest(self) -> list[tuple[str, int, str]]:
        """A last line without its newline (the job has ended)."""
        line, self.partial = self.partial.decode(errors="replace"), b""
        return [(self.stamp, self.rank, line)] if line else []


def log_lines(run: Run, rank: int | None = None, follow: bool = False, poll_s: float = 0.5,
              state_every_s: float = 2.0) -> Iterator[str]:
    """The ranks' logs as one stream, each line prefixed ``rank<N> | `` and in time order
    across ranks (or rank ``rank``'s log as it is); with ``follow``, also what they write
    until the job ends."""
    if rank is not None and not 0 <= rank < run.ranks:
        raise UserError(f"--rank {rank}: job {run.job_id} has ranks 0 to {run.ranks - 1}")
    ranks = [rank] if rank is not None else range(run.ranks)
    tails = [_Tail(status.rank_log(run.path, r), r) for r in ranks]
    # Each poll opens every followed log: at most about a thousand a second on the file system.
    poll_s = max(poll_s, len(tails) / 1000)
    checked, finished = 0.0, not follow
    while True:
        if follow and time.monotonic() - checked > state_every_s:
            checked, finished = time.monotonic(), job_state(run).finished
        batch = [entry for t in tails for entry in t.read()]
        if finished:  # read after the end was seen: nothing written before it is missed
            batch += [entry for t in tails for entry in t.rest()]
        for _, r, line in sorted(batch, key=lambda e: (e[0], e[1])):  # stable: a file's order stays
            yield line if rank is not None else f"rank{r} | {line}"
        if finished:
            return
        time.sleep(poll_s)


def write_lines(lines: Iterator[str], out: IO[str] = sys.stdout) -> None:
    for line in lines:
        out.write(line + "\n")
        out.flush()
