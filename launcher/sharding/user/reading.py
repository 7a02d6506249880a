"""What a user's step is read as (``step.py: step_program``), so that nothing in it is guessed.

The program CFP analyses, profiles and runs is ``step(*args) -> (*new_state, outputs)``: made
once from the user's function (``Reading.step``) and undone where the plan is applied
(``Reading.call``):

- **Arguments.** Flax NNX objects (modules, optimizers: graph nodes) are passed as their joint
  state, as ``nnx.jit`` passes them: a variable two of them hold (a model's ``Param`` that the
  optimizer holds too, the Flax examples' pattern) is one input with one layout, updated once;
  the step's in-place updates come back as that state, and ``Reading.call`` writes them into the
  objects. Host arrays are taken as JAX takes them: NumPy float64 is float32 unless
  ``jax_enable_x64`` (``jnp.asarray``'s dtype), in the search and wherever the plan is used.
  One array reached from two state arguments (not NNX: those are joined) is refused, naming
  both paths: fed back, it would become two. Python numbers in the arguments (a Flax
  ``TrainState.create``'s ``step=0``, a float schedule value) are taken as ``jax.jit`` takes them:
  weakly typed scalar arrays, so that the ``int32[]`` a jitted step returns for ``step`` is the
  new value of the ``0`` it was given. Where the step needs one as a Python value (``range(n)``,
  an ``if``), the reading falls back to closing over them, as ``eqx.filter_jit`` does
  (``Reading.scalars``).
- **Data.** ``data_argnums``, or left out the last argument past trailing PRNG keys and counters
  and the ones before it of the same leading dimension (``_default_data``).
- **State.** A state argument (any that is not data) is fed back where the step returns, at the
  top level of its output, a value alike in structure, shapes and dtypes, in any order
  (``(state, loss)``, ``(loss, state)``, ``params, opt_state, loss``); ``state_argnums`` names the
  state arguments instead (``()``: none, the step's reruns timed as such). Where the step returns
  no state, the search would time reruns of one step: refused, saying what it returns and how to
  settle it. A value in a state argument's place with its structure but another shape or
  dtype: refused, naming the leaf.
- **Loss.** The one scalar floating-point leaf of the outputs besides the state; among several,
  the one whose path names ``loss``; ``loss=`` (a path such as ``"[1]['loss']"``, or a function of
  the step's outputs returning one of them) says which. Several and none named so: refused.
"""

from __future__ import annotations

import functools
import re
import sys
import types
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from launcher.typing import PyTree, StepFn
from launcher.errors import UserError

Loss = Union[None, str, Callable[[PyTree], PyTree]]   # None (read from the outputs), a path string, or a function of the outputs


def nnx_module() -> types.ModuleType | None:
    """flax.nnx where the user's program imported Flax (a step holding NNX objects did)."""
    if "flax" not in sys.modules:
        return None
    from flax import nnx  # noqa: PLC0415  only where the user's program uses Flax

    return nnx


def step_name(fn: StepFn) -> str:
    """What the user calls ``fn``: its ``__name__``, through the ``functools.partial`` a trainer
    jits (``partial(train_step, config=...)``), and any wrapper that has none, its type's."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


def is_array(x: PyTree) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, jax.ShapeDtypeStruct))


def split(tree: PyTree) -> tuple[PyTree, PyTree]:
    """(arrays, static): ``tree`` with its non-array leaves set to None, and with its array
    leaves set to None (``eqx.partition(tree, eqx.is_array)``)."""
    return (jax.tree.map(lambda x: x if is_array(x) else None, tree),
            jax.tree.map(lambda x: None if is_array(x) else x, tree))


def combine(arrays: PyTree, static: PyTree) -> PyTree:
    """``split``'s inverse."""
    return jax.tree.map(lambda a, s: s if a is None else a, arrays, static, is_leaf=lambda x: x is None)


class ArrayStep:
    """``fn`` as a function of its arguments' array leaves: their other leaves are closed over,
    and the other leaves of what it returns are kept from its last trace (``static_out``)."""

    def __init__(self, fn: StepFn, static_args: tuple) -> None:
        self.fn, self.static_args = fn, static_args
        self.static_out: PyTree = None
        self.__name__ = step_name(fn)

    def __call__(self, *arrays: PyTree) -> PyTree:
        out, self.static_out = split(self.fn(*combine(arrays, self.static_args)))
        return out

    def whole(self, out: PyTree) -> PyTree:
        """What ``fn`` returns, from what this returned."""
        return combine(out, self.static_out)




