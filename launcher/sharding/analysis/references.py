"""Hand-written plans in CFP's space: the block plans nearest a reference layout, and the plans
blocks offer so that the space holds every reference a block plan can express.

A *reference* is a layout per tensor (var id -> ``Spec``) that a plan people trust gives the
program. ``search/nearest.py`` reads one off the program for each built-in plan (``models.plans``:
dp, tp, fsdp, dp_tp, ep) by tracing the step again under its rules: the layouts of the program's
inputs and of every activation its rules constrain. XLA's propagation decides the rest, in the
built-in plan's program as in CFP's.

**Nearest.** Each block takes the plan under which the most tensors *the block makes* get
exactly the reference's layout: the outputs of its operators (``Block.specs``). A tie goes to
the plan that reads the most operands as the reference lays them out: program inputs (CFP lays
an input out as its first consumer computes with it) and tensors other blocks make (no
resharding where the built-in plan has none); then to the first plan. Operands count only
second because their layout is not always the one they are computed with: fsdp stores every
weight split and gathers it where it is used, and a block whose built-in layout reshards its
input (ep's dispatch: groups split where the tokens are made, experts split where they are
dispatched) would otherwise copy its producer's layout rather than take its own.

**Offered.** The enumeration (``strategies.py``) splits something along every mesh axis, but a
hand-written plan leaves an axis unused where splitting would cost more than repeating the work:
dp_tp keeps a GShard MoE's router, dispatch and combine off its model axis, and tp keeps them
(and BERT's MLM transform) replicated. So the blocks are built first offering also every strategy
that splits part of what an enumerated one splits (``strategies.sub_strategies``); each
reference's nearest plan is found among those, and the blocks are built again offering, after the
enumerated strategies, the ones some reference's nearest plan took (``Block.references`` names
the references). A split left out adds no communication, so both builds group the operators into
the same blocks, and the added plans cost only where a reference needs them.

``mismatches`` lists what a plan still lays out otherwise than a reference, block by block: where
that list is not empty, no plan of CFP's space is the reference (``docs/cfp-layouts.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

from launcher.sharding.analysis.blocks import Block, build_blocks
from launcher.sharding.analysis.contractions import Contraction
from launcher.sharding.analysis.graph import Graph
from launcher.sharding.analysis.propagation import propagate
from launcher.sharding.analysis.strategies import Spec, Strategy, enumerate_strategies, operand_specs, sub_strategies

Reference = Mapping[int, Spec]


@dataclass(frozen=True)
class Mismatch:
    """A tensor ``var`` that block ``block``'s plan lays out as ``got`` where the reference has ``want``."""
    block: int
    var: int
    want: Spec
    got: Spec

    def is_input(self, g: Graph) -> bool:
        """A program input (parameter, optimizer state, batch), read as ``got``; else an activation
        the block makes."""
        return g.producer[self.var] is None


def laid_out(b: Block, cons: Mapping[int, Contraction], p: int) -> Iterator[tuple[int, Spec, bool]]:
    """(var, layout, made) for every tensor plan ``p`` of ``b`` gives a layout: ``made`` for the
    outputs of its operators, not for the operands its contractions read from elsewhere."""
    yield from ((v, spec, True) for v, spec in b.specs[p].items())
    for op in b.contractions:
        c = cons[op]
        for v, spec in zip((c.lhs, c.rhs), operand_specs(c, b.strategies[op][p])[:2], strict=True):
            if v is not None and v not in b.specs[p]:
                yield v, spec, False


def score(b: Block, cons: Mapping[int, Contraction], p: int, known: Reference) -> tuple[int, int]:
    made = read = 0
    for v, spec, mine in laid_out(b, cons, p):
        if known.get(v) == tuple(spec):
            made, read = made + mine, read + (not mine)
    return made, read


def nearest_assignment(g: Graph, blocks: Sequence[Block], cons: Mapping[int, Contraction],
                       known: Reference, carry: bool = False) -> list[int]:
    """Per block, its plan nearest the reference ``known`` (see the module's docstring). With
    ``carry`` (a reference of the inputs alone, a user's step's baselines), the layout a block's
    chosen plan makes counts as the reference's for the blocks after it: a block reading it then
    keeps it, as the reference's own program would (XLA propagates the inputs' layouts), rather
    than resharding it."""
    out, known = [], dict(known)
    for b in blocks:
        scores = [score(b, cons, p, known) for p in range(b.num_plans)]
        out.append(scores.index(max(scores)))
        if carry:
            for v, spec in b.specs[out[-1]].items():
                known.setdefault(v, tuple(spec))
    return out


