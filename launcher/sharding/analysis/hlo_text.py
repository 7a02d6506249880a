"""A Graph from an HLO text module, for analysing a dumped program (``mode.hlo_file``).

The module is read by ``launcher/hlo/text.py`` (the reader the replay uses too); what is taken
from it is enough for the analysis: contractions (``dot``, ``convolution``, embedding-lookup ``gather`` and
its ``scatter``-add gradient) and the operators ParallelBlocks propagate through. HLO opcodes are
mapped to the jaxpr primitive names the rest of the analysis uses (``multiply`` -> ``mul``,
``broadcast`` -> ``broadcast_in_dim``, a ``reduce`` whose reducer adds -> ``reduce_sum``, ...).
``call`` and ``fusion`` are inlined; ``tuple``/``get-tuple-element`` only route values; ``while``
and ``conditional`` are opaque operators (their bodies are not walked). Scalar constants are
literals; array constants are tensors without a producer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from launcher.sharding.analysis.graph import Graph, mark_phases
from launcher.errors import UserError
from launcher.hlo.text import ELEMENT_TYPES, Instruction as Instr, read, shape
from launcher.hlo.text import ints as _ints, leaves as _leaves

OPCODES = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max", "minimum": "min",
    "power": "pow", "remainder": "rem", "and": "and", "or": "or", "xor": "xor", "not": "not",
    "negate": "neg", "abs": "abs", "exponential": "exp", "exponential-minus-one": "expm1", "log": "log",
    "log-plus-one": "log1p", "logistic": "logistic", "tanh": "tanh", "sqrt": "sqrt", "rsqrt": "rsqrt",
    "cbrt": "cbrt", "sine": "sin", "cosine": "cos", "tan": "tan", "atan2": "atan2", "sign": "sign",
    "floor": "floor", "ceil": "ceil", "round-nearest-afz": "round", "round-nearest-even": "round",
    "compare": "eq", "select": "select_n", "clamp": "clamp", "convert": "convert_element_type",
    "copy": "copy", "erf": "erf", "is-finite": "is_finite", "real": "real", "imag": "imag",
    "reduce-precision": "reduce_precision", "broadcast": "broadcast_in_dim", "transpose": "transpose",
    "reshape": "reshape", "bitcast": "reshape", "dot": "dot_general", "convolution": "conv_general_dilated",
    "gather": "gather", "iota": "iota", "slice": "slice", "dynamic-slice": "dynamic_slice",
    "dynamic-update-slice": "dynamic_update_slice", "pad": "pad", "concatenate": "concatenate",
    "reverse": "rev", "sort": "sort", "while": "while", "conditional": "cond",
    "optimization-barrier": "optimization_barrier",
}
REDUCERS = {"add": "reduce_sum", "maximum": "reduce_max", "minimum": "reduce_min", "multiply": "reduce_prod",
            "and": "reduce_and", "or": "reduce_or"}


def read_hlo(path: str | Path) -> Graph:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"mode.hlo_file={str(path)!r}: no such file; give the path of an HLO text module "
                        "(e.g. a *before_optimizations.txt dump, or jit(f).lower(...).as_text(dialect='hlo'))")
    return parse_hlo(p.read_text(), str(p))


def parse_hlo(text: str, origin: str = "<hlo>") -> Graph:
    module = read(text, origin)
    comps, entry = module.computations, module.entry
    g = Graph(source="hlo")
    params = module.parameters(entry)
    env: dict[str, Any] = {}
    for ins in params:
        value = _fresh(g, ins.type)
        env[ins.name] = value
        for v in _leaves(value):
            g.inputs.append(v)
            g.input_names.append(ins.name)
    root = _inline(g, comps, entry, env, origin)
    g.outputs = list(_leaves(root))
    mark_phases(g)
    return g


def _types(typ: str) -> Any:
    """A shape (dtype, dims) or a nested list of them for a tuple type, dtypes named as in jaxprs."""
    def named(t: Any) -> Any:
        if isinstance(t, list):
            return [named(x) for x in t]
        return (np.dtype(ELEMENT_TYPES[t[0]]).name if t[0] in ELEMENT_TYPES else t[0], t[1])

    return named(shape(typ))


def _fresh(g: Graph, typ: str) -> Any:
    t = _types(typ)
    make = lambda t: [make(x) for x in t] if isinstance(t, list) else g.new_var(t[1], t[0])
    return make(t)


def _inline(g: Graph, comps: dict[str, list[Instr]], name: str, env: dict[str, Any], origin: str) -> Any:
    root = None
    for ins in comps[name]:
        if ins.opcode == "parameter":
            if ins.name not in env:
                env[ins.name] = _fresh(g, ins.type)
            value = env[ins.name]
        else:
            value = _emit(g, comps, ins, env, origin)
        env[ins.name] = value
        if ins.root:
            root = value
    if root is None and comps[name]:
        root = env[comps[name][-1].name]
    return root


def _emit(g: Graph, comps: dict[str, list[Instr]], ins: Instr, env: dict[str, Any], origin: str) -> Any:
    def arg(o: str) -> Any:
        if o not in env:
            raise UserError(f"{origin}:{ins.line}: operand {o!r} of {ins.name} is not defined before it")
        return env[o]

    op, a = ins.opcode, ins.attrs
    if op == "constant":
        t = _types(ins.type)
        return None if not t[1] else g.new_var(t[1], t[0])
    if op == "tuple":
        return [arg(o) for o in ins.operands]
    if op == "get-tuple-element":
        return arg(ins.operands[0])[int(a["index"])]
    if op in ("call", "fusion", "async-start"):
        callee = a.get("to_apply") or a.get("calls")
        if callee and callee in comps:
            params = sorted((i for i in comps[callee] if i.opcode == "parameter"), key=lambda i: int(i.operands[0]))
            inner = {p.name: arg(o) for p, o in zip(params, ins.operands, strict=True)}
            return _inline(g, comps, callee, inner, origin)
    inputs = [v for o in ins.operands for v in _leaves(arg(o))]
    out = _fresh(g, ins.type)
    prim, params = _translate(g, comps, ins, inputs)
    g.add_op(prim, inputs, list(_leaves(out)), params, ins.name)
    return out


def _translate(g: Graph, comps: dict[str, list[Instr]], ins: Instr, inputs: list) -> tuple[str, dict]:
    op, a = ins.opcode, ins.attrs
    if op == "dot":
        dims = lambda key: (_ints(a.get(f"lhs_{key}_dims")), _ints(a.get(f"rhs_{key}_dims")))
        return "dot_general", {"contracting": dims("contracting"), "batch": dims("batch")}
    if op == "convolution":
        lhs, rhs_out = a["dim_labels"].split("_", 1)
        rhs, out = rhs_out.split("->")
        spec = lambda labels, first, second: (labels.index(first), labels.index(second)) + tuple(
            labels.index(str(d)) for d in range(len(labels) - 2))
        return "conv_general_dilated", {"lhs_spec": spec(lhs, "b", "f"), "rhs_spec": spec(rhs, "o", "i"),
                                        "out_spec": spec(out, "b", "f"),
                                        "feature_group_count": int(a.get("feature_group_count", 1)),
                                        "batch_group_count": int(a.get("batch_group_count", 1))}
    if op == "gather":
        return "gather", {"offset_dims": _ints(a.get("offset_dims")),
                          "collapsed_slice_dims": _ints(a.get("collapsed_slice_dims")),
                          "start_index_map": _ints(a.get("start_index_map")),
                          "operand_batching_dims": _ints(a.get("operand_batching_dims")),
                          "slice_sizes": _ints(a.get("slice_sizes")), "index_vector_dim": int(a["index_vector_dim"])}
    if op == "scatter":
        reducer = _reducer(comps, a.get("to_apply"))
        return ("scatter-add" if reducer == "reduce_sum" else "scatter"), {
            "update_window_dims": _ints(a.get("update_window_dims")),
            "inserted_window_dims": _ints(a.get("inserted_window_dims")),
            "scatter_dims_to_operand_dims": _ints(a.get("scatter_dims_to_operand_dims")),
            "operand_batching_dims": _ints(a.get("input_batching_dims")),
            "index_vector_dim": int(a["index_vector_dim"])}
    if op == "reduce":
        prim = _reducer(comps, a.get("to_apply")) if len(inputs) <= 2 else "argmax"
        return prim or "reduce_sum", {"axes": _ints(a.get("dimensions"))}
    if op == "broadcast":
        return "broadcast_in_dim", {"broadcast_dimensions": _ints(a.get("dimensions"))}
    if op == "transpose":
        return "transpose", {"permutation": _ints(a.get("dimensions"))}
    if op in ("concatenate", "sort"):
        return OPCODES[op], {"dimension": _ints(a.get("dimensions"))[0]}
    if op == "reverse":
        return "rev", {"dimensions": _ints(a.get("dimensions"))}
    if op == "pad":
        cfg = [tuple(int(x) for x in d.split("_")) for d in a.get("padding", "").split("x") if d]
        return "pad", {"padded": tuple(i for i, c in enumerate(cfg) if any(c))}
    return OPCODES.get(op, op), {}


def _reducer(comps: dict[str, list[Instr]], name: str | None) -> str | None:
    if not name or name not in comps:
        return None
    root = next((i for i in comps[name] if i.root), comps[name][-1] if comps[name] else None)
    return REDUCERS.get(root.opcode) if root else None
