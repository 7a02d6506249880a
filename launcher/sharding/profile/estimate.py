"""A rough cost of a unit's plan combination, to choose which combinations to profile.

Profiling a combination means compiling a program of the unit under it (about a second on a
CPU device, nearly all of a cold search's time), and most combinations of a layer are far from
its best: where CFP's artifact profiles every one, ``ProfileOptions.top_k`` profiles the ones this
model ranks first (and ``keep``'s, ``candidates.py``). It counts, under the combination's
strategies:

- computation: each contraction's FLOPs over the devices its strategy splits it across (a plan
  leaving a mesh axis unused repeats the work on it);
- collectives: each contraction's all-reduce of a split contracting dimension (its output's
  per-device bytes), and each operand a contraction reads in another layout than the block
  making it in the same unit gives it (its per-device bytes, twice: gathered, then re-split);
- a latency per collective, so that many small ones are not free.

in seconds with round figures for a device (``FLOPS``, ``BYTES_PER_S``, ``LATENCY_S``): what
matters is the order, and the order of a layer's combinations on the machines measured here put
the fastest combination measured among the first seven of 72 on every mesh
(``tests/test_cfp_profile_estimate.py`` checks the ranking on a scanned LM's stored profile).
"""

from __future__ import annotations

import math
from typing import Sequence

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.strategies import allreduce_axes, operand_specs, shard_bytes
from launcher.sharding.profile.units import Unit

FLOPS = 1e11          # a device's FLOP/s
BYTES_PER_S = 2e9     # a collective's bytes per second per device
LATENCY_S = 1e-5      # a collective's start-up


def estimate(a: Analysis, u: Unit, combo: Sequence[int]) -> float:
    """Seconds the rough model gives unit ``u`` under ``combo`` (see the module doc)."""
    shape, g = a.mesh_shape, a.graph
    devices = math.prod(shape)
    assignment = u.assignment(combo)
    made = {}
    for b_id, p in assignment.items():
        made.update(a.blocks[b_id].specs[p])
    flops = moved = collectives = 0.0
    for b_id, p in assignment.items():
        b = a.blocks[b_id]
        for op in b.contractions:
            c, s = a.contractions[op], b.strategies[op][p]
            split = math.prod(shape[ax] for axes in s.axes for ax in axes)
            flops += 2 * math.prod(d.size for d in c.dims) / max(split, 1)
            lhs, rhs, out = operand_specs(c, s)
            if allreduce_axes(c, s):
                moved += shard_bytes(c.out_shape, out, 4, shape)
                collectives += 1
            for v, want in ((c.lhs, lhs), (c.rhs, rhs)):
                if v is not None and v in made and tuple(made[v]) != tuple(want):
                    moved += 2 * shard_bytes(g.shape(v), (), 4, None) / devices
                    collectives += 1
    return flops / FLOPS + moved / BYTES_PER_S + collectives * LATENCY_S


def ranked(a: Analysis, u: Unit) -> list[tuple[int, ...]]:
    """``u``'s combinations, the ones the model gives the least time first (ties: in order)."""
    combos = u.combos()
    costs = [estimate(a, u, c) for c in combos]
    return [combos[i] for i in sorted(range(len(combos)), key=lambda i: (costs[i], i))]
