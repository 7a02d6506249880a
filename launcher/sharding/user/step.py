"""A user's own training step as the program CFP works on: whatever function the user jits.

    program = step_program(train_step, (state, batch))                        # Flax, plain JAX
    program = step_program(step, (model, opt_state, x, y), data_argnums=(2, 3))  # Equinox

Nothing asks for logical axis names: the analysis reads the step's jaxpr. What is read from the
step and its example arguments:

- **Arguments**: pytrees whose array leaves (jax or numpy arrays, or ``jax.ShapeDtypeStruct``
  for shapes only) are the step's inputs. Any other leaf (an Equinox module's activation
  function, a Python number) is static and closed over, as ``eqx.filter_jit`` does (``split``,
  ``combine``, ``ArrayStep``), so Flax NNX modules and states, Linen variables, Equinox modules
  and plain dicts all work as they are.
- **Data**: ``data_argnums`` (default: the last argument) are the batch: the dp baseline splits
  their leading dimension over every device. The other arguments are state (parameters,
  optimizer state), which fsdp splits.
- **State fed back**: where the step returns the new values of its state arguments first, in
  order and alike in shape (``state, loss = step(state, batch)``; ``params, opt_state, loss =
  step(params, opt_state, batch)``), a whole-step run feeds them back as the next step's, so it
  trains as the user's loop would (``feeds_back``); otherwise it reruns on the same arguments.
  The data stay the example ones. The loss is the first scalar floating-point leaf of what the
  step returns besides (``loss_leaf``): the losses compared with one device's.

The baselines a user would compare with (``baseline_shardings``): ``dp`` (the data's leading
dimension split over every device, everything else replicated), ``fsdp`` (each state leaf split
on its largest dimension the device count divides, the data as dp) and ``user``: the shardings
the user's own code gives the step (``in_shardings``, as for ``jax.jit``). The built-in plans
``tp``, ``dp_tp`` and ``ep`` lay out the model protocol's logical axes, which a user's step has
not; they are skipped with a note saying so.

Arguments given as shapes only are made up for the runs (``materialize``): floating-point leaves
uniform in [0, 0.02) (not negative, so an optimizer's second moments stay valid), integers and
booleans zero, keys from a fixed seed; the same on every process.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from launcher.sharding.analysis.contractions import find_contractions
from launcher.sharding.analysis.graph import trace
from launcher.sharding.analysis.references import axis_map, cfp_spec
from launcher.sharding.analysis.strategies import Spec
from launcher.sharding.apply import make_mesh, program_signature, spec_json, whole_step
from launcher.sharding.options import USER_BASELINE as USER
from launcher.sharding.program import TrainingProgram
from launcher.sharding.search.measure import StepRunner
from launcher.sharding.user.reading import ArrayStep, Loss, Reading, canonical, nnx_module, read, split, step_name
from launcher import jaxcompat
from launcher.errors import UserError
from launcher.typing import Json, PyTree, StepFn

if TYPE_CHECKING:
    from launcher.sharding.analysis.contractions import Contraction
    from launcher.sharding.analysis.core import Analysis

STEP_BASELINES = ("dp", "fsdp")  # the built-in names a user's step has a layout for (and USER, its own)


# ---------------------------------------------------------------------------------------------
# Array leaves and the rest


def shapes_of(tree: PyTree) -> PyTree:
    """Shapes and dtypes of an array pytree, dtypes as JAX takes them (``reading.canonical``)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), canonical(x).dtype,
                                                       weak_type=getattr(x, "weak_type", False)), tree)


