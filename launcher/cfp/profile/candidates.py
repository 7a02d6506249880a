"""The candidate loop: every plan combination of the first unit of each kind, compiled as a
program of that unit alone with those plans' sharding constraints, timed beside its overhead
program and stored as soon as it is measured.

The next candidate compiles on a worker thread while the current one is timed (``overlap``).
With several processes, each compiles and runs the same candidates in the same order (the
collectives need it); rank 0 decides which the store lacks and writes the entries.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from launcher.cfp.analysis.core import Analysis
from launcher.cfp.profile.keys import StoreKeys
from launcher.cfp.profile.segment_program import SegmentProgram, boundary_bytes, build, input_layouts, \
    segment_program, synthetic_inputs
from launcher.cfp.profile.store import ProfileStore
from launcher.cfp.profile.timing import Timer, overhead_program
from launcher.cfp.profile.units import Unit, first_units
from launcher.runtime import hosts

Candidate = tuple[Unit, tuple[int, ...]]


class CandidateLoop:
    def __init__(self, a: Analysis, mesh: Any, store: ProfileStore, keys: StoreKeys, timer: Timer,
                 units: Sequence[Unit], *, overlap: bool = True, log: Callable[[str], None] = print,
                 is_main: bool = True) -> None:
        self.a, self.mesh, self.store, self.keys, self.timer = a, mesh, store, keys, timer
        self.overlap, self.log, self.is_main = overlap, log, is_main
        self.first = first_units(units)
        self._programs: dict[tuple[int, int], SegmentProgram] = {}
        self._split = {u.kind[0] for u in units if u.kind[1] > 0}  # templates profiled in parts

    def candidates(self) -> list[Candidate]:
        return [(u, c) for u in self.first.values() for c in u.combos()]

    def missing(self, candidates: list[Candidate]) -> list[bool]:
        """Which candidates the store lacks; rank 0 decides for every process."""
        import numpy as np

        mask = np.array([self.keys.segment(u, c) not in self.store for u, c in candidates] if self.is_main
                        else [False] * len(candidates), dtype=np.int32)
        return [bool(x) for x in hosts.broadcast(mask)]

    def program(self, u: Unit) -> SegmentProgram:
        if u.kind not in self._programs:
            self._programs[u.kind] = segment_program(self.a, u.start, u.end)
        return self._programs[u.kind]

    def prepare(self, u: Unit, combo: tuple[int, ...]) -> tuple[Any, Any, list[Any], int, float]:
        """(compiled program, its overhead program, arguments, bytes of its inputs from other
        units, compile seconds) of ``u`` under ``combo``."""
        import jax

        sp = self.program(u)
        assignment = u.assignment(combo)
        fn, shardings = build(self.a, sp, assignment, self.mesh)
        t0 = time.perf_counter()
        args = synthetic_inputs(self.a, sp, shardings)
        compiled = jax.jit(fn, in_shardings=shardings).lower(*args).compile()
        overhead = overhead_program(args, [self.a.graph.vars[v] for v in sp.outputs], compiled.output_shardings)
        return compiled, overhead, args, boundary_bytes(self.a, sp, input_layouts(self.a, sp, assignment)), \
            time.perf_counter() - t0

    def measure(self, todo: list[Candidate], progress: Any = None) -> int:
        """Profiles ``todo`` in order, writing each entry as soon as it is measured."""
        if not todo:
            return 0
        pool = ThreadPoolExecutor(max_workers=1) if self.overlap else None
        next_up = pool.submit(self.prepare, *todo[0]) if pool else None
        try:
            for i, (u, combo) in enumerate(todo):
                if pool:
                    prepared = next_up.result()
                    if i + 1 < len(todo):
                        next_up = pool.submit(self.prepare, *todo[i + 1])  # compiles while this one is timed
                else:
                    prepared = self.prepare(u, combo)
                compiled, overhead, args, boundary, compile_s = prepared
                times, overhead_times = self.timer.beside_overhead(compiled, overhead, args)
                m = compiled.memory_analysis()
                memory = {k: int(getattr(m, f"{k}_size_in_bytes", 0)) for k in ("argument", "output", "temp", "alias")}
                mem = memory["argument"] + memory["output"] + memory["temp"] - memory["alias"] - boundary
                entry = {"time_s": statistics.median(times), "times_s": times,
                         "overhead_s": statistics.median(overhead_times), "overhead_times_s": overhead_times,
                         "memory": memory, "boundary_bytes": boundary, "mem_bytes": mem, "compile_s": compile_s,
                         "blocks": [u.start, u.end]}
                if self.is_main:
                    self.store.put(self.keys.segment(u, combo), entry)
                part = f".{u.kind[1]}" if u.kind[0] in self._split else ""
                self.log(f"SegmentIdx: {u.kind[0]}{part} "
                         f"ParallelBlock Strategy: {list(combo)} avgcost: {entry['time_s']:.6f} "
                         f"mem_cost(GB): {mem / 2**30:.6f}")
                if progress is not None:
                    progress.advance()
        finally:
            if pool:
                pool.shutdown(wait=True)
        return len(todo)

    def table(self) -> dict[tuple[int, int], dict[tuple[int, ...], dict]]:
        """Every kind's entries from the store, by combination."""
        out: dict[tuple[int, int], dict[tuple[int, ...], dict]] = {}
        for kind, u in self.first.items():
            out[kind] = {}
            for c in u.combos():
                entry = self.store.get(self.keys.segment(u, c))
                if entry is None:
                    raise RuntimeError(f"profile entry missing after profiling: template {kind}, combination {c}")
                out[kind][c] = entry
        return out
