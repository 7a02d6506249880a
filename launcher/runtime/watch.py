"""Watching a job's ranks at a cost that does not grow with their number.

Every rank keeps its status file in the run dir (``status.py``) and touches it once a beat
(``HEARTBEAT_S``): its heartbeat. One rank, the job's *watcher* (rank 0), reads every rank's
file once a beat and publishes what it saw in one small file, ``.xlaunch/watch.json`` (``Watch``):
which ranks are in which state, why the job cannot go on (a rank that failed, died, went silent
or is late), a hang and where each rank was, a stack dump or a stop someone asked for. Every other
rank reads that one file once a beat, and so do the waiting launcher and ``xlaunch status``
(``JobWatch``). So a rank costs the run dir's file system two calls a beat, its heartbeat and the
watch's read, and the watcher one more per rank: the job's traffic is O(N), as with torchrun's
per-node agents and JAX's own coordination service, where every rank reading every rank's file
was O(N) per rank.

Whether a rank's process still runs can only be seen from its host. On each host one rank,
whichever holds a lock in node-local memory (``node_watch.NodeWatch``), checks the pids of that
host's ranks, which register there, and records a dead one in the run dir as failed
(``status.mark_failed``), where the watcher reads it at its next beat. Nothing of this goes
through the shared file system.

Before rank 0 has joined (a job starting, a rank that never arrives) and after it is gone, there
is no watch: the launcher then reads every rank's file itself, at most once per
``JobWatch.fallback_s`` (more seldom as the job grows), and a rank whose watch went quiet names
the watcher's end itself.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import socket
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from launcher.runtime import status, straggler
from launcher.runtime.node_watch import NodeWatch
from launcher.runtime.status import (ENDED, HANG_REQUEST, HEARTBEAT_S, STATUS_DIR, RankStatus, StallClock, hung_for,
                                     parse_ranges, peer_failure, rank_log, rank_ranges, read_attempt,
                                     read_stacks_request, status_dir)

WATCH_FILE = "watch.json"
# The launcher's own reading of every rank's file (no watch yet, or the watcher gone) costs one
# call per rank: at most this many a second on the run dir's file system.
FALLBACK_CALLS_PER_S = 1024
# The watcher's reading of every rank's file must fit well inside launcher.peer_timeout_s on a
# shared file system; a job larger than this many ranks per second of peer_timeout_s/3 is refused.
WATCHER_FILES_PER_S = 2048
# Saying a hang (every rank's stacks, the line of where each was, every rank saying it) takes a few
# beats; a rank whose watcher has not finished within this long ends all the same.
HANG_SAY_S = 60.0


def watch_path(run_dir: Path) -> Path:
    return Path(run_dir) / STATUS_DIR / WATCH_FILE


def max_ranks(peer_timeout_s: float) -> int:
    """The most ranks one watcher serves: it must read every rank's file (at
    ``WATCHER_FILES_PER_S`` on a shared file system) at least three times within
    ``launcher.peer_timeout_s``, or a live rank could be taken for a silent one."""
    return max(int(peer_timeout_s / 3 * WATCHER_FILES_PER_S), 64)


def scan_every_s(num_ranks: int) -> float:
    """How often the watcher reads every rank's file: every beat, or less often where the job is
    so large that a read of them all would take a noticeable part of the file system's time."""
    return max(HEARTBEAT_S, num_ranks / WATCHER_FILES_PER_S)


