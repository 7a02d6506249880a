"""The candidate loop: every plan combination of the first unit of each kind, compiled as a
program of that unit alone with those plans' sharding constraints, timed beside its overhead
program and stored as soon as its kind's are measured.

Candidates are compiled in batches of whole unit kinds, the job's processes sharing each batch's
compiles (``launcher/runtime/compile_share.py``: each compiles its share and loads the others'),
then each kind's combinations are timed in rounds (``Timer.rounds``: every round runs each once,
beside its overhead program), so the machine's drift falls on the combinations compared alike.
Timed one after another, as CFP's artifact does (``interleave=False``), the same 10 runs picked a
unit's truly fastest combination in 60% of units, in rounds in 65% (three runs of
``bench/bench_profile_timing.py``, docs/benchmarks.md). With ``overlap`` the next batch compiles on
a worker thread while this one is timed. Every process runs the same candidates in the same order
(the collectives need it); rank 0 decides which the store lacks and writes the entries.

CFP's two profiling shortcuts (``Shortcuts``; its artifact's ``test_exec`` and
``benchmark_func``, ``alpa/shard_parallel/exp.py``):

- a candidate whose compiled per-device memory (XLA's memory analysis, the ``mem_bytes`` the
  search adds up), with the least memory every other unit of the model needs, is over the
  memory budget is not timed: no plan under that budget can hold it, since the search's plan
  memory is the sum of its units' figures. (The artifact compares a candidate's own memory with
  the device's; a whole plan's budget compares the plan's, and the candidate's own memory alone
  would skip none of a small model's candidates while any plan fits.) The other units count
  with the least memory of their kind where every combination of it is known (compiled earlier
  in the run, or in the store), else with nothing, so the figure, ``plan_floor_bytes``, is a
  floor: nothing skipped could be in a plan within the budget. The entry keeps the candidate's
  memory and that floor, marked ``over_budget`` with ``time_s`` null;
- a candidate whose first timed runs are all over ``early_stop_ratio`` times the fastest
  candidate of its unit timed in full so far (``timing.EarlyStop``) is not timed further. In
  rounds, that yardstick is the faster of the best timed in full before and the candidate of the
  same rounds whose slowest first run is the fastest. Its entry is marked ``stopped_early``: its
  ``time_s`` comes from those first runs, and the candidate is at least ``early_stop_ratio`` times
  slower than the best, so the search may use it as its cost (it cannot be its unit's best) but
  nothing may take it for a full measurement.

A budget no plan can meet stops the loop as soon as that is known (``budget.py``): once every
combination of a unit kind has a known memory and those kinds' least memories add up to more
than the budget, ``infeasible`` says so and nothing more is compiled on this mesh. So that this
is known early, the kinds with the fewest combinations (an embedding, a head) are profiled first.

Which stored entries a run reuses follows from what they promise (``Shortcuts.reuses``): an
``over_budget`` entry only while the run's budget is still below its floor (a run with a larger
budget, or without the shortcut, times it), a ``stopped_early`` one only while the run stops at
least as eagerly (a run without early stop measures it in full). Every process takes each
decision on rank 0's figures (memory) or the slowest process's (times), broadcast by rank 0.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import statistics
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np

from launcher.models.train import memory_stats
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.options import ProfileOptions
from launcher.sharding.profile.budget import UNITS_OVER_STEP, least_plan_bytes, no_plan_fits, state_floor_bytes
from launcher.sharding.profile.estimate import ranked
from launcher.sharding.profile.keys import StoreKeys
from launcher.sharding.profile.segment_program import (
    SegmentProgram,
    boundary_bytes,
    build,
    input_layouts,
    segment_program,
    synthetic_inputs,
)
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.measuring.timing import EarlyStop, Timer, overhead_program
from launcher.sharding.profile.units import Unit, first_units
from launcher import jaxcompat
from launcher.runtime import compile_share, hosts

if TYPE_CHECKING:
    from jax.sharding import Mesh

Candidate = tuple[Unit, tuple[int, ...]]

# Timed runs an early stop decides on: the artifact's two.
EARLY_STOP_AFTER = 2
# Candidates compiled together (at least two per process): enough for the job's processes to
# compile side by side, few enough that their arguments, held until timed, stay small. Batches
# hold whole unit kinds (a kind is timed in rounds once all of it is compiled), packed up to
# ROUNDS_AT_MOST, and a kind with more combinations (``profile_top_k=0``) is timed in parts of that many.
BATCH = 8
ROUNDS_AT_MOST = 16


class _Submitted(NamedTuple):
    program: compile_share.Compiling
    args: list[Any]
    boundary: int        # bytes of its inputs from other units
    lowering_s: float    # making its arguments and lowering it


@dataclass(frozen=True)
class Shortcuts:
    """CFP's profiling shortcuts (see the module doc). The defaults take none."""
    memory_budget_bytes: float | None = None   # per device: candidates no plan within it holds are not timed
    early_stop_ratio: float = 0.0              # 0: every candidate timed in full
    early_stop_after: int = EARLY_STOP_AFTER
    # How far the segments' sum may pass the budget before it rules a plan out (budget.py:
    # UNITS_OVER_STEP from a search's options; 1 where the sum itself is the budget's measure).
    units_over_step: float = 1.0

    @classmethod
    def of(cls, options: ProfileOptions) -> "Shortcuts":
        """The shortcuts ``options`` ask for: the budget where ``skip_over_budget`` (the segments'
        sum allowed ``UNITS_OVER_STEP`` times it), the early stop."""
        return cls(options.memory_budget_bytes if options.skip_over_budget else None, options.early_stop_ratio,
                   units_over_step=UNITS_OVER_STEP)

    def over_budget(self, plan_floor_bytes: float) -> bool:
        return self.memory_budget_bytes is not None and \
            plan_floor_bytes > self.memory_budget_bytes * self.units_over_step

    def reuses(self, entry: dict) -> bool:
        """Whether a stored entry stands for this run's measurement of its candidate."""
        if entry.get("over_budget"):
            # Infeasible under any budget below its floor, and only there: never a time.
            return self.over_budget(entry.get("plan_floor_bytes", entry["mem_bytes"]))
        if entry.get("stopped_early"):
            # A bound, good for a run that would have stopped at least as soon (same ratio or a
            # smaller one); a run that asks for more (a larger ratio, or none) measures it.
            return 0 < self.early_stop_ratio <= entry.get("stop_ratio", 0.0)
        return True