def describe_leaves(tree: PyTree) -> list[dict]:
    """Per array leaf: its path in the arguments (as the plan's ``in:`` constraints name it),
    shape and dtype."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [{"path": jax.tree_util.keystr(p), "shape": list(x.shape), "dtype": str(x.dtype)} for p, x in leaves]


# ---------------------------------------------------------------------------------------------
# The program


def step_program(fn: StepFn, args: Sequence[PyTree], *, data_argnums: Optional[Sequence[int]] = None,
                 in_shardings: PyTree = None, name: Optional[str] = None, state_argnums: Optional[Sequence[int]] = None,
                 loss: Loss = None, log: Callable[[str], None] = lambda line: None,
                 scalars: Optional[bool] = None) -> StepProgram:
    """``fn(*args)`` as a ``TrainingProgram`` (a ``StepProgram``): read as ``reading.py`` says (NNX objects as their
    joint state, host arrays as JAX takes them, the state fed back, the loss), refused in one
    line (UserError) where it cannot be: no argument, no array among them, positions out of
    range, a step that cannot be traced on them, one with no contraction for the search to
    decide, state that is not returned or changes type, an ambiguous loss, ``in_shardings``
    that do not match the arguments. ``in_shardings`` None: the layouts the example arguments
    already have, where the state's are all laid out on one mesh (``_given_shardings``).
    ``scalars``: ``reading.read``'s (a plan applied reads the step as it was searched)."""
    name = name or step_name(fn)
    args = tuple(args)
    if not args:
        raise UserError(f"{name}: no example arguments; give them as the step takes them: "
                        "autoshard(step_fn, *example_args)")
    if not jax.tree.leaves(split(args)[0]) and not any(_is_nnx_node(a) for a in args):
        raise UserError(f"{name}: none of its example arguments holds an array (jax or numpy array, or "
                        "jax.ShapeDtypeStruct); give the parameters, optimizer state and batch the step takes")
    reading, pargs = read(fn, args, name=name, data_argnums=data_argnums, state_argnums=state_argnums, loss=loss,
                          log=log, scalars=scalars)
    arrays, static = split(pargs)
    step = ArrayStep(reading.step(fn), static)
    shapes = shapes_of(arrays)
    closed, g = trace(step, *shapes)
    contractions = find_contractions(g)
    if not contractions:
        raise UserError(f"{name} has no tensor contraction (dot_general/einsum, convolution or embedding lookup), "
                        "so there is nothing to shard: autoshard a training step whose loss multiplies by its "
                        "weights")
    out_shapes = jax.tree.unflatten(g.out_tree, [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in closed.out_avals])
    given = any(not isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(arrays))
    if in_shardings is not None and reading.nnx and not isinstance(in_shardings, Sharding):
        in_shardings = _nnx_shardings(name, in_shardings, reading, pargs)
    user = (_user_shardings(name, in_shardings, shapes) if in_shardings is not None
            else _given_shardings(name, arrays, reading.data_argnums, log))
    return StepProgram(step, shapes, data_argnums=reading.data_argnums, values=arrays if given else None,
                           feeds_back=reading.feeds_back, out_shapes=out_shapes, loss_leaf=reading.loss_leaf,
                           flops=contraction_flops(contractions.values()), in_shardings=user, name=name,
                           signature=program_signature(g), reading=reading)


def _is_nnx_node(x: PyTree) -> bool:
    nnx = nnx_module()
    return nnx is not None and nnx.graph.is_graph_node(x)


def _laid_out_on(x: PyTree) -> PyTree:
    """The mesh of every device ``x`` is laid out on by a ``NamedSharding``, or None."""
    if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and x.sharding.mesh.size == jax.device_count():
        return x.sharding.mesh
    return None


