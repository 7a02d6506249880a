"""Applying block plans to a traced program on a real mesh.

The flattened graph is re-evaluated operator by operator (``evaluate``: each operator binds its
original primitive), and every tensor whose layout a block's chosen plan determines (its
contractions' outputs and whatever the plan propagates to, ``Layouts.pinned``) is pinned with
``jax.lax.with_sharding_constraint``. XLA's sharding propagation fills in the rest (operators of
blocks without a plan), and inserts the collectives. Program inputs are laid out as their
first planned consumer wants them (``wanted_spec``). The program's own layout hints
(``with_sharding_constraint`` in the user's step, on the user's mesh) are left out of a plan's
program (``USERS_LAYOUTS``): the search reads them as passing layouts through
(``propagation.py``), so a plan that kept them would pay resharding to and from the user's
layout at each one that no profile or prediction saw (Flax's pjit guide pins its activations to
its own 2x4 mesh: CFP's plans ran 2-3x their prediction). The user's own baseline runs the step
as written, hints and all.

The mesh has axes ``cfp0`` (and ``cfp1``) and is built with ``jaxcompat.auto_mesh``, whose axes
are Auto: ``jax.make_mesh``'s Explicit axes would refuse a contraction over a split dimension.

A plan saved for ``mode=train`` carries its layouts in the ``constraints`` field of the models'
plan JSON: ``"<op id>": [...]`` pins the output of that operator (``"<op id>.<k>"`` its k-th
output) and ``"in:<path>": [...]``
lays out a program input (its pytree path in the step's arguments), each a PartitionSpec-like
list (per dimension ``null``, an axis name, or a list of axis names); ``"program"`` is the
signature of the traced step those ids refer to (``program_signature``), so a plan searched for
another model or optimizer setting is refused rather than silently misapplied.
``constrained_step`` turns such a mapping back into a step function, and ``constraints_transform``
hands it to the models' trainer (``models.train.Trainer(transform_step=...)``).
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, AbstractSet, Iterable, Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.graph import Graph, Op, trace
from launcher.sharding.analysis.propagation import ELEMENTWISE, PASS_THROUGH
from launcher.sharding.analysis.strategies import Spec, operand_specs
from launcher.errors import UserError
from launcher.models.plans import Plan, arranged
from launcher.models.train import StepTransform
from launcher.typing import Json, JsonValue, PyTree, StepFn

if TYPE_CHECKING:
    from launcher.typing import JaxprEqn

AXIS_NAMES = ("cfp0", "cfp1", "cfp2")
# The program's own layout hints, identities in a plan's program (module doc).
USERS_LAYOUTS = frozenset({"sharding_constraint"})


def make_mesh(mesh_shape: Sequence[int], devices: Sequence[jax.Device] | None = None, across: int | None = None) -> Mesh:
    """The logical mesh (axes cfp0, cfp1, cfp2) over ``devices`` (default: every device), ordered
    by process, the processes changing along axis ``across`` (default the first: ``plans.arranged``)."""
    devices = list(devices) if devices is not None else jax.devices()
    n = 1
    for s in mesh_shape:
        n *= s
    if n != len(devices):
        raise UserError(f"mode.mesh_shape={list(mesh_shape)} has {n} devices but the job has {len(devices)}: "
                        "make the product of mode.mesh_shape the global device count (or leave it [] for 1-D)")
    return jaxcompat.auto_mesh(arranged(devices, tuple(mesh_shape), across), AXIS_NAMES[:len(mesh_shape)])


def across_of(mesh: Mesh) -> str | None:
    """The axis of ``mesh`` its devices' processes change along (``plans.arranged``), or None
    (one process)."""
    procs = np.vectorize(lambda d: getattr(d, "process_index", 0))(mesh.devices)
    for k, name in enumerate(mesh.axis_names):
        if (np.diff(procs, axis=k) != 0).any():
            return name
    return None


def pspec(spec: Spec) -> PartitionSpec:
    return PartitionSpec(*[None if not ax else AXIS_NAMES[ax[0]] if len(ax) == 1 else tuple(AXIS_NAMES[a] for a in ax)
                           for ax in spec])


def spec_json(spec: Spec) -> list:
    return [None if not ax else AXIS_NAMES[ax[0]] if len(ax) == 1 else [AXIS_NAMES[a] for a in ax] for ax in spec]


def spec_from_json(entry: Sequence[str | Sequence[str] | None]) -> Spec:
    def axes(e: str | Sequence[str] | None) -> tuple[int, ...]:
        if e is None:
            return ()
        names = [e] if isinstance(e, str) else list(e)
        return tuple(AXIS_NAMES.index(n) for n in names)
    return tuple(axes(e) for e in entry)


# ---------------------------------------------------------------------------------------------
# Layouts a plan assignment implies


class Layouts:
    """Layouts of tensors under an assignment {block id: plan index} (blocks absent: free)."""

    def __init__(self, a: Analysis, assignment: Mapping[int, int]) -> None:
        self.a, self.assignment = a, dict(assignment)

    def pinned(self) -> dict[int, Spec]:
        """var id -> layout, for every (non-scalar) tensor an assigned block's operators produce
        and whose layout its plan determines: the contractions' outputs and everything the plan
        propagates to. Pinning all of them makes a segment run alone and the same segment inside
        the whole step lay out (and communicate) alike."""
        g, out, expanded = self.a.graph, {}, self.a.expanded
        for b_id, p in self.assignment.items():
            for v, spec in self.a.blocks[b_id].specs[p].items():
                # (An expanded scan's results are laid out by its body, below; the block owning
                # the scan sees one opaque operator.)
                if g.shape(v) and g.producer[v] not in expanded:
                    out[v] = spec
        # An expanded scan's body inputs (a layer of the stacked weights or residuals, the carry)
        # as the body's blocks read them, and its stacked results as their layers are made: XLA
        # then lays the loop's operands and results out to match, instead of choosing its own
        # layout for them (a stacked residual split one way by the forward loop and gathered
        # for the backward one).
        for loop in self.a.expanded:
            (ins, outs), = g.loop_io[loop]
            for v in ins:
                spec = self._wanted(v, None, 3) if g.shape(v) else None
                if spec is not None:
                    out.setdefault(v, tuple(spec))
            nk = g.ops[loop].params["num_carry"]
            for k, (v, result) in enumerate(zip(outs, g.ops[loop].outputs, strict=True)):
                if v in out:
                    out[result] = tuple(out[v]) if k < nk else ((),) + tuple(out[v])
        return out

    def produced(self, v: int) -> Spec | None:
        """The layout ``v`` has where it is produced, if its block is assigned and knows it."""
        op = self.a.graph.producer[v]
        if op is None:
            return None
        b = self.a.owner[op]
        if b not in self.assignment:
            return None
        return self.a.blocks[b].specs[self.assignment[b]].get(v)

    def wanted(self, v: int, within: AbstractSet[int] | None = None, depth: int = 3) -> Spec:
        """The layout ``v``'s consumers (among ops ``within``) want: the operand layout of the
        first planned contraction reached, or the output layout of the first planned operator
        that carries v's shape (or broadcasts it, as labels become a one-hot), or the layout a
        gather's batching dimensions take from its operand (labels read by take_along_axis),
        looking through element-wise operators and into the bodies of the scans that read it (a
        stacked operand's layers as the body wants one, its layer axis whole); else replicated."""
        found = self._wanted(v, within, depth)
        return found if found is not None else ((),) * len(self.a.graph.shape(v))

    def _wanted(self, v: int, within: AbstractSet[int] | None, depth: int) -> Spec | None:
        g, a = self.a.graph, self.a
        shape = g.shape(v)
        frontier = [v]
        for _ in range(depth + 1):
            nxt = []
            for u in frontier:
                for op_id in g.consumers[u]:
                    if within is not None and op_id not in within:
                        continue
                    if g.ops[op_id].prim == "scan" and op_id in g.loop_io:
                        inner = self._into_scan(op_id, u, depth)
                        if inner is not None and _fits(shape, g.shape(u)):
                            return tuple(inner[:len(shape)])
                        continue
                    b_id = a.owner[op_id]
                    p = self.assignment.get(b_id)
                    found = None
                    if p is not None:
                        b = a.blocks[b_id]
                        if op_id in b.roles:
                            c = a.contractions[op_id]
                            lhs, rhs, _ = operand_specs(c, b.strategies[op_id][p])
                            found = lhs if c.lhs == u else rhs if c.rhs == u else None
                        else:
                            found = next((b.specs[p][o] for o in g.ops[op_id].outputs
                                          if o in b.specs[p] and g.shape(o) == g.shape(u)), None)
                    if found is None and g.ops[op_id].prim == "gather":
                        found = self._gather_indices(op_id, u)
                    if found is not None and tuple(g.shape(u)[:len(shape)]) == tuple(shape):
                        return tuple(found[:len(shape)])
                    prim = g.ops[op_id].prim
                    if prim in ELEMENTWISE | PASS_THROUGH | {"broadcast_in_dim", "reshape"}:
                        nxt.extend(o for o in g.ops[op_id].outputs if _fits(shape, g.shape(o))
                                   or prim in ELEMENTWISE and _widens(shape, g.shape(u), g.shape(o)))
            frontier = nxt
        return None

    def _gather_indices(self, op_id: int, u: int) -> Spec | None:
        """The layout gather ``op_id`` wants for ``u`` as its indices: each batching dimension
        as the operand's is laid out where it is produced (``take_along_axis``: the integer labels
        of optax's cross-entropy, as the logits), the others whole; None where ``u`` is not its
        indices, it has no batching dimensions, or the operand's layout is not known."""
        g = self.a.graph
        op, eqn = g.ops[op_id], g.eqns.get(op_id)   # (no equation: a graph read from HLO text)
        numbers = eqn.params["dimension_numbers"] if eqn is not None else None
        if len(op.inputs) < 2 or op.inputs[1] != u or numbers is None or not numbers.start_indices_batching_dims:
            return None
        src = self.produced(op.inputs[0])
        if src is None:
            return None
        spec = [()] * len(g.shape(u))
        for o, i in zip(numbers.operand_batching_dims, numbers.start_indices_batching_dims, strict=True):
            spec[i] = src[o]
        return tuple(spec)

    def _into_scan(self, op_id: int, u: int, depth: int) -> Spec | None:
        """The layout scan ``op_id``'s body wants for its operand ``u``: a constant or carry as the
        body reads it; a stacked operand, its layer axis whole and each layer as the body reads one."""
        g = self.a.graph
        (ins, _), = g.loop_io[op_id]
        for k, x in enumerate(g.ops[op_id].inputs):
            if x != u:
                continue
            inner = self._wanted(ins[k], None, depth)
            if inner is not None:
                return ((),) + tuple(inner) if g.outer.get(ins[k], (None, ""))[1] == "slice" else tuple(inner)
        return None


def _widens(shape: Sequence[int], u: Sequence[int], out: Sequence[int]) -> bool:
    """An element-wise result ``out`` of ``u`` (``shape`` and then trailing dimensions) that
    keeps ``shape`` as its leading dimensions and at most broadcasts ``u``'s unit trailing ones:
    labels as an index vector compared with the vocabulary's iota, making the one-hot the loss
    multiplies with the log-probabilities (laid out as the logits, so the labels are split as
    the batch is)."""
    k = len(shape)
    return (len(out) == len(u) > k and tuple(out[:k]) == tuple(shape)
            and all(d in (1, o) for d, o in zip(u[k:], out[k:], strict=True)))


def _fits(shape: Sequence[int], other: Sequence[int]) -> bool:
    """``other`` is ``shape`` or ``shape`` with trailing unit dimensions (an index vector)."""
    return tuple(other[:len(shape)]) == tuple(shape) and all(d == 1 for d in other[len(shape):])


# ---------------------------------------------------------------------------------------------
# Evaluation


def evaluate(g: Graph, op_ids: Iterable[int], env: dict[int, jax.Array], pins: Mapping[int, NamedSharding]) -> dict[int, jax.Array]:
    """Runs operators ``op_ids`` (program order, one body's or the top level's) over ``env`` (var
    id -> value), pinning var ``v`` to sharding ``pins[v]`` as soon as it is computed. A scan with
    pinned tensors in its body runs that body the same way, once per iteration (``_scan``)."""
    for i in op_ids:
        op, eqn = g.ops[i], g.eqns[i]
        args = [env[v] if v is not None else eqn.invars[k].val for k, v in enumerate(op.inputs)]
        if op.prim == "scan" and _pinned_inside(g, i, pins):
            outs = _scan(g, op, eqn, args, pins)
        elif op.prim in USERS_LAYOUTS:
            outs = args   # the plan's pins lay the step out, not the program's own (module doc)
        else:
            with eqn.ctx.manager:
                outs = jaxcompat.bind_equation(eqn, args)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, x in zip(op.outputs, outs, strict=True):
            env[v] = jax.lax.with_sharding_constraint(x, pins[v]) if v in pins else x
    return env


def _pinned_inside(g: Graph, loop: int, pins: Mapping[int, NamedSharding]) -> bool:
    for v in pins:
        op = g.producer[v]
        while op is not None and g.ops[op].loop is not None:
            op = g.ops[op].loop
            if op == loop:
                return True
    return False


def _scan(g: Graph, op: Op, eqn: JaxprEqn, args: list[jax.Array], pins: Mapping[int, NamedSharding]) -> list[jax.Array]:
    """Scan ``op`` run by ``jax.lax.scan`` over its body's operators, each evaluated (and pinned)
    as at the top level: what the traced scan computes, with the plan's layouts inside."""
    p = eqn.params
    (ins, outs), = g.loop_io[op.id]
    body, nc, nk = g.body_ops(op.id), p["num_consts"], p["num_carry"]
    literals = {k: x.val for k, x in enumerate(p["jaxpr"].jaxpr.outvars) if outs[k] is None}
    consts = constants(g, {v for i in body for v in g.ops[i].inputs if v is not None})

    def step(carry: list[jax.Array], xs: list[jax.Array]) -> tuple[list[jax.Array], list[jax.Array]]:
        env = {v: jax.lax.with_sharding_constraint(x, pins[v]) if v in pins else x
               for v, x in zip(ins, [*args[:nc], *carry, *xs], strict=True)}
        env.update(consts)
        evaluate(g, body, env, pins)
        res = [literals[k] if v is None else env[v] for k, v in enumerate(outs)]
        return res[:nk], res[nk:]

    carry, ys = jax.lax.scan(step, list(args[nc:nc + nk]), list(args[nc + nk:]), length=p["length"],
                             reverse=p["reverse"], unroll=p["unroll"])
    return [*carry, *ys]


def constants(g: Graph, needed: Iterable[int]) -> dict[int, jax.Array]:
    return {v: g.const_values[v] for v in needed if v in g.const_values}


def pins_for(specs: Mapping[int, Spec], mesh: Mesh) -> dict[int, NamedSharding]:
    return {v: NamedSharding(mesh, pspec(s)) for v, s in specs.items()}


def whole_step(a: Analysis, assignment: Mapping[int, int], mesh: Mesh, stored: AbstractSet[int] = frozenset()
               ) -> tuple[StepFn, PyTree, PyTree]:
    """(step, in_shardings, out_shardings) for the whole traced program under ``assignment``
    (``stored``: ``plan_constraints``'); ``step`` takes and returns the same pytrees as the
    traced function."""
    return constrained_step_from_graph(a.graph, plan_constraints(a, assignment, stored), mesh)


def plan_constraints(a: Analysis, assignment: Mapping[int, int], stored: AbstractSet[int] = frozenset()
                     ) -> Json:
    """A plan's ``constraints`` entry for ``assignment``: the traced step's signature, every
    input's layout (as its first planned consumer wants it) and every pinned tensor's.
    ``stored``: the inputs (positions among the step's) kept split over every device between
    steps instead, on their largest dimension the device count divides (the state, as ZeRO-3 and
    fsdp store it: XLA gathers each where the plan computes with it), where one does; the
    backward pass and the optimizer's update are then left unpinned, so XLA reduces the
    gradients onto the stored shards and updates them there (pinned, whole gradients and a
    replicated update would hold the state again: on the scanned LM, 4.31 MiB with the backward
    pinned, 3.57 MiB without, fsdp 3.63 MiB, per device)."""
    layouts, g = Layouts(a, assignment), a.graph
    constraints: Json = {"program": program_signature(g)}
    every = tuple(range(len(a.mesh_shape)))
    n = math.prod(a.mesh_shape)
    for k, (v, name) in enumerate(zip(g.inputs, g.input_names, strict=True)):
        spec = layouts.wanted(v)
        dims = [d for d, size in enumerate(g.shape(v)) if size % n == 0] if k in stored else []
        if dims:
            d = max(dims, key=lambda d: g.shape(v)[d])
            spec = tuple(every if i == d else () for i in range(len(g.shape(v))))
        constraints[f"in:{name}"] = spec_json(spec)
    pinned = layouts.pinned()
    if stored:
        pinned = {v: s for v, s in pinned.items() if g.producer[v] is None or g.ops[g.producer[v]].phase == "fwd"}
    constraints.update(pin_constraints(g, pinned))
    return constraints


def program_signature(g: Graph) -> str:
    """A hash of the traced step's operators (primitive, operand and result types) and inputs:
    equal exactly when a plan's operator ids mean the same tensors."""
    text = "\n".join([*g.input_names, *(f"{op.prim} {g.describe(op)}" for op in g.ops)])
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def pin_constraints(g: Graph, pinned: Mapping[int, Spec]) -> Json:
    """Pinned layouts keyed as in a plan's ``constraints``: ``"<op id>"`` for an operator's only
    output, ``"<op id>.<k>"`` for its k-th of several, ``"<loop op id>:<k>"`` for the k-th input of
    a loop's body (a layer of a stacked operand, the carry)."""
    out = {}
    for v, spec in pinned.items():
        if g.producer[v] is None:
            loop = next(op for op, bodies in g.loop_io.items() if v in bodies[0][0])
            out[f"{loop}:{g.loop_io[loop][0][0].index(v)}"] = spec_json(spec)
            continue
        op = g.ops[g.producer[v]]
        key = str(op.id) if len(op.outputs) == 1 else f"{op.id}.{op.outputs.index(v)}"
        out[key] = spec_json(spec)
    return out


def _pinned_var(g: Graph, key: str) -> int:
    """The var a ``constraints`` key names (``pin_constraints``); IndexError/ValueError if none."""
    if ":" in key:
        loop, _, k = key.partition(":")
        return g.loop_io[int(loop)][0][0][int(k)] if int(loop) in g.loop_io else [][0]
    op_id, _, k = key.partition(".")
    return g.ops[int(op_id)].outputs[int(k or 0)]


def constrained_step_from_graph(g: Graph, constraints: Json, mesh: Mesh,
                                plan: str = "searched") -> tuple[StepFn, PyTree, PyTree]:
    def sharding(key: str, entry: JsonValue, shape: Sequence[int]) -> NamedSharding:
        try:
            spec = spec_from_json(entry)
        except (TypeError, ValueError):
            spec = None
        if spec is None or len(spec) > len(shape) or any(a >= len(mesh.axis_names) for ax in spec for a in ax):
            raise UserError(f"plan {plan!r}: constraint {key!r}: {entry!r} does not fit a tensor of shape "
                            f"{tuple(shape)} on mesh axes {list(mesh.axis_names)}; {_STALE}")
        return NamedSharding(mesh, pspec(spec))

    signature = constraints.get("program")
    if signature is not None and signature != program_signature(g):
        raise UserError(f"plan {plan!r}: its constraints were made for a training step with signature "
                        f"{signature}, not this one ({program_signature(g)}); {_STALE}")
    pins = {}
    for key, entry in constraints.items():
        if key.startswith("in:") or key == "program":
            continue
        try:
            v = _pinned_var(g, key)
        except (ValueError, IndexError):
            raise UserError(f"plan {plan!r}: constraint {key!r} names no operator output of this training step "
                            f"(it has {len(g.ops)} operators); {_STALE}") from None
        pins[v] = sharding(key, entry, g.shape(v))
    unknown = {k[3:] for k in constraints if k.startswith("in:")} - set(g.input_names)
    if unknown:
        raise UserError(f"plan {plan!r}: constraints for inputs {sorted(unknown)} that this training step does not "
                        f"have; {_STALE}")
    in_specs = []
    for v, name in zip(g.inputs, g.input_names, strict=True):
        entry = constraints.get(f"in:{name}")
        in_specs.append(sharding(f"in:{name}", entry, g.shape(v)) if entry is not None
                        else NamedSharding(mesh, PartitionSpec()))
    top = [op.id for op in g.ops if op.loop is None]

    def flat_step(*leaves: jax.Array) -> list[jax.Array | None]:
        env = dict(zip(g.inputs, leaves, strict=True))
        env.update(constants(g, g.const_values))
        env = evaluate(g, top, env, pins)
        return [env[v] if v is not None else None for v in g.outputs]

    def step(*args: PyTree) -> PyTree:
        leaves = jax.tree_util.tree_leaves(args)
        return jax.tree_util.tree_unflatten(g.out_tree, flat_step(*leaves))

    in_shardings = jax.tree_util.tree_unflatten(g.in_tree, in_specs)
    out_shardings = _follow_inputs(g, in_shardings, NamedSharding(mesh, PartitionSpec()))
    return step, in_shardings, out_shardings


def _follow_inputs(g: Graph, in_shardings: PyTree, replicated: NamedSharding) -> PyTree:
    """Output shardings: a step returning its first argument's structure first (the training
    state) keeps that part laid out as it came in, so steps chain; the rest is replicated."""
    outs, ins = g.out_tree.children(), g.in_tree.children()
    if outs and ins and outs[0] == ins[0]:
        rest = [jax.tree_util.tree_unflatten(t, [replicated] * t.num_leaves) for t in outs[1:]]
        return jax.tree_util.tree_unflatten(g.out_tree, jax.tree_util.tree_leaves((in_shardings[0], *rest)))
    return jax.tree_util.tree_unflatten(g.out_tree, [replicated] * g.out_tree.num_leaves)


_STALE = ("the plan was searched for another model, optimizer setting or mesh: run mode=search again with "
          "the same model and settings, or use a built-in plan")


def constrained_step(step: StepFn, args: Sequence[PyTree], constraints: Json, mesh: Mesh,
                     plan: str = "searched") -> tuple[StepFn, PyTree, PyTree]:
    """For ``mode=train`` with a CFP plan: ``step`` (traced on ``args``, arrays or shapes) under the
    plan's constraints on ``mesh`` (axes cfp0/cfp1). Returns (step, in_shardings, out_shardings)
    for ``jax.jit``; operator ids match the analysis because tracing and flattening are
    deterministic."""
    _, g = trace(step, *args)
    return constrained_step_from_graph(g, constraints, mesh, plan)


# Step transforms (``models.train.StepTransform``): how CFP's layouts reach the models' trainer.

def constraints_transform(plan: Plan) -> StepTransform | None:
    """For ``mode=train``: the step transform applying a plan's ``constraints`` (a plan the
    search wrote), or None for a plan without them."""
    if not plan.constraints:
        return None
    return lambda step, shapes, mesh: constrained_step(step, shapes, plan.constraints, mesh, plan.name)


def assignment_transform(a: Analysis, assignment: Mapping[int, int], stored: AbstractSet[int] = frozenset()) -> StepTransform:
    """The step transform laying the whole traced step out as ``assignment`` (block -> plan)
    says (``whole_step``): the search's own runs of its plans."""
    return lambda step, shapes, mesh: whole_step(a, assignment, mesh, stored)


def plan_json(analysis: Analysis, assignment: Sequence[int], name: str = "searched",
              stored: AbstractSet[int] = frozenset(), across: str | None = None) -> Plan:
    """A plan per block in the models' plan format under ``name`` (its algorithm's row: the
    plan's name in plan.json); layouts go in ``constraints`` (``stored``: ``plan_constraints``');
    ``across``: the mesh axis between processes (``plans.arranged``)."""
    axes = tuple((AXIS_NAMES[i], n) for i, n in enumerate(analysis.mesh_shape))
    return Plan(name, axes, {"params": {}, "activations": {}, "inputs": {}},
                plan_constraints(analysis, dict(enumerate(assignment)), stored), across=across)