def mismatches(g: Graph, blocks: Sequence[Block], cons: Mapping[int, Contraction], known: Reference,
               assignment: Sequence[int]) -> list[Mismatch]:
    """What the blocks lay out otherwise than ``known`` under ``assignment``, each tensor once,
    in block order: the tensors they make, and the program inputs they read (as an input is laid
    out as it is read)."""
    out, seen = [], set()
    for b in blocks:
        for v, spec, made in laid_out(b, cons, assignment[b.id]):
            if (made or g.producer[v] is None) and v in known and v not in seen and known[v] != tuple(spec):
                seen.add(v)
                out.append(Mismatch(b.id, v, known[v], tuple(spec)))
    return out


def referenced_strategies(g: Graph, cons: Mapping[int, Contraction], mesh_shape: Sequence[int],
                          two_axis_only: bool, references: Mapping[str, Reference]
                          ) -> dict[int, dict[Strategy, tuple[str, ...]]]:
    """Per head contraction, the strategies beyond its enumerated ones that the plans nearest
    ``references`` take, each with the names of those references (see "Offered" above)."""
    if not references:
        return {}
    wider = {op: dict.fromkeys(sub_strategies(enumerate_strategies(c, mesh_shape, two_axis_only)), ())
             for op, c in cons.items()}
    blocks, _ = build_blocks(g, cons, mesh_shape, two_axis_only, wider)
    out: dict[int, dict[Strategy, tuple[str, ...]]] = {}
    for name, known in references.items():
        for b, p in zip(blocks, nearest_assignment(g, blocks, cons, known), strict=True):
            if p >= b.enumerated:
                names = out.setdefault(b.head, {}).setdefault(b.plans[p], ())
                out[b.head][b.plans[p]] = names + (name,)
    return out


# What a loop body does to take its layer of a stacked constant (``fori_loop``'s ``w[i]``:
# a dynamic slice of the layer axis, then that axis squeezed away).
LAYER_PICKS = frozenset({"dynamic_slice", "squeeze", "reshape"})


def into_loops(g: Graph, known: Reference, mesh_shape: Sequence[int] = ()) -> dict[int, Spec]:
    """``known`` carried into the loops' bodies: a body's constant or carry is laid out as the
    operand it stands for; a layer of a stacked tensor (a scan's slice of it, or its result
    stacked into it) as that tensor without its layer axis, where the layer axis is whole; and
    with ``mesh_shape``, a layer a body picks out of a stacked constant itself (``LAYER_PICKS``,
    as ``fori_loop`` indexes its weights) as the propagation rules lay it out, where that
    moves no data."""
    out = dict(known)
    for v, (o, how) in sorted(g.outer.items()):  # an outer tensor's id is below its bodies'
        spec = out.get(o)
        if spec is None or v in out:
            continue
        if how == "same":
            out[v] = spec
        elif spec and not spec[0]:
            out[v] = tuple(spec[1:])
    if not mesh_shape:
        return out
    for op in g.ops:  # in program order: a pick's operand is known before the pick
        if op.loop is None or op.prim not in LAYER_PICKS or op.inputs[0] not in out \
                or any(v in out for v in op.outputs):
            continue
        specs, comm = propagate(g, op, [out.get(v) if v is not None else None for v in op.inputs], mesh_shape)
        if not comm:
            out.update(zip(op.outputs, specs, strict=True))
    return out


# --- a named mesh's layouts on CFP's mesh axes (the built-in plans', a user's baselines') ----

def axis_map(sizes: dict[str, int], mesh_shape: Sequence[int]) -> dict[str, tuple[int, ...]] | None:
    """Named mesh axes (outermost first) -> the run of CFP mesh axes each covers, or None."""
    out, i = {}, 0
    for name, size in sizes.items():
        run, n = [], 1
        while n < size and i < len(mesh_shape):
            run.append(i)
            n *= mesh_shape[i]
            i += 1
        if n != size:
            return None
        out[name] = tuple(run)
    return out if i == len(mesh_shape) or all(s == 1 for s in mesh_shape[i:]) else None


def cfp_spec(partition_spec: Any, axes: dict[str, tuple[int, ...]], ndim: int) -> Spec:
    entries = tuple(partition_spec) + (None,) * (ndim - len(partition_spec))
    spec = []
    for e in entries:
        names = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        spec.append(tuple(a for name in names for a in axes[name]))
    return tuple(spec)
