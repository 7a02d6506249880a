"""A Graph from an HLO text module, for analysing a dumped program (``mode.hlo_file``).

A small reader for the instruction lines of HLO text (``name = type opcode(operands), attrs``),
enough for the analysis: contractions (``dot``, ``convolution``, embedding-lookup ``gather`` and
its ``scatter``-add gradient) and the operators ParallelBlocks propagate through. HLO opcodes are
mapped to the jaxpr primitive names the rest of the analysis uses (``multiply`` -> ``mul``,
``broadcast`` -> ``broadcast_in_dim``, a ``reduce`` whose reducer adds -> ``reduce_sum``, ...).
``call`` and ``fusion`` are inlined; ``tuple``/``get-tuple-element`` only route values; ``while``
and ``conditional`` are opaque operators (their bodies are not walked). Scalar constants are
literals; array constants are tensors without a producer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.cfp.analysis.graph import Graph, mark_phases
from launcher.errors import UserError

DTYPES = {"pred": "bool", "s8": "int8", "s16": "int16", "s32": "int32", "s64": "int64", "u8": "uint8",
          "u16": "uint16", "u32": "uint32", "u64": "uint64", "f16": "float16", "bf16": "bfloat16",
          "f32": "float32", "f64": "float64", "c64": "complex64", "c128": "complex128"}

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


@dataclass
class Instr:
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: dict[str, str]
    root: bool
    line: int


def read_hlo(path: str | Path) -> Graph:
    p = Path(path)
    if not p.is_file():
        raise UserError(f"mode.hlo_file={str(path)!r}: no such file; give the path of an HLO text module "
                        "(e.g. a *before_optimizations.txt dump, or jit(f).lower(...).as_text(dialect='hlo'))")
    return parse_hlo(p.read_text(), str(p))


def parse_hlo(text: str, origin: str = "<hlo>") -> Graph:
    comps, entry = _computations(text, origin)
    g = Graph(source="hlo")
    params = sorted((i for i in comps[entry] if i.opcode == "parameter"), key=lambda i: int(i.operands[0]))
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


def _computations(text: str, origin: str) -> tuple[dict[str, list[Instr]], str]:
    comps: dict[str, list[Instr]] = {}
    entry = None
    current: list[Instr] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("//")[0].strip() if not raw.strip().startswith("//") else ""
        if not line or line.startswith("HloModule"):
            continue
        if current is None:
            m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*(->.*)?\{$", line)
            if m:
                current = comps.setdefault(m.group(2), [])
                last = m.group(2)
                if m.group(1):
                    entry = m.group(2)
            continue
        if line == "}":
            current = None
            continue
        current.append(_instruction(line, n, origin))
    if not comps:
        raise UserError(f"{origin}: no HLO computation found; expected text like 'ENTRY main {{ ... }}'")
    return comps, entry or last


def _instruction(line: str, n: int, origin: str) -> Instr:
    root = line.startswith("ROOT ")
    if root:
        line = line[5:]
    name, sep, rest = line.partition("=")
    if not sep:
        raise UserError(f"{origin}:{n}: cannot read HLO instruction {line!r}")
    rest = rest.strip()
    if rest.startswith("("):
        end = _match(rest, 0)
        typ, rest = rest[:end + 1], rest[end + 1:].strip()
    else:
        typ, _, rest = rest.partition(" ")
    m = re.match(r"([\w\-]+)\(", rest)
    if not m:
        raise UserError(f"{origin}:{n}: cannot read the opcode of {line!r}")
    close = _match(rest, m.end() - 1)
    operands = [o.strip().split()[-1].lstrip("%") for o in _split(rest[m.end():close]) if o.strip()]
    attrs = {}
    for part in _split(rest[close + 1:].lstrip(", ")):
        k, _, v = part.partition("=")
        if k.strip():
            attrs[k.strip()] = v.strip()
    return Instr(name.strip().lstrip("%"), typ, m.group(1), operands, attrs, root, n)


def _match(s: str, i: int) -> int:
    depth = 0
    for j in range(i, len(s)):
        if s[j] in "({[":
            depth += 1
        elif s[j] in ")}]":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def _split(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        parts.append("".join(cur))
    return [p.strip() for p in parts]


def _types(typ: str) -> Any:
    """A shape (dtype, dims) or a nested list of them for a tuple type."""
    typ = typ.strip()
    if typ.startswith("("):
        return [_types(t) for t in _split(typ[1:-1])]
    m = re.match(r"(\w+)\[([^\]]*)\]", typ)
    if not m:
        return ("token", ())
    dims = tuple(int(d.lstrip("<=")) for d in m.group(2).split(",") if d.strip())
    return (DTYPES.get(m.group(1), m.group(1)), dims)


def _fresh(g: Graph, typ: str) -> Any:
    t = _types(typ)
    make = lambda t: [make(x) for x in t] if isinstance(t, list) else g.new_var(t[1], t[0])
    return make(t)


def _leaves(value: Any):
    if isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def _ints(s: str | None) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"-?\d+", s or ""))


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
            inner = {p.name: arg(o) for p, o in zip(params, ins.operands)}
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
