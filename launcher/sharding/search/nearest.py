"""The block plans nearest to a built-in plan (``models.plans``): dp, tp, fsdp, dp_tp, ep.

Each built-in plan is a layout family people already trust, and each is (or nearly is) a point of
CFP's search space: on a 4x2 mesh dp_tp splits the batch over axis 0 and the heads and MLP
columns over axis 1, which is one plan per block. The search pass measures these points beside
its own optimum (``search.shortlist``), so the searched plan is never a layout family the
segment profiles happened to misjudge.

How a built-in plan becomes a plan per block: its layouts are read off the program itself. The
training step is traced again under the plan's activation rules, which adds its
``sharding_constraint`` operators (and ``reshard`` of literals) to an otherwise identical
program; dropping them aligns it operator for operator with the analysed one. That gives a layout
for every program input (parameters, optimizer state, batch, from the plan's shardings) and for
every constrained activation: the plan's *reference* layout (``analysis/references.py``). Each
block then takes the plan under which the most tensors it lays out have exactly the built-in
layout. The analysis is given the same references (``builtin_references``), so its blocks offer
the plans a built-in plan takes where the enumerated ones leave them out (a mesh axis unused:
dp_tp's MoE router); ``nearest`` says which tensors the nearest plan still lays out otherwise,
and why (``docs/cfp-layouts.md``).

Mesh axes map in order: each of the built-in plan's axes must be a run of consecutive CFP axes of
the same total size (dp's 8-device ``data`` axis is CFP axes (0, 1) of a 4x2 mesh; dp_tp's
``data``/``model`` are axes 0 and 1). A plan that does not map, or does not fit the model, has no
nearest plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import jax

from launcher import jaxcompat
from launcher.sharding.analysis import references
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.graph import Graph, trace
from launcher.sharding.analysis.references import Mismatch, Reference, axis_map, cfp_spec
from launcher.sharding.analysis.strategies import Spec
from launcher.sharding.search.meshes import natural_shape
from launcher.errors import BAD_INPUT
from launcher.models.plans import BUILTINS, builtin
from launcher.models.sharding import use_rules
from launcher.models.train import make_train_step

if TYPE_CHECKING:
    from launcher.sharding.program import TrainingProgram

# Identity operators a plan's rules add to the traced step; everything else must line up.
_ADDED = ("sharding_constraint", "reshard")


def reference_layouts(g: Graph, mesh_shape: Sequence[int], program: TrainingProgram, plan: Any) -> dict[int, Spec] | None:
    """var id (of ``g``, the analysed step) -> the layout ``plan`` gives it on as many devices as
    a mesh of ``mesh_shape`` has, or None when the plan does not map onto that mesh, does not fit
    the model, or its traced step does not line up. Only shapes are traced, on a mesh without
    devices: the layouts are the same whatever devices this process has."""
    try:
        mesh = jaxcompat.abstract_mesh(plan.axis_sizes(math.prod(mesh_shape)))
        sh = plan.shardings(program.model, mesh, program.optimizer)
    except BAD_INPUT:  # the plan does not fit the model (ModelError) or the mesh
        return None
    axes = axis_map(dict(mesh.shape), mesh_shape)
    if axes is None:
        return None
    leaves = jax.tree_util.tree_leaves((sh.state, sh.batch))
    if len(leaves) != len(g.inputs):
        return None
    known = {v: cfp_spec(s.spec, axes, len(g.shape(v))) for v, s in zip(g.inputs, leaves, strict=True)}

    # A fresh step function: jit caches traces per function, and the rules are not in its key.
    with use_rules(mesh, plan.rules_for("activations")):
        _, g2 = trace(make_train_step(program.model, program.optimizer), *program.args)
    same: dict[int | None, int | None] = dict(zip(g2.inputs, g.inputs, strict=True))
    ops = iter(g.ops)
    forward_done = False   # an add_any (cotangents meeting) has lined up: the backward pass began
    for op2 in g2.ops:
        if op2.prim in _ADDED:
            v = same.get(op2.inputs[0])
            same[op2.outputs[0]] = v
            if op2.prim == "sharding_constraint" and v is not None:
                known.setdefault(v, cfp_spec(g2.eqns[op2.id].params["sharding"].spec, axes, len(g.shape(v))))
            continue
        op = next(ops, None)
        if op is None or op.prim != op2.prim or len(op.outputs) != len(op2.outputs):
            # The traces part where the backward pass accumulates cotangents in another order
            # (cfp-moe's gating: a constraint's transpose moves an add_any). The forward pass,
            # where the plan's constraints and the inputs' layouts are, has lined up by then.
            return known if forward_done else None
        forward_done = forward_done or op2.prim == "add_any"
        same.update(zip(op2.outputs, op.outputs, strict=True))
    return known if next(ops, None) is None else None


def builtin_references(program: TrainingProgram, names: Sequence[str] | None = None,
                       natural_only: bool = False) -> Callable[[Graph, Sequence[int]], dict[str, Reference]]:
    """For ``analysis.core.analyze``: (graph, mesh shape) -> {name: reference layout} for each
    built-in plan of ``names`` (default: all) that maps onto the mesh; with ``natural_only``
    (``mode.mesh_shape=auto``, where each is looked for on the mesh shaped like its own,
    ``nearest_on_meshes``) only those whose own mesh it is."""

    def refs(g: Graph, mesh_shape: Sequence[int]) -> dict[str, Reference]:
        out = {}
        for name in names if names is not None else BUILTINS:
            if natural_only and natural_shape(name, math.prod(mesh_shape)) != list(mesh_shape):
                continue
            known = reference_layouts(g, mesh_shape, program, builtin(name))
            if known is not None:
                out[name] = known
        return out
    return refs


def builtin_layouts(a: Analysis, program: TrainingProgram, plan: Any) -> dict[int, Spec] | None:
    """``reference_layouts`` on the analysis's graph and mesh; the analysis's own when it was
    given the plan's (``Analysis.references``)."""
    if plan.name in a.references and not plan.constraints:
        return dict(a.references[plan.name])
    return reference_layouts(a.graph, a.mesh_shape, program, plan)


