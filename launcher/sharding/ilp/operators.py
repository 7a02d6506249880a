"""Alpa's graph: one decision per contraction, the operators between contractions merged into
their producer.

Alpa's intra-operator pass gives every operator a strategy vector, but the operators that are
not heavy (element-wise, reshapes, reductions, ...) *follow* an operand: they share its ILP
variable instead of getting one of their own (the ``following`` of Alpa's auto-sharding, the
graph simplification of the paper's section 4.2). That is what is done here: every contraction
of the step (forward and backward alike, each with its own choice) is a node, and every other
operator follows the node its layout comes from, by the rule the ParallelBlocks already use to
place an operator (``analysis/blocks.py``: the latest-produced input of the output's shape;
operators with no such input join their first consumer's node). Its layouts under each of the
node's strategies come from ``analysis/propagation.py``, as in a block; where propagation needs
communication the node pays for it (``formulate.py``: the operator's *glue* cost).

So the graph differs from CFP's in one thing only: CFP's ParallelBlock binds a forward
contraction, its siblings (Q/K/V), the contractions it absorbs (attention scores) and its
backward contractions to one choice, while here each of them chooses alone and pays for
resharding between them. That keeps every strategy Alpa could pick within the same layout
language, and lets the result be an ``Analysis`` whose blocks each hold one contraction: the
layouts a choice implies, and the plan's sharding constraints, are then built by
``apply.py``'s ``Layouts``/``plan_constraints``/``whole_step`` unchanged (no new function
there), and the crossing tensors by ``profile/boundaries.py``.

Strategies (``alpa_strategies``): those ``analysis/strategies.py`` enumerates, and those CFP's
blocks give the contraction under any of their plans. The enumeration splits one dimension per
role, while Alpa also splits two batch dimensions over the two mesh axes (its dot handler's
``SplitTwoBatchDims``: attention's batch and heads, as dp_tp lays them out), which CFP's blocks
reach by propagation; with them the ILP can give every contraction the layout any CFP plan
gives it. Then the ones that leave a mesh axis replicating the work when another strategy of
the same contraction uses every device are dropped: Alpa gives computation no cost because it
does not allow replicated computation of heavy operators (paper, section 4.2), which only holds
once those are out. On a 1-D mesh every strategy uses every device, and nothing is dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from launcher.sharding.analysis.blocks import Block, Owners, _settle_pending
from launcher.sharding.analysis.contractions import Contraction
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.strategies import Spec, Strategy, enumerate_strategies, operand_specs
from launcher.errors import UserError


def devices_used(s: Strategy, mesh_shape: Sequence[int]) -> int:
    """How many devices share a contraction's work under ``s`` (the rest replicate it)."""
    return math.prod(mesh_shape[a] for a in {a for axes in s.axes for a in axes})


def alpa_strategies(c: Contraction, mesh_shape: Sequence[int], more: Sequence[Strategy] = ()) -> list[Strategy]:
    """The enumerated strategies and ``more``, less those that do not divide the work over the
    most devices any of them does (module doc)."""
    every = list(dict.fromkeys([*enumerate_strategies(c, mesh_shape), *more]))
    most = max(devices_used(s, mesh_shape) for s in every)
    return [s for s in every if devices_used(s, mesh_shape) == most]


@dataclass
class OperatorGraph:
    """The step as Alpa's nodes: ``analysis`` has one block per contraction (its plans are that
    contraction's strategies); ``glue`` records, per operator whose layout propagation needs
    communication under some strategy of its node, for each strategy its (input layouts the
    node decides, output layouts), or None where that strategy needs none."""
    analysis: Analysis
    glue: dict[int, list[tuple[list[Spec | None], list[Spec]] | None]] = field(default_factory=dict)

    @property
    def nodes(self) -> list[Block]:
        return self.analysis.blocks

    def choice(self, assignment: Sequence[int]) -> dict[int, Strategy]:
        """contraction op id -> its strategy, for a strategy index per node."""
        return {b.head: b.plans[p] for b, p in zip(self.nodes, assignment, strict=True)}


def operator_graph(a: Analysis, every_strategy: bool = False) -> OperatorGraph:
    """Alpa's graph of the program ``a`` analysed (same operators, same ids, same mesh).
    ``every_strategy``: keep the strategies that leave a mesh axis repeating a contraction's work
    too (their computation is then priced per strategy, ``formulate(compute=True)``: how a
    prediction prices any plan, a baseline's among them)."""
    g, cons, mesh_shape = a.graph, a.contractions, a.mesh_shape
    blocks: list[Block] = []
    owner: list[int | None] = [None] * len(g.ops)
    pending: list[int] = []
    glue: dict[int, list] = {}

    owner_of = Owners(g, cons, blocks, owner)   # a scanned body's results: as in CFP's blocks

    for op in g.ops:
        c = cons.get(op.id)
        if c is not None:
            cfp = a.blocks[a.owner[c.op]]
            strategies = (list(dict.fromkeys([*enumerate_strategies(c, mesh_shape), *cfp.strategies[c.op]]))
                          if every_strategy else alpa_strategies(c, mesh_shape, cfp.strategies[c.op]))
            b = Block(len(blocks), c.op, strategies)
            b.roles[c.op], b.strategies[c.op], owner[c.op] = "head", list(b.plans), b.id
            b.members.add(c.op)
            b.specs = [{c.out: operand_specs(c, s)[2]} for s in b.plans]
            blocks.append(b)
            continue
        followed = owner_of.follow(op, pending, mesh_shape)   # as in CFP's blocks
        if followed is None:
            continue
        b, followed_plans = followed
        per_plan = [(ins, outs) if needs else None for ins, outs, needs in followed_plans]
        if any(per_plan):
            glue[op.id] = per_plan
        elif any(g.producer[v] in b.members for v in op.inputs if v is not None and g.producer[v] is not None):
            b.members.add(op.id)

    _settle_pending(g, pending, owner, blocks)
    for i, o in enumerate(owner):
        blocks[o].ops.append(i)
    # (The scans CFP's analysis runs a body iteration at a time are the ILP's too: its costs count
    # them once per iteration, and the plan pins their bodies.)
    analysis = Analysis(g, a.mesh_shape, cons, blocks, owner, [f"op {b.head}" for b in blocks], [], [],
                        a.closed_jaxpr, _expanded=a.expanded)
    return OperatorGraph(analysis, glue)


def check_decidable(og: OperatorGraph) -> None:
    """Bad input when no contraction has a choice: the ILP would have nothing to decide."""
    a = og.analysis
    if all(b.num_plans == 1 for b in og.nodes):
        raise UserError(f"the ILP has no contraction to decide: each of the {len(og.nodes)} contractions has one "
                        f"strategy on mesh {list(a.mesh_shape)} (no mesh axis larger than 1 divides their "
                        "dimensions); give mode.mesh_shape axes that divide the batch, hidden or vocabulary sizes")
