"""The operator graph CFP analyses: a flat list of operators over typed tensors.

It comes from a traced program (``from_jaxpr``) or from an HLO text module (``hlo_text.py``).
Nested calls (``jit``, ``custom_jvp_call``, ``custom_vjp_call``, ``remat``, ``closed_call``) are
inlined, so every operator of the training step appears once, in program order, with a stable id:
the same program always flattens to the same ids, which is what lets a plan found on one run be
applied on another (``apply.py`` walks the jaxpr the same way).

Loop bodies (``scan``, ``while``, ``cond`` branches) are walked too: the loop itself is one
operator, followed by its body's operators (``Op.loop`` names the loop). A body's inputs and
outputs are tensors of their own (``Graph.loop_io``), related to the loop's operands and results
(``Graph.outer``): a constant or carry stands for the operand itself; a ``scan``'s per-iteration
slice of an operand (a stacked layer's weights) and its per-iteration result stacked into an
output (a residual the backward loop reads) are one layer of that stacked tensor.
``Graph.canonical`` follows these relations out to the top level, so the forward and backward
loops of a scanned model name one layer's weights alike (``blocks.py`` pairs their contractions
through it).

Each operator is marked with the phase of the training step it belongs to:

- ``fwd``: an ancestor of the loss (the step's scalar floating-point output);
- ``opt``: not forward, and reached from an input the forward pass never reads (the optimizer
  state). A stateless optimizer's update is therefore counted with the backward pass;
- ``bwd``: everything else (gradients, and residuals computed only for the backward pass).

A program without a scalar floating-point output is all forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore

from launcher.typing import PyTree, StepFn
from launcher.jaxcompat import NESTED_JIT_PRIMITIVES

if TYPE_CHECKING:
    from launcher.typing import ClosedJaxpr, Jaxpr, JaxprEqn, JaxprVar, Literal

# Call-like primitives whose single sub-program is inlined: they change how a computation is
# staged or differentiated, never what it computes once the step is traced.
INLINE = NESTED_JIT_PRIMITIVES | {"closed_call", "core_call", "remat", "remat2", "checkpoint",
                                  "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_lin"}
LOOPS = frozenset({"scan", "while", "cond"})


# Typed PRNG keys (``jax.random.key``: dtype ``key<fry>``) have no NumPy dtype to read back from
# their name: the graph keeps the dtype of each such name it met (``dtype_of``).
_KEY_DTYPES: dict[str, np.dtype] = {}


def is_key_dtype(dtype: np.dtype | str) -> bool:
    return not isinstance(dtype, str) and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def dtype_of(name: str) -> np.dtype:
    """The dtype a var's ``dtype`` names: a NumPy dtype, or a typed key's (``key<fry>``)."""
    return _KEY_DTYPES[name] if name in _KEY_DTYPES else jnp.dtype(name)


def itemsize(name: str) -> int:
    """Bytes per element of the dtype ``name`` (a typed key: its key data's)."""
    return int(dtype_of(name).itemsize)


@dataclass(frozen=True)
class Var:
    id: int
    shape: tuple[int, ...]
    dtype: str

    @property
    def type_str(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass
class Op:
    id: int
    prim: str                       # primitive name (jaxpr spelling; HLO opcodes are mapped)
    inputs: tuple[int | None, ...]  # var ids; None for a literal scalar
    outputs: tuple[int, ...]
    params: dict[str, Any]          # what the propagation rules and contractions need, normalised
    name: str = ""                  # where it came from: nested call path or HLO instruction name
    loop: int | None = None         # id of the enclosing loop operator, if inside a loop body
    phase: str = "fwd"


@dataclass
class Graph:
    vars: list[Var] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)        # program inputs, in flattened order
    input_names: list[str] = field(default_factory=list)
    outputs: list[int | None] = field(default_factory=list)
    source: str = "jaxpr"
    producer: list[int | None] = field(default_factory=list)   # var id -> op id
    consumers: list[list[int]] = field(default_factory=list)   # var id -> op ids, in order
    # For re-evaluating a traced program (apply.py): op id -> its JaxprEqn, and the values of
    # tensors that are constants of the program (closed-over arrays, literals passed to calls).
    eqns: dict[int, JaxprEqn] = field(default_factory=dict, repr=False)
    const_values: dict[int, jax.Array] = field(default_factory=dict, repr=False)
    in_tree: jax.tree_util.PyTreeDef | None = field(default=None, repr=False)
    out_tree: jax.tree_util.PyTreeDef | None = field(default=None, repr=False)
    # Loops: loop op id -> per body (a scan's one; a while's condition, then body; a cond's
    # branches), its input and output var ids (None: a literal output), in the body's order.
    loop_io: dict[int, list[tuple[list[int], list[int | None]]]] = field(default_factory=dict)
    # Body var -> (outer var, how): "same" (a constant or carry: the operand itself), "slice" (a
    # scan's per-iteration slice of a stacked operand), "stacked" (a scan's per-iteration result,
    # stacked into that output).
    outer: dict[int, tuple[int, str]] = field(default_factory=dict)

    def new_var(self, shape: Sequence[int], dtype: np.dtype | str) -> int:
        if is_key_dtype(dtype):
            _KEY_DTYPES.setdefault(str(dtype), dtype)
        v = Var(len(self.vars), tuple(int(s) for s in shape), str(dtype))
        self.vars.append(v)
        self.producer.append(None)
        self.consumers.append([])
        return v.id

    def add_op(self, prim: str, inputs: Sequence[int | None], outputs: Sequence[int],
               params: dict[str, Any] | None = None, name: str = "", loop: int | None = None) -> Op:
        op = Op(len(self.ops), prim, tuple(inputs), tuple(outputs), params or {}, name, loop)
        self.ops.append(op)
        for v in op.inputs:
            if v is not None:
                self.consumers[v].append(op.id)
        for v in op.outputs:
            self.producer[v] = op.id
        return op

    def shape(self, v: int) -> tuple[int, ...]:
        return self.vars[v].shape

    def canonical(self, v: int) -> int:
        """The top-level tensor ``v`` is, or is a layer of (``outer``, followed out)."""
        while v in self.outer:
            v = self.outer[v][0]
        return v

    def scan_layers(self, v: int) -> int:
        """How many scan slicings lie between ``v`` and its top-level tensor (leading layer axes)."""
        n = 0
        while v in self.outer:
            v, how = self.outer[v]
            n += how != "same"
        return n

    def outermost_loop(self, op_id: int) -> int | None:
        """The top-level loop op whose bodies hold ``op_id`` (None: it is at the top level)."""
        loop = None
        while self.ops[op_id].loop is not None:
            op_id = loop = self.ops[op_id].loop
        return loop

    def trip_counts(self) -> dict[int, int]:
        """Each ``scan`` op's trip count (its length); other loops' are not known from the program."""
        return {op.id: op.params["length"] for op in self.ops if op.prim == "scan"}

    def body_ops(self, loop: int) -> list[int]:
        """The operators directly inside loop op ``loop``'s bodies, in program order."""
        return [op.id for op in self.ops if op.loop == loop]

    def describe(self, op: Op) -> str:
        ins = " ".join(self.vars[v].type_str if v is not None else "lit" for v in op.inputs)
        outs = " ".join(self.vars[v].type_str for v in op.outputs)
        return f"{outs} = {op.prim}({ins})"


# ---------------------------------------------------------------------------------------------
# From a jaxpr


def trace(fn: StepFn, *args: PyTree) -> tuple[ClosedJaxpr, Graph]:
    """Traces ``fn(*args)`` (arrays or ShapeDtypeStructs) and flattens it into a Graph."""
    closed, out_shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    leaves, in_tree = jax.tree_util.tree_flatten_with_path(args)
    g = from_jaxpr(closed, [jax.tree_util.keystr(p) for p, _ in leaves])
    g.in_tree = jax.tree_util.tree_structure(args)
    g.out_tree = jax.tree_util.tree_structure(out_shapes)
    return closed, g


def from_jaxpr(closed: ClosedJaxpr, input_names: Sequence[str] | None = None) -> Graph:
    g = Graph(source="jaxpr")
    jaxpr = closed.jaxpr
    env: dict[JaxprVar, int] = {}
    for v, value in zip(jaxpr.constvars, closed.consts, strict=True):
        env[v] = _new(g, v)
        g.const_values[env[v]] = value
    for v in jaxpr.invars:
        env[v] = _new(g, v)
        g.inputs.append(env[v])
    names = list(input_names) if input_names is not None else [f"in{i}" for i in range(len(jaxpr.invars))]
    g.input_names = names
    _walk(g, jaxpr, env, path="", loop=None)
    g.outputs = [_read(env, v) for v in jaxpr.outvars]
    mark_phases(g)
    return g


def _new(g: Graph, v: JaxprVar) -> int:
    aval = v.aval
    return g.new_var(getattr(aval, "shape", ()), getattr(aval, "dtype", "token"))


def _is_literal(v: JaxprVar | Literal) -> bool:
    return isinstance(v, jcore.Literal)


def _read(env: dict[JaxprVar, int], v: JaxprVar | Literal) -> int | None:
    if _is_literal(v):
        return None
    return env.get(v)


def inline_target(eqn: JaxprEqn) -> tuple[Jaxpr, Sequence[jax.Array]] | None:
    """(sub-jaxpr, its constants) of an inlinable call, else None. Shared with ``apply.py``."""
    if eqn.primitive.name not in INLINE:
        return None
    for value in eqn.params.values():
        if isinstance(value, jcore.ClosedJaxpr):
            jaxpr, consts = value.jaxpr, value.consts
        elif isinstance(value, jcore.Jaxpr):
            jaxpr, consts = value, ()
        else:
            continue
        if len(jaxpr.invars) == len(eqn.invars) and len(jaxpr.outvars) == len(eqn.outvars):
            return jaxpr, consts
    return None


def loop_bodies(eqn: JaxprEqn) -> list[tuple[Jaxpr, Sequence[jax.Array], list[tuple[JaxprVar | Literal, str] | None]]]:
    """Each body of a loop eqn: (jaxpr, its constants, per body input the outer operand it
    relates to and how: "same" or "slice", or None)."""
    p, name, ins = eqn.params, eqn.primitive.name, list(eqn.invars)
    if name == "scan":
        body = p["jaxpr"]
        n_bound = p["num_consts"] + p["num_carry"]
        return [(body.jaxpr, body.consts, [(v, "same") for v in ins[:n_bound]] + [(v, "slice") for v in ins[n_bound:]])]
    if name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        carry = [(v, "same") for v in ins[cn + bn:]]
        return [(p["cond_jaxpr"].jaxpr, p["cond_jaxpr"].consts, [(v, "same") for v in ins[:cn]] + carry),
                (p["body_jaxpr"].jaxpr, p["body_jaxpr"].consts, [(v, "same") for v in ins[cn:cn + bn]] + carry)]
    if name == "cond":
        return [(br.jaxpr, br.consts, [(v, "same") for v in ins[1:]]) for br in p["branches"]]
    return []


def _walk(g: Graph, jaxpr: Jaxpr, env: dict[JaxprVar, int], path: str, loop: int | None) -> None:
    for eqn in jaxpr.eqns:
        target = inline_target(eqn)
        if target is not None:
            sub, consts = target
            inner: dict[JaxprVar, int] = {}
            for cv, value in zip(sub.constvars, consts, strict=True):
                inner[cv] = _new(g, cv)
                g.const_values[inner[cv]] = value
            for iv, ov in zip(sub.invars, eqn.invars, strict=True):
                src = _read(env, ov)
                if src is None:  # a literal passed into the call
                    src = _new(g, iv)
                    g.const_values[src] = ov.val
                inner[iv] = src
            label = eqn.params.get("name", eqn.primitive.name)
            _walk(g, sub, inner, f"{path}{label}/", loop)
            for ov, iv in zip(eqn.outvars, sub.outvars, strict=True):
                src = _read(inner, iv)
                if src is None:  # the call returns a literal
                    src = _new(g, ov)
                    g.const_values[src] = iv.val
                env[ov] = src
            continue
        ins = [_read(env, v) for v in eqn.invars]
        outs = []
        for v in eqn.outvars:
            env[v] = _new(g, v)
            outs.append(env[v])
        op = g.add_op(eqn.primitive.name, ins, outs, _params(eqn), path + eqn.primitive.name, loop)
        g.eqns[op.id] = eqn
        if eqn.primitive.name in LOOPS:
            _walk_loop(g, eqn, op, env, path)


def _walk_loop(g: Graph, eqn: JaxprEqn, op: Op, env: dict[JaxprVar, int], path: str) -> None:
    """A loop's bodies, each with input and output tensors of its own (``Graph.loop_io``,
    ``Graph.outer``)."""
    bodies = []
    for body, consts, bound in loop_bodies(eqn):
        inner: dict[JaxprVar, int] = {}
        for cv, value in zip(body.constvars, consts, strict=True):
            inner[cv] = _new(g, cv)
            g.const_values[inner[cv]] = value
        ins = []
        for iv, rel in zip(body.invars, bound, strict=True):
            inner[iv] = v = _new(g, iv)
            ins.append(v)
            src = _read(env, rel[0]) if rel is not None else None
            if src is not None:
                g.outer[v] = (src, rel[1])
        _walk(g, body, inner, f"{path}{eqn.primitive.name}/", op.id)
        bodies.append((ins, [_read(inner, ov) for ov in body.outvars]))
    g.loop_io[op.id] = bodies
    if eqn.primitive.name == "scan":
        (_, outs), = bodies
        carry = eqn.params["num_carry"]
        for v, stacked in zip(outs[carry:], op.outputs[carry:], strict=True):
            if v is not None and v not in g.outer:  # a body input passed through keeps what it is
                g.outer[v] = (stacked, "stacked")


def _params(eqn: JaxprEqn) -> dict[str, Any]:
    """The parameters the analysis reads, as plain tuples/ints (stable across runs)."""
    name, p = eqn.primitive.name, eqn.params
    if name == "dot_general":
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        return {"contracting": (tuple(lc), tuple(rc)), "batch": (tuple(lb), tuple(rb))}
    if name == "conv_general_dilated":
        dn = p["dimension_numbers"]
        return {"lhs_spec": tuple(dn.lhs_spec), "rhs_spec": tuple(dn.rhs_spec), "out_spec": tuple(dn.out_spec),
                "feature_group_count": int(p["feature_group_count"]),
                "batch_group_count": int(p["batch_group_count"])}
    if name == "gather":
        dn = p["dimension_numbers"]
        return {"offset_dims": tuple(dn.offset_dims), "collapsed_slice_dims": tuple(dn.collapsed_slice_dims),
                "start_index_map": tuple(dn.start_index_map),
                "operand_batching_dims": tuple(dn.operand_batching_dims),
                "slice_sizes": tuple(int(s) for s in p["slice_sizes"]),
                "index_vector_dim": len(eqn.invars[1].aval.shape) - 1,
                # (Only where there are batching dimensions: lookups keep the parameters, and so
                # the profile store keys, they had before.)
                **({"start_indices_batching_dims": tuple(dn.start_indices_batching_dims)}
                   if tuple(dn.operand_batching_dims) else {})}
    if name.startswith("scatter"):
        dn = p["dimension_numbers"]
        return {"update_window_dims": tuple(dn.update_window_dims),
                "inserted_window_dims": tuple(dn.inserted_window_dims),
                "scatter_dims_to_operand_dims": tuple(dn.scatter_dims_to_operand_dims),
                "operand_batching_dims": tuple(dn.operand_batching_dims),
                "index_vector_dim": len(eqn.invars[1].aval.shape) - 1}
    if name == "pad":
        return {"padded": tuple(i for i, cfg in enumerate(p["padding_config"]) if tuple(cfg) != (0, 0, 0))}
    if "window_dimensions" in p:   # pooling (reduce_window_*, select_and_scatter_add, ...)
        n = len(p["window_dimensions"])
        plain = {"window_dimensions": 1, "window_strides": 1, "base_dilation": 1, "window_dilation": 1}
        return {"windowed": tuple(d for d in range(n) if tuple(p["padding"][d]) != (0, 0)
                                  or any(int(p.get(k, (one,) * n)[d]) != one for k, one in plain.items()))}
    out: dict[str, Any] = {}
    for key in ("axes", "broadcast_dimensions", "permutation", "dimensions", "dimension", "axis",
                "new_sizes", "y", "sizes"):
        if key in p and p[key] is not None:
            value = p[key]
            out[key] = tuple(int(x) for x in value) if isinstance(value, (tuple, list)) else _plain(value)
    if name == "scan":
        out.update(length=int(p["length"]), num_consts=int(p["num_consts"]), num_carry=int(p["num_carry"]))
    return out


def _plain(value: Any) -> Any:
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(value)


# ---------------------------------------------------------------------------------------------
# Phases


def mark_phases(g: Graph) -> None:
    loss = [v for v in g.outputs if v is not None and g.vars[v].shape == ()
            and g.vars[v].dtype.startswith(("float", "bfloat", "f"))]
    top = [op for op in g.ops if op.loop is None]
    if not loss:
        for op in g.ops:
            op.phase = "fwd"
        return
    fwd = _ancestors(g, loss)
    read_by_fwd = {v for i in fwd for v in g.ops[i].inputs if v is not None}
    opt_roots = [v for v in g.inputs if v not in read_by_fwd]
    reached = set(opt_roots)
    for op in top:
        if op.id in fwd:
            op.phase = "fwd"
        elif any(v in reached for v in op.inputs if v is not None):
            op.phase = "opt"
            reached.update(op.outputs)
        else:
            op.phase = "bwd"
    for op in g.ops:
        if op.loop is not None:
            op.phase = g.ops[op.loop].phase


def _ancestors(g: Graph, roots: Sequence[int]) -> set[int]:
    seen: set[int] = set()
    stack = [g.producer[v] for v in roots if g.producer[v] is not None]
    while stack:
        i = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        for v in g.ops[i].inputs:
            if v is not None and g.producer[v] is not None:
                stack.append(g.producer[v])
    return seen