def _given_shardings(name: str, arrays: tuple, data_argnums: Sequence[int], log: Callable[[str], None]
                     ) -> Optional[tuple]:
    """The layout the example arguments already have, as the user's own (``user`` baseline),
    wherever some are laid out by a ``NamedSharding`` on a mesh of every device (the mesh most
    of them are on, where several): those leaves as they are, the others (a single-device PRNG
    key, an array JAX made without a layout, NumPy data) replicated, data leaves split on their
    leading dimension as a loop placing each batch would; one line says how many were read so.
    The mesh's axes are taken as Auto (an Explicit-axes mesh's names would refuse the search's
    constraints). None where nothing is laid out, or where what is is dp's (replicated state on
    a 1-D mesh)."""
    leaves = jax.tree.leaves(arrays)
    meshes = Counter(m for m in map(_laid_out_on, leaves) if m is not None)
    if not meshes:
        return None
    mesh = meshes.most_common(1)[0][0]
    auto = jaxcompat.auto_mesh(mesh.devices, mesh.axis_names)
    first = mesh.axis_names[0]
    state_split = any(_laid_out_on(x) == mesh and any(x.sharding.spec)
                      for i, a in enumerate(arrays) if i not in data_argnums for x in jax.tree.leaves(a))
    if not state_split and len(mesh.axis_names) == 1:
        log(f"{name}: the arguments' own layout is dp's (the state replicated, the batch split): raced once, as dp")
        return None

    def laid_out(x: PyTree, data: bool) -> NamedSharding:
        if _laid_out_on(x) == mesh:
            return NamedSharding(auto, x.sharding.spec)
        lead = data and np.ndim(x) > 0 and np.shape(x)[0] % mesh.shape[first] == 0
        return NamedSharding(auto, PartitionSpec(first) if lead else PartitionSpec())

    out = tuple(jax.tree.map(lambda x, i=i: laid_out(x, i in data_argnums), a) for i, a in enumerate(arrays))
    read = sum(_laid_out_on(x) == mesh for x in leaves)
    # What was read, as it was: the leaves found laid out, and of the others which were split as a
    # batch and which replicated (a batch the program replicates itself stays replicated).
    split = sum(_laid_out_on(x) != mesh and any(s.spec) for x, s in zip(leaves, jax.tree.leaves(out), strict=True))
    rest = len(leaves) - read
    others = ("" if not rest else f", the other {rest} " + (
        "replicated" if not split else "split on their leading dimension (a batch)" if split == rest else
        f"replicated but {split} split on their leading dimension (a batch)"))
    log(f"{name}: its own layout, raced as 'user': {read} of {len(leaves)} array leaves read as laid out on its mesh "
        f"{dict(mesh.shape)}{others}; in_shardings=... gives another")
    return out


def _nnx_shardings(name: str, in_shardings: PyTree, reading: Reading, pargs: tuple) -> tuple:
    """``in_shardings`` given in the step's own positions, a Flax NNX object's as ``nnx.jit`` takes
    it (a Sharding for all its arrays, None, or a tree shaped like ``nnx.state(obj)``, as
    ``nnx.get_named_sharding`` gives), in the program's: the objects' joint state first (a
    variable two objects share takes the first's), None where nothing is said (replicated)."""
    given = tuple(in_shardings) if isinstance(in_shardings, (tuple, list)) else ()
    if len(given) != reading.n_args:
        raise UserError(f"in_shardings of {name}: give one entry per argument ({reading.n_args}), as for nnx.jit: a "
                        "Sharding, None, or for a Flax NNX object a tree shaped like nnx.state(obj)")
    is_leaf = lambda x: x is None or isinstance(x, Sharding)
    by_path: dict[str, Sharding | None] = {}
    for j, i in enumerate(reading.nnx):
        if isinstance(given[i], Sharding) or given[i] is None:
            by_path[f"[{j}]"] = given[i]
            continue
        for path, s in jax.tree_util.tree_flatten_with_path(given[i], is_leaf=is_leaf)[0]:
            by_path.setdefault(f"[{j}]{jax.tree_util.keystr(path)}", s)

    def lookup(path: tuple, _: PyTree) -> Sharding | None:
        key = jax.tree_util.keystr(path)
        return by_path.get(key, by_path.get(key[:key.index("]") + 1]))

    joint = jax.tree_util.tree_map_with_path(lookup, pargs[0])
    return (joint, *[s for i, s in enumerate(given) if i not in reading.nnx])


def contraction_flops(contractions: Iterable[Contraction]) -> float:
    """Twice the multiply-adds of the dot and convolution contractions (a loop body's once)."""
    return float(sum(2 * math.prod(d.size for d in c.dims) for c in contractions if c.kind in ("dot", "conv")))