def canonical(x: PyTree) -> PyTree:
    """An array leaf as JAX takes it: NumPy data of a type JAX does not keep (float64, int64
    under x64 off) in the type ``jnp.asarray`` gives it; the rest as it is."""
    if isinstance(x, (np.ndarray, np.generic)):
        dtype = jax.dtypes.canonicalize_dtype(x.dtype)
        return np.asarray(x, dtype) if dtype != x.dtype else x
    if isinstance(x, jax.ShapeDtypeStruct):
        dtype = jax.dtypes.canonicalize_dtype(x.dtype)
        return jax.ShapeDtypeStruct(x.shape, dtype, sharding=x.sharding) if dtype != x.dtype else x
    return x


def is_scalar(x: PyTree) -> bool:
    """A Python number (bool, int, float, complex): ``jax.jit`` traces one as a weakly typed array."""
    return isinstance(x, (bool, int, float, complex))


def has_scalars(args: PyTree) -> bool:
    return any(is_scalar(x) for x in jax.tree.leaves(args))


def canonical_args(args: PyTree, scalars: bool = True) -> PyTree:
    """``args`` as the program takes them: array leaves as JAX takes them (``canonical``) and,
    with ``scalars``, Python numbers as ``jax.jit`` takes them (weakly typed scalar arrays)."""
    def leaf(x: PyTree) -> PyTree:
        if is_array(x):
            return canonical(x)
        return jnp.asarray(x) if scalars and is_scalar(x) else x
    return jax.tree.map(leaf, args)


# What a step that needs one of its Python numbers as a Python value raises when it is traced.
_NEEDS_PYTHON_VALUE = (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)


@dataclass(frozen=True)
class Reading:
    """How a user's step with ``n_args`` arguments is read (module doc)."""
    n_args: int
    nnx: tuple[int, ...]                 # argument positions holding NNX objects, passed as one joint state
    graphdef: PyTree                     # nnx.split's of those objects (None without any)
    data_argnums: tuple[int, ...]        # of the program's arguments
    feeds_back: tuple[int, ...]          # program arguments whose new values the program returns first
    returned_at: tuple[Optional[int], ...]  # per fed-back argument: its place in the step's outputs (None: NNX state)
    returns_tuple: bool                  # the step returns a tuple or list (else one value)
    outputs: int                         # its top-level outputs
    loss_leaf: Optional[int]             # among the program's output leaves
    loss_path: str = ""                  # the loss as a path of the step's outputs ("" where none)
    # The options as given, in the user's positions: what reads the step again (a plan applied).
    user_data_argnums: tuple[int, ...] = ()
    user_state_argnums: Optional[tuple[int, ...]] = None
    # Python numbers in the arguments traced as arrays (``jax.jit``'s way), or closed over where
    # the step needs their Python values (module doc).
    scalars: bool = True

    # --- arguments ------------------------------------------------------------------------------

    def args(self, user_args: Sequence[PyTree]) -> tuple:
        """The program's arguments: the NNX objects' joint state first, where there are any."""
        user_args = tuple(user_args)
        if not self.nnx:
            return canonical_args(user_args, self.scalars)
        nnx = nnx_module()
        objects = tuple(user_args[i] for i in self.nnx)
        graphdef, state = nnx.split(objects)
        if graphdef != self.graphdef:
            raise UserError("the Flax NNX objects passed are not those the plan was searched for (their graph "
                            "differs): pass the model and optimizer the step was searched with, or autoshard again")
        return (state, *canonical_args([a for i, a in enumerate(user_args) if i not in self.nnx], self.scalars))

    def _user_args(self, args: Sequence[PyTree]) -> tuple[tuple, tuple]:
        """(the user's arguments, the NNX objects among them) from the program's."""
        if not self.nnx:
            return tuple(args), ()
        objects = tuple(nnx_module().merge(self.graphdef, args[0]))
        rest, out = iter(args[1:]), []
        for i in range(self.n_args):
            out.append(objects[self.nnx.index(i)] if i in self.nnx else next(rest))
        return tuple(out), objects

    # --- the program ----------------------------------------------------------------------------

    def raw(self, fn: StepFn) -> StepFn:
        """``fn`` on the program's arguments: (the NNX objects' new state or None, what ``fn``
        returns, the NNX objects it was given among it as ``Returned`` markers: ``call`` puts the
        user's own objects, updated, in their places, as ``nnx.jit`` returns them)."""
        def raw_step(*args: PyTree) -> PyTree:
            user_args, objects = self._user_args(args)
            out = fn(*user_args)
            if objects:
                nnx = nnx_module()
                out = jax.tree.map(lambda o: _returned(o, objects), out, is_leaf=nnx.graph.is_graph_node)
            return (nnx_module().state(objects) if objects else None), out
        raw_step.__name__ = step_name(fn)
        return raw_step

    def step(self, fn: StepFn) -> StepFn:
        """The program: ``fn`` on the program's arguments, returning the fed-back arguments' new
        values first (in ``feeds_back``'s order), then the rest of its outputs as a tuple."""
        raw = self.raw(fn)

        def program_step(*args: PyTree) -> PyTree:
            state, out = raw(*args)
            outs = list(out) if self.returns_tuple else [out]
            new = [state if at is None else outs[at] for at in self.returned_at]
            taken = {at for at in self.returned_at if at is not None}
            return (*new, tuple(o for k, o in enumerate(outs) if k not in taken))
        program_step.__name__ = raw.__name__
        return program_step

    def call(self, program_step: StepFn, user_args: Sequence[PyTree]) -> PyTree:
        """Runs the program (``program_step``: jitted under a plan) on the user's arguments and
        returns what the user's step returns: its outputs in their places, the NNX objects
        updated in place."""
        out = program_step(*self.args(user_args))
        new, rest = list(out[:len(self.feeds_back)]), list(out[len(self.feeds_back)])
        if self.nnx:
            nnx_module().update(tuple(user_args[i] for i in self.nnx), new[self.returned_at.index(None)])
        outs: list[PyTree] = [None] * self.outputs
        for value, at in zip(new, self.returned_at, strict=True):
            if at is not None:
                outs[at] = value
        free = iter(rest)
        outs = [o if k in self.returned_at else next(free) for k, o in enumerate(outs)]
        out = tuple(outs) if self.returns_tuple else outs[0]
        if self.nnx:   # the objects it returns: the user's own, updated above
            out = jax.tree.map(lambda o: user_args[self.nnx[o.index]] if isinstance(o, Returned) else o, out)
        return out


    def program_position(self, i: int) -> int:
        """The program argument user argument ``i`` is (or is part of: NNX objects' joint state)."""
        return _program_positions(self.n_args, self.nnx)[i % self.n_args]