# XLA:CPU's quicker code generation (``ProfileOptions.quick_compile``): its LLVM IR emitters, not
# its newer MLIR fusion emitters, and LLVM at O1. On the Linen LM's profiled programs the two
# together compiled 1.9-2.0x faster, the emitters alone 1.4x, O1 alone 1.2x (by hand; the
# emitters with one codegen thread, xla_cpu_parallel_codegen_split_count=1, no faster at all),
# docs/benchmarks.md.
QUICK_CPU_COMPILE = {"xla_cpu_use_fusion_emitters": False, "xla_backend_optimization_level": 1}


def quick_compile_options(options: ProfileOptions, mesh: Mesh) -> dict[str, Any]:
    """The XLA options the profiled programs compile with (``ProfileOptions.quick_compile``;
    None: on one process's CPU devices): ``QUICK_CPU_COMPILE``, less any option the jaxlib does
    not know or ``XLA_FLAGS`` sets (the process's own flags stand, as they do for the step)."""
    quick = options.quick_compile
    if quick is None:
        quick = mesh.devices.flat[0].platform == "cpu" and jax.process_count() == 1
    if not quick:
        return {}
    flags = os.environ.get("XLA_FLAGS", "")
    wanted = {k: v for k, v in QUICK_CPU_COMPILE.items() if not re.search(rf"--{k}(=|\s|$)", flags)}
    return jaxcompat.known_compile_options(wanted)


def overlaps(options: ProfileOptions, mesh: Mesh) -> bool:
    """Whether the next candidate compiles while this one is timed (``overlap_compile``; None:
    on accelerators, not on CPU devices, where the compiler would share the timed program's cores)."""
    if options.overlap_compile is not None:
        return options.overlap_compile
    return mesh.devices.flat[0].platform != "cpu"


def timed_in_full(entry: dict) -> bool:
    return not entry.get("over_budget") and not entry.get("stopped_early")


