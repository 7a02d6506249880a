"""The CFP profile pass: every plan combination of every unique segment, compiled and timed.

For each template, the first segment instance is turned into a program of that segment alone
(``segment_program.py``); for every combination of its blocks' plans the program is compiled
with those plans' sharding constraints on the real mesh, run (warm-up, then repeats) and its
median time and per-device memory (XLA's memory analysis) recorded. A template whose space
exceeds ``max_space`` is profiled in consecutive parts (block ranges whose plan-count product
fits), so an MoE layer's thousands of combinations become a few hundred; the search then treats
the parts as segments, with measured resharding between them.

Running a program costs something whatever it computes: dispatching its arguments, making its
results, starting and finishing every device. On small devices (and on CPU devices, always)
that cost is a large part of a segment's time, and a whole step pays it once, not once per
segment. So every program is timed alternately with its *overhead program*: the same
arguments and results (same shapes, same shardings), computing nothing. The segment's cost is
the difference; the whole step's own overhead program is measured once and added back by the
search.

The same holds for the gradient all-reduces of data-parallel splits: a segment alone all-reduces
its own weight gradients (XLA combines those of one program into one all-reduce per group of
mesh axes), while the whole step combines every segment's into one. Gradient all-reduces are
the all-reduces of contractions whose results reach no other contraction (weight gradients, on
their way to the optimizer); the latency of one all-reduce over each group of mesh axes is
measured (a tiny ``psum`` less its overhead program, lower quartiles of 30 runs), taken off
every unit for each group its combination all-reduces gradients over (never below zero), and
added back once per group the whole plan uses.

Resharding between units (segments or parts) is measured, not fitted: for every tensor one unit
produces and another consumes (activations forward, gradients backward; mostly the next unit,
but residual connections and tied embeddings skip some), every pair (layout produced under
some combination, layout wanted under some combination) is compiled as an identity with those
input and output shardings and timed, less its overhead program.

How a program is timed (in turns with its overhead program, retaken when the hypervisor
interrupted it, optionally from cold caches, the slowest process's time) is ``timing.py``'s.

Every result goes into the profile store (``store.py``) as soon as it is measured, keyed by the
model's signature, the mesh, the devices, the timing (warm or cold caches), the template and the
combination, so an interrupted run resumes and a later one reuses. Rank 0 writes it and every
process reads it back, so with several hosts it must be on a shared filesystem (like the run
dir). The next candidate compiles on a worker thread while the current one is timed. With
several processes, each compiles and runs the same candidates in the same order (the
collectives need it).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from launcher import jaxcompat
from launcher.cfp.analysis import Analysis
from launcher.cfp.apply import Layouts, pspec
from launcher.cfp.segment_program import SegmentProgram, boundary_bytes, build, input_layouts, segment_program, \
    synthetic_inputs
from launcher.cfp.store import ProfileStore
from launcher.cfp.strategies import Spec, allreduce_axes
from launcher.cfp.timing import CacheFlush, Timer, lower_quartile, overhead_program, slowest_process
from launcher.runtime import hosts


# Part of every store key: bump it when what a measurement means changes (which tensors are
# pinned, what a segment program contains), so old entries are not reused.
PROFILE_VERSION = 4


@dataclass
class Unit:
    """A profiled piece of the block sequence: a segment, or a part of one."""
    index: int
    segment: int
    kind: tuple[int, int]        # (template id, part): units of one kind share profiles
    start: int                   # first block
    end: int
    plan_counts: list[int]

    def combos(self) -> list[tuple[int, ...]]:
        return list(itertools.product(*(range(n) for n in self.plan_counts)))

    def assignment(self, combo: Sequence[int]) -> dict[int, int]:
        return {self.start + i: p for i, p in enumerate(combo)}


def split_parts(plan_counts: Sequence[int], max_space: int) -> list[tuple[int, int]]:
    """Consecutive (start, end) offsets whose plan-count products stay within ``max_space``."""
    parts, start, product = [], 0, 1
    for i, n in enumerate(plan_counts):
        if i > start and product * n > max_space:
            parts.append((start, i))
            start, product = i, 1
        product *= n
    parts.append((start, len(plan_counts)))
    return parts


def profiling_units(a: Analysis, max_space: int) -> list[Unit]:
    units = []
    for seg in a.segments:
        t = a.templates[seg.template]
        for part, (lo, hi) in enumerate(split_parts(t.plan_counts, max_space)):
            units.append(Unit(len(units), seg.index, (t.id, part), seg.start + lo, seg.start + hi,
                              t.plan_counts[lo:hi]))
    return units


@dataclass
class Boundary:
    """Tensors crossing between units ``left`` and ``right`` (either way) and their layouts. Most
    cross between neighbours; a residual connection skips a unit, a tied embedding's gradient
    goes from the last unit to the first, an MoE layer's dispatch skips several."""
    left: int
    right: int
    vars: list[int]
    types: list[tuple]                  # per var: (shape, dtype)
    produced: list[list[Spec | None]]   # per var: layout per producing unit's combo
    wanted: list[list[Spec]]            # per var: layout per consuming unit's combo
    from_left: list[bool]               # per var: produced by the left unit


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
    measured: int = 0                   # entries measured by this run
    reused: int = 0                     # entries found in the store
    seconds: float = 0.0

    @property
    def profiled_configs(self) -> int:
        return sum(len(v) for v in self.table.values())

    def unit_time(self, kind: tuple[int, int], combo: tuple[int, ...]) -> float:
        """A unit's measured time less its overhead program's: inside the whole step the units
        run as one program, which pays its overhead once (``whole_overhead_s``)."""
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
                total += self.reshard[(b.types[k], src, dst)]
        return total


