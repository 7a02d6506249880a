"""Alpa's intra-operator ILP over the operator graph (``operators.py``), priced by the calibrated
communication model (``measuring/costmodel.py``).

One choice per node (a contraction and the operators that follow it): strategy ``p`` of node
``u`` costs ``node[u][p]`` seconds, a pair of choices of two nodes that exchange tensors costs
``edges[(u, v)][p, q]``, and the plan's peak memory per device must fit the budget:

- node cost: the contraction's own collective (the all-reduce of its output over the mesh axes
  that split its contracting dimension, on the output's per-device bytes), plus, for every
  operator following it whose layout propagation needs communication (its *glue*): a reduction
  over a split dimension all-reduces its result; an element-wise operator reshards the inputs
  laid out differently from its result; anything else gathers its split inputs whole (what XLA
  does with an operator it cannot partition);
- edge cost: resharding every tensor that crosses between the two nodes, from the layout its
  producer's strategy gives it to the layout its consumer's strategy wants
  (``profile/boundaries.py``, the same crossings CFP's search charges); a program input (a
  parameter, optimizer state, the batch) is laid out as its first planned consumer wants it
  (``apply.Layouts.wanted``, how the plan is applied), so it is merged into that node and every
  other node that reads it pays an edge; the new training state leaves the step laid out as the
  state came in (``apply._follow_inputs``), so the node producing it pays an edge to the node
  its input follows. Crossings within a node are the node's own cost;
- memory: Alpa's liveness constraint. In program order every tensor lives from its producer to
  its last consumer (program outputs to the end; inputs to the end, except the donated training
  state, whose buffers are reused once read), holding its per-device bytes under the layout its
  node's strategy gives it (whole, where no node decides it). At every point the live bytes must
  fit the budget: one linear row per point;
- computation: none, as in Alpa (every allowed strategy divides a contraction's work evenly over
  the devices, ``operators.alpa_strategies``): the contractions' FLOPs over the calibrated matmul
  rate (once per iteration of a scanned body) are the same for every plan, added only to predict
  a step time. A prediction (``launcher/sharding/predict/``) keeps every strategy instead, and each
  node then pays its contraction's computation under each (``formulate(compute=True)``).

``Problem.time_s``/``memory_bytes`` evaluate any choice exactly as the ILP scores it (the tests
check the solver's optimum against a brute force over them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.propagation import ELEMENTWISE, PASS_THROUGH, REDUCTIONS
from launcher.sharding.analysis.strategies import Spec, allreduce_axes, operand_specs
from launcher.sharding.apply import Layouts, _fits
from launcher.sharding.measuring.costmodel import CommModel
from launcher.sharding.ilp.operators import OperatorGraph, devices_used
from launcher.sharding.profile.boundaries import find_boundaries
from launcher.sharding.profile.units import Unit


@dataclass
class Problem:
    sizes: list[int]                               # strategies per node
    node_s: list[np.ndarray]                       # per node: seconds per strategy
    edges: dict[tuple[int, int], np.ndarray]       # (u, v), u < v: seconds [strategy of u, strategy of v]
    mem_rows: np.ndarray                           # [point, flat strategy index]: bytes live there
    mem_const: np.ndarray                          # [point]: bytes live there whatever the plan
    compute_s: float                               # the same for every plan (module doc)

    @property
    def offsets(self) -> list[int]:
        return [0, *np.cumsum(self.sizes)[:-1].tolist()]

    def flat(self, choice: Sequence[int]) -> list[int]:
        return [o + p for o, p in zip(self.offsets, choice, strict=True)]

    def comm_s(self, choice: Sequence[int]) -> float:
        """The ILP's objective: seconds of communication of a strategy index per node."""
        t = sum(float(self.node_s[u][p]) for u, p in enumerate(choice))
        return t + sum(float(m[choice[u], choice[v]]) for (u, v), m in self.edges.items())

    def time_s(self, choice: Sequence[int]) -> float:
        """Predicted step time: computation plus communication."""
        return self.compute_s + self.comm_s(choice)

    def memory_bytes(self, choice: Sequence[int]) -> float:
        """Predicted peak bytes per device (the liveness rows' largest)."""
        if not len(self.mem_const):
            return 0.0
        return float((self.mem_const + self.mem_rows[:, self.flat(choice)].sum(axis=1)).max())

    def memory_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Per point, the least and the most bytes any plan can have live there."""
        lo, hi = self.mem_const.copy(), self.mem_const.copy()
        for o, n in zip(self.offsets, self.sizes, strict=True):
            block = self.mem_rows[:, o:o + n]
            lo += block.min(axis=1)
            hi += block.max(axis=1)
        return lo, hi

    @property
    def space(self) -> int:
        return math.prod(self.sizes)


def itemsize(dtype: str) -> int:
    """Bytes per element of a dtype name (``float32``, ``bfloat16``, ``int8``, ``bool``)."""
    if dtype == "bool":
        return 1
    bits = re.search(r"(\d+)$", dtype)
    return int(bits.group(1)) // 8 if bits else 0


def formulate(og: OperatorGraph, model: CommModel, compute: bool = False) -> Problem:
    """The ILP's costs and memory rows for ``og`` (module doc). ``compute``: each strategy's
    node also pays its contraction's computation, its FLOPs over the devices that share them
    at the model's matmul rate (a graph of ``every_strategy``, where that differs by strategy)."""
    a = og.analysis
    nodes = a.blocks
    sizes = [b.num_plans for b in nodes]
    pricer = _Pricer(a, model)
    # A node inside a scanned body runs once per iteration (its glue too, where it is there).
    node_s = [pricer.node(u) * a.trips_of(b.head) for u, b in enumerate(nodes)]
    if compute:
        for u, b in enumerate(nodes):
            node_s[u] = node_s[u] + a.trips_of(b.head) * np.array(
                [contraction_s(a.contractions[b.head], s, a.mesh_shape, model.matmul_flops_per_s) for s in b.plans])
    for op, per_plan in og.glue.items():
        u = a.owner[op]
        node_s[u] = node_s[u] + a.trips_of(op) * np.array([pricer.glue(op, x) if x else 0.0 for x in per_plan])
    edges: dict[tuple[int, int], np.ndarray] = {}

    def charge(u: int, v: int, m: np.ndarray) -> None:
        """Seconds ``m[p, q]`` for node u on p and v on q; within one node, its own cost."""
        if u == v:
            node_s[u] = node_s[u] + np.diag(m)
        elif u < v:
            edges[(u, v)] = edges.get((u, v), 0.0) + m
        else:
            edges[(v, u)] = edges.get((v, u), 0.0) + m.T

    for u, v, m in pricer.crossings():
        charge(u, v, m)
    for u, v, m in pricer.inputs():
        charge(u, v, m)
    for u, v, m in pricer.state():
        charge(u, v, m)
    edges = {k: m for k, m in edges.items() if np.any(m)}
    rows, const = pricer.liveness()
    fixed = 0.0 if compute else sum(a.trips_of(op) * contraction_s(c, nodes[a.owner[op]].plans[0], a.mesh_shape,
                                                                   model.matmul_flops_per_s)
                                    for op, c in a.contractions.items())
    return Problem(sizes, node_s, edges, rows, const, fixed)


