"""Rank status files and the peer watchdog: how a job fails fast.

JAX ends a process with SIGABRT when a coordination deadline passes instead of raising, and a
rank blocked in a collective waits ``heartbeat_timeout_seconds`` for a dead peer. So every rank
keeps a small status file in the shared run dir (state, pid, host, log) and touches it every
second. A rank that fails writes ``failed``; a rank that dies hard simply goes quiet. Peers and
the submitting process read these files: a failed or silent rank ends the job within seconds,
on any backend, whether or not anyone is waiting on the submission.

A job that SLURM requeues (``launcher.runtime.requeue``) runs again in the same run dir as its
next *attempt*: the attempt it is on is kept in ``.xlaunch/attempt.json``, each status says which
attempt wrote it, and statuses of earlier attempts (ranks that ended because the job was
requeued, not because they failed) are not read as the job's.
"""

from __future__ import annotations

import faulthandler
import functools
import json
import os
import socket
import sys
import sysconfig
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

STATUS_DIR = ".xlaunch"
# How often every rank touches its status file and reads the job's watch (launcher/runtime/watch.py):
# each beat is two calls on the run dir's file system per rank, whatever the job's size.
HEARTBEAT_S = 2.0
# How a rank ends other than "done": one in these no longer acts on a verdict (runtime/watch.py).
# A final state ("done" or one of these) stands against a later mark (``_mark``), except one
# marked for a death, which a later account that is not a death replaces.
ENDED = ("failed", "stopped", "hung", "requeued")
ATTEMPT_FILE = "attempt.json"
CANCELLED_FILE = "cancelled.json"  # written by `xlaunch cancel` (launcher/cli/jobs.py)
STOP_FILE = "stop.json"  # a stop request for a user's program (launcher/runtime/stop.py)


def status_dir(run_dir: Path) -> Path:
    return Path(run_dir) / STATUS_DIR / "ranks"


def stop_file(run_dir: Path) -> Path:
    return Path(run_dir) / STATUS_DIR / STOP_FILE


def node_name() -> str:
    """This node's name as its scheduler knows it (SLURM's, which ``--exclude`` takes; two
    pretend nodes on one host have one host name), else the host's."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def rank_log(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / "logs" / f"rank{rank}.log"


@dataclass
class RankStatus:
    rank: int
    # starting | joining | joined | done | failed | stopped (ended because a peer failed) |
    # requeued (rank 0 of an attempt that asked SLURM to requeue the job) | hung (no rank of the
    # job progressed for launcher.hang_timeout_s; the message says where each rank was)
    state: str
    pid: int
    host: str
    log: str
    message: str = ""
    time: float = 0.0
    pidns: str = ""  # the pid is only checkable from the same host and pid namespace
    bad_input: bool = False  # failed on bad input (the message says what to fix), not a fault
    attempt: int = 0  # 0 for the job's first run, n after its n-th requeue
    progress: float = 0.0  # when this rank last made progress (a step, a combination, a log line)
    # Found dead without a word of its own (by its host's watch, runtime/watch.py): the state is
    # "failed", and a backend that saw how it ended (Ray's driver) may still say so.
    died: bool = False
    # The node it runs on as its scheduler names it (SLURM's node name, what --exclude takes; the
    # host's name elsewhere), and its host-side seconds per step (runtime/straggler.py).
    node: str = ""
    steps: dict = field(default_factory=dict)


def _write_json(path: Path, obj: dict) -> None:
    # One temporary name per thread: a rank's heartbeat thread writes its status beside the main one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)  # readers never see half a file


def read_attempt(run_dir: Path) -> dict:
    """The attempt the job is on: ``{"attempt": n, "reason": why it was requeued, "time": when}``
    (``{"attempt": 0}`` before any requeue)."""
    try:
        return json.loads((Path(run_dir) / STATUS_DIR / ATTEMPT_FILE).read_text())
    except (OSError, ValueError):
        return {"attempt": 0}


def write_attempt(run_dir: Path, attempt: int, reason: str) -> None:
    """Records that the job is on ``attempt`` from now on; never goes back to an earlier one
    (every rank of a new attempt writes it when it starts, so the last writer may be late)."""
    if read_attempt(run_dir).get("attempt", 0) >= attempt:
        return
    d = Path(run_dir) / STATUS_DIR
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / ATTEMPT_FILE, {"attempt": attempt, "reason": reason, "time": time.time()})


def write_cancelled(run_dir: Path, by: str) -> None:
    """Records that the job was cancelled on purpose (``by``: who, from where): its ranks'
    ends are then not read as failures."""
    d = Path(run_dir) / STATUS_DIR
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / CANCELLED_FILE, {"by": by, "time": time.time()})


def read_cancelled(run_dir: Path) -> dict | None:
    try:
        return json.loads((Path(run_dir) / STATUS_DIR / CANCELLED_FILE).read_text())
    except (OSError, ValueError):
        return None


def mark_failed(run_dir: Path, rank: int, message: str, host: str = "", died: bool = False) -> None:
    """Records, for a rank that could not (it was killed, its node was lost), that it failed:
    written by whatever saw it end (the Ray driver; ``died``: its host's watch, which saw only
    that its process is gone). A rank that already ended (done, failed, stopped) keeps its own
    word; a backend's word replaces a mere "died"."""
    _mark(run_dir, rank, "failed", message, host, died)