class CandidateLoop:
    def __init__(self, a: Analysis, mesh: Mesh, store: ProfileStore, keys: StoreKeys, timer: Timer,
                 units: Sequence[Unit], options: ProfileOptions = ProfileOptions(), *,
                 keep: Sequence[Sequence[int]] = (), log: Callable[[str], None] = print, is_main: bool = True) -> None:
        self.a, self.mesh, self.store, self.keys, self.timer = a, mesh, store, keys, timer
        self.log, self.is_main, self.shortcuts = log, is_main, Shortcuts.of(options)
        self.compile_options = keys.compile_options   # what the entries' keys say they were compiled with
        self.overlap, self.interleave = overlaps(options, mesh), options.interleave
        # Which combinations of a kind are profiled: the ``profile_top_k`` the rough model ranks
        # first (``estimate.py``; 0: every one) and those of the whole plans ``keep`` (the plans
        # nearest the baselines, which the search measures beside its own).
        self.top_k, self.keep = options.profile_top_k, [list(plan) for plan in keep]
        self.first = first_units(units)
        self.units = list(units)
        self._programs: dict[tuple[int, int], SegmentProgram] = {}
        self._program_keys: dict[tuple[tuple[int, int], tuple[int, ...]], dict] = {}
        self._split = {u.kind[0] for u in units if u.kind[1] > 0}  # templates profiled in parts
        # Per kind: (time_s, overhead_s) of the fastest candidate timed in full (the early stop's
        # yardstick), the same on every process: from rank 0's store (``missing``) and the
        # slowest process's times since.
        self.best: dict[tuple[int, int], tuple[float, float]] = {}
        # By this run: timed in full, not timed (over the memory budget), stopped early; and found
        # as the same program measured on another mesh (``same_program``).
        self.counts = {"timed": 0, "over_budget": 0, "stopped_early": 0, "same_program": 0}
        # For the memory floor: units per kind, and every compiled memory known so far, by kind
        # (rank 0's store, then this run's compilations).
        self.instances = Counter(u.kind for u in units)
        self._combos = {kind: len(u.combos()) for kind, u in self.first.items()}
        self.memory: dict[tuple[int, int], dict[tuple[int, ...], int]] = {kind: {} for kind in self.first}
        # Set when no plan on this mesh fits the budget (``budget.py``): why, and the least
        # memory a plan needs as far as the memories known tell.
        self.infeasible: str | None = None
        self.least_plan_bytes = 0

    def candidates(self) -> list[Candidate]:
        """The combinations to profile, the kinds with the fewest first: the sooner a kind's every
        memory is known, the sooner the floors of the rest (``plan_floor``) and a budget no plan
        meets (``over_budget_everywhere``) are known too. Within a kind, the rough model's order
        (``estimate.ranked``): the likely best first, so the early stop has its yardstick soon;
        with ``top_k``, its first ``top_k`` and those of the ``keep`` plans."""
        out = []
        for u in sorted(self.first.values(), key=lambda u: len(u.combos())):
            order = ranked(self.a, u)
            if self.top_k and len(order) > self.top_k:
                # Every unit of the kind, not only the first: instances of one layer template
                # may take other combinations in the same plan (the first block after an
                # embedding), and a plan missing any of them cannot be predicted.
                kept = {tuple(plan[v.start:v.end]) for plan in self.keep for v in self.units if v.kind == u.kind}
                order = order[:self.top_k] + [c for c in order[self.top_k:] if c in kept]
            out += [(u, c) for c in order]
        return out

    def space(self) -> int:
        """Every kind's combinations (what CFP's artifact profiles)."""
        return sum(self._combos.values())

    def missing(self, candidates: list[Candidate]) -> list[bool]:
        """Which candidates the store lacks, or holds an entry this run's shortcuts may not reuse
        for (``Shortcuts.reuses``); rank 0 decides for every process. Also takes each kind's best
        from the entries timed in full, and every stored candidate's memory (for the floor)."""
        # (missing, time_s and overhead_s of an entry timed in full else inf, mem_bytes else -1)
        rows = np.zeros((len(candidates), 4), dtype=np.float64)
        rows[:, 1:3], rows[:, 3] = math.inf, -1
        if self.is_main:
            for row, (u, c) in zip(rows, candidates, strict=True):
                entry = self.store.get(self.keys.segment(u, c))
                if entry is None or not self.shortcuts.reuses(entry):
                    entry = self.same_program(u, c) or entry
                row[0] = entry is None or not self.shortcuts.reuses(entry)
                if entry is not None and timed_in_full(entry):
                    row[1:3] = entry["time_s"], entry.get("overhead_s", 0.0)
                if entry is not None and "mem_bytes" in entry:
                    row[3] = entry["mem_bytes"]
        rows = hosts.broadcast(rows)
        for (u, c), (_, t, o, m) in zip(candidates, rows, strict=True):
            self.best[u.kind] = min(self.best.get(u.kind, (math.inf, 0.0)), (float(t), float(o)))
            if m >= 0:
                self.memory[u.kind][c] = int(m)
        return [bool(row[0]) for row in rows]

    def same_program(self, u: Unit, combo: tuple[int, ...]) -> dict | None:
        """(Rank 0's.) The entry of the same program measured on another mesh of these devices
        (``StoreKeys.program``), now stored as this combination's too; None where there is none.
        Only an entry timed in full: the others' marks are their own mesh's (a memory floor
        summed over its units, an early stop against its unit's best)."""
        entry = self.store.get(self.program_key(u, combo))
        if entry is None or not timed_in_full(entry):
            return None
        entry = {**{k: v for k, v in entry.items() if k != "key"}, "same_program_as": entry.get("mesh", "?")}
        self.store.put(self.keys.segment(u, combo), entry)
        self.counts["same_program"] += 1
        return entry

    def program_key(self, u: Unit, combo: tuple[int, ...]) -> dict:
        """``StoreKeys.program`` of a candidate, made once: looked up before it is measured and
        written with its entry after."""
        if (u.kind, combo) not in self._program_keys:
            self._program_keys[u.kind, combo] = self.keys.program(u, combo, self.program(u))
        return self._program_keys[u.kind, combo]

    def plan_floor(self, kind: tuple[int, int], mem: int) -> int:
        """The least memory a plan holding a unit of ``kind`` at ``mem`` needs, as far as known:
        ``mem``, plus, for every other unit, the least memory of its kind where every
        combination of the kind has a known memory (else nothing)."""
        floor = mem
        for k, n in self.instances.items():
            known = self.memory[k]
            if len(known) == self._combos[k]:
                floor += (n - (k == kind)) * min(known.values())
        return floor

    def over_budget_everywhere(self) -> bool:
        """Whether the memories known so far show that no plan on this mesh fits the budget
        (then ``infeasible`` says why); rank 0's figures decide for every process."""
        budget = self.shortcuts.memory_budget_bytes
        if budget is None:
            return False
        known = least_plan_bytes(self.memory, self._combos, self.instances) / self.shortcuts.units_over_step
        least = max(known, state_floor_bytes(self.a))
        if not _rank0_flag(least > budget):
            return False
        kinds = sum(len(m) == self._combos[k] for k, m in self.memory.items())
        measured = sum(len(m) for m in self.memory.values())
        self.least_plan_bytes = least
        self.infeasible = no_plan_fits(
            budget, least, f"on mesh {list(self.a.mesh_shape)} ",
            f"from the {kinds} of its {len(self._combos)} unit kinds whose every combination's memory is known, "
            f"{measured} of {sum(self._combos.values())} combinations compiled"
            + (f"; their sum over {self.shortcuts.units_over_step:g}, what it may over-count the step by"
               if self.shortcuts.units_over_step != 1 else ""))
        return True

    def program(self, u: Unit) -> SegmentProgram:
        if u.kind not in self._programs:
            self._programs[u.kind] = segment_program(self.a, u.start, u.end)
        return self._programs[u.kind]

    def submit(self, u: Unit, combo: tuple[int, ...]) -> _Submitted:
        """``u``'s program under ``combo`` lowered and given to be compiled (``compile_share``:
        by one of the job's processes), with its arguments."""
        sp = self.program(u)
        assignment = u.assignment(combo)
        fn, shardings = build(self.a, sp, assignment, self.mesh)
        t0 = time.perf_counter()
        args = synthetic_inputs(self.a, sp, shardings)
        program = compile_share.compile(lambda: jax.jit(fn, in_shardings=shardings).lower(*args),
                                        self.compile_options)
        boundary = boundary_bytes(self.a, sp, input_layouts(self.a, sp, assignment))
        return _Submitted(program, args, boundary, time.perf_counter() - t0)

    def prepare(self, u: Unit, combo: tuple[int, ...]) -> tuple[Any, Any, list[Any], int, float]:
        """(compiled program, its overhead program, arguments, bytes of its inputs from other
        units, seconds to lower and compile it) of ``u`` under ``combo``. The overhead program
        is None when the program is over the memory budget (it will not be timed, so it is not
        compiled)."""
        return self.ready(u, self.submit(u, combo))

    def ready(self, u: Unit, submitted: _Submitted) -> tuple[Any, Any, list[Any], int, float]:
        """``prepare``'s tuple of a ``submit``-ted candidate of ``u``."""
        compiled = submitted.program.result()
        # (The candidate's own memory: its floor, known in the loop, is at least that.)
        over = self.shortcuts.over_budget(memory_of(submitted.program, submitted.boundary)[1])
        overhead = None if over else self.overhead_of(u, compiled, submitted.args)
        return (compiled, overhead, submitted.args, submitted.boundary,
                submitted.lowering_s + submitted.program.compile_s)

    def submit_all(self, batch: Sequence[Candidate]) -> list[_Submitted]:
        return [self.submit(u, combo) for u, combo in batch]

    def overhead_of(self, u: Unit, compiled: jax.stages.Compiled, args: list[Any]) -> Any:
        """The overhead program of ``u``'s program ``compiled`` (``timing.overhead_program``)."""
        outputs = [self.a.graph.vars[v] for v in self.program(u).outputs]
        return overhead_program(args, outputs, compiled.output_shardings, self.compile_options)

    def measure(self, todo: list[Candidate], progress: Any = None) -> int:
        """Profiles ``todo`` in order, writing entries as soon as they are measured (in rounds, a
        kind's as its rounds end: a kill loses at most the ``ROUNDS_AT_MOST`` being timed); counts in
        ``self.counts`` how many were timed in full, not timed (over the memory budget) and
        stopped early. Stops as soon as no plan can fit the budget (``infeasible``); returns how
        many were measured."""
        if self.over_budget_everywhere():  # from the memories stored already
            self.log(f"profile: nothing measured: {self.infeasible}")
            return 0
        if not todo:
            return 0
        # In batches: each process compiles its share of a batch while the others compile theirs
        # (``compile_share``), and with ``overlap`` the next batch compiles while this one is timed.
        batches = batched(todo, max(BATCH, 2 * jax.process_count()))
        pool = ThreadPoolExecutor(max_workers=1) if self.overlap else None
        with compile_share.shared():
            try:
                return self._measure(batches, pool, progress)
            finally:
                if pool:
                    pool.shutdown(wait=True, cancel_futures=True)

    def _measure(self, batches: list[list[Candidate]], pool: Optional[ThreadPoolExecutor], progress: Any) -> int:
        total, done = sum(map(len, batches)), 0
        next_up = pool.submit(self.submit_all, batches[0]) if pool else None
        for k, batch in enumerate(batches):
            if pool:
                submitted = next_up.result()
                if k + 1 < len(batches):
                    next_up = pool.submit(self.submit_all, batches[k + 1])  # compiles while this one is timed
            else:
                # Compiled side by side (``compile_share``), and all of them before any is timed:
                # on CPU devices a compile beside the timed program would take its cores.
                submitted = self.submit_all(batch)
                compile_share.ready(s.program for s in submitted)
            # Each candidate's memory first (in order: each floor counts the memories known
            # before it), then each kind's candidates within the budget timed together.
            ready, infeasible = [], False
            for (u, combo), sub in zip(batch, submitted, strict=True):
                ready.append(self._sized(u, combo, sub))
                if done + len(ready) < total and len(self.memory[u.kind]) == self._combos[u.kind] \
                        and self.over_budget_everywhere():
                    infeasible = True
                    break
            for _, group in itertools.groupby(ready, key=lambda r: r.unit.kind):
                group = list(group)
                self._time_all([r for r in group if r.overhead is not None])
                for r in group:
                    if self.is_main:
                        self.store.put(self.keys.segment(r.unit, r.combo), r.entry)
                        if timed_in_full(r.entry):   # what another mesh compiling the same program reuses
                            self.store.put(self.program_key(r.unit, r.combo), r.entry)
                    if progress is not None:
                        progress.advance()
            done += len(ready)
            if infeasible:
                self.log(f"profile: stopped after {done} of {total} combinations to measure: {self.infeasible}")
                return done
        return total

    def _sized(self, u: Unit, combo: tuple[int, ...], sub: _Submitted) -> "_Ready":
        """A compiled candidate with its memory known, its entry begun: over the memory budget
        (``overhead`` None: it will not be timed), or to be timed."""
        compiled, overhead, args, boundary, compile_s = self.ready(u, sub)
        memory, mem = memory_of(sub.program, boundary)
        self.memory[u.kind][combo] = mem
        floor = self.plan_floor(u.kind, mem)
        entry = {"memory": memory, "boundary_bytes": boundary, "mem_bytes": mem, "compile_s": compile_s,
                 "blocks": [u.start, u.end], "mesh": list(self.a.mesh_shape)}
        # Rank 0's figures decide (every process compiled the same programs; its figures are the
        # ones the store keeps and the search adds up).
        if _rank0_flag(self.shortcuts.over_budget(floor)):
            budget = self.shortcuts.memory_budget_bytes
            entry.update({"time_s": None, "over_budget": True, "budget_bytes": budget, "plan_floor_bytes": floor})
            self.counts["over_budget"] += 1
            self.log(f"{self.where(u, combo)} not timed: mem_cost(GB): {mem / 2**30:.6f}, a plan holding it needs at "
                     f"least {floor / 2**30:.6f}, over the memory budget {budget / 2**30:.6f}")
            return _Ready(u, combo, compiled, None, args, entry)
        # (No overhead program only where this process's memory said over budget and rank 0's
        # did not: never seen, since every process compiles the same program.)
        overhead = overhead if overhead is not None else self.overhead_of(u, compiled, args)
        return _Ready(u, combo, compiled, overhead, args, entry)

    def where(self, u: Unit, combo: tuple[int, ...]) -> str:
        part = f".{u.kind[1]}" if u.kind[0] in self._split else ""
        return f"SegmentIdx: {u.kind[0]}{part} ParallelBlock Strategy: {list(combo)}"

    def _time_all(self, group: list["_Ready"]) -> None:
        """Times ``group`` (candidates of one unit kind) and completes their entries: in rounds,
        or each in full in turn without ``interleave``."""
        if not group:
            return
        kind = group[0].unit.kind
        if self.interleave:
            timings = self._rounds(kind, group)
        else:   # CFP's artifact's way: each in full on its own (rounds of one), against the best so far
            timings = [timing for r in group for timing in self._rounds(kind, [r])]
        for r, timing in zip(group, timings, strict=True):
            r.entry.update(timing)
            mem = r.entry["mem_bytes"] / 2**30
            if timing.get("stopped_early"):
                self.log(f"{self.where(r.unit, r.combo)} avgcost: {timing['time_s']:.6f} (stopped early: first "
                         f"{len(timing['times_s'])} runs over {self.shortcuts.early_stop_ratio:g}x the best "
                         f"{timing['best_s']:.6f}) mem_cost(GB): {mem:.6f}")
            else:
                self.log(f"{self.where(r.unit, r.combo)} avgcost: {timing['time_s']:.6f} mem_cost(GB): {mem:.6f}")

    def _rounds(self, kind: tuple[int, int], group: list["_Ready"]) -> list[dict]:
        """The timing parts of the entries of ``group``, one kind's candidates timed in rounds
        (``Timer.rounds``), those whose first runs say so stopped early (module doc)."""
        ratio, after = self.shortcuts.early_stop_ratio, self.shortcuts.early_stop_after
        best, best_overhead = self.best.get(kind, (math.inf, 0.0))
        yardstick: list[float] = [best]

        def stop(times: list[list[float]], overheads: list[list[float]]) -> list[bool]:
            if len(times) == 1:   # one after another, as CFP's artifact: against the best before alone
                if not math.isfinite(best):
                    return [False]
                return [EarlyStop(ratio, best, best_overhead, after=after).slower(times[0], overheads[0])]
            # The yardstick: the best timed in full before, or the candidate of these rounds whose
            # slowest first run is the fastest (it runs on, so it is never stopped itself).
            k = min(range(len(times)), key=lambda k: max(times[k]))
            own = (max(times[k]), statistics.median(overheads[k]))
            rule = EarlyStop(ratio, *min((best, best_overhead), own), after=after)
            yardstick[0] = rule.best_s
            stops = [rule.slower(t, o) for t, o in zip(times, overheads, strict=True)]
            stops[k] = stops[k] and own >= (best, best_overhead)   # (a ratio under 1 would stop it too)
            return stops

        measured = self.timer.rounds([(r.compiled, r.overhead, r.args) for r in group],
                                     stop=stop if ratio > 0 else None, after=after)
        return [self._timing(kind, times, overhead_times, ratio, yardstick[0]) for times, overhead_times in measured]

    def _timing(self, kind: tuple[int, int], times: list[float], overhead_times: list[float], ratio: float,
                best: float) -> dict:
        """A timing's part of an entry (fewer runs than ``repeats``: stopped early against
        ``best``); the kind's best timed in full updated (slowest-process times: the same on
        every process)."""
        out = {"time_s": statistics.median(times), "times_s": times, "overhead_s": statistics.median(overhead_times),
               "overhead_times_s": overhead_times}
        if len(times) < self.timer.repeats:  # the only way fewer runs come back
            self.counts["stopped_early"] += 1
            out.update({"stopped_early": True, "stop_ratio": ratio, "best_s": best})
        else:
            self.counts["timed"] += 1
            self.best[kind] = min(self.best.get(kind, (math.inf, 0.0)), (out["time_s"], out["overhead_s"]))
        return out

    def table(self, partial: bool = False, profiled: Sequence[Candidate] = ()) -> dict[tuple[int, int], dict[tuple[int, ...], dict]]:
        """Every kind's entries from the store, by combination: those ``profiled`` must be there
        (``partial``: what is); any other the store holds (measured by an earlier run) too."""
        out: dict[tuple[int, int], dict[tuple[int, ...], dict]] = {}
        wanted = {(u.kind, c) for u, c in profiled}
        for kind, u in self.first.items():
            out[kind] = {}
            for c in u.combos():
                entry = self.store.get(self.keys.segment(u, c))
                if entry is None and (kind, c) in wanted and not partial:
                    raise RuntimeError(f"profile entry missing after profiling: template {kind}, combination {c}")
                if entry is not None and ((kind, c) in wanted or self.shortcuts.reuses(entry)):
                    out[kind][c] = entry
        return out


