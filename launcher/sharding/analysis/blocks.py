"""ParallelBlocks: groups of operators whose layout one choice fixes without communication.

A block starts at a forward contraction, its *head*. A *plan* of the block is one of the head's
strategies (``strategies.py``); choosing it fixes the layout of every operator in the block. The
enumerated strategies come first; after them, where a hand-written plan lays the block out in a
way the enumeration leaves out (a mesh axis left unused), the head's strategy under that plan
(``references.py``), named after the plans it was added for.
Operators are visited in program order and each is *owned* by exactly one block:

- a forward contraction joins an existing block as a *sibling* when it shares a (non-input)
  operand with that block's head or sibling at the same operand position and has the same
  dimension roles and sizes: Q, K and V projections of one activation, LLaMA's gate and up
  projections. It takes the head's strategy, role for role;
- it is *absorbed* by a block when both its operands are members of that block and, under every
  plan, their layouts imply a communication-free strategy: attention scores and the weighted sum
  of values, whose operands both come from the Q/K/V projections;
- otherwise it heads a new block;
- a backward contraction joins the block of its forward counterpart: the forward contraction
  that has one of its operands as an operand (the weight for the input gradient, the input for
  the weight gradient) and whose output has the shape of its other operand (the cotangent). Its
  strategy under each plan is derived from the counterpart's: the dimensions of the shared
  operand keep their loop-dimension labels, paired dimensions share labels, and the remaining
  ones take the counterpart's unused labels by size, so the data-parallel plan's weight gradient
  contracts over the split batch dimension (the gradient all-reduce) while a column-split plan's
  stays split. A backward contraction that repeats a forward one (recomputed under remat: the
  same operator on the same weights) joins its block as a *recompute* with its strategy. Tensors
  are compared as ``Graph.canonical`` names them, so a scanned model's backward loop finds its
  counterparts in the forward loop (both read slices of one stacked weight; the backward loop
  reads the residuals the forward loop stacked). A backward contraction with neither heads its
  own block;
- any other operator is owned by the block of its most recently produced owned input of the
  output's shape (a residual add belongs to the block that produced the later of its two
  inputs; a scalar such as a gradient-clipping scale never decides), and follows that block's
  layouts by the rules in ``propagation.py``. It is a *member* of the block when it is reached
  from a member and needs no communication under any plan; otherwise it is *glue*: owned (it
  runs with the block), but the place where the block's plans stop propagating. Operators with
  no owned input at all (index arithmetic, masks from ``iota``, the optimizer's step counter)
  are glue of the block of their first consumer.

For each plan, every contraction in a block gets its strategy, hence its operand and output
layouts; those are the sharding constraints the profile pass applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from launcher.sharding.analysis.contractions import Contraction
from launcher.sharding.analysis.graph import LOOPS, Graph
from launcher.sharding.analysis.propagation import propagate
from launcher.sharding.analysis.strategies import Spec, Strategy, enumerate_strategies, from_operand_specs, operand_specs

KIND_FAMILY = {"dot": "dot", "conv": "conv", "lookup": "lookup", "lookup_grad": "lookup"}


@dataclass
class Block:
    id: int
    head: int                                   # op id of the head contraction
    plans: list[Strategy]                       # the head's strategies: plan k is plans[k]
    ops: list[int] = field(default_factory=list)          # every owned op, program order
    members: set[int] = field(default_factory=set)        # communication-free under every plan
    roles: dict[int, str] = field(default_factory=dict)   # contraction -> head/sibling/absorbed/bwd
    strategies: dict[int, list[Strategy]] = field(default_factory=dict)  # contraction -> per plan
    specs: list[dict[int, Spec]] = field(default_factory=list)  # per plan: var -> layout
    enumerated: int = 0                         # plans[:enumerated]: enumerate_strategies'
    references: dict[int, tuple[str, ...]] = field(default_factory=dict)  # plan added -> for whom

    @property
    def num_plans(self) -> int:
        return len(self.plans)

    @property
    def contractions(self) -> list[int]:
        return sorted(self.roles)


def build_blocks(g: Graph, cons: dict[int, Contraction], mesh_shape: Sequence[int],
                 two_axis_only: bool = False, extra: Mapping[int, Mapping[Strategy, tuple[str, ...]]] | None = None
                 ) -> tuple[list[Block], list[int]]:
    """The blocks in head order, and the owner block of every operator (``two_axis_only``:
    ``strategies.enumerate_strategies``'s). ``extra``: per contraction, strategies its block
    offers after the enumerated ones should it head one, each with the names it is offered for."""
    blocks: list[Block] = []
    owner: list[int | None] = [None] * len(g.ops)
    pending: list[int] = []
    alike = _alike(g)
    # A scan with contractions in its body (a scanned model's layers) is laid out by its body's
    # blocks, not by the block that owns the scan operator: what reads its results starts afresh,
    # as what reads a program input does.
    owner_of = Owners(g, cons, blocks, owner)

    def is_member(v: int | None, b: Block) -> bool:
        return v is not None and g.producer[v] is not None and g.producer[v] in b.members

    def open_block(c: Contraction) -> Block:
        b = Block(len(blocks), c.op, enumerate_strategies(c, mesh_shape, two_axis_only))
        b.enumerated = len(b.plans)
        for s, names in (extra or {}).get(c.op, {}).items():
            if s not in b.plans:
                b.plans.append(s)
                b.references[len(b.plans) - 1] = tuple(names)
        b.specs = [{} for _ in b.plans]
        blocks.append(b)
        return b

    def join(b: Block, c: Contraction, role: str, strats: list[Strategy]) -> None:
        b.roles[c.op] = role
        b.strategies[c.op] = strats
        b.members.add(c.op)
        owner[c.op] = b.id
        for p, s in enumerate(strats):
            b.specs[p][c.out] = operand_specs(c, s)[2]

    for op in g.ops:
        c = cons.get(op.id)
        if c is not None:
            if op.phase == "bwd":
                found = _recompute(g, c, cons, blocks, owner, alike) or _counterpart(g, c, cons, blocks, owner, alike)
            else:
                found = _sibling(g, c, cons, blocks, owner) or _absorber(c, blocks, owner_of, is_member)
            if found is None:
                b = open_block(c)
                found = (b, "head", list(b.plans))
            join(found[0], c, found[1], found[2])
            continue

        followed = owner_of.follow(op, pending, mesh_shape)
        if followed is None:
            continue
        b, per_plan = followed
        if not any(needs for _, _, needs in per_plan) and any(is_member(v, b) for v in op.inputs):
            b.members.add(op.id)

    _settle_pending(g, pending, owner, blocks)
    for i, o in enumerate(owner):
        blocks[o].ops.append(i)
    return blocks, owner  # type: ignore[return-value]


class Owners:
    """v -> the block owning the operator that makes tensor v (None: an input, or unowned).

    A scan with contractions in its body (a scanned model's layers, ``scans``) is laid out by its
    body's blocks, not by the block that owns the scan operator: each of its results belongs to
    the block making it in the body (its final carry; or its layers, stacked: the optimizer
    updates a scanned model's stacked weights with the layouts the body's plan gives each
    layer's gradient), with that block's layouts, a layer axis added where stacked. Shared by the
    ParallelBlocks and the ILP's operator graph (``ilp/operators.py``)."""

    def __init__(self, g: Graph, cons: Mapping[int, Contraction], blocks: list[Block], owner: list[int | None]):
        self.g, self.blocks, self.owner = g, blocks, owner
        self.scans = {loop for op in cons for loop in [g.outermost_loop(op)]
                      if loop is not None and g.ops[loop].prim == "scan"}
        self.made_by = _scan_results(g, self.scans)

    def follow(self, op: Any, pending: list[int], mesh_shape: Sequence[int]
               ) -> tuple[Block, list[tuple[list, list, bool]]] | None:
        """An operator that is not a contraction joins the block owning the tensor that carries
        it (``_carrier``), and its outputs get, under each of that block's plans, the layouts
        propagation gives them. Returns the block and, per plan, (its inputs' layouts the block
        decides, its outputs' layouts, whether propagation needs communication); None where it
        waits for an owner (no input owned yet: appended to ``pending``) or is a scan laid out
        by its body's blocks."""
        owned = [v for v in op.inputs if self(v) is not None]
        if not owned:
            pending.append(op.id)
            return None
        b = self.blocks[self(_carrier(self.g, op, owned))]
        self.owner[op.id] = b.id
        if op.id in self.scans:  # its results are laid out by its body's blocks (__call__), not by this one
            return None
        per_plan = []
        for p in range(b.num_plans):
            ins = [b.specs[p].get(v) if self(v) == b.id else None for v in op.inputs]
            outs, needs = propagate(self.g, op, ins, mesh_shape)
            for v, s in zip(op.outputs, outs, strict=True):
                b.specs[p][v] = s
            per_plan.append((ins, outs, needs))
        return b, per_plan

    def __call__(self, v: int | None) -> int | None:
        g = self.g
        if v is None or g.producer[v] is None:
            return None
        if g.producer[v] not in self.scans:
            return self.owner[g.producer[v]]
        if v not in self.made_by:
            return None
        u, stacked = self.made_by[v]
        o = self(u)
        if o is not None:
            for spec in self.blocks[o].specs:
                if u in spec and v not in spec:
                    spec[v] = ((),) + tuple(spec[u]) if stacked else spec[u]
        return o


def _scan_results(g: Graph, scans: set[int]) -> dict[int, tuple[int, bool]]:
    """Each result of ``scans``: (the body tensor it is, whether stacked: a layer per iteration)."""
    out = {}
    for loop in scans:
        (_, outs), = g.loop_io[loop]
        nk = g.ops[loop].params["num_carry"]
        for k, (u, v) in enumerate(zip(outs, g.ops[loop].outputs, strict=True)):
            if u is not None:
                out[v] = (u, k >= nk)
    return out


def _carrier(g: Graph, op, owned: list[int]) -> int:
    """The input whose block owns ``op``: the latest-produced one among those shaped like the
    output (the layout carriers of an element-wise op), else among non-scalars, else any. A scalar
    never decides: gradient clipping multiplies every gradient by one global scale, and that must
    not pull every layer's optimizer update into the block that computed the scale."""
    out_shape = g.shape(op.outputs[0]) if op.outputs else None
    for pool in ([v for v in owned if g.shape(v) == out_shape], [v for v in owned if g.shape(v)], owned):
        if pool:
            return max(pool, key=lambda v: g.producer[v])
    raise AssertionError("no owned input")


def _sibling(g: Graph, c: Contraction, cons: dict[int, Contraction], blocks: list[Block],
             owner: list[int | None]) -> tuple[Block, str, list[Strategy]] | None:
    for side in ("lhs", "rhs"):
        v = getattr(c, side)
        if v is None or g.producer[v] is None:
            continue  # program inputs (weights) are shared by design, not siblings
        for u in g.consumers[v]:
            if u >= c.op or u not in cons or owner[u] is None:
                continue
            b = blocks[owner[u]]
            other = cons[u]
            if b.roles.get(u) in ("head", "sibling") and getattr(other, side) == v and other.signature == c.signature:
                return b, "sibling", list(b.strategies[u])
    return None


def _absorber(c: Contraction, blocks: list[Block], owner_of, is_member) -> tuple[Block, str, list[Strategy]] | None:
    if c.lhs is None or c.rhs is None:
        return None
    o = owner_of(c.lhs)
    if o is None or owner_of(c.rhs) != o:
        return None
    b = blocks[o]
    if not (is_member(c.lhs, b) and is_member(c.rhs, b)):
        return None
    strats = []
    for p in range(b.num_plans):
        s, free = from_operand_specs(c, b.specs[p][c.lhs], b.specs[p][c.rhs])
        if not free:
            return None
        strats.append(s)
    return b, "absorbed", strats


def _alike(g: Graph):
    """v -> the tensors that are v: a layer of the same top-level tensor (``Graph.canonical``),
    or recomputed (``_recomputed``)."""
    same = _recomputed(g)
    rep = lambda v: same.get(g.canonical(v), g.canonical(v))
    classes: dict[int, list[int]] = {}
    for v in [*g.outer, *same]:
        classes.setdefault(rep(v), [rep(v)]).append(v)
    return lambda v: classes.get(rep(v), [v])


def _recomputed(g: Graph) -> dict[int, int]:
    """Tensors the backward pass recomputes under remat (``jax.checkpoint``) -> the forward
    tensors they are: an operator inside a remat region of the backward pass computing what a
    forward operator computes (same primitive and parameters, inputs that are the same tensors)
    makes its outputs again."""
    same: dict[int, int] = {}
    made: dict[tuple, tuple[int, ...]] = {}

    def key(op) -> tuple:
        ins = tuple(None if v is None else same.get(g.canonical(v), g.canonical(v)) for v in op.inputs)
        return op.prim, repr(sorted(op.params.items())), ins, tuple(g.vars[v].type_str for v in op.outputs)

    for op in g.ops:
        if op.prim in LOOPS or not op.outputs:
            continue
        if op.phase == "fwd":
            made.setdefault(key(op), op.outputs)
        elif "remat" in op.name or "checkpoint" in op.name:
            first = made.get(key(op))
            if first is not None:
                same.update({v: same.get(u, u) for v, u in zip(op.outputs, first, strict=True)})
    return same


def _recompute(g: Graph, c: Contraction, cons: dict[int, Contraction], blocks: list[Block],
               owner: list[int | None], alike) -> tuple[Block, str, list[Strategy]] | None:
    """The block of the forward contraction ``c`` repeats under remat: the same operator
    (parameters and operand types), inside a remat region, reading the same tensor at the same
    operand position."""
    op = g.ops[c.op]
    if "remat" not in op.name and "checkpoint" not in op.name:
        return None
    for side in ("lhs", "rhs"):
        v = getattr(c, side)
        if v is None:
            continue
        for w in alike(v):
            for u in g.consumers[w]:
                f = cons.get(u)
                if (f is None or u >= c.op or owner[u] is None or g.ops[u].phase == "bwd" or getattr(f, side) != w
                        or g.ops[u].prim != op.prim or g.ops[u].params != op.params
                        or [g.vars[x].type_str for x in g.ops[u].inputs if x is not None]
                        != [g.vars[x].type_str for x in op.inputs if x is not None]):
                    continue
                b = blocks[owner[u]]
                return b, "recompute", list(b.strategies[u])
    return None


def _counterpart(g: Graph, c: Contraction, cons: dict[int, Contraction], blocks: list[Block],
                 owner: list[int | None], alike) -> tuple[Block, str, list[Strategy]] | None:
    candidates = []
    for side, other in (("lhs", c.rhs), ("rhs", c.lhs)):
        v = getattr(c, side)
        if v is None or other is None:
            continue
        for w in alike(v):
            for u in g.consumers[w]:
                f = cons.get(u)
                if f is None or u >= c.op or owner[u] is None or g.ops[u].phase == "bwd" or w not in (f.lhs, f.rhs):
                    continue
                if g.shape(other) != f.out_shape:
                    continue
                same_family = KIND_FAMILY[f.kind] == KIND_FAMILY[c.kind]
                candidates.append((not same_family, u, f, w, side))
    for _, u, f, v, side in sorted(candidates, key=lambda t: (t[0], t[1])):
        labels = derive_labels(f, v, c, side)
        if labels is None:
            continue
        b = blocks[owner[u]]
        return b, "bwd", [Strategy(tuple(s.axes[l] for l in labels)) for s in b.strategies[u]]
    return None


def derive_labels(f: Contraction, v: int, c: Contraction, c_side: str) -> list[int] | None:
    """For each loop dimension of backward contraction ``c``, the loop dimension of forward
    contraction ``f`` it iterates over, given that ``v`` is an operand of both."""
    f_side = "lhs" if f.lhs == v else "rhs"
    f_dim_of = {getattr(d, f_side): i for i, d in enumerate(f.dims) if getattr(d, f_side) is not None}
    labels: list[int | None] = [None] * len(c.dims)
    for i, d in enumerate(c.dims):
        od = getattr(d, c_side)
        if od is not None and od in f_dim_of:
            labels[i] = f_dim_of[od]
    unused = [j for j in range(len(f.dims)) if j not in labels]
    for i, l in enumerate(labels):
        if l is None:
            j = next((j for j in unused if f.dims[j].size == c.dims[i].size), None)
            if j is None:
                return None
            labels[i] = j
            unused.remove(j)
    if any(f.dims[l].size != c.dims[i].size for i, l in enumerate(labels)) or len(set(labels)) != len(labels):
        return None
    return labels  # type: ignore[return-value]


def _settle_pending(g: Graph, pending: list[int], owner: list[int | None], blocks: list[Block]) -> None:
    for i in reversed(pending):
        consumers = [u for v in g.ops[i].outputs for u in g.consumers[v] if owner[u] is not None]
        if consumers:
            owner[i] = owner[min(consumers)]
    for i in pending:
        if owner[i] is None:
            # The latest owned operator before it in the same body (a loop body's operators run
            # with a block of that body: ``segment_program`` evaluates them together).
            loop = g.ops[i].loop
            before = [owner[j] for j in range(i - 1, -1, -1) if owner[j] is not None and g.ops[j].loop == loop]
            owner[i] = before[0] if before else next((o for o in owner if o is not None), 0)