def mark_stopped(run_dir: Path, rank: int, message: str) -> None:
    """Records, for a rank a cancel had to kill (it had not ended on SIGINT in time: on a busy
    machine, or stuck inside XLA), that it was stopped: the job was cancelled on purpose, so its
    end reads as the stop it was, not as a crash. A rank that ended on its own keeps its word."""
    _mark(run_dir, rank, "stopped", message)


def _mark(run_dir: Path, rank: int, state: str, message: str, host: str = "", died: bool = False) -> None:
    path = status_dir(run_dir) / f"rank{rank}.json"
    try:
        st = json.loads(path.read_text())
    except (OSError, ValueError):
        st = {"rank": rank, "pid": 0, "host": host, "log": str(rank_log(run_dir, rank)),
              "attempt": read_attempt(run_dir).get("attempt", 0)}
    if st.get("state") in ("done", *ENDED) and not (st.get("died") and not died):
        return
    st.update(state=state, message=message, time=time.time(), died=died)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_json(path, st)


def read_status(path: Path) -> tuple[bytes, float]:
    """A status file's bytes and its modification time (its last heartbeat): one call on the run
    dir's file system (the open; the time comes from the open file)."""
    with open(path, "rb") as f:
        return f.read(), os.fstat(f.fileno()).st_mtime


def read_statuses(run_dir: Path) -> dict[int, tuple[RankStatus, float]]:
    """Each rank's last status in the job's current attempt and the age in seconds of its last
    heartbeat: every rank's file, so for what is read once (a job's end, ``xlaunch status`` of
    a small job) or by the launcher before the job's watcher publishes (``watch.JobWatch``).
    A status an earlier attempt left (its ranks ended when the job was requeued) is not the
    job's: that rank has not started again yet."""
    out = {}
    d = status_dir(run_dir)
    now = time.time()
    attempt = read_attempt(run_dir).get("attempt", 0)
    for p in d.glob("rank*.json") if d.exists() else ():
        try:
            data, mtime = read_status(p)
            st = RankStatus(**json.loads(data))
            if st.attempt >= attempt:
                out[st.rank] = (st, now - mtime)
        except (OSError, ValueError, TypeError):
            continue  # replaced between glob and read: next poll sees it
    return out


def any_status(run_dir: Path) -> bool:
    """Whether any rank has written its status (one listing, not a read of every file)."""
    try:
        with os.scandir(status_dir(run_dir)) as it:
            return any(e.name.startswith("rank") for e in it)
    except OSError:
        return False


# --- where each rank is: stack dumps --------------------------------------------------------------

STACKS_DIR = "stacks"
STACKS_REQUEST = "stacks-request.json"
HANG_REQUEST = -1.0  # the request id of the dump a hang makes (an `xlaunch stacks` one is its time)


def request_stacks(run_dir: Path) -> float:
    """Asks every running rank of the job for its stacks (``xlaunch stacks``); returns the
    request's id, which each rank's answer carries. The job's watcher passes it on
    (``runtime/watch.py``)."""
    d = Path(run_dir) / STATUS_DIR
    d.mkdir(parents=True, exist_ok=True)
    asked = time.time()
    _write_json(d / STACKS_REQUEST, {"time": asked})
    return asked