def model_signature(a: Analysis) -> str:
    return hashlib.sha1(json.dumps(a.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def device_signature(mesh: Any) -> str:
    import jax

    d = mesh.devices.flat[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '?')}x{mesh.devices.size}/{jax.process_count()}proc"


class Profiler:
    def __init__(self, a: Analysis, mesh: Any, store: ProfileStore, *, repeats: int = 3, warmup: int = 1,
                 cold: bool = False, max_space: int = 128, overlap: bool = True,
                 log: Callable[[str], None] = print, is_main: bool = True) -> None:
        self.a, self.mesh, self.store = a, mesh, store
        self.overlap, self.log, self.is_main = overlap, log, is_main
        self.timer = Timer(warmup, repeats, CacheFlush(mesh) if cold else None)
        self.units = profiling_units(a, max_space)
        # Keys of measurements that depend on the mesh only (resharding, all-reduce latency), and
        # of those that depend on the model too.
        self.mesh_base = {"version": PROFILE_VERSION, "mesh": list(a.mesh_shape), "devices": device_signature(mesh),
                          "caches": "cold" if cold else "warm"}
        self.base = {**self.mesh_base, "model": model_signature(a)}
        self._programs: dict[tuple[int, int], SegmentProgram] = {}
        self._split = {u.kind[0] for u in self.units if u.kind[1] > 0}  # templates profiled in parts

    # --- segment combinations ---------------------------------------------------------------

    def first_units(self) -> dict[tuple[int, int], Unit]:
        first: dict[tuple[int, int], Unit] = {}
        for u in self.units:
            first.setdefault(u.kind, u)
        return first

    def key(self, u: Unit, combo: Sequence[int]) -> dict:
        sigs = self.a.signatures[u.start:u.end]
        template = hashlib.sha1("|".join(sigs).encode()).hexdigest()[:16]
        return {**self.base, "template": template, "combination": list(combo)}

    def program(self, u: Unit) -> SegmentProgram:
        if u.kind not in self._programs:
            self._programs[u.kind] = segment_program(self.a, u.start, u.end)
        return self._programs[u.kind]

    def candidates(self) -> list[tuple[Unit, tuple[int, ...]]]:
        return [(u, c) for u in self.first_units().values() for c in u.combos()]

    def missing(self, candidates: list[tuple[Unit, tuple[int, ...]]]) -> list[bool]:
        """Which candidates the store lacks; rank 0 decides for every process."""
        import numpy as np

        mask = np.array([self.key(u, c) not in self.store for u, c in candidates] if self.is_main
                        else [False] * len(candidates), dtype=np.int32)
        return [bool(x) for x in hosts.broadcast(mask)]

    def _prepare(self, u: Unit, combo: tuple[int, ...]) -> tuple[Any, Any, list[Any], int, float]:
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

    def measure(self, todo: list[tuple[Unit, tuple[int, ...]]], progress: Any = None) -> int:
        """Profiles ``todo`` in order, writing each entry as soon as it is measured."""
        if not todo:
            return 0
        pool = ThreadPoolExecutor(max_workers=1) if self.overlap else None
        next_up = pool.submit(self._prepare, *todo[0]) if pool else None
        try:
            for i, (u, combo) in enumerate(todo):
                if pool:
                    prepared = next_up.result()
                    if i + 1 < len(todo):
                        next_up = pool.submit(self._prepare, *todo[i + 1])  # compiles while this one is timed
                else:
                    prepared = self._prepare(u, combo)
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
                    self.store.put(self.key(u, combo), entry)
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
        out: dict[tuple[int, int], dict[tuple[int, ...], dict]] = {}
        for kind, u in self.first_units().items():
            out[kind] = {}
            for c in u.combos():
                entry = self.store.get(self.key(u, c))
                if entry is None:
                    raise RuntimeError(f"profile entry missing after profiling: template {kind}, combination {c}")
                out[kind][c] = entry
        return out

    # --- boundaries -------------------------------------------------------------------------

    def boundaries(self) -> list[Boundary]:
        """Every pair of units some tensor crosses between, left to right."""
        g, owner = self.a.graph, self.a.owner
        unit_of = {}
        for u in self.units:
            for b in range(u.start, u.end):
                unit_of[b] = u.index
        crossing: dict[tuple[int, int], dict[int, bool]] = {}   # (left, right) -> {var: produced by left}
        for op in g.ops:
            if op.loop is not None:
                continue
            here = unit_of[owner[op.id]]
            for v in op.outputs:
                for c in g.consumers[v]:
                    there = unit_of[owner[c]]
                    if g.ops[c].loop is None and here != there and g.shape(v):
                        crossing.setdefault((min(here, there), max(here, there)), {})[v] = here < there
        ops_of = {u.index: {op.id for op in g.ops if op.loop is None and u.start <= owner[op.id] < u.end}
                  for u in self.units}
        out = []
        for (left, right), cross in sorted(crossing.items()):
            b = Boundary(left, right, [], [], [], [], [])
            for v, from_left in sorted(cross.items()):
                src, dst = (self.units[left], self.units[right]) if from_left else (self.units[right], self.units[left])
                b.vars.append(v)
                b.types.append((g.shape(v), g.vars[v].dtype))
                b.from_left.append(from_left)
                b.produced.append([Layouts(self.a, src.assignment(c)).produced(v) for c in src.combos()])
                b.wanted.append([Layouts(self.a, dst.assignment(c)).wanted(v, within=ops_of[dst.index])
                                 for c in dst.combos()])
            out.append(b)
        return out

    def reshard_costs(self, boundaries: list[Boundary]) -> tuple[dict[tuple, float], int]:
        pairs = set()
        for b in boundaries:
            for k in range(len(b.vars)):
                for src in set(b.produced[k]):
                    for dst in set(b.wanted[k]):
                        if src is not None and src != dst:
                            pairs.add((b.types[k], src, dst))
        pairs_sorted = sorted(pairs, key=repr)
        costs, measured = {}, 0
        for p in pairs_sorted:
            key = {**self.mesh_base, "kind": "reshard", "shape": list(p[0][0]), "dtype": p[0][1],
                   "src": [list(a) for a in p[1]], "dst": [list(a) for a in p[2]]}
            costs[p], new = self._stored(key, lambda: reshard_time(p[0][0], p[0][1], p[1], p[2], self.mesh,
                                                                   self.timer))
            measured += new
        return costs, measured

    # --- everything -------------------------------------------------------------------------

    def run(self, progress_factory: Callable[[int, str], Any] | None = None) -> Profiles:
        import contextlib

        t0 = time.perf_counter()
        candidates = self.candidates()
        missing = self.missing(candidates)
        todo = [c for c, m in zip(candidates, missing) if m]
        reused = len(candidates) - len(todo)
        self.log(f"profile: {len(candidates)} combinations over {len(self.first_units())} units "
                 f"({reused} in the store, {len(todo)} to measure)")
        ctx = progress_factory(len(todo), "profiling segments") if progress_factory else contextlib.nullcontext()
        with ctx as progress:
            measured = self.measure(todo, progress)
        hosts.barrier("cfp-profile")
        table = self.table()
        boundaries = self.boundaries()
        reshard, n_reshard = self.reshard_costs(boundaries)
        self.log(f"profile: resharding between {len(boundaries)} pairs of units: {len(reshard)} layout pairs "
                 f"({n_reshard} measured now)")
        whole = self.whole_overhead()
        self.log(f"profile: running a program with the whole step's arguments and results costs "
                 f"{whole * 1e3:.3f} ms whatever it computes (taken off every unit and resharding as "
                 "measured alone, added once to the whole step)")
        grads = self.gradient_allreduces()
        latency = {axes: self.allreduce_latency(axes) for axes in sorted({ax for u in grads for c in u for ax in c})}
        if latency:
            each = ", ".join(f"{t * 1e3:.3f} ms over mesh axes {list(axes)}" for axes, t in latency.items())
            self.log(f"profile: one all-reduce costs {each} (paid once per step for the gradients, which the "
                     "whole step combines)")
        return Profiles(self.units, table, boundaries, reshard, whole_overhead_s=whole, gradient_allreduces=grads,
                        allreduce_latency_s=latency, measured=measured, reused=reused,
                        seconds=time.perf_counter() - t0)

    def gradient_allreduces(self) -> list[list[frozenset]]:
        """Per unit, per combination: the mesh axes of each gradient all-reduce (of a contraction
        whose result reaches no other contraction) that the combination's strategies imply."""
        terminal = terminal_contractions(self.a)
        out = []
        for u in self.units:
            blocks = [self.a.blocks[i] for i in range(u.start, u.end)]
            per_plan = [[frozenset(axes for op in b.contractions if op in terminal
                                   for axes in [allreduce_axes(self.a.contractions[op], b.strategies[op][p])] if axes)
                         for p in range(b.num_plans)] for b in blocks]
            out.append([frozenset().union(*(per_plan[j][p] for j, p in enumerate(c))) for c in u.combos()])
        return out

    def allreduce_latency(self, axes: tuple[int, ...]) -> float:
        key = {**self.mesh_base, "kind": "allreduce-latency", "axes": list(axes), "statistic": "q25"}
        return self._stored(key, lambda: allreduce_time(self.mesh, axes, self.timer, max(self.timer.repeats, 30)))[0]

    def whole_overhead(self) -> float:
        """The whole step's overhead program, timed: its arguments laid out as under every block's
        first plan (the overhead hardly depends on layouts; it grows with buffers)."""
        return self._stored({**self.base, "kind": "whole-overhead"}, self._time_whole_overhead)[0]

    def _time_whole_overhead(self) -> dict:
        from jax.sharding import NamedSharding

        sp = segment_program(self.a, 0, len(self.a.blocks))
        assignment = {b.id: 0 for b in self.a.blocks}
        _, shardings = build(self.a, sp, assignment, self.mesh)
        args = synthetic_inputs(self.a, sp, shardings)
        produced = Layouts(self.a, assignment)
        outs = [NamedSharding(self.mesh, pspec(produced.produced(v) or ())) for v in sp.outputs]
        overhead = overhead_program(args, [self.a.graph.vars[v] for v in sp.outputs], outs)
        seconds = statistics.median(slowest_process(self.timer.runs([overhead], args, max(self.timer.repeats, 10))[0]))
        return {"time_s": seconds}

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


# ---------------------------------------------------------------------------------------------
# Programs timed beside the segments


def reshard_time(shape: Sequence[int], dtype: str, src: Spec, dst: Spec, mesh: Any, timer: Timer) -> dict:
    """The store entry (median seconds, and its overhead program's) of turning layout ``src``
    into ``dst``."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding

    from launcher.cfp.segment_program import _host_value

    s_in, s_out = NamedSharding(mesh, pspec(src)), NamedSharding(mesh, pspec(dst))
    host = _host_value(tuple(shape), dtype, 0)
    x = jax.make_array_from_callback(tuple(shape), s_in, lambda idx: host[idx])
    # An identity whose input and output layouts differ: exactly the collective XLA inserts.
    identity = jax.jit(lambda y: y + np.zeros((), host.dtype), in_shardings=s_in, out_shardings=s_out)
    compiled = identity.lower(x).compile()
    return timer.entry(compiled, overhead_program([x], [x], [s_out]), [x])


def allreduce_time(mesh: Any, axes: Sequence[int], timer: Timer, repeats: int) -> dict:
    """The store entry (lower-quartile seconds, and its overhead program's) of one small
    all-reduce over mesh ``axes``."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    every = PartitionSpec(tuple(mesh.axis_names))
    sharding = NamedSharding(mesh, every)
    x = jax.make_array_from_callback((mesh.devices.size, 64), sharding, lambda idx: np.ones((1, 64), np.float32))
    names = tuple(mesh.axis_names[a] for a in axes)
    psum = jax.jit(jaxcompat.shard_map(lambda y: jax.lax.psum(y, names), mesh=mesh, in_specs=every, out_specs=every))
    compiled = psum.lower(x).compile()
    # The lower quartile, not the median: a latency is a floor that noise only adds to, and it is
    # taken off every unit that all-reduces gradients, so an inflated one would be paid many times.
    return timer.entry(compiled, overhead_program([x], [x], [sharding]), [x], repeats, statistic=lower_quartile)


def terminal_contractions(a: Analysis) -> set[int]:
    """Contractions whose results reach no other contraction: in a training step, the weight
    gradients (they go on to the optimizer and out)."""
    g = a.graph
    feeds = [False] * len(g.ops)
    for op in reversed(g.ops):
        feeds[op.id] = any(c in a.contractions or feeds[c] for v in op.outputs for c in g.consumers[v])
    return {op for op in a.contractions if not feeds[op]}


# ---------------------------------------------------------------------------------------------
# Multi-process agreement (no-ops with one process)


def _broadcast_flag(flag: bool) -> bool:
    import numpy as np

    return bool(hosts.broadcast(np.array([int(flag)], dtype=np.int32))[0])


def _broadcast_float(x: float) -> float:
    import numpy as np

    return float(hosts.broadcast(np.array([x], dtype=np.float64))[0])