@dataclass(frozen=True)
class Returned:
    """Where the step returns the ``index``-th NNX object it was given (``model, optimizer, loss =
    step(model, optimizer, x, y)``): a static output, the object itself given back by ``call``."""
    index: int


def _returned(o: PyTree, objects: tuple) -> PyTree:
    return next((Returned(j) for j, obj in enumerate(objects) if o is obj), o)


def program_args(args: Sequence[PyTree], scalars: bool = True) -> tuple[tuple, tuple[int, ...]]:
    """(the program's arguments, the positions of the NNX objects among ``args``) of a step's
    arguments, read as ``read`` reads them (for a plan used without its step: ``AutoPlan.place``;
    ``scalars``: ``Reading.scalars``)."""
    args = tuple(args)
    nnx = nnx_module()
    at = tuple(i for i, a in enumerate(args) if nnx is not None and nnx.graph.is_graph_node(a))
    if not at:
        return canonical_args(args, scalars), ()
    _, state = nnx.split(tuple(args[i] for i in at))
    return (state, *canonical_args([a for i, a in enumerate(args) if i not in at], scalars)), at


def write_back(args: Sequence[PyTree], at: tuple[int, ...], placed: tuple) -> tuple:
    """``args`` with the program's arguments ``placed`` in their places: NNX objects updated in
    place from the joint state (and returned as they are), the others replaced."""
    if at:
        nnx_module().update(tuple(args[i] for i in at), placed[0])
    rest = iter(placed[1:] if at else placed)
    return tuple(a if i in at else next(rest) for i, a in enumerate(args))


# --- reading a step ---------------------------------------------------------------------------