@dataclass
class Watch:
    """What the job's watcher saw at its last beat (``.xlaunch/watch.json``), or the launcher saw
    reading every rank's file itself (``fallback``)."""

    attempt: int = 0
    seq: int = 0  # one higher every beat: a watch that stops counting has lost its watcher
    time: float = 0.0
    ranks: int = 0  # the job's size
    states: dict[str, str] = field(default_factory=dict)  # state -> ranks in it (status.rank_ranges)
    verdict: str = ""  # why the job cannot go on ("" while it can)
    hang: bool = False  # no rank progressed for launcher.hang_timeout_s: every rank dumps its stacks
    hung: str = ""  # ... and this is where each one was: every rank says so and ends
    ending: bool = False  # every rank has said it hung: they end now, the watcher last
    stacks: float = 0.0  # the latest `xlaunch stacks` request (its id), for every rank to answer
    stop: dict = field(default_factory=dict)  # a stop request (mode=run's runtime/stop.py)
    # Rank 0's progress over its current piece of work: description, completed, total, started.
    progress: dict = field(default_factory=dict)
    # The ranks' host-side work per step scored (runtime/straggler.py: watch_entry): the slowest,
    # and those found slow; {} before any rank has published a window of steps.
    stragglers: dict = field(default_factory=dict)
    final: bool = False  # the watcher stopped on purpose (its rank ended): no further beat comes
    fallback: bool = False  # read by the launcher from every rank's file, not published by a watcher

    def ranks_in(self, *states: str) -> list[int]:
        return [r for s in states for r in parse_ranges(self.states.get(s, ""))]

    def count(self, *states: str) -> int:
        return len(self.ranks_in(*states))

    @property
    def present(self) -> set[int]:
        """The ranks that have written a status in this attempt."""
        return set(self.ranks_in(*self.states))


