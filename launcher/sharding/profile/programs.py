"""Programs the profile pass times besides the segments: a resharding, one small all-reduce, the
whole step's overhead program; and which gradient all-reduces each unit's combinations make.

Gradient all-reduces are the all-reduces of contractions whose results reach no other
contraction (weight gradients, on their way to the optimizer). A segment alone all-reduces its
own (XLA combines those of one program into one all-reduce per group of mesh axes), while the
whole step combines every segment's into one: the latency of one all-reduce over each group of
mesh axes is measured (a tiny ``psum`` less its overhead program, lower quartile of 30 runs),
taken off every unit for each group its combination all-reduces gradients over, and added back
once per group the whole plan uses (``search/dp.py``).
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Sequence

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.strategies import Spec, allreduce_axes
from launcher.sharding.apply import Layouts, pspec
from launcher.sharding.profile.segment_program import _host_value, build, segment_program, synthetic_inputs
from launcher.sharding.measuring.timing import Timer, lower_quartile, overhead_program, slowest_process
from launcher.sharding.profile.units import Unit

if TYPE_CHECKING:
    from jax.sharding import Mesh


def reshard_time(shape: Sequence[int], dtype: str, src: Spec, dst: Spec, mesh: Mesh, timer: Timer) -> dict:
    """The store entry (median seconds, and its overhead program's) of turning layout ``src``
    into ``dst``."""
    s_in, s_out = NamedSharding(mesh, pspec(src)), NamedSharding(mesh, pspec(dst))
    host = _host_value(tuple(shape), dtype, 0)
    x = jax.make_array_from_callback(tuple(shape), s_in, lambda idx: host[idx])
    # An identity whose input and output layouts differ: exactly the collective XLA inserts.
    compiled = _identity(x, s_in, s_out)
    # Its overhead: the same identity keeping the layout, which every resharding of this tensor
    # from ``src`` shares (compiled once: ``_identity`` caches it).
    return timer.entry(compiled, _identity(x, s_in, s_in), [x])


_IDENTITIES: dict = {}


def _identity(x: Any, s_in: Any, s_out: Any) -> Any:
    key = (tuple(x.shape), str(x.dtype), s_in, s_out)
    if key not in _IDENTITIES:
        if len(_IDENTITIES) >= 512:
            _IDENTITIES.pop(next(iter(_IDENTITIES)))
        _IDENTITIES[key] = jax.jit(lambda y: y + np.zeros((), x.dtype), in_shardings=s_in,
                                   out_shardings=s_out).lower(x).compile()
    return _IDENTITIES[key]


def allreduce_time(mesh: Mesh, axes: Sequence[int], timer: Timer, repeats: int) -> dict:
    """The store entry (lower-quartile seconds, and its overhead program's) of one small
    all-reduce over mesh ``axes``."""
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


def gradient_allreduces(a: Analysis, units: Sequence[Unit]) -> list[list[frozenset]]:
    """Per unit, per combination: the mesh axes of each gradient all-reduce (of a contraction
    whose result reaches no other contraction) that the combination's strategies imply."""
    terminal = terminal_contractions(a)
    out = []
    for u in units:
        blocks = [a.blocks[i] for i in range(u.start, u.end)]
        per_plan = [[frozenset(axes for op in b.contractions if op in terminal
                               for axes in [allreduce_axes(a.contractions[op], b.strategies[op][p])] if axes)
                     for p in range(b.num_plans)] for b in blocks]
        out.append([frozenset().union(*(per_plan[j][p] for j, p in enumerate(c))) for c in u.combos()])
    return out


def whole_overhead_entry(a: Analysis, mesh: Mesh, timer: Timer) -> dict:
    """The store entry of the whole step's overhead program, timed: its arguments laid out as
    under every block's first plan (the overhead hardly depends on layouts; it grows with buffers)."""
    sp = segment_program(a, 0, len(a.blocks), top_level=True)
    assignment = {b.id: 0 for b in a.blocks}
    _, shardings = build(a, sp, assignment, mesh)
    args = synthetic_inputs(a, sp, shardings)
    produced = Layouts(a, assignment)
    outs = [NamedSharding(mesh, pspec(produced.produced(v) or ())) for v in sp.outputs]
    overhead = overhead_program(args, [a.graph.vars[v] for v in sp.outputs], outs)
    seconds = statistics.median(slowest_process(timer.runs([overhead], args, max(timer.repeats, 10))[0]))
    return {"time_s": seconds}