def _user_shardings(name: str, in_shardings: PyTree, shapes: tuple) -> tuple:
    """The user's ``in_shardings`` (as for ``jax.jit``: one per argument, each a Sharding or a
    pytree prefix of it; None: replicated) as a Sharding per array leaf."""
    if isinstance(in_shardings, Sharding):
        in_shardings = (in_shardings,) * len(shapes)
    is_leaf = lambda x: x is None or isinstance(x, Sharding)
    prefix = jax.tree.structure(tuple(in_shardings), is_leaf=is_leaf)
    try:
        subtrees = prefix.flatten_up_to(shapes)
    except (ValueError, TypeError):
        raise UserError(f"in_shardings of {name}: {first_difference(tuple(in_shardings), shapes, is_leaf)}; give one "
                        "sharding per argument, or a pytree of them made from the arguments themselves "
                        "(jax.tree.map), as for jax.jit") from None
    given = jax.tree.leaves(tuple(in_shardings), is_leaf=is_leaf)
    meshes = {s.mesh for s in given if s is not None}
    if not all(s is None or isinstance(s, NamedSharding) for s in given) or len(meshes) != 1:
        raise UserError(f"in_shardings of {name}: give NamedShardings on one mesh (None: replicated), e.g. "
                        "NamedSharding(mesh, PartitionSpec('data'))")
    mesh = meshes.pop()
    auto = jaxcompat.auto_mesh(mesh.devices, mesh.axis_names)  # Explicit axes would refuse the search's constraints
    full = [jax.tree.map(lambda _, s=s: NamedSharding(auto, s.spec if s is not None else PartitionSpec()), sub)
            for s, sub in zip(given, subtrees, strict=True)]
    return tuple(prefix.unflatten(full))


def first_difference(given: PyTree, args: PyTree, is_leaf: Callable[[PyTree], bool]) -> str:
    """Where the pytree ``given`` (a prefix of ``args`` down to its ``is_leaf`` leaves) first
    stops matching ``args``, and what stands on each side, in a few words: the whole of either
    (a TrainState's static fields print its model and optimizer) runs to thousands of characters."""
    def walk(a: PyTree, b: PyTree, path: str) -> Optional[str]:
        if is_leaf(a):
            return None
        one = lambda x: jax.tree_util.tree_flatten_with_path(x, is_leaf=lambda y: y is not x)
        (ka, da), (kb, db) = one(a), one(b)
        if type(a) is not type(b):
            return f"at {path or 'the top'} the arguments hold a {type(b).__name__}, the shardings a {type(a).__name__}"
        if len(ka) != len(kb) or [k for k, _ in ka] != [k for k, _ in kb]:
            keys = lambda kv: ", ".join(jax.tree_util.keystr(k) for k, _ in kv[:4]) or "nothing"
            return f"at {path or 'the top'} the arguments hold {keys(kb)}, the shardings {keys(ka)}"
        if da != db:
            return f"at {path or 'the top'} the {type(b).__name__}s differ in {_static_difference(a, b)}"
        for (k, x), (_, y) in zip(ka, kb, strict=True):
            found = walk(x, y, path + jax.tree_util.keystr(k))
            if found:
                return found
        return None

    return walk(given, args, "") or "its structure is not the arguments'"


def _static_difference(a: PyTree, b: PyTree) -> str:
    """Which static (not pytree) field of two dataclass nodes of one type differs."""
    if dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            if f.metadata.get("pytree_node", True):
                continue
            x, y = getattr(a, f.name, None), getattr(b, f.name, None)
            if x is not y and x != y:
                return f"their static field {f.name} (another {type(y).__name__} object)"
    return "their static data"


# ---------------------------------------------------------------------------------------------
# The baselines


