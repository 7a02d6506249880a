"""The CFP profile pass: every plan combination of every unique segment, compiled and timed.

For each template, the first segment instance is turned into a program of that segment alone
(``segment_program.py``); for every combination of its blocks' plans the program is compiled
with those plans' sharding constraints on the real mesh, run (warm-up, then repeats) and its
median time and per-device memory (XLA's memory analysis) recorded. A template whose space
exceeds ``max_space`` is profiled in consecutive parts (``units.py``), so an MoE layer's
thousands of combinations become a few hundred; the search then treats the parts as segments,
with measured resharding between them.

Running a program costs something whatever it computes: dispatching its arguments, making its
results, starting and finishing every device. On small devices (and on CPU devices, always)
that cost is a large part of a segment's time, and a whole step pays it once, not once per
segment. So every program is timed alternately with its *overhead program*: the same
arguments and results (same shapes, same shardings), computing nothing. The segment's cost is
the difference; the whole step's own overhead program is measured once and added back by the
search. Gradient all-reduces get the same treatment (``programs.py``).

The parts, one concern each: ``units.py`` (what is profiled), ``candidates.py`` (the candidate
loop: compile, time, store), ``boundaries.py`` (tensors crossing between units, and the
resharding pairs they need), ``keys.py`` (profile-store keys), ``programs.py`` (the programs
timed besides the segments), ``measuring/timing.py`` (how a program is timed: in turns with its
overhead program, retaken when the hypervisor interrupted it, optionally from cold caches,
the slowest process's time). ``Profiler`` runs them in order and returns ``Profiles``.

Every result goes into the profile store (``measuring/store.py``) as soon as it is measured, so
an interrupted run resumes and a later one reuses. Rank 0 writes it and every process reads it
back, so with several hosts it must be on a shared filesystem (like the run dir).

CFP's profiling shortcuts (``candidates.Shortcuts``: ``memory_budget_bytes``,
``early_stop_ratio``; none by default) leave some entries untimed (over the memory budget: the
search never picks them) or timed only in part (stopped early: their time is a bound the
search may use as their cost); ``Profiles.timed`` and ``Profiles.bounded`` tell them apart. A
budget no plan can meet is refused before profiling or stops it as soon as that is known
(``budget.py``): then ``Profiles.infeasible`` says why, and the search refuses this mesh.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.graph import itemsize
from launcher.sharding.measuring.calibrate import calibrate, calibrated
from launcher.sharding.measuring.calibrate import programs as calibration_programs
from launcher.sharding.profile.boundaries import Boundary, find_boundaries, layout_pairs
from launcher.sharding.profile.budget import no_plan_fits, state_floor_bytes
from launcher.sharding.options import ProfileOptions
from launcher.sharding.profile.candidates import CandidateLoop, quick_compile_options
from launcher.sharding.profile.keys import StoreKeys
from launcher.sharding.profile.programs import (
    allreduce_time,
    gradient_allreduces,
    reshard_time,
    whole_overhead_entry,
)
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.measuring.timing import CacheFlush, Timer
from launcher.sharding.profile.units import Unit, profiling_units
from launcher.errors import UserError
from launcher.runtime import hosts

if TYPE_CHECKING:
    from jax.sharding import Mesh


@dataclass
class Profiles:
    units: list[Unit]
    table: dict[tuple[int, int], dict[tuple[int, ...], dict]]   # kind -> combo -> entry
    boundaries: list[Boundary]
    reshard: dict[tuple, float]         # (shape, dtype, src, dst) -> seconds, less the overhead
    whole_overhead_s: float = 0.0      # the whole step's overhead program (see the module doc)
    # per unit, per combo index: the mesh axes of each gradient all-reduce its program makes
    gradient_allreduces: list[list[frozenset]] | None = None
    allreduce_latency_s: dict[tuple[int, ...], float] = field(default_factory=dict)  # by axes
    measured: int = 0                   # entries measured by this run (compiled; timed or not)
    reused: int = 0                     # entries found in the store
    same_program: int = 0               # of those, another mesh's of the same per-device program (keys.py)
    seconds: float = 0.0
    # Of the entries measured by this run: not timed, their memory over the budget; and timed
    # only in part (stopped early). The table's own counts, reused entries included, are
    # ``over_budget_configs`` and ``stopped_early_configs``.
    skipped: int = 0
    stopped: int = 0
    candidates_s: float = 0.0           # of ``seconds``, in the candidate loop (what the shortcuts save on)
    # Set when the profile stopped because no plan on this mesh fits the memory budget
    # (``budget.py``; the table then holds only what was measured): why, the least memory a plan
    # needs as far as known, and the budget.
    infeasible: str | None = None
    least_plan_bytes: int = 0
    budget_bytes: float | None = None

    @property
    def profiled_configs(self) -> int:
        return sum(len(v) for v in self.table.values())

    @property
    def over_budget_configs(self) -> int:
        return sum(not self.timed(k, c) for k, combos in self.table.items() for c in combos)

    @property
    def stopped_early_configs(self) -> int:
        return sum(self.bounded(k, c) for k, combos in self.table.items() for c in combos)

    def timed(self, kind: tuple[int, int], combo: tuple[int, ...]) -> bool:
        """Whether the combination has a time: not when the profile skipped it for its memory
        (then no plan may hold it), nor when it did not profile it (``ProfileOptions.top_k``)."""
        e = self.table[kind].get(combo)
        return e is not None and not e.get("over_budget")

    def profiled(self, kind: tuple[int, int], combo: tuple[int, ...]) -> bool:
        """Whether the profile has an entry for the combination (timed, bounded or over budget)."""
        return combo in self.table[kind]

    def bounded(self, kind: tuple[int, int], combo: tuple[int, ...]) -> bool:
        """Whether the combination's time is only a bound: its first runs were over the early
        stop's ratio of its unit's best, and it was timed no further."""
        return bool(self.table[kind].get(combo, {}).get("stopped_early"))

    def unit_time(self, kind: tuple[int, int], combo: tuple[int, ...]) -> float:
        """A unit's measured time less its overhead program's: inside the whole step the units
        run as one program, which pays its overhead once (``whole_overhead_s``). Infinite for a
        combination the profile did not time (over its memory budget)."""
        if not self.timed(kind, combo):
            return float("inf")
        e = self.table[kind][combo]
        return max(e["time_s"] - e.get("overhead_s", 0.0), 0.0)

    def boundary_cost(self, b: Boundary, left_combo: int, right_combo: int) -> float:
        """Seconds of resharding across boundary ``b`` for the two units' combo indices (each
        measured as a program of its own, so less its overhead program, like ``unit_time``)."""
        total = 0.0
        for k in range(len(b.vars)):
            if b.from_left[k]:
                src, dst = b.produced[k][left_combo], b.wanted[k][right_combo]
            else:
                src, dst = b.produced[k][right_combo], b.wanted[k][left_combo]
            if src is not None and src != dst:
                total += self.reshard[(b.types[k], src, dst)] * b.count(k)
        return total


# What pricing resharding takes (``measuring/costmodel.py: reshard_seconds``).
RESHARD_COLLECTIVES = ("all-gather", "all-to-all")
# Of the resharding pairs that move a mesh axis, how many (the largest) are timed on each mesh.
MOVED_TIMED = 8


class Profiler:
    """The profile pass over analysis ``a`` on ``mesh``, measuring what ``store`` lacks."""

    def __init__(self, a: Analysis, mesh: Mesh, store: ProfileStore, options: ProfileOptions = ProfileOptions(), *,
                 keep: Sequence[Sequence[int]] = (), log: Callable[[str], None] = print, is_main: bool = True) -> None:
        """``options``: the profile's (repeats, warmup, cold caches, parts, the shortcuts,
        resharding); ``keep``: whole plans (a plan per block) whose combinations are profiled
        whatever ``profile_top_k`` keeps."""
        self.a, self.mesh, self.store, self.log, self.is_main = a, mesh, store, log, is_main
        self.timer = Timer(options.warmup, options.repeats, CacheFlush(mesh) if options.cold_caches else None)
        self.units = profiling_units(a, options.max_segment_space)
        self.keys = StoreKeys(a, mesh, options.cold_caches, quick_compile_options(options, mesh))
        self.loop = CandidateLoop(a, mesh, store, self.keys, self.timer, self.units, options, keep=keep, log=log,
                                  is_main=is_main)
        self.shortcuts, self.overlap = self.loop.shortcuts, self.loop.overlap
        self.top_k, self.measure_resharding = options.profile_top_k, options.measure_resharding
        self.budget_bytes = options.memory_budget_bytes
        self.priced = False   # resharding priced by the calibrated collectives (reshard_costs)
        self.moved_scale = (0, 1.0)   # pairs moving a mesh axis, and the scale their prices took (reshard_costs)

    def run(self, progress_factory: Callable[[int, str], Any] | None = None) -> Profiles:
        t0 = time.perf_counter()
        candidates = self.loop.candidates()
        missing = self.loop.missing(candidates)
        todo = [c for c, m in zip(candidates, missing, strict=True) if m]
        reused = len(candidates) - len(todo)
        budget = self.shortcuts.memory_budget_bytes
        # A true floor (every input is held somewhere): refused at the budget itself, shortcuts or not.
        if self.budget_bytes is not None and state_floor_bytes(self.a) > self.budget_bytes:
            raise UserError(no_plan_fits(self.budget_bytes, state_floor_bytes(self.a), "",
                                         f"its parameters, optimizer state and batch alone, split over all "
                                         f"{self.mesh.devices.size} devices"))
        space = self.loop.space()
        chosen = "" if len(candidates) == space else (
            f" of their {space}: the {self.top_k} of each a rough cost model ranks first and the plans nearest the "
            "baselines (mode.profile_top_k=0 profiles every one)")
        same = self.loop.counts["same_program"]
        self.log(f"profile: {len(candidates)} combinations over {len(self.loop.first)} units{chosen} "
                 f"({reused} reused from the store"
                 + (f", {same} of them as the same per-device program measured on another mesh" if same else "")
                 + f", {len(todo)} to measure)")
        ctx = progress_factory(len(todo), "profiling segments") if progress_factory else contextlib.nullcontext()
        t_loop = time.perf_counter()
        with ctx as progress:
            measured = self.loop.measure(todo, progress)
        hosts.barrier("cfp-profile")
        candidates_s = time.perf_counter() - t_loop
        counts = self.loop.counts
        if self.loop.infeasible:
            return Profiles(self.units, self.loop.table(partial=True, profiled=candidates), [], {}, measured=measured,
                            reused=reused, same_program=same,
                            seconds=time.perf_counter() - t0, skipped=counts["over_budget"],
                            stopped=counts["stopped_early"], candidates_s=candidates_s,
                            infeasible=self.loop.infeasible, least_plan_bytes=self.loop.least_plan_bytes,
                            budget_bytes=budget)
        if measured:
            sc = self.shortcuts
            budget = f"{sc.memory_budget_bytes / 2**30:.6g} GB" if sc.memory_budget_bytes is not None else "none set"
            rule = (f"first {sc.early_stop_after} runs over {sc.early_stop_ratio:g}x their segment's best"
                    if sc.early_stop_ratio > 0 else "early stop off")
            self.log(f"profile: of {measured} measured, {counts['timed']} timed in full, {counts['over_budget']} not "
                     f"timed (no plan within the memory budget, {budget}, holds them), {counts['stopped_early']} "
                     f"stopped early ({rule})")
        table = self.loop.table(profiled=candidates)
        boundaries = find_boundaries(self.a, self.units)
        reshard, n_reshard = self.reshard_costs(boundaries, table)
        moved, scale = self.moved_scale
        how = (f"priced by the calibrated collectives; of the {moved} that move a mesh axis the largest "
               f"{min(moved, MOVED_TIMED)} timed ({n_reshard} now), the others priced x{scale:.2f} as those timed"
               if self.priced else f"{n_reshard} measured now")
        self.log(f"profile: resharding between {len(boundaries)} pairs of units: {len(reshard)} layout pairs ({how})")
        whole = self.whole_overhead()
        self.log(f"profile: running a program with the whole step's arguments and results costs "
                 f"{whole * 1e3:.3f} ms whatever it computes (taken off every unit and resharding as "
                 "measured alone, added once to the whole step)")
        grads = gradient_allreduces(self.a, self.units)
        latency = {axes: self.allreduce_latency(axes) for axes in sorted({ax for u in grads for c in u for ax in c})}
        if latency:
            each = ", ".join(f"{t * 1e3:.3f} ms over mesh axes {list(axes)}" for axes, t in latency.items())
            self.log(f"profile: one all-reduce costs {each} (paid once per step for the gradients, which the "
                     "whole step combines)")
        return Profiles(self.units, table, boundaries, reshard, whole_overhead_s=whole, gradient_allreduces=grads,
                        allreduce_latency_s=latency, measured=measured, reused=reused, same_program=same,
                        seconds=time.perf_counter() - t0, skipped=counts["over_budget"],
                        stopped=counts["stopped_early"], candidates_s=candidates_s)

    def reshard_costs(self, boundaries: list[Boundary], table: dict) -> tuple[dict[tuple, float], int]:
        """The resharding each boundary needs between combinations the table has (the search
        uses no other): each measured (``measure_resharding``, as CFP's artifact does), else
        priced by the mesh's collectives (the cost model the ILP prices with too,
        ``measuring/calibrate.py``: a few dozen programs timed once per mesh and machine, for
        every model, where the pairs are hundreds per model)."""
        costs, measured = {}, 0
        profiled = [[k for k, c in enumerate(u.combos()) if c in table[u.kind]] for u in self.units]
        pairs = layout_pairs(boundaries, profiled)
        # Priced where the mesh's calibration is in the store already, or where measuring the
        # pairs would time more programs than calibrating does (a collective program of the
        # calibration costs about two of a pair's).
        if pairs and not self.measure_resharding and (
                calibrated(self.mesh, self.store, RESHARD_COLLECTIVES, self.is_main)
                or len(pairs) > 2 * calibration_programs(self.mesh, RESHARD_COLLECTIVES)):
            model, new, seconds = calibrate(self.mesh, self.store, is_main=self.is_main, log=self.log,
                                            kinds=RESHARD_COLLECTIVES, matmul=False)
            if new:
                self.log(f"profile: the mesh's collectives calibrated in {seconds:.1f} s (kept in the store for every "
                         "model on this mesh)")
            self.priced = True
            costs = {p: model.reshard_seconds(p[0][0], itemsize(p[0][1]), p[1], p[2]) for p in pairs}
            # Pairs that move a mesh axis between dimensions XLA does in steps and copies no line
            # prices (``CommModel.moves_an_axis``: a quarter of their time on the pjit guide's
            # weights): the largest few are timed as XLA does them, and the others priced times
            # the median of those times over their prices.
            moved = sorted((p for p in pairs if model.moves_an_axis(p[1], p[2])),
                           key=lambda p: (-math.prod(p[0][0]) * itemsize(p[0][1]), repr(p)))
            ratios = []
            for p in moved[:MOVED_TIMED]:
                priced = costs[p]
                costs[p], new = self._stored(self.keys.reshard(p), lambda p=p: reshard_time(
                    p[0][0], p[0][1], p[1], p[2], self.mesh, self.timer))
                measured += new
                if priced > 0:
                    ratios.append(costs[p] / priced)
            scale = float(np.median(ratios)) if ratios else 1.0
            for p in moved[MOVED_TIMED:]:
                costs[p] *= scale
            self.moved_scale = (len(moved), scale)
            return costs, measured
        for p in pairs:
            costs[p], new = self._stored(self.keys.reshard(p), lambda p=p: reshard_time(p[0][0], p[0][1], p[1], p[2],
                                                                                    self.mesh, self.timer))
            measured += new
        return costs, measured

    def allreduce_latency(self, axes: tuple[int, ...]) -> float:
        return self._stored(self.keys.allreduce_latency(axes),
                            lambda: allreduce_time(self.mesh, axes, self.timer, max(self.timer.repeats, 30)))[0]

    def whole_overhead(self) -> float:
        """The whole step's overhead program (``programs.whole_overhead_entry``)."""
        return self._stored(self.keys.whole_overhead(), lambda: whole_overhead_entry(self.a, self.mesh, self.timer))[0]

    def _stored(self, key: dict, measure: Callable[[], dict]) -> tuple[float, bool]:
        """(seconds less the overhead, whether measured now) of the store's entry for ``key``;
        when rank 0 lacks it, every process measures (``measure`` returns the entry) and rank 0
        writes it. Rank 0's value counts everywhere (the store holds only its entries)."""
        entry = self.store.get(key) if self.is_main else None
        missing = not _broadcast_flag(entry is not None)
        if missing:
            entry = measure()
            if self.is_main:
                self.store.put(key, entry)
        seconds = max(entry["time_s"] - entry.get("overhead_s", 0.0), 0.0) if self.is_main else 0.0
        return _broadcast_float(seconds), missing


# Multi-process agreement (no-ops with one process)

def _broadcast_flag(flag: bool) -> bool:
    return bool(hosts.broadcast(np.array([int(flag)], dtype=np.int32))[0])


def _broadcast_float(x: float) -> float:
    return float(hosts.broadcast(np.array([x], dtype=np.float64))[0])