def read(fn: StepFn, args: Sequence[PyTree], *, name: str, data_argnums: Optional[Sequence[int]] = None,
         state_argnums: Optional[Sequence[int]] = None, loss: Loss = None, log: Callable[[str], None] = print,
         scalars: Optional[bool] = None) -> tuple[Reading, tuple]:
    """(how ``fn`` is read, the program's arguments) from the user's example arguments
    ``args`` and options (module doc). UserError naming what cannot be read, and the fix.
    ``scalars``: Python numbers traced as arrays (default: unless the step needs their values; ``Reading.scalars``)."""
    args = tuple(args)
    n = len(args)
    nnx_mod = nnx_module()
    nnx_at = tuple(i for i, a in enumerate(args) if nnx_mod is not None and nnx_mod.graph.is_graph_node(a))
    data = _positions("data_argnums", data_argnums, n, _default_data(args, nnx_at), name, "data (batch) arguments")
    if set(nnx_at) & set(data):
        raise UserError(f"data_argnums={list(data)} names a Flax NNX object (argument {sorted(set(nnx_at) & set(data))}):"
                        " data are the batch; give the positions of the batch arguments")
    scalars = True if scalars is None else scalars
    graphdef, pargs = None, canonical_args(args, scalars)
    if nnx_at:
        graphdef, state = nnx_mod.split(tuple(args[i] for i in nnx_at))
        pargs = (state, *canonical_args([a for i, a in enumerate(args) if i not in nnx_at], scalars))
    to_program = _program_positions(n, nnx_at)
    pdata = tuple(sorted({to_program[i] for i in data}))
    stated = _positions("state_argnums", state_argnums, n, None, name, "state arguments")
    pstate = (sorted({to_program[i] for i in stated} | ({0} if nnx_at else set())) if stated is not None else
              [i for i in range(len(pargs)) if i not in pdata])
    _refuse_shared(pargs, pstate)
    probe = Reading(n, nnx_at, graphdef, pdata, (), (), False, 0, None)
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x),
                                                         weak_type=getattr(x, "weak_type", False))
                          if is_array(x) else x, pargs)
    try:
        (_, out), values = _eval_shape(probe.raw(fn), shapes)
    except UserError:
        raise
    except Exception as e:  # the user's function on arguments it does not take: say which, keep the cause
        if isinstance(e, _NEEDS_PYTHON_VALUE) and scalars and has_scalars(args):
            # The step reads one of its Python numbers as a Python value: close over them instead.
            log(f"{name}: its Python numbers are used as Python values (an if, a range), so they are kept as they "
                "are, not traced")
            return read(fn, args, name=name, data_argnums=data_argnums, state_argnums=state_argnums, loss=loss,
                        log=log, scalars=False)
        first = _cut((str(e).strip().splitlines() or [type(e).__name__])[0], 120)
        raise UserError(f"{name} cannot be traced on its example arguments ({type(e).__name__}: {first}); give "
                        "example arguments shaped as the step takes them, one per parameter") from e
    # A tuple or list is the step's outputs, unless it is itself a state argument's new value
    # (JAX's MNIST: params = [(w, b), ...] in, the new list out).
    returns_tuple = isinstance(out, (tuple, list)) and not any(
        _alike(out, pargs[i]) for i in pstate if not (nnx_at and i == 0))
    outs = list(out) if returns_tuple else [out]
    feeds, at = _fed_back(name, pargs, pstate, outs, bool(nnx_at), stated is not None, to_program, log)
    rest = tuple(o for k, o in enumerate(outs) if k not in set(at))
    loss_leaf, loss_path = _loss(name, out, rest, at, returns_tuple, loss, log, values)
    if loss_leaf is not None:  # among the program's output leaves: the fed-back values' come first
        loss_leaf += sum(len(_array_leaves(pargs[i])) for i in feeds)
    return Reading(n, nnx_at, graphdef, pdata, tuple(feeds), tuple(at), returns_tuple, len(outs), loss_leaf,
                   loss_path, tuple(data), stated, scalars), pargs


def _eval_shape(fn: StepFn, shapes: tuple) -> tuple[PyTree, dict[int, PyTree]]:
    """(``jax.eval_shape`` of ``fn`` on ``shapes`` whose non-array leaves, an Equinox module's
    activation or a Python number, are closed over as the program closes over them; per array
    leaf of that, by ``id``, the traced value it is: two leaves of one value, such as nanodo's
    ``__train_loss`` and ``train_loss``, have the same)."""
    arrays, static = split(shapes)
    step = ArrayStep(fn, static)
    closed, out = jax.make_jaxpr(step, return_shape=True)(*arrays)
    whole = step.whole(out)
    values = [v if isinstance(v, jcore.Var) else object() for v in closed.jaxpr.outvars]
    return whole, {id(x): v for x, v in zip(_array_leaves(whole), values, strict=True)}