class _Ready(NamedTuple):
    unit: Unit
    combo: tuple[int, ...]
    compiled: jax.stages.Compiled
    overhead: Any        # None: over the memory budget, not timed
    args: list[Any]
    entry: dict


def batched(todo: list[Candidate], size: int, most: int = ROUNDS_AT_MOST) -> list[list[Candidate]]:
    """``todo`` (each kind's candidates together) in batches of whole kinds, parts of at most
    ``most`` candidates of a kind, packed while a batch stays within ``max(size, most)``."""
    parts = []
    for _, kind in itertools.groupby(todo, key=lambda c: c[0].kind):
        kind = list(kind)
        parts += [kind[k:k + most] for k in range(0, len(kind), most)]
    out: list[list[Candidate]] = []
    for part in parts:
        if out and len(out[-1]) + len(part) <= max(size, most):
            out[-1] += part
        else:
            out.append(list(part))
    return out


def memory_of(compiled: jax.stages.Compiled, boundary: int) -> tuple[dict[str, int], int]:
    """(XLA's memory analysis of ``compiled`` (a program, or ``compile_share.Compiling``: its
    compiler's analysis) per device, by kind; the unit's memory the search adds up: the step's
    peak as ``models.train.memory_stats`` reads it, less ``boundary``, the bytes of its inputs
    another unit produces, counted there as results)."""
    memory = memory_stats(compiled)
    return memory, memory.pop("peak_bytes") - boundary


def _rank0_flag(flag: bool) -> bool:
    """Rank 0's ``flag`` on every process (the identity with one process)."""
    return bool(hosts.broadcast(np.array([int(flag)], dtype=np.int32))[0])