def read_stacks_request(run_dir: Path) -> float:
    try:
        return float(json.loads((Path(run_dir) / STATUS_DIR / STACKS_REQUEST).read_text())["time"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def stacks_folder(run_dir: Path, request: float) -> Path:
    """Where the answers to one request go: a folder each, so that counting them is one listing."""
    name = "hang" if request == HANG_REQUEST else f"{request:.6f}"
    return Path(run_dir) / STATUS_DIR / STACKS_DIR / name


def dump_stacks(run_dir: Path, rank: int, request: float) -> None:
    """This process's Python stacks, every thread's: in full into its log (stderr is the log),
    and where its main thread is into ``.xlaunch/stacks/<request>/rank<N>.json``. Run from the
    heartbeat thread: the main thread may be blocked inside XLA (which releases the GIL while
    it waits)."""
    sys.stderr.write(f"=== xlaunch: the stacks of rank {rank}'s threads, "
                     f"{'no rank progressing' if request == HANG_REQUEST else 'as asked (xlaunch stacks)'} ===\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    frame = sys._current_frames().get(threading.main_thread().ident)
    stack = [(f.filename, f.lineno, f.name, f.line or "") for f in traceback.extract_stack(frame)] if frame else []
    d = stacks_folder(run_dir, request)
    d.mkdir(parents=True, exist_ok=True)
    _write_json(d / f"rank{rank}.json", {"rank": rank, "request": request, "time": time.time(),
                                         "where": _where(stack), "stack": stack})


def read_stacks(run_dir: Path, request: float, here: bool = False) -> dict[int, dict]:
    """The ranks' answers to ``request``, by rank (``here``: ``run_dir`` is a folder of answers
    itself, searched at any depth: a TPU worker's copy)."""
    out = {}
    folder = Path(run_dir) if here else stacks_folder(run_dir, request)
    for p in folder.glob("**/rank*.json" if here else "rank*.json"):
        try:
            d = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if d.get("request") == request:
            out[d["rank"]] = d
    return out


def count_stacks(run_dir: Path, request: float) -> int:
    """How many ranks have answered ``request`` (one listing)."""
    try:
        return sum(1 for name in os.listdir(stacks_folder(run_dir, request)) if name.startswith("rank"))
    except OSError:
        return 0


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.1) -> bool:
    """Polls ``predicate`` until it holds (True) or ``timeout_s`` passes (False)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def wait_for_stacks(run_dir: Path, request: float, num_ranks: int, timeout_s: float) -> dict[int, dict]:
    """The answers to ``request`` once ``num_ranks`` have answered or ``timeout_s`` has passed:
    the answers are counted by a listing while they come, and read once."""
    wait_until(lambda: count_stacks(run_dir, request) >= num_ranks, timeout_s, 0.2)
    return read_stacks(run_dir, request)


def where_ranks_are(stacks: dict[int, dict], num_ranks: int) -> str:
    """One clause per place, ranks at the same place together: ``ranks 0,2 at train.py:41 in
    step (total = psum(x)); rank 1 at loader.py:12 in next (...)``; ranks that did not answer
    last. Runs of ranks are written as ranges (``ranks 0-4095``)."""
    places: dict[str, list[int]] = {}
    for rank, d in sorted(stacks.items()):
        places.setdefault(d["where"], []).append(rank)
    parts = [f"{ranks_text(rs)} {where}" for where, rs in places.items()]
    silent = sorted(set(range(num_ranks)) - set(stacks))
    if silent:
        parts.append(f"{ranks_text(silent)} did not answer")
    return "; ".join(parts)


def rank_ranges(ranks: Iterable[int]) -> str:
    """``0-3,5,7-9``: a set of ranks in a few characters however many there are."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def ranks_text(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 0-2,5``."""
    return f"{'ranks' if len(ranks) > 1 else 'rank'} {rank_ranges(ranks)}"


def parse_ranges(text: str) -> list[int]:
    """The ranks ``rank_ranges`` wrote."""
    out: list[int] = []
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        out.extend(range(int(a), int(b or a) + 1))
    return out


def _where(stack: list) -> str:
    """Where a main thread is, said by the innermost frame of the user's own code (not Python's,
    an installed package's or xlaunch's), else the innermost of xlaunch's, else the innermost."""
    if not stack:
        return "(no Python frame)"
    frame = max(reversed(stack), key=lambda f: _code_kind(f[0]))  # innermost among the best kind
    filename, line, name, text = frame
    code = text.split("  #")[0].strip()  # the statement, without an inline comment
    return f"at {Path(filename).name}:{line} in {name}" + (f" ({code})" if code else "")


@functools.lru_cache(maxsize=4096)
def _code_kind(filename: str) -> int:
    """0: Python's or an installed package's code; 1: xlaunch's; 2: the user's. (Cached: a path
    is resolved once per process, not once per frame of every dump.)"""
    path = str(Path(filename).resolve()) if filename and not filename.startswith("<") else filename
    if "site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB) or path.startswith("<"):
        return 0
    return 1 if path.startswith(_OURS) else 2


_OURS = str(Path(__file__).resolve().parents[1])
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())


def hung_for(statuses: dict[int, tuple[RankStatus, float]], awake_since: float = 0.0) -> float:
    """How long no rank of the job has progressed (0 unless every rank has joined and none
    has ended), from its statuses (``read_statuses``): the age of the latest progress any rank
    reported, counted from ``awake_since`` at the earliest (``StallClock``)."""
    if not statuses or any(st.state != "joined" for st, _ in statuses.values()):
        return 0.0
    latest = max(max(st.progress, st.time) for st, _ in statuses.values())
    return time.time() - max(latest, awake_since)


def refusal(run_dir: Path) -> str:
    """The message of the first rank that failed on bad input, when the first to fail did ("" if not)."""
    failed = sorted((st.time, st.rank, st) for st, _ in read_statuses(run_dir).values() if st.state == "failed")
    if failed and failed[0][2].bad_input:
        st = failed[0][2]
        return f"rank {st.rank} on {st.host}: {st.message}"
    return ""


class StallClock:
    """When the process watching its peers last woke from a stall.

    A VM its host paused, a suspended laptop or a job stopped and continued freezes every
    process alike, and wall time goes on: on waking, every peer's heartbeat is old. So a peer's
    silence counts only from when the watcher itself last ran without a gap of ``stall_s``;
    call ``tick`` once per watching round (every ``HEARTBEAT_S`` or so)."""

    def __init__(self, stall_s: float = 5.0):
        self.stall_s = stall_s
        self.awake_since = self.last = time.time()

    def tick(self) -> float:
        now = time.time()
        if abs(now - self.last) > self.stall_s:
            self.awake_since = now
        self.last = now
        return self.awake_since


def peer_failure(run_dir: Path, peer_timeout_s: float, init_timeout_s: float, exclude: int = -1,
                 awake_since: float = 0.0, statuses: dict[int, tuple[RankStatus, float]] | None = None) -> str:
    """Why the job cannot go on ("" if it can): a rank that failed, went silent after joining,
    or has not joined within the initialisation timeout. Silence and lateness count from
    ``awake_since`` at the earliest (``StallClock``). ``statuses``: ``read_statuses``'s, when the
    caller has read them already."""
    since = time.time() - awake_since
    read = read_statuses(run_dir) if statuses is None else statuses
    statuses = {r: (st, min(age, since)) for r, (st, age) in read.items() if r != exclude}
    hung = [st for _, (st, _) in sorted(statuses.items()) if st.state == "hung"]
    if hung:  # every rank says the same: where each one was
        return f"the job hung: {hung[0].message}"
    failed = sorted((st.time, r) for r, (st, _) in statuses.items() if st.state == "failed" and not st.died)
    here = (socket.gethostname(), _pid_namespace())
    dead = [st for r, (st, _) in sorted(statuses.items())
            if (st.state == "failed" and st.died) or
            (st.state in ("starting", "joining", "joined") and (st.host, st.pidns) == here and not pid_alive(st.pid))]
    if failed:
        st = statuses[failed[0][1]][0]
        reason = f"rank {st.rank} failed on {st.host}: {st.message} (log: {st.log})"
        if dead and lost_peer(st.message):
            # A peer that aborted (XLA ends a process with SIGABRT) writes no status; the rank
            # that saw its socket close reports first, but the cause is the dead one.
            return f"{_died(dead[0])}; then {reason}"
        return reason
    if dead:
        return _died(dead[0])
    for r, (st, age) in sorted(statuses.items()):
        if st.state == "joined" and age > peer_timeout_s:
            return (f"rank {r} stopped responding on {st.host} (pid {st.pid}, no heartbeat for {age:.0f} s; "
                    f"it probably crashed: see its log {st.log})")
    late = [(st.state != "starting", r, st) for r, (st, age) in statuses.items()
            if st.state in ("starting", "joining") and age > init_timeout_s]
    if late:
        # A rank still "starting" never reached jax.distributed.initialize: it is the cause, and
        # the ranks waiting for it inside initialize ("joining") are not.
        _, r, st = min(late, key=lambda x: (x[0], x[1]))
        where = "never reached jax.distributed.initialize" if st.state == "starting" else "could not join"
        return (f"rank {r} on {st.host} {where} within launcher.init_timeout_s={init_timeout_s:g} s "
                f"(see its log {st.log})")
    return ""


# How a collective's transport reports a peer process that went away (gloo over TCP, gRPC).
_LOST_PEER = ("connection reset by peer", "connection closed by peer", "broken pipe", "socket closed",
              "connection refused", "end of file")


def lost_peer(message: str) -> bool:
    """Whether ``message`` is a rank's error about a peer that went away, not a fault of its own."""
    return any(s in message.lower() for s in _LOST_PEER)


_DIED = "without reporting an error"


def _died(st: RankStatus) -> str:
    return (f"rank {st.rank} (pid {st.pid}) died on {st.host} {_DIED} "
            f"(killed or crashed: see its log {st.log})")


def died_silently(reason: str) -> bool:
    """Whether ``peer_failure``'s ``reason`` is only a rank found dead, with no word of how it
    ended: the backend that ran it (Ray's driver) may yet say (``mark_failed``)."""
    return _DIED in reason and "; then " not in reason


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (it may be another's: see
    ``clusters.base.job_process_alive``). Only meaningful on the rank's own host; elsewhere the
    heartbeat's age decides. A zombie (killed, not yet reaped by its parent) has ended."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except FileNotFoundError:
        return not os.path.exists("/proc/self/stat")  # gone since the kill; without /proc, the pid alone
    except (OSError, IndexError):
        return True