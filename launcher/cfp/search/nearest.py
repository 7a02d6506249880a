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
every constrained activation. Each block then takes the plan under which the most of those
tensors have exactly the built-in layout (the first such plan on a tie).

Mesh axes map in order: each of the built-in plan's axes must be a run of consecutive CFP axes of
the same total size (dp's 8-device ``data`` axis is CFP axes (0, 1) of a 4x2 mesh; dp_tp's
``data``/``model`` are axes 0 and 1). A plan that does not map, or does not fit the model, has no
nearest plan.
"""

from __future__ import annotations

from typing import Any, Sequence

from launcher.cfp.analysis.core import Analysis
from launcher.cfp.analysis.strategies import Spec, operand_specs
from launcher.errors import BAD_INPUT

# Identity operators a plan's rules add to the traced step; everything else must line up.
_ADDED = ("sharding_constraint", "reshard")


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


def builtin_layouts(a: Analysis, program: Any, plan: Any, devices: Sequence[Any]) -> dict[int, Spec] | None:
    """var id (of ``a.graph``) -> the layout ``plan`` gives it, or None when the plan does not map
    onto the analysis mesh, does not fit the model, or its traced step does not line up."""
    import jax

    from launcher.cfp.analysis.graph import trace
    from launcher.models.sharding import use_rules
    from launcher.models.train import make_train_step

    try:
        mesh = plan.mesh(devices)
        sh = plan.shardings(program.model, mesh, program.optimizer)
    except BAD_INPUT:  # the plan does not fit the model (ModelError) or the mesh
        return None
    axes = axis_map(dict(mesh.shape), a.mesh_shape)
    if axes is None:
        return None
    g = a.graph
    leaves = jax.tree_util.tree_leaves((sh.state, sh.batch))
    if len(leaves) != len(g.inputs):
        return None
    known = {v: cfp_spec(s.spec, axes, len(g.shape(v))) for v, s in zip(g.inputs, leaves)}

    # A fresh step function: jit caches traces per function, and the rules are not in its key.
    with use_rules(mesh, plan.rules_for("activations")):
        _, g2 = trace(make_train_step(program.model, program.optimizer), *program.args)
    same: dict[int | None, int | None] = dict(zip(g2.inputs, g.inputs))
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
        same.update(zip(op2.outputs, op.outputs))
    return known if next(ops, None) is None else None


def nearest_assignment(a: Analysis, known: dict[int, Spec]) -> list[int]:
    """Per block, the plan under which the most tensors with a known layout have exactly it."""
    assignment = []
    for b in a.blocks:
        scores = []
        for p in range(b.num_plans):
            layouts = list(b.specs[p].items())
            for op in b.contractions:
                c = a.contractions[op]
                layouts += zip((c.lhs, c.rhs, c.out), operand_specs(c, b.strategies[op][p]))
            scores.append(sum(known.get(v) == tuple(spec) for v, spec in layouts))
        assignment.append(scores.index(max(scores)))
    return assignment


def nearest_plans(a: Analysis, program: Any, names: Sequence[str], devices: Sequence[Any]) -> dict[str, list[int]]:
    """{built-in plan name: its nearest plan per block} for every name that maps. A user's step
    (no model protocol, ``launcher/cfp/user_step.py``) has no logical axes: the layouts its
    baseline of that name (dp, fsdp, the user's own) gives the step's inputs decide alone."""
    from launcher.cfp.user_step import input_layouts
    from launcher.models.plans import builtin

    out = {}
    for name in names:
        known = builtin_layouts(a, program, builtin(name), devices) if program.is_model else \
            input_layouts(a, program, name, devices)
        if known is not None:
            out[name] = nearest_assignment(a, known)
    return out