def _default_data(args: tuple, nnx_at: tuple[int, ...]) -> tuple[int, ...]:
    """The data arguments when ``data_argnums`` is not given: the last argument, past any
    trailing PRNG keys and counters (``(params, opt_state, batch, key)``), and before it those
    whose every array leaf has the same leading dimension (Flax's ``step(model, optimizer, x,
    y)``). Never a Flax NNX object."""
    def leading(a: PyTree) -> Optional[set[int]]:
        leaves = [x for x in jax.tree.leaves(a) if is_array(x)]
        dims = {np.shape(x)[0] if np.ndim(x) else None for x in leaves}
        return dims if leaves and None not in dims and len(dims) == 1 else None

    def scalar_like(a: PyTree) -> bool:   # a key (typed, or old uint32[2]), a counter, a Python number
        if not is_array(a):
            return not jax.tree.leaves(a) or isinstance(a, (int, float))
        dtype = jnp.result_type(a)
        return np.ndim(a) == 0 or jnp.issubdtype(dtype, jax.dtypes.prng_key) or (
            np.shape(a) == (2,) and dtype == jnp.uint32)

    last = len(args) - 1
    while last > 0 and last not in nnx_at and scalar_like(args[last]):
        last -= 1
    if last in nnx_at:
        return (len(args) - 1,)
    data, dims = [last], leading(args[last])
    while dims is not None and data[0] - 1 >= 0 and data[0] - 1 not in nnx_at and leading(args[data[0] - 1]) == dims:
        data.insert(0, data[0] - 1)
    return tuple(data)


def _positions(option: str, given: Optional[Sequence[int]], n: int, default: tuple[int, ...] | None, name: str,
               what: str) -> tuple[int, ...] | None:
    if given is None:
        return default
    raw, given = given, (given,) if isinstance(given, int) else tuple(given)
    if not all(isinstance(i, int) and -n <= i < n for i in given):
        raise UserError(f"{option}={raw}: {name} has {n} argument(s); give the positions of its {what}, 0 to {n - 1}")
    return tuple(sorted({i % n for i in given}))


def _program_positions(n: int, nnx_at: tuple[int, ...]) -> dict[int, int]:
    """User argument position -> program argument position (NNX objects: 0, their joint state)."""
    out, k = {}, 1 if nnx_at else 0
    for i in range(n):
        if i in nnx_at:
            out[i] = 0
        else:
            out[i], k = k, k + 1
    return out


def _paths(tree: PyTree, prefix: str) -> list[tuple[str, PyTree]]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(prefix + jax.tree_util.keystr(p), x) for p, x in leaves]


def _refuse_shared(pargs: tuple, state: Sequence[int]) -> None:
    """One array (by identity) reached from two paths of which one is a fed-back state argument."""
    seen: dict[int, str] = {}
    for i, a in enumerate(pargs):
        for path, x in _paths(a, f"[{i}]"):
            if not isinstance(x, (jax.Array, np.ndarray)):
                continue
            first = seen.setdefault(id(x), path)
            if first != path and (i in state or int(first[1:first.index("]")]) in state):
                raise UserError(f"arguments {first} and {path} are one array: a variable reached from two arguments "
                                "would be fed back as two and train in one place only; pass it once (Flax NNX objects "
                                "sharing variables are joined as nnx.jit joins them), or pass a copy where the two are "
                                "meant to differ")


def _same_type(x: PyTree, y: PyTree) -> bool:
    """Array leaves alike in shape and dtype (any other leaf, static, is not compared)."""
    if not (is_array(x) and is_array(y)):
        return is_array(x) == is_array(y)
    return np.shape(x) == np.shape(y) and jnp.result_type(x) == jnp.result_type(y)