def baseline_shardings(program: TrainingProgram, name: str, mesh: Mesh) -> tuple:
    """The shardings (a pytree per argument) of baseline ``name`` on a 1-D ``mesh`` over every
    device (``user``: the user's own). UserError where it does not apply, saying why."""
    if name == USER:
        if program.in_shardings is None:
            raise UserError(f"{USER}: no shardings of your own were given (in_shardings=...)")
        return program.in_shardings
    if name not in STEP_BASELINES:
        raise UserError(f"{name} lays out the model protocol's logical axes (param_axes, batch_axes), which a user's "
                        f"step has not; give your own layout as in_shardings to race it (the {USER!r} baseline)")
    (axis,), n = mesh.axis_names, mesh.size

    def split_on(x: PyTree, dim: Optional[int]) -> NamedSharding:
        return NamedSharding(mesh, PartitionSpec(*[axis if i == dim else None for i in range(len(x.shape))]))

    def data(x: PyTree) -> NamedSharding:
        return split_on(x, 0 if x.shape and x.shape[0] % n == 0 else None)

    def state(x: PyTree) -> NamedSharding:
        if name == "dp":
            return split_on(x, None)
        divisible = [i for i, s in enumerate(x.shape) if s % n == 0]
        return split_on(x, max(divisible, key=lambda i: x.shape[i]) if divisible else None)

    out = tuple(jax.tree.map(data if i in program.data_argnums else state, a) for i, a in enumerate(program.args))
    splits = lambda nums: [s for i in nums for s in jax.tree.leaves(out[i]) if any(s.spec)]
    if not splits(program.data_argnums):
        raise UserError(f"{name}: no data argument (data_argnums={list(program.data_argnums)}) has a leading "
                        f"dimension {n} devices divide; give a batch that {n} divides, or other data_argnums")
    if name == "fsdp" and not splits([i for i in range(len(out)) if i not in program.data_argnums]):
        raise UserError(f"fsdp: no state leaf has a dimension {n} devices divide")
    return out


def baseline_constraints(program: TrainingProgram, name: str) -> tuple[list[int], Json]:
    """Baseline ``name``'s layouts as a plan's mesh shape and ``constraints`` (``apply.py``'s
    format: the step's signature and each argument's layout, nothing pinned inside the step),
    for an ``AutoPlan`` whose answer is that baseline."""
    leaves = jax.tree.leaves(baseline_shardings(program, name, make_mesh([jax.device_count()])))
    mesh = leaves[0].mesh
    shape = [int(n) for n in mesh.devices.shape]
    axes = axis_map(dict(mesh.shape), shape)
    constraints: Json = {"program": program.signature}
    for leaf, sharding in zip(describe_leaves(program.args), leaves, strict=True):
        constraints[f"in:{leaf['path']}"] = spec_json(cfp_spec(sharding.spec, axes, len(leaf["shape"])))
    return shape, constraints


def input_layouts(a: Analysis, program: TrainingProgram, name: str, devices: Sequence[jax.Device]) -> Optional[dict[int, Spec]]:
    """var id (of the analysis ``a``'s graph) -> the layout baseline ``name`` gives each input of
    the step, on ``a``'s mesh (``search/nearest.py``'s nearest plan of a user's step); None
    where the baseline does not apply or does not map onto the mesh."""
    try:
        shardings = baseline_shardings(program, name, make_mesh([len(devices)], devices))
    except UserError:
        return None
    leaves = jax.tree.leaves(shardings)
    meshes = {s.mesh for s in leaves if isinstance(s, NamedSharding)}
    if len(meshes) != 1 or len(leaves) != len(a.graph.inputs) or not all(isinstance(s, NamedSharding) for s in leaves):
        return None
    axes = axis_map(dict(next(iter(meshes)).shape), a.mesh_shape)
    if axes is None:
        return None
    return {v: cfp_spec(s.spec, axes, len(a.graph.shape(v))) for v, s in zip(a.graph.inputs, leaves, strict=True)}


# ---------------------------------------------------------------------------------------------
# Running it


def out_shardings(program: TrainingProgram, in_shardings: tuple, replicated: NamedSharding) -> PyTree:
    """The step's output shardings: the state it returns laid out as it came in (so steps
    chain), the rest ``replicated``."""
    state = [s for i in program.feeds_back for s in jax.tree.leaves(in_shardings[i])]
    tree = jax.tree.structure(program.out_shapes)
    return jax.tree.unflatten(tree, state + [replicated] * (tree.num_leaves - len(state)))