def nearest_assignment(a: Analysis, known: Reference, carry: bool = False) -> list[int]:
    """Per block, the plan under which the most tensors it lays out have exactly the layout
    ``known`` gives them (``analysis/references.py``; ``carry``: a reference of inputs alone)."""
    return references.nearest_assignment(a.graph, a.blocks, a.contractions, known, carry)


@dataclass
class Nearest:
    """A built-in plan's nearest plan, and the tensors that plan still lays out otherwise."""
    name: str
    assignment: list[int]
    mismatches: list[Mismatch]

    @property
    def exact(self) -> bool:
        return not self.mismatches

    def reason(self, a: Analysis) -> str:
        """Why no plan of the space is the built-in one, in one line: what differs, block by
        block (empty when the plan is exact). Two causes (``docs/cfp-layouts.md``): the built-in
        plan stores inputs split otherwise than it computes with them (fsdp), or it changes a
        layout between operators that CFP keeps in one communication-free block (ep)."""
        if self.exact:
            return ""
        g = a.graph
        inputs = dict(zip(g.inputs, g.input_names, strict=True))
        what = []
        for m in self.mismatches:
            if m.is_input(g) and m.var in inputs:
                tensor = f"input {inputs[m.var]}"
            elif m.is_input(g):  # a loop body's input: a layer of a stacked tensor, or a carry
                outer = g.canonical(m.var)
                tensor = f"{g.vars[m.var].type_str} in a loop, from " + (
                    f"input {inputs[outer]}" if outer in inputs else f"op {g.producer[outer]}")
            else:
                op = g.ops[g.producer[m.var]]
                tensor = f"{g.vars[m.var].type_str} of op {op.id} {op.prim} ({op.phase})"
            what.append(f"block {m.block} (head op {a.blocks[m.block].head}): {tensor} is {_spec_str(m.want)} in "
                        f"{self.name}, {_spec_str(m.got)} in the nearest plan")
        made = sorted({m.block for m in self.mismatches if not m.is_input(g)})
        if not made:
            why = (f"{self.name} stores {len(self.mismatches)} program inputs split otherwise than it computes with "
                   "them (XLA gathers each where it is used), while a CFP plan lays an input out as its first "
                   "consumer computes with it")
        else:
            why = (f"{self.name} changes layouts inside block{'s' if len(made) > 1 else ''} "
                   f"{', '.join(map(str, made))}: no plan of such a block gives every tensor it makes "
                   f"{self.name}'s layout, and a block's operators share one plan (it is communication-free "
                   "inside)")
        more = f"; and {len(what) - 3} more" if len(what) > 3 else ""
        return f"{why}: " + "; ".join(what[:3]) + more

    def in_words(self, a: Analysis) -> str:
        """``reason`` for the table, short: the first tensor that differs (an argument by its path
        in the step's arguments) and its two layouts, and how many more differ."""
        if self.exact:
            return ""
        g = a.graph
        inputs = dict(zip(g.inputs, g.input_names, strict=True))
        m = self.mismatches[0]
        outer = g.canonical(m.var) if m.is_input(g) else None
        tensor = (inputs[outer] if outer in inputs else
                  f"a {g.vars[m.var].type_str} the step computes" if outer is None else f"a {g.vars[m.var].type_str}")
        more = f" (and {len(self.mismatches) - 1} more)" if len(self.mismatches) > 1 else ""
        return f"{tensor} is {_in_words(m.want)} in {self.name}, {_in_words(m.got)} in its plan{more}"