def read_watch(run_dir: Path) -> Watch | None:
    try:
        return Watch(**json.loads(watch_path(run_dir).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def summarize(statuses: dict[int, tuple[RankStatus, float]], num_ranks: int, attempt: int, peer_timeout_s: float,
              init_timeout_s: float, awake_since: float = 0.0, straggler_factor: float = 0.0) -> Watch:
    """The watch made from every rank's status (``status.read_statuses``' form): the one
    judgement of a job's ranks, by the watcher and by the launcher alike; with
    ``straggler_factor``, their steps scored too (``straggler.scores``)."""
    by_state: dict[str, list[int]] = {}
    for r, (st, _) in statuses.items():
        by_state.setdefault(st.state, []).append(r)
    verdict = peer_failure(Path(), peer_timeout_s, init_timeout_s, awake_since=awake_since, statuses=statuses)
    stopped = [st for st, _ in statuses.values() if st.state == "stopped"]
    if not verdict and stopped:  # ended because of a peer, or interrupted: it says which, or why
        st = min(stopped, key=lambda s: s.time)
        verdict = f"rank {st.rank} stopped on {st.host}: {st.message}"
    stragglers = {}
    if straggler_factor > 0:
        stragglers = straggler.watch_entry(*straggler.scores(
            {r: (st.node or st.host, st.steps) for r, (st, _) in statuses.items() if st.steps}, straggler_factor))
    return Watch(attempt=attempt, time=time.time(), ranks=num_ranks, verdict=verdict, stragglers=stragglers,
                 states={s: rank_ranges(rs) for s, rs in sorted(by_state.items())})


# --- the launcher's side ----------------------------------------------------------------------

class JobWatch:
    """The job's state as the waiting launcher (or ``xlaunch status``) reads it: the watch its
    watcher publishes, one file a poll; without a fresh one (no rank has joined yet, or rank 0
    is gone), every rank's file, at most once every ``fallback_s``."""

    def __init__(self, run_dir: Path, num_ranks: int, peer_timeout_s: float, init_timeout_s: float,
                 straggler_factor: float = 0.0) -> None:
        self.run_dir, self.num_ranks = Path(run_dir), num_ranks
        self.peer_timeout_s, self.init_timeout_s = peer_timeout_s, init_timeout_s
        self.straggler_factor = straggler_factor
        self.fallback_s = max(num_ranks / FALLBACK_CALLS_PER_S, 0.0)
        self._seen: tuple[int, int, float] | None = None  # (attempt, seq, when it changed: monotonic)
        self._last: Watch | None = None
        self._scanned = -float("inf")

    def stale_after_s(self) -> float:
        """How long a watch may go without a new beat before its watcher is taken for gone."""
        return max(self.peer_timeout_s, 3 * scan_every_s(self.num_ranks))

    def read(self, attempt: int, awake_since: float = 0.0, fallback: bool = True) -> Watch | None:
        """The job's watch in ``attempt``: its watcher's while fresh, else (``fallback``) one
        made from every rank's file, or the last one made while the next is not due."""
        w = read_watch(self.run_dir)
        now = time.monotonic()
        if w is not None and w.attempt == attempt:
            if self._seen is None or self._seen[:2] != (w.attempt, w.seq):
                self._seen = (w.attempt, w.seq, now)
            if w.final or now - max(self._seen[2], _monotonic(awake_since)) <= self.stale_after_s():
                return w
        if not fallback:
            return None
        if self._last is None or now - self._scanned >= self.fallback_s:
            self.scan(attempt, awake_since)
        return self._last

    def scan(self, attempt: int, awake_since: float = 0.0) -> Watch:
        """The watch made here from every rank's file (one read of each)."""
        self._scanned = time.monotonic()
        statuses = status.read_statuses(self.run_dir)
        self._last = summarize(statuses, self.num_ranks, attempt, self.peer_timeout_s, self.init_timeout_s,
                               awake_since, self.straggler_factor)
        self._last.fallback = True
        return self._last


def _monotonic(wall: float) -> float:
    """A wall-clock time as the monotonic clock's."""
    return time.monotonic() - (time.time() - wall) if wall else -float("inf")


# --- every rank -------------------------------------------------------------------------------

class RankReporter:
    """Writes this rank's status and heartbeats; once started, follows the job's watch (and, on
    the watcher's rank, makes it)."""

    def __init__(self, run_dir: Path, rank: int, num_ranks: int, attempt: int = 0,
                 watches: Sequence[int] | None = None, node_root: Path | None = None) -> None:
        """``watches``: the ranks this one watches (default: every rank on rank 0, none on the
        others; a backend whose ranks share no run dir, TPU's, has each watch its own)."""
        self.run_dir, self.rank, self.num_ranks, self.attempt = Path(run_dir), rank, num_ranks, attempt
        status_dir(run_dir).mkdir(parents=True, exist_ok=True)
        self.path = status_dir(run_dir) / f"rank{rank}.json"
        self.status = RankStatus(rank, "starting", os.getpid(), socket.gethostname(),
                                 str(rank_log(run_dir, rank)), pidns=status._pid_namespace(), attempt=attempt,
                                 node=status.node_name())
        self.watches = list(range(num_ranks) if rank == 0 else ()) if watches is None else list(watches)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The heartbeat thread writes this status too: a beat read before the main thread's
        # "failed" and written after it would put "joined" back (seen in CI: the crashed rank then
        # read as one that died without a word, and its peer's abort was blamed).
        self._writing = threading.Lock()
        self._written = 0.0  # when the status file was last written (a write is a heartbeat too)
        self._progress_written = 0.0
        self.progress_every_s = HEARTBEAT_S  # launcher.hang_timeout_s / 8 once started (start)
        self._log_fd: int | None = None
        self._log_pos = -1
        self._listeners: list[Callable[[Watch], None]] = []
        self.progress_report: dict = {}
        self._node_root = node_root
        self.node: NodeWatch | None = None  # registered once started (start)
        # This rank's host seconds per step (runtime/straggler.py), when the job scores its ranks;
        # published in its status at most every straggler.PUBLISH_EVERY_S.
        self.step_clock: straggler.StepClock | None = None
        self._steps_published = (0, 0.0)   # (steps, when)
        # Rank 0's: called in its main thread with each new scoring of the job's ranks (its scalars).
        self.on_scores: Callable[[int, dict], None] | None = None
        self._scores_seen = 0
        self._watcher: Watcher | None = None
        self.set("starting")

    def set(self, state: str, message: str = "", bad_input: bool = False) -> None:
        with self._writing:
            self.status.state, self.status.message, self.status.time = state, message, time.time()
            self.status.bad_input = bad_input
            self.status.progress = max(self.status.progress, self.status.time)
            self._write()

    def _write(self) -> None:
        status._write_json(self.path, asdict(self.status))
        self._written = self._progress_written = time.time()

    def progressed(self, when: float | None = None) -> None:
        """This rank made progress (a step, a profiled combination, a line in its log): written
        at most every ``progress_every_s`` (an eighth of launcher.hang_timeout_s, at most a
        minute), since steps can be far more frequent and the watcher needs no more to see a hang."""
        now = time.time() if when is None else when
        with self._writing:
            self.status.progress = max(self.status.progress, now)
            if now - self._progress_written >= self.progress_every_s:
                self._write()

    def stepped(self, step: int | None = None) -> None:
        """This rank finished a step (``step``: its number where the program gives one): its host
        time measured (``straggler.StepClock.mark``) and progress made."""
        if self.step_clock is not None:
            self.step_clock.mark(step)
            if not self._steps_published[0]:
                # Its first window published as soon as it is full, not at the next beat: of a
                # program stepping three times a second, a beat is six steps late.
                self._publish_steps()
            watch = self._watcher.last if self._watcher is not None else None
            if self.on_scores is not None and watch is not None and watch.stragglers and watch.seq > self._scores_seen:
                self._scores_seen = watch.seq
                self.on_scores(self.step_clock.steps if step is None else step, watch.stragglers)
        self.progressed()

    def last_scores(self) -> dict:
        """The job's scores of its ranks' steps at the watcher's last beat ({} on another rank)."""
        last = self._watcher.last if self._watcher is not None else None
        return dict(last.stragglers) if last is not None else {}

    def follow_log(self, fd: int) -> None:
        """Takes output to ``fd`` (this rank's log, which stdout and stderr go to) as progress: its
        position moves with every write, and reading it is no file-system call."""
        self._log_fd = fd

    def report_progress(self, description: str, completed: float, total: float, started: float,
                        first: tuple[float, float] | None = None) -> None:
        """Progress over the current piece of work (rank 0's), which the job's watch carries;
        ``first``: (when, how much was done) at its first unit done (``remaining_s``)."""
        self.progress_report = {"description": description, "completed": completed, "total": total,
                                "started": started, "first": list(first) if first else None, "time": time.time()}

    def listen(self, listener: Callable[[Watch], None]) -> None:
        """Calls ``listener`` with every watch this rank reads (mode=run's stop requests)."""
        self._listeners.append(listener)

    def start(self, peer_timeout_s: float, init_timeout_s: float, on_peer_failure: Callable[[str], None],
              hang_timeout_s: float = float("inf"), on_hang: Callable[[str], None] | None = None,
              straggler_factor: float = 0.0) -> None:
        """Heartbeats every ``HEARTBEAT_S`` from a thread. On each, the job's watch is read (or,
        on the watcher's rank, made): a verdict calls ``on_peer_failure``; a hang has this rank
        dump its stacks, say where every rank was and call ``on_hang``; a stack dump asked for
        (``xlaunch stacks``) is written. ``straggler_factor``: the watcher scores the ranks' steps
        (launcher.straggler.factor; 0: it does not)."""
        self.progress_every_s = min(max(hang_timeout_s / 8, HEARTBEAT_S), 60.0)
        self.node = NodeWatch(self.run_dir, self.rank, self.attempt, self._node_root)
        watcher = Watcher(self, peer_timeout_s, init_timeout_s, hang_timeout_s if on_hang else float("inf"),
                          straggler_factor) if self.watches else None
        follower = _Follower(self, peer_timeout_s, on_peer_failure, on_hang or on_peer_failure)
        self._watcher = watcher

        # Ranks join together: each beats at its own phase of the beat, so that thousands of them
        # do not ask the file system for the same things in the same millisecond.
        first = random.uniform(0.1, HEARTBEAT_S)

        def loop() -> None:
            clock = StallClock()
            if self._stop.wait(first):
                return
            while not self._stop.wait(scan_every_s(len(self.watches)) if watcher else HEARTBEAT_S):
                awake_since = clock.tick()
                self._heartbeat()
                if watcher is None:
                    watch = read_watch(self.run_dir)
                else:
                    watch = watcher.beat(awake_since)
                    if watch is None:  # the job went on to another attempt: this one's watch is over
                        return
                if follower.follow(watch, awake_since):
                    return

        self._thread = threading.Thread(target=loop, name="xlaunch-heartbeat", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        """This rank is alive (its file's time) and whether its log moved; its host's ranks checked."""
        if self._log_fd is not None:
            with contextlib.suppress(OSError):
                pos = os.lseek(self._log_fd, 0, os.SEEK_CUR)
                if pos != self._log_pos:
                    if self._log_pos >= 0:
                        self.progressed()
                    self._log_pos = pos
        self._publish_steps()
        if time.time() - self._written >= HEARTBEAT_S / 2:
            with contextlib.suppress(OSError):
                os.utime(self.path)
        if self.node is not None:
            self.node.beat()

    def _publish_steps(self) -> None:
        """This rank's figures into its status file, in place of the beat's touch, when it has new
        ones and published none for ``straggler.PUBLISH_EVERY_S``."""
        done, when = self._steps_published
        if self.step_clock is None or time.time() - when < straggler.PUBLISH_EVERY_S:
            return
        figures = self.step_clock.figures()
        if figures and figures["steps"] != done:
            with self._writing, contextlib.suppress(OSError):
                self.status.steps = figures
                self._write()
            self._steps_published = (figures["steps"], time.time())

    def stop(self) -> None:
        """This rank ends: its heartbeat stops, the watcher's rank publishes a last watch, and the
        rank leaves its host's register."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._watcher is not None:
            self._watcher.publish_final()
        if self.node is not None:
            self.node.close()


class _Follower:
    """What a rank does with the job's watch (every rank, the watcher's too)."""

    def __init__(self, reporter: RankReporter, peer_timeout_s: float, on_peer_failure: Callable[[str], None],
                 on_hang: Callable[[str], None]) -> None:
        self.r, self.peer_timeout_s = reporter, peer_timeout_s
        self.on_peer_failure, self.on_hang = on_peer_failure, on_hang
        # The stack request answered last: one made before this rank joined is not for it.
        self.answered = read_stacks_request(reporter.run_dir)
        self.seen: tuple[int, float] | None = None  # (seq, when it changed, monotonic)
        self.started = time.monotonic()
        self.dumped: float | None = None  # when this rank dumped its stacks for a hang

    def follow(self, watch: Watch | None, awake_since: float) -> bool:
        """Acts on one watch; True when this rank's watching is over."""
        r = self.r
        if watch is not None and watch.attempt > r.attempt:
            # This attempt is being requeued or restarted: its ranks end as the scheduler stops
            # them, and ending one first would fail the job step before the requeue is through.
            return True
        if watch is None or watch.attempt < r.attempt:
            return self._quiet(awake_since, "has published nothing")
        for listener in r._listeners:
            listener(watch)
        if watch.hang:
            return self._hang(watch)
        if watch.verdict and r.status.state not in ENDED:
            if len(r.watches) > 1:
                # The watcher's rank is the coordinator's: its end aborts its peers' JAX, so it
                # leaves them a beat to read the verdict and say they stopped.
                time.sleep(HEARTBEAT_S + 0.5)
            self.on_peer_failure(watch.verdict)
            return True
        if watch.stacks > self.answered:
            self.answered = watch.stacks
            status.dump_stacks(r.run_dir, r.rank, watch.stacks)
        if self.seen is None or self.seen[0] != watch.seq or watch.final:
            self.seen = (watch.seq, time.monotonic())
            return False
        return self._quiet(awake_since, f"has published nothing new since beat {watch.seq}")

    def _quiet(self, awake_since: float, what: str) -> bool:
        """The watch has not moved: after launcher.peer_timeout_s (from when this rank started
        following, or last woke) the watcher's rank is taken for gone, and this rank ends naming it."""
        since = max(self.seen[1] if self.seen else self.started, self.started, _monotonic(awake_since))
        if time.monotonic() - since <= max(self.peer_timeout_s, 3 * scan_every_s(self.r.num_ranks)):
            return False
        if read_attempt(self.r.run_dir).get("attempt", 0) > self.r.attempt:
            return True  # requeued: the watcher's rank ended with its attempt
        self.on_peer_failure(watcher_gone(self.r.run_dir, self.peer_timeout_s, what))
        return True

    def _hang(self, watch: Watch) -> bool:
        """The watcher found the job hung: this rank dumps its stacks, says where every rank was
        once the watcher has put it in one line, and ends once every rank has said it (each at its
        own beat: nothing here reads faster than a beat, however many ranks wait)."""
        r = self.r
        if self.dumped is None:
            self.dumped = time.monotonic()
            if r.rank not in r.watches:  # the watcher dumped its own as it asked
                status.dump_stacks(r.run_dir, r.rank, HANG_REQUEST)
        if watch.hung and r.status.state != "hung":
            r.set("hung", watch.hung)
        late = time.monotonic() - self.dumped > HANG_SAY_S
        if watch.ending or late:  # late: the watcher did not finish saying it (gone with its rank)
            self.on_hang(watch.hung or "no rank progressed for launcher.hang_timeout_s, and the job's watcher "
                                      "said no more")
            return True
        return False


def watcher_gone(run_dir: Path, peer_timeout_s: float, what: str, watcher: int = 0) -> str:
    """Why the watch stopped: what the watcher's rank said of its end, or that it died or went
    silent (one read of its status)."""
    try:
        data, mtime = status.read_status(status_dir(run_dir) / f"rank{watcher}.json")
        st = RankStatus(**json.loads(data))
    except (OSError, ValueError, TypeError):
        return f"rank {watcher}, the job's watcher, {what} for {peer_timeout_s:g} s and wrote no status"
    reason = peer_failure(run_dir, peer_timeout_s, float("inf"), statuses={watcher: (st, time.time() - mtime)})
    return reason or (f"rank {watcher}, the job's watcher, {what} for over {peer_timeout_s:g} s "
                      f"(launcher.peer_timeout_s; its state: {st.state} on {st.host}, see its log {st.log})")


class Watcher:
    """The job's watcher, on one rank: reads every watched rank's status once a beat, judges the
    job (``summarize``), passes on what was asked of every rank (a stack dump, a stop), finds a
    hang, and publishes it all as the job's watch."""

    def __init__(self, reporter: RankReporter, peer_timeout_s: float, init_timeout_s: float,
                 hang_timeout_s: float, straggler_factor: float = 0.0) -> None:
        self.r = reporter
        self.peer_timeout_s, self.init_timeout_s, self.hang_timeout_s = peer_timeout_s, init_timeout_s, hang_timeout_s
        self.straggler_factor = straggler_factor
        self._cache: dict[int, tuple[bytes, RankStatus]] = {}
        self.seq = 0
        self.last: Watch | None = None
        self.hang: Watch | None = None  # the hang being said, once found

    def statuses(self, attempt: int) -> dict[int, tuple[RankStatus, float]]:
        """Every watched rank's status of this attempt, and the age of its heartbeat: one open a
        rank, the file parsed again only when it changed; this rank's own from memory."""
        out = {}
        now = time.time()
        d = status_dir(self.r.run_dir)
        for rank in self.r.watches:
            if rank == self.r.rank:
                out[rank] = (RankStatus(**asdict(self.r.status)), 0.0)
                continue
            try:
                data, mtime = status.read_status(d / f"rank{rank}.json")
            except OSError:
                continue  # not started yet
            cached = self._cache.get(rank)
            if cached is None or cached[0] != data:
                try:
                    cached = (data, RankStatus(**json.loads(data)))
                except (ValueError, TypeError):
                    continue
                self._cache[rank] = cached
            if cached[1].attempt >= attempt:
                out[rank] = (cached[1], now - mtime)
        return out

    def beat(self, awake_since: float) -> Watch | None:
        """One beat: read, judge, publish; a hang is said here, from start to end. None once the
        job has gone on to a later attempt (a requeue, a restart), whose own watcher publishes."""
        run_dir = self.r.run_dir
        if read_attempt(run_dir).get("attempt", 0) > self.r.attempt:
            return None
        statuses = self.statuses(self.r.attempt)
        watch = summarize(statuses, len(self.r.watches), self.r.attempt, self.peer_timeout_s,
                          self.init_timeout_s, awake_since, self.straggler_factor)
        watch.stacks = read_stacks_request(run_dir)
        watch.progress = dict(self.r.progress_report)
        try:
            watch.stop = json.loads(status.stop_file(run_dir).read_text())
        except (OSError, ValueError):
            pass
        if not watch.verdict and hung_for(statuses, awake_since) > self.hang_timeout_s:
            watch = self._say_hang(watch, statuses, awake_since)
        return self.publish(watch)

    def publish(self, watch: Watch) -> Watch:
        # A rank found slow stays found for the attempt (``straggler.keep_found``), in every watch.
        watch.stragglers = straggler.keep_found(watch.stragglers, self.last.stragglers if self.last else None)
        self.seq += 1
        watch.seq = self.seq
        status._write_json(watch_path(self.r.run_dir), asdict(watch))
        self.last = watch
        return watch

    def publish_final(self) -> None:
        """The last watch, as the watcher's rank ends (it is marked final: no beat follows, and
        the launcher does not wait for one)."""
        if self.last is not None and not self.last.final:
            w = summarize(self.statuses(self.last.attempt), len(self.r.watches), self.last.attempt,
                          float("inf"), float("inf"), straggler_factor=self.straggler_factor)
            w.final = True
            with contextlib.suppress(OSError):
                self.publish(w)

    def _say_hang(self, watch: Watch, statuses: dict, awake_since: float) -> Watch:
        """No rank progressed for launcher.hang_timeout_s: every rank is asked for its stacks
        (this one's first), where each was is said in one line, every rank says it (``hung``)
        before any ends (a rank's end ends its peers' JAX: the coordination service aborts them),
        and the watcher's rank, the coordinator's, goes last."""
        r = self.r
        quiet = max(hung_for(statuses, awake_since), self.hang_timeout_s)
        watch.hang = True
        self.publish(watch)
        status.dump_stacks(r.run_dir, r.rank, HANG_REQUEST)
        stacks = status.wait_for_stacks(r.run_dir, HANG_REQUEST, len(r.watches), timeout_s=10)
        watch.hung = (f"no rank progressed for {quiet:.0f} s (launcher.hang_timeout_s={self.hang_timeout_s:g}): "
                      f"{status.where_ranks_are(stacks, len(r.watches))}")
        self.publish(watch)
        r.set("hung", watch.hung)
        # Every rank says it at its next beat (ranks that have ended already need not).
        deadline = time.monotonic() + 2 * HEARTBEAT_S + 1
        while time.monotonic() < deadline:
            time.sleep(1.0)
            if all(st.state != "joined" for st, _ in self.statuses(watch.attempt).values()):
                break
        watch.ending = True
        watch.states = summarize(self.statuses(watch.attempt), watch.ranks, watch.attempt, float("inf"),
                                 float("inf")).states
        watch.verdict = f"the job hung: {watch.hung}"
        self.publish(watch)
        time.sleep(HEARTBEAT_S + 0.5)  # the others read it at their next beat and end; the coordinator's rank last
        return watch


def check_size(num_ranks: int, peer_timeout_s: float) -> str:
    """Why one watcher cannot serve a job of ``num_ranks`` ("" when it can)."""
    limit = max_ranks(peer_timeout_s)
    if num_ranks <= limit:
        return ""
    needed = math.ceil(3 * num_ranks / WATCHER_FILES_PER_S)
    return (f"{num_ranks} ranks: the job's watcher reads every rank's status file (about {WATCHER_FILES_PER_S} a "
            f"second on a shared file system), which at this size takes {num_ranks / WATCHER_FILES_PER_S:.0f} s, "
            f"and launcher.peer_timeout_s={peer_timeout_s:g} must be at least three times that to tell a live rank "
            f"from a silent one: set launcher.peer_timeout_s={needed:.0f} or more (at most {limit} ranks at "
            f"{peer_timeout_s:g} s)")


def remaining_s(completed: float, total: float, first: Sequence[float] | None, now: float) -> float | None:
    """Seconds a piece of work has left at the pace it kept since its first unit was done
    (``first``: when, and how much was done then); None before a second is done. Not from its
    start: a race compiles every plan before its first step (a minute, on a user's model), and
    a pace from the start then put 61 minutes on a race of two."""
    if not first or completed <= first[1] or now <= first[0]:
        return None
    return (now - first[0]) / (completed - first[1]) * max(total - completed, 0)


__all__ = ["RankReporter", "Watch", "JobWatch", "Watcher", "read_watch", "summarize", "check_size",
           "max_ranks", "watch_path", "remaining_s", "HEARTBEAT_S"]