def place(x: PyTree, sharding: Sharding) -> jax.Array:
    """``x`` (a host value, or a jax array the same on every process) laid out as ``sharding``,
    as a new array (the runs donate the state they feed back). A jax array on any mesh (the
    program's own, auto or explicit axes) is moved to ``sharding``'s: a step jitted on one mesh
    takes no argument laid out on another."""
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = place(jax.random.key_data(x), NamedSharding(sharding.mesh, sharding.spec))
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(x))
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return jax.jit(jnp.copy, out_shardings=sharding)(x)
    host = np.asarray(canonical(np.asarray(x)))   # float64 host data as JAX takes it
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def materialize(program: TrainingProgram, in_shardings: tuple, seed: int = 0) -> tuple:
    """The step's arguments laid out as ``in_shardings``: the user's values where given, made up
    from the shapes (the module's doc) elsewhere."""
    shapes, tree = jax.tree.flatten(program.args)
    shardings = jax.tree.leaves(in_shardings)
    values = jax.tree.leaves(program.values) if program.values is not None else [None] * len(shapes)
    missing = [k for k, v in enumerate(values) if v is None or isinstance(v, jax.ShapeDtypeStruct)]

    def make() -> list[PyTree]:
        key = jax.random.key(seed)
        return [_made_up(jax.random.fold_in(key, k), shapes[k]) for k in missing]

    made = dict(zip(missing, jax.jit(make, out_shardings=[shardings[k] for k in missing])() if missing else [], strict=True))
    return tuple(jax.tree.unflatten(tree, [made[k] if k in made else place(v, s)
                                           for k, (v, s) in enumerate(zip(values, shardings, strict=True))]))


def _made_up(key: jax.Array, s: jax.ShapeDtypeStruct) -> jax.Array:
    if jnp.issubdtype(s.dtype, jax.dtypes.prng_key):
        return jax.random.split(key, s.shape)
    if jnp.issubdtype(s.dtype, jnp.floating):
        return jax.random.uniform(key, s.shape, s.dtype, 0.0, 0.02)
    return jnp.zeros(s.shape, s.dtype)


def next_args(program: TrainingProgram, args: Sequence[PyTree], out: PyTree) -> tuple:
    """The next step's arguments: the state the step returned in place of its state arguments."""
    if not program.feeds_back:
        return tuple(args)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    new = list(args)
    for j, i in enumerate(program.feeds_back):
        new[i] = outs[j]
    return tuple(new)


def loss_of(program: TrainingProgram, out: PyTree) -> Optional[float]:
    """The step's loss (``loss_leaf``) from what it returned, or None."""
    if program.loss_leaf is None:
        return None
    return float(jax.tree.leaves(out)[program.loss_leaf])


# ---------------------------------------------------------------------------------------------
# What the passes ask of it


class StepProgram(TrainingProgram):
    """A user's step as the passes take it (``step_program``): the program, and what the race
    (``search/measure.py``'s ``StepRunner``) and the nearest plans (``search/nearest.py``) ask of
    a step that has no model protocol, answered by this module. The passes ask it of the program
    they are given, so they import nothing of this folder, which builds on them."""

    # Its baselines lay out its inputs alone: the nearest plans carry them through the step.
    layouts_inputs_only = True

    def plan_runner(self, a: Analysis, assignment: Mapping[int, int], mesh: Mesh, *, seed: int = 0,
                    name: str = "searched", stored: frozenset = frozenset()) -> StepRunner:
        step, in_shardings, _ = whole_step(a, assignment, mesh, stored)
        return StepRunner(name, self, step, in_shardings, seed=seed)

    def baseline_runner(self, name: str, devices: Sequence[jax.Device], *, seed: int = 0) -> StepRunner:
        return StepRunner(name, self, self.step, self.baseline_shardings(name, make_mesh([len(devices)], devices)),
                          seed=seed)

    def baseline_layouts(self, a: Analysis, name: str, devices: Sequence[jax.Device]) -> Optional[dict[int, Spec]]:
        return input_layouts(a, self, name, devices)

    def baseline_shardings(self, name: str, mesh: Mesh) -> tuple:
        return baseline_shardings(self, name, mesh)

    def out_shardings(self, in_shardings: tuple, replicated: NamedSharding) -> PyTree:
        return out_shardings(self, in_shardings, replicated)

    def materialize(self, in_shardings: tuple, seed: int = 0) -> tuple:
        return materialize(self, in_shardings, seed)

    def next_args(self, args: Sequence[PyTree], out: PyTree) -> tuple:
        return next_args(self, args, out)

    def loss_of(self, out: PyTree) -> Optional[float]:
        return loss_of(self, out)