def _alike(a: PyTree, b: PyTree) -> bool:
    return jax.tree.structure(a) == jax.tree.structure(b) and all(
        _same_type(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


def _fed_back(name: str, pargs: tuple, state: Sequence[int], outs: list, nnx: bool, named: bool,
              to_program: dict[int, int], log: Callable[[str], None]) -> tuple[list[int], list[Optional[int]]]:
    """(program arguments fed back, their places in the step's outputs): each state argument
    with a value alike at the top level of the outputs, the first not taken (module doc)."""
    feeds, at, taken = [], [], set()
    for i in state:
        if nnx and i == 0:
            feeds.append(0)
            at.append(None)
            continue
        k = next((k for k, o in enumerate(outs) if k not in taken and _alike(o, pargs[i])), None)
        if k is None:
            _refuse_changed(name, pargs[i], i, outs, taken)
            continue
        feeds.append(i)
        at.append(k)
        taken.add(k)
    user = {p: u for u, p in to_program.items()}
    missing = [i for i in state if i not in feeds]
    if state and not feeds:
        what = ", ".join(_describe(o) for o in outs) or "nothing"
        raise UserError(f"{name} returns {what}: none of it is the new value of a state argument "
                        f"({', '.join(f'argument {user[i]}' for i in state)}), so the search would time reruns of one "
                        "step. Return the new state (state, loss = step(state, batch)), or give state_argnums=() to "
                        "time the step's reruns as they are")
    if missing and not named:
        log(f"{name}: argument{'s' if len(missing) > 1 else ''} {', '.join(str(user[i]) for i in missing)} "
            "not returned: every step of the search's runs gets the same value (state_argnums=... to say otherwise)")
    if missing and named:
        raise UserError(f"state_argnums names argument {user[missing[0]]}, and {name} returns no value alike it "
                        "(same structure, shapes and dtypes): return its new value, or leave it out of state_argnums")
    return feeds, at


def _refuse_changed(name: str, arg: PyTree, i: int, outs: list, taken: set) -> None:
    """A returned value with a state argument's structure but another dtype (or, for a tree of
    several arrays, another shape): the state would change between steps. Not for an argument
    that is one array other than floating point (a PRNG key, old or typed, a step counter), nor
    one array of another shape: a scalar the step returns besides (its loss) is no new value of
    it; not returned, it keeps its value."""
    if is_array(arg) and not jnp.issubdtype(jnp.result_type(arg), jnp.floating):
        return
    if is_array(arg) and not any(k not in taken and is_array(o) and np.shape(o) == np.shape(arg)
                                 for k, o in enumerate(outs)):
        return
    for k, o in enumerate(outs):
        if k in taken or jax.tree.structure(o) != jax.tree.structure(arg):
            continue
        for (path, x), y in zip(_paths(arg, f"[{i}]"), jax.tree.leaves(o), strict=True):
            if is_array(x) and is_array(y) and not _same_type(x, y):
                raise UserError(f"{name} takes {path} as {_type(x)} and returns it (output {k}) as {_type(y)}: state must "
                                "keep its shape and dtype from step to step; return it as it came (cast inside the "
                                "step), or make the example argument what the step returns")


def _array_leaves(tree: PyTree) -> list:
    return [x for x in jax.tree.leaves(tree) if is_array(x)]


def _loss(name: str, out: PyTree, rest: tuple, at: list, returns_tuple: bool, loss: Loss,
          log: Callable[[str], None], values: dict[int, PyTree]) -> tuple[Optional[int], str]:
    """(the loss's index among the array leaves of the outputs besides the fed-back state, its
    path in the step's outputs). ``values``: the traced value of each output leaf (by ``id``)."""
    leaves = [(p, x) for p, x in _paths(out, "out" if not returns_tuple else "") if is_array(x)]
    where = {id(x): p for p, x in leaves}
    index = {id(x): k for k, x in enumerate(_array_leaves(rest))}
    skip = {id(x) for a in at if a is not None for x in jax.tree.leaves(out[a] if returns_tuple else out)}
    if loss is not None:
        chosen = _chosen(name, out, loss, leaves)
        if np.shape(chosen) != () or not jnp.issubdtype(jnp.result_type(chosen), jnp.floating):
            raise UserError(f"loss={loss!r} picks {where[id(chosen)]}, a {_type(chosen)}: the loss is a floating-point "
                            "scalar; pick the step's loss")
        if id(chosen) in skip:
            raise UserError(f"loss={loss!r} picks {where[id(chosen)]}, part of the state the step returns: pick its loss")
        return index[id(chosen)], where[id(chosen)]
    scalars = [(p, x) for p, x in leaves if id(x) not in skip and np.shape(x) == ()
               and jnp.issubdtype(jnp.result_type(x), jnp.floating)]
    if not scalars:
        log(f"{name}: no floating-point scalar besides the state, so no loss is recorded (loss=... names one)")
        return None, ""
    # One value under several names (nanodo's metrics: "__train_loss" and "train_loss") is one
    # candidate, named by its most loss-like name.
    groups: dict[object, list[tuple[str, PyTree]]] = {}
    for p, x in scalars:
        groups.setdefault(values.get(id(x), id(x)), []).append((p, x))
    candidates = [min(g, key=lambda px: _loss_rank(px[0])) for g in groups.values()]
    if len(candidates) == 1:
        return index[id(candidates[0][1])], candidates[0][0]
    best = min(_loss_rank(p)[0] for p, _ in candidates)
    chosen = [(p, x) for p, x in candidates if _loss_rank(p)[0] == best]
    if best < len(_LOSS_NAMES) and len(chosen) == 1:
        log(f"{name}: the loss is {chosen[0][0]}, the scalar named so among {len(candidates)} "
            f"({_few(p for p, _ in candidates)}; loss=... to choose another)")
        return index[id(chosen[0][1])], chosen[0][0]
    ranked = [p for p, _ in sorted(candidates, key=lambda px: _loss_rank(px[0]))]
    for shown in (3, 2, 1):   # one line a reader takes in: at most about 300 characters
        line = (f"{name} returns {len(candidates)} floating-point scalars besides its state ({_few(ranked, shown)}) and "
                f"{'none' if best >= len(_LOSS_NAMES) else 'more than one'} is named loss: say which is the loss with "
                f"loss={ranked[0]!r} (a path of the outputs) or loss=lambda out: ...")
        if len(line) <= 300:
            break
    raise UserError(line)


# How the loss is named, most certain first: a path's last key, lower case, leading underscores
# dropped ("__train_loss" is "train_loss"); a name matching none is not a loss by its name.
_LOSS_NAMES = (lambda k: k == "loss", lambda k: k in ("train_loss", "total_loss", "training_loss", "loss_value"),
               lambda k: k.endswith("loss"), lambda k: "loss" in k)


def _loss_rank(path: str) -> tuple[int, bool, int]:
    """(how loss-like its name is, ``_LOSS_NAMES``; its key begins with an underscore; its length)."""
    found = re.findall(r"\['([^']*)'\]|\.(\w+)|\[(\d+)\]", path)
    key = next((a or b or c for a, b, c in reversed(found)), path) if found else path
    plain = key.lower().lstrip("_")
    rank = next((i for i, named in enumerate(_LOSS_NAMES) if named(plain)), len(_LOSS_NAMES))
    return rank, key.startswith("_"), len(path)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _few(paths: Iterable[str], n: int = 3, width: int = 40) -> str:
    """A few of ``paths``, each cut to ``width`` characters, for a line that stays short."""
    paths = list(paths)
    cut = [p if len(p) <= width else p[:width - 3] + "..." for p in paths[:n]]
    return ", ".join(cut) + (f", and {len(paths) - n} more" if len(paths) > n else "")


def _chosen(name: str, out: PyTree, loss: Loss, leaves: list[tuple[str, PyTree]]) -> PyTree:
    """The output leaf ``loss`` (a path, or a function of the outputs returning one) picks."""
    if isinstance(loss, str):
        found = [x for p, x in leaves if p == loss or p == f"out{loss}"]
        if not found:
            raise UserError(f"loss={loss!r}: {name}'s outputs have no such path (they are "
                            f"{', '.join(p for p, _ in leaves[:8])}); give one of them")
        return found[0]
    if callable(loss):
        try:
            picked = loss(out)
        except Exception as e:  # a function that computes rather than picks
            raise UserError(f"loss=: the function could not be applied to {name}'s outputs ({type(e).__name__}: {e}); "
                            "give a function returning one of the outputs, e.g. lambda out: out[1]['loss']") from None
        if not any(picked is x for _, x in leaves):
            raise UserError("loss=: the function must return one of the step's outputs as it is (e.g. "
                            "lambda out: out[1]['loss']), not compute a new value")
        return picked
    raise UserError(f"loss={loss!r}: give a path of the step's outputs (e.g. \"[1]['loss']\") or a function of them")


def _type(x: PyTree) -> str:
    return f"{jnp.result_type(x)}{list(np.shape(x))}"


def _describe(o: PyTree) -> str:
    leaves = _array_leaves(o)
    if len(leaves) == 1 and leaves[0] is o:
        return _type(o)
    return f"a {type(o).__name__} of {len(leaves)} arrays"
