"""Boundary discovery: the tensors crossing between profiled units and their layouts on either
side, and the (produced, wanted) layout pairs whose resharding the profile pass measures.

For every tensor one unit produces and another consumes (activations forward, gradients
backward; mostly the next unit, but residual connections and tied embeddings skip some), every
pair (layout produced under some combination, layout wanted under some combination) is a
resharding the whole step may do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from launcher.cfp.analysis.core import Analysis
from launcher.cfp.analysis.strategies import Spec
from launcher.cfp.apply import Layouts
from launcher.cfp.profile.units import Unit


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


def find_boundaries(a: Analysis, units: Sequence[Unit]) -> list[Boundary]:
    """Every pair of units some tensor crosses between, left to right."""
    g, owner = a.graph, a.owner
    unit_of = {}
    for u in units:
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
              for u in units}
    out = []
    for (left, right), cross in sorted(crossing.items()):
        b = Boundary(left, right, [], [], [], [], [])
        for v, from_left in sorted(cross.items()):
            src, dst = (units[left], units[right]) if from_left else (units[right], units[left])
            b.vars.append(v)
            b.types.append((g.shape(v), g.vars[v].dtype))
            b.from_left.append(from_left)
            b.produced.append([Layouts(a, src.assignment(c)).produced(v) for c in src.combos()])
            b.wanted.append([Layouts(a, dst.assignment(c)).wanted(v, within=ops_of[dst.index])
                             for c in dst.combos()])
        out.append(b)
    return out


def layout_pairs(boundaries: Sequence[Boundary]) -> list[tuple]:
    """Every ((shape, dtype), src, dst) resharding the boundaries can need, in a fixed order."""
    pairs = set()
    for b in boundaries:
        for k in range(len(b.vars)):
            for src in set(b.produced[k]):
                for dst in set(b.wanted[k]):
                    if src is not None and src != dst:
                        pairs.add((b.types[k], src, dst))
    return sorted(pairs, key=repr)
