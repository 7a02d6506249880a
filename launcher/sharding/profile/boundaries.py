"""Boundary discovery: the tensors crossing between profiled units and their layouts on either
side, and the (produced, wanted) layout pairs whose resharding the profile pass measures.

For every tensor one unit produces and another consumes (activations forward, gradients
backward; mostly the next unit, but residual connections and tied embeddings skip some; and the
state a step returns, which the next step's first unit reads back), every pair (layout produced
under some combination, layout wanted under some combination) is a resharding the whole step
may do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.strategies import Spec
from launcher.sharding.apply import Layouts
from launcher.sharding.profile.units import Unit


@dataclass
class Boundary:
    """Tensors crossing between units ``left`` and ``right`` (either way) and their layouts. Most
    cross between neighbours; a residual connection skips a unit, a tied embedding's gradient
    goes from the last unit to the first, an MoE layer's dispatch skips several. In a scanned
    model a tensor also crosses into and out of the loop (the carry, the stacked gradients), from
    one iteration to the next (``left == right`` where the body is one unit), and from the forward
    loop's body to the backward's (the residuals): those are counted ``times`` a step, a layer at
    a time."""
    left: int
    right: int
    vars: list[int]
    types: list[tuple]                  # per var: (shape, dtype)
    produced: list[list[Spec | None]]   # per var: layout per producing unit's combo
    wanted: list[list[Spec]]            # per var: layout per consuming unit's combo
    from_left: list[bool]               # per var: produced by the left unit
    times: list[int] = field(default_factory=list)  # per var: crossings a step (default once)

    def count(self, k: int) -> int:
        return self.times[k] if self.times else 1


def find_boundaries(a: Analysis, units: Sequence[Unit]) -> list[Boundary]:
    """Every pair of units some tensor crosses between, left to right."""
    g, owner = a.graph, a.owner
    unit_of = {}
    for u in units:
        for b in range(u.start, u.end):
            unit_of[b] = u.index
    ops_of = {u.index: {i for i in range(len(g.ops)) if a.evaluable(i) and u.start <= owner[i] < u.end}
              for u in units}
    # (left, right) -> {(produced var, wanted var): (produced by left, times)}
    crossing: dict[tuple[int, int], dict[tuple[int, int], tuple[bool, int]]] = {}

    def cross(here: int, there: int, made: int, read: int, times: int, self_ok: bool = False) -> None:
        if (here != there or self_ok) and g.shape(made) and times > 0:
            crossing.setdefault((min(here, there), max(here, there)), {})[(made, read)] = (here <= there, times)

    for op in g.ops:
        if not a.evaluable(op.id):
            continue
        here = unit_of[owner[op.id]]
        for v in op.outputs:
            for c in g.consumers[v]:
                if a.evaluable(c):
                    cross(here, unit_of[owner[c]], v, v, a.trips_of(op.id))
    # The state the step returns, taken back by the next step: its new value, as the unit that
    # updates it lays it out, becomes the input its first consumer wants (the whole step's
    # out_shardings are its in_shardings), so each step reshards it where the two differ. Left
    # out, Flax's pjit guide's plans updated their weights split on both mesh axes and read them
    # split on one: an all-gather of every weight and moment a step, no profile's, and the plan
    # ran 2.5-3.6x its prediction (72 ms a step, 43 ms with the state left where the update put it).
    for made, read in a.fed_back:
        producer = g.producer[made]
        readers = [c for c in g.consumers[read] if a.evaluable(c)]
        if producer is not None and a.evaluable(producer) and readers:
            cross(unit_of[owner[producer]], unit_of[owner[min(readers)]], made, read, 1, self_ok=True)
    for made, read, times, self_ok in _loop_crossings(a):
        if g.producer[made] is not None and a.evaluable(g.producer[made]):
            here = unit_of[owner[g.producer[made]]]
            for there in {unit_of[owner[c]] for c in g.consumers[read] if a.evaluable(c)}:
                cross(here, there, made, read, times, self_ok)
    return [_boundary(a, units, ops_of, left, right, pairs) for (left, right), pairs in sorted(crossing.items())]


def _boundary(a: Analysis, units: Sequence[Unit], ops_of: dict[int, set[int]], left: int, right: int,
              pairs: dict[tuple[int, int], tuple[bool, int]]) -> Boundary:
    """The boundary between units ``left`` and ``right`` of the tensors ``pairs`` says cross it."""
    g = a.graph
    b = Boundary(left, right, [], [], [], [], [], [])
    for (made, read), (from_left, times) in sorted(pairs.items()):
        src, dst = (units[left], units[right]) if from_left else (units[right], units[left])
        drop = len(g.shape(read)) - len(g.shape(made))   # a stacked tensor read as layers, or back
        b.vars.append(made if drop >= 0 else read)
        b.types.append((g.shape(b.vars[-1]), g.vars[made].dtype))
        b.from_left.append(from_left)
        b.times.append(times)
        b.produced.append([_layer(Layouts(a, src.assignment(c)).produced(made), -drop) for c in src.combos()])
        b.wanted.append([_layer(Layouts(a, dst.assignment(c)).wanted(read, within=ops_of[dst.index]), drop)
                         for c in dst.combos()])
    return b


def _layer(spec: Spec | None, drop: int) -> Spec | None:
    """A stacked tensor's layout as its layers': the leading (layer) axis dropped, where ``drop``."""
    return spec if spec is None or drop <= 0 else tuple(spec[drop:])


def _loop_crossings(a: Analysis) -> list[tuple[int, int, int, bool]]:
    """(tensor made, tensor read, times a step, within one unit too) for what crosses the
    expanded scans' boundaries: into the body (a constant or the carry, once), out of it (the
    final carry once; a stacked result, a layer per iteration), from one iteration to the next
    (the carry, trips - 1 times), and from one expanded scan's body to another's (a layer of a
    stacked residual, per iteration)."""
    g, out = a.graph, []
    stacked_from: dict[int, int] = {}   # stacked result of an expanded scan -> the body tensor stacked
    for loop in a.expanded:
        (_, outs), = g.loop_io[loop]
        nk = g.ops[loop].params["num_carry"]
        for v, s in zip(outs[nk:], g.ops[loop].outputs[nk:], strict=True):
            if v is not None:
                stacked_from[s] = v
    for loop in sorted(a.expanded):
        p, op = g.ops[loop].params, g.ops[loop]
        (ins, outs), = g.loop_io[loop]
        nc, nk, trips = p["num_consts"], p["num_carry"], p["length"]
        for v in ins:
            outer, how = g.outer.get(v, (None, ""))
            if outer is None:
                continue
            if how == "same":
                out.append((outer, v, 1, False))
            elif outer in stacked_from:
                out.append((stacked_from[outer], v, trips, True))
            else:  # a stacked tensor the top level makes (weights cast for compute), read a layer at a time
                out.append((outer, v, trips, False))
        for k, (v, result) in enumerate(zip(outs, op.outputs, strict=True)):
            if v is None:
                continue
            out.append((v, result, 1 if k < nk else trips, False))
            if k < nk:
                out.append((v, ins[nc + k], trips - 1, True))
    return out


def layout_pairs(boundaries: Sequence[Boundary], profiled: Sequence[Sequence[int]] | None = None) -> list[tuple]:
    """Every ((shape, dtype), src, dst) resharding the boundaries can need, in a fixed order;
    with ``profiled`` (per unit, the combination indices the search may use), only between those."""
    pairs = set()
    for b in boundaries:
        for k in range(len(b.vars)):
            src_unit, dst_unit = (b.left, b.right) if b.from_left[k] else (b.right, b.left)
            made = b.produced[k] if profiled is None else [b.produced[k][c] for c in profiled[src_unit]]
            read = b.wanted[k] if profiled is None else [b.wanted[k][c] for c in profiled[dst_unit]]
            for src in set(made):
                for dst in set(read):
                    if src is not None and src != dst:
                        pairs.add((b.types[k], src, dst))
    return sorted(pairs, key=repr)
