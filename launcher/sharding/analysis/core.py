"""The CFP analysis pass: program -> contractions -> ParallelBlocks -> unique segments.

``analyze(step_fn, args, mesh_shape)`` traces any step function; ``analyze_graph`` takes a graph
built some other way (an HLO module, ``hlo_text.py``). Either may be given ``references``: the
layouts hand-written plans give the program (``references.py``), which the blocks then offer
where their enumerated plans do not. The result renders the pass's four files
(``parallel_blocks.txt``, ``strategy_map.txt``, ``segments.txt``, ``analysis.json``); they depend
only on the program and the mesh, so the same input gives the same bytes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Union

from launcher.sharding.analysis.blocks import Block, build_blocks
from launcher.sharding.analysis.contractions import Contraction, find_contractions
from launcher.sharding.analysis.graph import Graph, trace
from launcher.sharding.analysis.references import Reference, referenced_strategies
from launcher.sharding.analysis.segments import Segment, Template, block_signature, find_segments
from launcher.sharding.analysis.strategies import collective, enumerate_strategies, notation, operand_specs
from launcher.errors import UserError


@dataclass
class Analysis:
    graph: Graph
    mesh_shape: tuple[int, ...]
    contractions: dict[int, Contraction]
    blocks: list[Block]
    owner: list[int]             # op id -> block id
    signatures: list[str]        # per block
    segments: list[Segment]
    templates: list[Template]
    closed_jaxpr: Any = None     # the traced program, when there is one (apply.py re-evaluates it)
    two_axis_only: bool = False  # 2-D plans split two roles (strategies.py; mode.mesh_shape=auto)
    references: dict[str, Reference] = field(default_factory=dict)  # name -> layouts (references.py)
    # (output var, input var) per state leaf the step returns and the next step takes back (the
    # program's ``feeds_back``): the new value's layout becomes the input's each step
    # (``profile/boundaries.py``).
    fed_back: tuple[tuple[int, int], ...] = ()
    _expanded: frozenset[int] | None = field(default=None, repr=False)

    @property
    def expanded(self) -> frozenset[int]:
        """The scans whose bodies the profile runs as segments of their own (a scanned model's
        layers, forward and backward): their operators are evaluated directly, once per
        iteration, and the scans themselves are not run as one operator."""
        if self._expanded is None:
            g = self.graph
            body_blocks = [b for s in self.segments if s.loop is not None for b in s.blocks]
            self._expanded = frozenset(
                loop for b in body_blocks for i in self.blocks[b].ops
                for loop in [g.outermost_loop(i)] if loop is not None and g.ops[loop].prim == "scan")
        return self._expanded

    def evaluable(self, op_id: int) -> bool:
        """Whether a segment program evaluates ``op_id`` itself: a top-level operator other than an
        expanded scan, or one directly inside an expanded scan's body."""
        op = self.graph.ops[op_id]
        return op_id not in self.expanded and (op.loop is None or op.loop in self.expanded)

    def trips_of(self, op_id: int) -> int:
        """How often a step runs ``op_id`` as segment programs see it: an expanded scan's trip count
        inside its body, else once."""
        loop = self.graph.ops[op_id].loop
        return self.graph.ops[loop].params["length"] if loop in self.expanded else 1

    @property
    def exhaustive_space(self) -> int:
        return math.prod(b.num_plans for b in self.blocks)

    @property
    def segment_space(self) -> int:
        return sum(t.space for t in self.templates)

    # --- the run-dir files ------------------------------------------------------------------

    def contraction_line(self, op: int) -> str:
        c, g = self.contractions[op], self.graph
        return (f"op {op} {g.ops[op].prim} [{c.kind}, {g.ops[op].phase}] "
                f"{_t(c.lhs_shape)} x {_t(c.rhs_shape)} -> {_t(c.out_shape)}  roles: {c.roles_str()}")

    def strategy_map_txt(self) -> str:
        lines = [f"# Strategy map: every tensor contraction and its parallel strategies on mesh "
                 f"{list(self.mesh_shape)}",
                 f"# {len(self.contractions)} contractions; notation OUT = LHS x RHS @ {{mesh axis per split dim}}", ""]
        for op in sorted(self.contractions):
            c = self.contractions[op]
            strategies = enumerate_strategies(c, self.mesh_shape, self.two_axis_only)
            lines.append(f"{self.contraction_line(op)}  ({len(strategies)} strategies)")
            for k, s in enumerate(strategies):
                coll = collective(c, s)
                extra = "" if coll["kind"] == "none" else \
                    f"   [{coll['kind']} {coll['bytes']} B over axes {coll['axes']}]"
                lines.append(f"    {k}: {notation(c, s)}{extra}")
        return "\n".join(lines) + "\n"

    def parallel_blocks_txt(self) -> str:
        g = self.graph
        lines = [f"# ParallelBlocks on mesh {list(self.mesh_shape)}: {len(self.blocks)} blocks, "
                 f"{len(g.ops)} operators", "# op roles: head/sibling/absorbed/bwd contractions, member "
                 "(communication-free under every plan), glue (owned, where propagation stops)", ""]
        for b in self.blocks:
            head = self.contractions[b.head]
            lines.append(f"ParallelBlock {b.id}: head op {b.head} ({g.ops[b.head].phase}), {b.num_plans} plans, "
                         f"{len(b.ops)} ops ({len(b.members)} members), signature {self.signatures[b.id]}")
            for k, s in enumerate(b.plans):
                added = f"  (offered for {', '.join(b.references[k])})" if k in b.references else ""
                lines.append(f"  plan {k}: {notation(head, s)}{added}")
            for i in b.ops:
                op = g.ops[i]
                role = b.roles.get(i) or ("member" if i in b.members else "glue")
                line = f"  op {i:>5} {op.phase:<3} {role:<8} {g.describe(op)}"
                if i in b.roles:
                    c = self.contractions[i]
                    line += "  plans: [" + ", ".join(notation(c, s) for s in b.strategies[i]) + "]"
                lines.append(line)
            lines.append("")
        return "\n".join(lines)

    def segments_txt(self) -> str:
        lines = [f"# Unique segments: {len(self.segments)} segments, {len(self.templates)} templates; "
                 "block ranges are (first, one past last)", ""]
        for seg in self.segments:
            first = self.segments[self.templates[seg.template].instances[0]]
            trips = f", run {seg.trips} times by loop op {seg.loop}" if seg.loop is not None else ""
            lines.append(f"ParallelBlocks sequence: ({seg.start}, {seg.end}) mapped to ({first.start}, {first.end})"
                         f"{trips}")
        lines.append("")
        for t in self.templates:
            lines.append(f"template {t.id}: {len(t.instances)} instances, search space {t.plan_counts} "
                         f"= {t.space} combinations")
        lines += ["", f"exhaustive space: {self.exhaustive_space}", f"segment space: {self.segment_space}", ""]
        return "\n".join(lines)

    def to_json(self) -> dict:
        g = self.graph
        cons = []
        for op in sorted(self.contractions):
            c = self.contractions[op]
            cons.append({"op": op, "kind": c.kind, "phase": g.ops[op].phase, "lhs_shape": list(c.lhs_shape),
                         "rhs_shape": list(c.rhs_shape), "out_shape": list(c.out_shape),
                         "roles": [{"role": d.role, "size": d.size, "lhs": d.lhs, "rhs": d.rhs, "out": d.out}
                                   for d in c.dims],
                         "block": self.owner[op],
                         "strategies": [notation(c, s) for s in enumerate_strategies(c, self.mesh_shape, self.two_axis_only)]})
        blocks = []
        for b in self.blocks:
            blocks.append({
                "id": b.id, "head": b.head, "signature": self.signatures[b.id], "num_plans": b.num_plans,
                "plans": [notation(self.contractions[b.head], s) for s in b.plans],
                "ops": b.ops, "members": sorted(b.members),
                "contractions": [{"op": i, "role": b.roles[i],
                                  "plans": [_plan_entry(self.contractions[i], s) for s in b.strategies[i]]}
                                 for i in b.contractions],
                # Only where plans were added: an analysis without them keeps its bytes (and the
                # profile store its keys, profile/keys.py).
                **({"offered_for": {str(k): list(v) for k, v in sorted(b.references.items())}}
                   if b.references else {}),
            })
        return {
            "source": g.source, "mesh_shape": list(self.mesh_shape), "num_ops": len(g.ops),
            "num_contractions": len(self.contractions), "num_blocks": len(self.blocks),
            "contractions": cons, "blocks": blocks,
            "segments": self.segments_json(), "templates": self.templates_json(),
            "exhaustive_space": self.exhaustive_space, "segment_space": self.segment_space,
        }

    def segments_json(self) -> list[dict]:
        # A loop body's segment says which loop and how often (a step without loops keeps its bytes).
        return [{"index": s.index, "blocks": [s.start, s.end], "template": s.template,
                 **({"loop": s.loop, "trips": s.trips} if s.loop is not None else {})} for s in self.segments]

    def templates_json(self) -> list[dict]:
        return [{"id": t.id, "plan_counts": t.plan_counts, "space": t.space, "instances": t.instances}
                for t in self.templates]

    def summary(self) -> dict:
        """The analysis fields of ``result.json``."""
        return {"num_contractions": len(self.contractions), "num_blocks": len(self.blocks),
                "segments": self.segments_json(), "templates": self.templates_json(),
                "exhaustive_space": self.exhaustive_space, "segment_space": self.segment_space}

    def files(self) -> dict[str, str]:
        return {"parallel_blocks.txt": self.parallel_blocks_txt(), "strategy_map.txt": self.strategy_map_txt(),
                "segments.txt": self.segments_txt(),
                "analysis.json": json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"}


def _t(shape: Sequence[int]) -> str:
    return "[" + ",".join(map(str, shape)) + "]"


def _plan_entry(c: Contraction, s) -> dict:
    lhs, rhs, out = operand_specs(c, s)
    return {"strategy": notation(c, s), "lhs": [list(a) for a in lhs], "rhs": [list(a) for a in rhs],
            "out": [list(a) for a in out]}


References = Union[Mapping[str, Reference], Callable[[Graph, Sequence[int]], Mapping[str, Reference]], None]


def analyze(step_fn: Any, args: Sequence[Any], mesh_shape: Sequence[int], two_axis_only: bool = False,
            references: References = None) -> Analysis:
    """Analyses ``step_fn(*args)`` (arrays or ShapeDtypeStructs) for a mesh of ``mesh_shape``
    (``two_axis_only``: ``strategies.enumerate_strategies``'s). ``references``: name -> layout per
    var id of the traced graph, or a function of (graph, mesh shape) returning them
    (``search/nearest.py``'s ``builtin_references``)."""
    closed, g = trace(step_fn, *args)
    a = analyze_graph(g, mesh_shape, two_axis_only, references)
    a.closed_jaxpr = closed
    return a


def analyze_graph(g: Graph, mesh_shape: Sequence[int], two_axis_only: bool = False,
                  references: References = None) -> Analysis:
    mesh_shape = check_mesh_shape(mesh_shape)
    cons = find_contractions(g)
    if not cons:
        raise UserError("the program has no tensor contraction (dot_general/einsum, convolution or embedding "
                        "lookup), so CFP has nothing to partition: check that model._target_ names a model whose "
                        "loss multiplies by its weights, or give mode.hlo_file a module with dot/convolution")
    _check_axes_divide(cons, mesh_shape)
    refs = dict(references(g, mesh_shape) if callable(references) else references or {})
    extra = referenced_strategies(g, cons, mesh_shape, two_axis_only, refs)
    blocks, owner = build_blocks(g, cons, mesh_shape, two_axis_only, extra)
    signatures = [block_signature(g, b) for b in blocks]
    segments, templates = find_segments(signatures, [b.num_plans for b in blocks],
                                        [g.outermost_loop(b.head) for b in blocks], g.trip_counts())
    return Analysis(g, mesh_shape, cons, blocks, owner, signatures, segments, templates,
                    two_axis_only=two_axis_only and len([n for n in mesh_shape if n > 1]) == 2, references=refs)


def check_mesh_shape(mesh_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(n) for n in mesh_shape)
    if not 1 <= len(shape) <= 3 or any(n < 1 for n in shape):
        raise UserError(f"mode.mesh_shape={list(shape)}: CFP searches 1-D, 2-D or 3-D logical meshes with positive "
                        "sizes, e.g. mode.mesh_shape=[8], [2,4] or [2,2,2] (the first axis across processes)")
    return shape


def _check_axes_divide(cons: dict[int, Contraction], mesh_shape: Sequence[int]) -> None:
    sizes = sorted({d.size for c in cons.values() for d in c.dims if d.role != "window"})
    for a, n in enumerate(mesh_shape):
        if n > 1 and not any(s % n == 0 for s in sizes):
            raise UserError(f"mesh axis {a} of size {n} (mode.mesh_shape={list(mesh_shape)}) divides no dimension "
                            f"of any contraction (their sizes: {sizes}): choose axis sizes that divide the batch, "
                            "hidden or vocabulary sizes, or change the model's shapes")