def _in_words(spec: Spec) -> str:
    """A layout as a user says it: "replicated", or which dimensions split over which mesh axes."""
    split = [f"dim {d} over {'+'.join(f'axis {x}' for x in ax)}" for d, ax in enumerate(spec) if ax]
    return "split, " + " and ".join(split) if split else "replicated"


def _spec_str(spec: Spec) -> str:
    return "[" + ", ".join("/".join(map(str, ax)) if ax else "-" for ax in spec) + "]"


def nearest(a: Analysis, program: TrainingProgram, name: str, devices: Sequence[jax.Device] = ()) -> Nearest | None:
    """The plan nearest baseline ``name`` on ``a``'s mesh, or None where it does not map. A
    built-in model's baselines are its built-in plans; a user's step (no model protocol,
    ``launcher/sharding/user/step.py``) has no logical axes: the layouts its baseline of that name
    (dp, fsdp, the user's own) gives the step's inputs decide alone (on ``devices``, default
    every device)."""
    known = program.baseline_layouts(a, name, list(devices) or jax.devices())
    if known is None:
        return None
    known = references.into_loops(a.graph, known, a.mesh_shape)
    assignment = nearest_assignment(a, known, carry=program.layouts_inputs_only)
    return Nearest(name, assignment, references.mismatches(a.graph, a.blocks, a.contractions, known, assignment))


def nearest_plans(a: Analysis, program: TrainingProgram, names: Sequence[str], devices: Sequence[jax.Device] = ()) -> dict[str, list[int]]:
    """{baseline name: its nearest plan per block} for every name that maps (``nearest``;
    ``devices`` matter for a user's step only)."""
    out = {}
    for name in names:
        found = nearest(a, program, name, devices)
        if found is not None:
            out[name] = found.assignment
    return out


class Near(NamedTuple):
    """A built-in plan's nearest plan on the meshes searched: on ``on[mesh]``; ``exact`` where it
    is the built-in plan's own layout (``Nearest.exact``)."""
    mesh: int
    assignment: list[int]
    exact: bool


def nearest_on_meshes(analyses: Sequence[Any], program: TrainingProgram, names: Sequence[str],
                      devices: Sequence[jax.Device], log: Callable[[str], None] = lambda line: None) -> dict[str, Near]:
    """{built-in plan name: its nearest plan}: each plan on the mesh shaped like its own when one
    is searched, else on the first mesh it maps onto. Where the nearest plan is not the built-in
    plan's own layout, ``log`` says why (``Nearest.reason``)."""
    out = {}
    for name in names:
        natural = natural_shape(name, len(devices))
        order = sorted(range(len(analyses)), key=lambda i: list(analyses[i].mesh_shape) != natural)
        for i in order:
            found = nearest(analyses[i], program, name)
            if found is not None:
                out[name] = Near(i, found.assignment, found.exact)
                if not found.exact:
                    log(f"plan nearest {name} on mesh {list(analyses[i].mesh_shape)} is not {name}'s layout: "
                        f"{found.reason(analyses[i])}")
                break
    return out
