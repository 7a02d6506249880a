"""A slow rank named: each rank's host-side work per step, and two scores made from it.

Ranks that meet in a collective every step all take the same wall time per step, the fast ones
waiting inside the collective for the slow one. What tells them apart is what each spends outside
that wait, and each rank measures it as its main thread's CPU time per step: its Python, a data
pipeline run in that thread, JAX's dispatch. A thread waiting in a collective or for the device
uses no CPU. (Wall time outside the wait would do where every rank has cores of its own; where
ranks share cores, as on an oversubscribed node or this project's test machine, the ranks that
wait hand the slow one their cores and wall time hides most of the difference: 8 ranks on 2 cores,
one with 1.3x the host work, took 1.07x the median's wall time outside the wait and 1.27x its CPU
time.) Not seen: a slowdown on the device itself (that rank's main thread waits like every other),
in a loader's own threads or processes, or in I/O.

A step is what the program says it is: mode=train's steps, ``launcher.context().step()``, or a
``launcher.context().log(step, ...)`` at a new step (logging every tenth step counts ten).

Scores, as NVIDIA's resiliency extension names them (0 worst, 1 best), but against the median
rank rather than the fastest, so that one fast outlier does not flag every other rank:

- *relative*: the median rank's host seconds per step over this rank's (0.77: 1.3x slower), in
  the better of its last two windows once it has two (below: a rank is slow only where both say
  so, and a burst of shared cores in one window is not its score; CI's even job ended with a
  rank's last window at 0.77);
- *individual*: this rank's best over its current (its lowest median over a window of steps, of
  those it published).

A rank is *slow* once, over its last ``launcher.straggler.steps`` steps, both its median step and
its fastest took more than ``launcher.straggler.factor`` times the median rank's (median, fastest):
slower as a rule and even at its best, so for that many steps, not once. Like against like: where
ranks share cores every rank's step swings with the load (a tenth to a fifth, step to step, with 8
ranks on 2 cores beside another job), and a rank 1.25x slower had a step under the median rank's
median in most windows, so its fastest step against the others' median missed it, every run.
Once a rank has two windows of steps, the window before its last must say so too (against the
others' window before): under shared cores one rank's steps now and then take a third longer for
ten steps or so, then not (seen on 8 ranks of 25 ms steps beside other jobs: 1.23x for 4 windows
of 200; in CI, 1.24x), where a slow rank stays slow. A rank slow from the start is named at its
first window, one that turns slow after twice as many steps.

Once found slow, a rank stays in the watch's ``slow`` for the attempt (``keep_found``): the
console names it once, and result.json and the time accounting say which ranks were slow though
the last window, as noisy as the others, dipped under the line.

Each rank publishes its figures in its status file (``status.RankStatus.steps``), no more often
than every ``PUBLISH_EVERY_S``, and instead of a heartbeat's touch: the job's watcher, which
reads every rank's file anyway, scores them (``scores``), and the job's watch carries the slowest
ranks to the launcher and ``xlaunch status``.
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from launcher.runtime.status import HEARTBEAT_S

# A rank's figures reach its status file at most this often (a write in place of the beat's touch,
# one call more on the run dir: 0.25 a second a rank at most).
PUBLISH_EVERY_S = 2 * HEARTBEAT_S
# How many of the slowest ranks the job's watch, xlaunch status and result.json name.
SLOWEST = 5
# Each rank's scores go to TensorBoard (straggler/relative/rank<N>) up to this many ranks; beyond,
# the lowest of each score and which rank has it.
EACH_RANK_UP_TO = 64


def _main_thread_cpu() -> Callable[[], float]:
    """A clock of the main thread's CPU seconds, readable from any thread (the steps are marked
    from wherever the program calls; its work is in its main thread). The process's where the
    platform has no per-thread clock."""
    try:
        clock = time.pthread_getcpuclockid(threading.main_thread().ident)
        time.clock_gettime(clock)
        return lambda: time.clock_gettime(clock)
    except (AttributeError, OSError):
        return time.process_time


class StepClock:
    """One rank's host seconds per step over its last ``window`` steps, and the ``window`` before.

    ``mark`` at each step (from the program's calls); ``record`` for a step measured elsewhere
    (the scale bench's simulated ranks). ``figures`` is what the rank publishes."""

    def __init__(self, window: int, cpu: Callable[[], float] | None = None) -> None:
        self.window = max(int(window), 1)
        self._cpu = cpu or _main_thread_cpu()
        self._host: collections.deque[float] = collections.deque(maxlen=2 * self.window)
        self._wall: collections.deque[float] = collections.deque(maxlen=self.window)
        self._last: tuple[float, float] | None = None   # (cpu, wall) at the last mark
        self._step: int | None = None
        self._by_log = False      # the program numbers its steps (log): step() calls are not counted again
        self.steps = 0            # steps measured
        self.best_s = float("inf")
        self._lock = threading.Lock()

    def mark(self, step: int | None = None) -> None:
        """A step ended: ``step`` its number (a log call's), None for one more (``step()``). A
        number not above the last (a second scalar of the same step, a restart's first) starts
        the count again from here."""
        cpu, wall = self._cpu(), time.monotonic()
        if step is None:
            if self._by_log:
                return
            n = 1
        else:
            self._by_log = True
            n = step - self._step if self._step is not None else 0
            self._step = step
        last, self._last = self._last, (cpu, wall)
        if last is None or n <= 0:
            return
        self.record((cpu - last[0]) / n, (wall - last[1]) / n, n)

    def record(self, host_s: float, wall_s: float, steps: int = 1) -> None:
        """``steps`` steps of ``host_s`` host (main thread CPU) and ``wall_s`` wall seconds each."""
        with self._lock:
            for _ in range(min(steps, 2 * self.window)):
                self._host.append(host_s)
                self._wall.append(wall_s)
            self.steps += steps

    def figures(self) -> dict:
        """What the rank publishes once it has a window of steps ({} before): steps measured, the
        median and the lowest host seconds per step over the window, its best median (of those
        asked for here: a step only appends, whatever the program's pace), the median wall
        seconds per step; once it has two windows, the median and the lowest over the one before
        (``before_s``, ``before_low_s``). ``over``: how many steps they speak for."""
        with self._lock:
            if len(self._host) < self.window:
                return {}
            steps = list(self._host)
            last, before = steps[-self.window:], steps[:-self.window]
            host = statistics.median(last)
            self.best_s = min(self.best_s, host)
            out = {"steps": self.steps, "host_s": host, "low_s": min(last), "best_s": self.best_s,
                   "step_s": statistics.median(self._wall), "over": self.window}
            if len(before) == self.window:
                out.update(before_s=statistics.median(before), before_low_s=min(before), over=2 * self.window)
            return out


@dataclass(frozen=True)
class Score:
    rank: int
    node: str
    relative: float     # the median rank's host time per step / this rank's (the better of its two windows)
    individual: float   # this rank's best / its current
    host_s: float
    steps: int
    slow: bool          # its median and its fastest step of the window (and of the one before) above factor x the median rank's
    over: int = 0       # how many of its last steps say so (its figures' ``over``)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "node": self.node, "relative": round(self.relative, 4),
                "individual": round(self.individual, 4), "host_s": self.host_s, "steps": self.steps,
                "slow": self.slow, "over": self.over}

    def text(self) -> str:
        return (f"rank {self.rank} on {self.node} (relative {self.relative:.2f}, individual {self.individual:.2f}, "
                f"{1e3 * self.host_s:.1f} ms host work a step)")


def scores(figures: Mapping[int, tuple[str, Mapping]], factor: float) -> tuple[float, list[Score]]:
    """The ranks' scores from their published figures (rank -> (node, ``StepClock.figures``)),
    slowest first, and the median rank's host seconds per step (0.0 with none)."""
    have = {r: (node, f) for r, (node, f) in figures.items() if f and f.get("host_s", 0) > 0}
    if not have:
        return 0.0, []
    median, slow_now = _window(have.values(), "host_s", "low_s", factor)
    median_before, slow_before = _window(have.values(), "before_s", "before_low_s", factor)

    def relative(f: Mapping) -> float:   # in the better of its two windows
        now = median / f["host_s"]
        return max(now, median_before / f["before_s"]) if median_before and f.get("before_s") else now

    out = [Score(r, node, relative=relative(f), individual=min(f.get("best_s", f["host_s"]) / f["host_s"], 1.0),
                 host_s=f["host_s"], steps=int(f.get("steps", 0)), over=int(f.get("over", 0)),
                 slow=slow_now(f) and ("before_s" not in f or slow_before(f)))
           for r, (node, f) in have.items()]
    out.sort(key=lambda s: (s.relative, s.rank))
    return median, out


def _window(figures: Iterable[tuple[str, Mapping]], median_key: str, low_key: str,
            factor: float) -> tuple[float, Callable[[Mapping], bool]]:
    """Of the ranks that have a window (their figures' ``median_key``, ``low_key``): the median
    rank's median (0.0 with none), and whether a rank's window took over ``factor`` times the
    median rank's, median against median and fastest against fastest."""
    have = [f for _, f in figures if f.get(median_key)]
    if not have:
        return 0.0, lambda f: False
    median = statistics.median(f[median_key] for f in have)
    median_low = statistics.median(f.get(low_key, f[median_key]) for f in have)
    return median, lambda f: f[median_key] > factor * median and f.get(low_key, f[median_key]) > factor * median_low


def watch_entry(median: float, ranked: list[Score]) -> dict:
    """What the job's watch carries of them: the slowest few, and every rank found slow (at most
    ``SLOWEST`` more: a job whose every rank is slow is a job whose median moved)."""
    if not ranked:
        return {}
    slow = [s for s in ranked if s.slow]
    entry = {"median_host_s": median, "scored": len(ranked),
             "slowest": [s.to_dict() for s in ranked[:SLOWEST]],
             "slow": [s.to_dict() for s in slow[:2 * SLOWEST]],
             "lowest_individual": min(s.individual for s in ranked)}
    if len(ranked) <= EACH_RANK_UP_TO:   # a small job's every rank, for its curves
        entry["relative"] = {str(s.rank): round(s.relative, 4) for s in sorted(ranked, key=lambda s: s.rank)}
    return entry


def keep_found(entry: dict, before: Mapping | None) -> dict:
    """``entry`` (``watch_entry``'s) with the ranks ``before`` (the attempt's previous one) found
    slow kept in its ``slow``, as they were when found: a rank's last window dips under the line as
    often as an even rank's rises toward it, and what was found is not taken back."""
    found = list((before or {}).get("slow", []))
    if not entry or not found:
        return entry
    now = {s["rank"] for s in entry["slow"]}
    return {**entry, "slow": (entry["slow"] + [s for s in found if s["rank"] not in now])[:2 * SLOWEST]}


def warning(entry: Mapping, median_s: float, factor: float, steps: int) -> str:
    """The console's one line for a slow rank (one of ``watch_entry``'s ``slow``)."""
    return (f"rank {entry['rank']} on {entry['node']} is slow: its host-side work took more than "
            f"launcher.straggler.factor={factor:g} times the median rank's over its last {entry.get('over') or steps} steps "
            f"(relative score {entry['relative']:.2f}, individual {entry['individual']:.2f}; "
            f"{1e3 * entry['host_s']:.1f} ms a step against {1e3 * median_s:.1f} ms; "
            "xlaunch status names the slowest)")


def status_rows(entry: Mapping) -> list[tuple[str, str]]:
    """``xlaunch status``'s rows (label, text) for the watch's entry: the slowest ranks."""
    if not entry:
        return []
    rows = [("slowest ranks", f"host work a step against the median rank's {1e3 * entry['median_host_s']:.1f} ms "
                              f"({entry['scored']} ranks scored)")]
    found = {s["rank"] for s in entry.get("slow", [])}   # found slow in the attempt, if not in this window
    rows += [("", f"rank {s['rank']} on {s['node']}: relative {s['relative']:.2f}, individual {s['individual']:.2f}, "
                  f"{1e3 * s['host_s']:.1f} ms{' (slow)' if s['slow'] or s['rank'] in found else ''}")
             for s in entry["slowest"]]
    return rows


def tensorboard(entry: Mapping) -> dict[str, float]:
    """The scalars rank 0 writes of the scores (``straggler/`` prefixed by the caller): the lowest
    of each score, the slowest rank, how many are slow, and a small job's every rank's."""
    if not entry:
        return {}
    low = entry["slowest"][0]
    out = {"relative_min": low["relative"], "individual_min": entry["lowest_individual"],
           "slowest_rank": float(low["rank"]), "slow_ranks": float(len(entry["slow"]))}
    for rank, rel in entry.get("relative", {}).items():
        out[f"relative/rank{rank}"] = rel
    return out


__all__ = ["StepClock", "Score", "scores", "watch_entry", "keep_found", "warning", "status_rows", "tensorboard",
           "PUBLISH_EVERY_S", "SLOWEST", "EACH_RANK_UP_TO"]