def contraction_s(c: Any, s: Any, mesh_shape: Sequence[int], flops_per_s: float) -> float:
    """Seconds of one contraction's computation under strategy ``s`` (a dot's or convolution's
    FLOPs over the devices sharing them; an embedding lookup computes nothing to speak of)."""
    if c.kind not in ("dot", "conv"):
        return 0.0
    return 2.0 * math.prod(d.size for d in c.dims) / devices_used(s, mesh_shape) / flops_per_s


class _Pricer:
    """The terms of the ILP, one kind per method, over the operator graph's analysis ``a``."""

    def __init__(self, a: Analysis, model: CommModel) -> None:
        self.a, self.g, self.model = a, a.graph, model
        self._reshard: dict[tuple, float] = {}
        self._decider: dict[int, int | None] = {}

    def bytes(self, v: int, spec: Spec) -> float:
        return self.model.shard_bytes(self.g.shape(v), itemsize(self.g.vars[v].dtype), spec)

    def reshard(self, v: int, src: Spec | None, dst: Spec | None) -> float:
        if src is None or dst is None or tuple(src) == tuple(dst):
            return 0.0
        key = (self.g.shape(v), self.g.vars[v].dtype, tuple(src), tuple(dst))
        if key not in self._reshard:
            self._reshard[key] = self.model.reshard_seconds(key[0], itemsize(key[1]), src, dst)
        return self._reshard[key]

    # --- node costs ---------------------------------------------------------------------------

    def node(self, u: int) -> np.ndarray:
        """Per strategy, the all-reduce its contraction's split contracting dimension needs."""
        b = self.a.blocks[u]
        c = self.a.contractions[b.head]
        out = []
        for s in b.plans:
            nbytes = self.model.shard_bytes(c.out_shape, itemsize(self.g.vars[c.out].dtype), operand_specs(c, s)[2])
            out.append(self.model.seconds("all-reduce", allreduce_axes(c, s), nbytes))
        return np.array(out)

    def glue(self, op_id: int, where: tuple[list, list]) -> float:
        """What an operator following a node communicates under one strategy (module doc)."""
        op, (ins, outs) = self.g.ops[op_id], where
        if op.prim in REDUCTIONS and ins and ins[0] is not None:
            reduced = set(op.params.get("axes", ()))
            axes = [a for d, ax in enumerate(ins[0]) if d in reduced for a in ax]
            return sum(self.model.seconds("all-reduce", axes, self.bytes(v, s)) for v, s in zip(op.outputs, outs, strict=True))
        total = 0.0
        for v, spec in zip(op.inputs, ins, strict=True):
            if v is None or spec is None or not any(spec):
                continue
            if op.prim in ELEMENTWISE and len(self.g.shape(v)) == len(outs[0]):
                total += self.reshard(v, spec, outs[0])
            elif op.prim not in ELEMENTWISE:
                total += self.reshard(v, spec, ((),) * len(spec))
        return total

    # --- edge costs ---------------------------------------------------------------------------

    def crossings(self):
        """(u, v, seconds[p, q]) for the tensors produced by one node and read by another."""
        units = [Unit(i, i, (i, 0), i, i + 1, [b.num_plans]) for i, b in enumerate(self.a.blocks)]
        for bd in find_boundaries(self.a, units):
            m = np.zeros((units[bd.left].plan_counts[0], units[bd.right].plan_counts[0]))
            for k, v in enumerate(bd.vars):
                for p in range(m.shape[0]):
                    for q in range(m.shape[1]):
                        if bd.from_left[k]:
                            m[p, q] += self.reshard(v, bd.produced[k][p], bd.wanted[k][q]) * bd.count(k)
                        else:
                            m[p, q] += self.reshard(v, bd.produced[k][q], bd.wanted[k][p]) * bd.count(k)
            yield bd.left, bd.right, m

    def decider(self, v: int, depth: int = 3) -> int | None:
        """The node whose strategy lays program input ``v`` out: the node of the operator where
        ``apply.Layouts.wanted`` stops (the same walk: v's consumers, then through element-wise
        operators). Where it stops depends on the program only, not on the strategies (every
        strategy of a node gives layouts to the same tensors), so no assignment is needed."""
        if v in self._decider:
            return self._decider[v]
        g, a = self.g, self.a
        shape, frontier, found = g.shape(v), [v], None
        for _ in range(depth + 1):
            nxt = []
            for u in frontier:
                for op_id in g.consumers[u]:
                    if op_id in a.expanded:   # into the scanned body, as apply.Layouts.wanted goes
                        (ins, _), = g.loop_io[op_id]
                        nxt.extend(ins[k] for k, x in enumerate(g.ops[op_id].inputs) if x == u)
                        continue
                    b = a.blocks[a.owner[op_id]]
                    if op_id in b.roles:
                        c = a.contractions[op_id]
                        has = u in (c.lhs, c.rhs)
                    else:
                        has = any(o in b.specs[0] and g.shape(o) == g.shape(u) for o in g.ops[op_id].outputs)
                    if has and (_fits(shape, g.shape(u)) or g.canonical(u) == v):
                        found = b.id
                        break
                    if g.ops[op_id].prim in ELEMENTWISE | PASS_THROUGH | {"broadcast_in_dim", "reshape"}:
                        nxt.extend(o for o in g.ops[op_id].outputs if _fits(shape, g.shape(o)))
                if found is not None:
                    break
            if found is not None:
                break
            frontier = nxt
        self._decider[v] = found
        return found

    def input_layouts(self, v: int, u: int) -> list[Spec]:
        return [Layouts(self.a, {u: p}).wanted(v) for p in range(self.a.blocks[u].num_plans)]

    def inputs(self):
        """(decider, reader, seconds[p, q]) for every other node reading a program input."""
        g, owner = self.g, self.a.owner
        for v in g.inputs:
            if not g.shape(v):
                continue
            u = self.decider(v)
            if u is None:
                continue
            given = self.input_layouts(v, u)
            readers = sorted({owner[c] for c in g.consumers[v]} - {u})
            for r in readers:
                within = set(self.a.blocks[r].ops)
                wanted = [Layouts(self.a, {r: q}).wanted(v, within=within) for q in range(self.a.blocks[r].num_plans)]
                m = np.array([[self.reshard(v, src, dst) for dst in wanted] for src in given])
                yield u, r, m

    def state(self):
        """(producer, decider, seconds[p, q]): the new training state leaves the step laid out as
        the state came in (``apply._follow_inputs``)."""
        g = self.g
        for v, o in _state_pairs(g):
            p_op = g.producer[o]
            if p_op is None or not g.shape(o):
                continue
            u = self.a.owner[p_op]
            produced = [self.a.blocks[u].specs[p].get(o) for p in range(self.a.blocks[u].num_plans)]
            d = self.decider(v)
            given = self.input_layouts(v, d) if d is not None else [((),) * len(g.shape(v))]
            m = np.array([[self.reshard(o, src, dst) for dst in given] for src in produced])
            # An input no node lays out is replicated: the producer alone pays for reaching that.
            yield (u, u, np.diag(m[:, 0])) if d is None else (u, d, m)

    # --- memory -------------------------------------------------------------------------------

    def liveness(self) -> tuple[np.ndarray, np.ndarray]:
        """Bytes live at every point of the program (rows by flat strategy index, and the part
        no strategy changes)."""
        g, a = self.g, self.a
        top = [op.id for op in g.ops if op.loop is None]
        pos = {op_id: i for i, op_id in enumerate(top)}

        def position(op_id: int) -> int:
            while g.ops[op_id].loop is not None:
                op_id = g.ops[op_id].loop
            return pos[op_id]

        sizes = [b.num_plans for b in a.blocks]
        offsets = [0, *np.cumsum(sizes)[:-1].tolist()]
        T = len(top)
        rows = np.zeros((T + 1, sum(sizes)))
        const = np.zeros(T + 1)
        donated = {v for v, _ in _state_pairs(g)}
        outputs = {v for v in g.outputs if v is not None}

        def live(v: int, start: int, end: int, u: int | None, specs: list[Spec | None] | None) -> None:
            if specs is None or any(s is None for s in specs):
                n = math.prod(g.shape(v)) * itemsize(g.vars[v].dtype)
                const[start] += n
                const[end + 1] -= n
                return
            o = offsets[u]
            per = np.array([self.bytes(v, s) for s in specs])
            rows[start, o:o + len(per)] += per
            rows[end + 1, o:o + len(per)] -= per

        def last_use(v: int, start: int) -> int:
            uses = [position(c) for c in g.consumers[v]]
            return T - 1 if v in outputs else max(uses, default=start)

        for v in g.inputs:
            u = self.decider(v)
            end = last_use(v, 0) if v in donated else T - 1
            live(v, 0, end, u, self.input_layouts(v, u) if u is not None else None)
        for op_id in top:
            u = a.owner[op_id]
            for v in g.ops[op_id].outputs:
                specs = [a.blocks[u].specs[p].get(v) for p in range(sizes[u])]
                live(v, pos[op_id], last_use(v, pos[op_id]), u, specs)
        return np.cumsum(rows, axis=0)[:T], np.cumsum(const)[:T]


def _state_pairs(g) -> list[tuple[int, int]]:
    """(input var, output var) of each training-state leaf, when the step returns its first
    argument's structure first (``apply._follow_inputs``)."""
    outs, ins = g.out_tree.children() if g.out_tree else [], g.in_tree.children() if g.in_tree else []
    if not (outs and ins and outs[0] == ins[0]):
        return []
    n = ins[0].num_leaves
    return [(v, o) for v, o in zip(g.inputs[:n], g.outputs[:n], strict=True) if o is not None]

