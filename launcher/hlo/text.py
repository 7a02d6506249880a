"""The one reader of HLO text: computations, instructions, types and element types.

HLO text is a module of computations, each a ``{ ... }`` of one instruction per line:

    ENTRY %main (a: f32[8,16]) -> f32[8] {
      %a = f32[8,16]{1,0} parameter(0)
      ROOT %r = f32[8]{0} reduce(f32[8,16]{1,0} %a, f32[] %zero), dimensions={1}, to_apply=%add
    }

``read`` gives its computations and which one is the entry; ``instructions`` reads every
instruction line of a text, computation headers or not (a compiled program's text, a few lines
of a test). An instruction is its name, result type, opcode, operand names (XLA's canonical
print spells each with its type, hand-written text does not: only the name is kept) and the
attribute text after the operands. Comments (``/*index=5*/`` in long tuples, ``// ...``) are
dropped first; brackets and commas inside quoted strings (``metadata={op_name="jit(f)/..."}``)
are not structure.

Its users: the CFP analysis builds its operator graph from it (``launcher/sharding/analysis/
hlo_text.py``), the replay reads what a module needs to run (``launcher/hlo/module.py``), and the
search counts a compiled program's collectives (``launcher/sharding/search/comm.py``). It imports no
JAX: XLA's own parser (``launcher/hlo/_xla.py``) is what checks a module before it runs.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import ml_dtypes
import numpy as np

from launcher.errors import UserError

# --- element types -----------------------------------------------------------------------------

ELEMENT_TYPES = {"pred": np.bool_, "s8": np.int8, "s16": np.int16, "s32": np.int32, "s64": np.int64,
                 "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64, "f16": np.float16,
                 "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64, "c64": np.complex64,
                 "c128": np.complex128, "s4": ml_dtypes.int4, "u4": ml_dtypes.uint4, "s2": ml_dtypes.int2,
                 "u2": ml_dtypes.uint2}


def numpy_dtype(xla_name: str) -> np.dtype:
    """XLA's element type name (``bf16``, ``f8e4m3fn``...) as a numpy dtype."""
    if xla_name in ELEMENT_TYPES:
        return np.dtype(ELEMENT_TYPES[xla_name])
    small_float = re.fullmatch(r"f(\d+)(e\d+m\d+\w*)", xla_name)  # f8e4m3fn -> float8_e4m3fn
    if small_float and hasattr(ml_dtypes, f"float{small_float[1]}_{small_float[2]}"):
        return np.dtype(getattr(ml_dtypes, f"float{small_float[1]}_{small_float[2]}"))
    raise UserError(f"element type {xla_name!r} is not supported by HLO replay")


def dtype_name(dtype: np.dtype) -> str:
    """The XLA spelling of a numpy dtype, for messages that quote HLO shapes."""
    for name, t in ELEMENT_TYPES.items():
        if np.dtype(t) == dtype:
            return name
    return dtype.name.replace("float", "f").replace("_", "")


def hlo_type(dtype: np.dtype, shape: Sequence[int]) -> str:
    """``f32[8,16]``: an array type as HLO text spells it."""
    return f"{dtype_name(dtype)}[{','.join(map(str, shape))}]"


# --- types -------------------------------------------------------------------------------------

Shape = tuple[str, tuple[int, ...]]  # (XLA element type, dimensions): ("f32", (8, 16))
_ARRAY = re.compile(r"([a-z]\w*)\[([^\]]*)\]")


def shape(type_text: str) -> Shape | list:
    """A type as ``(element type, dims)``, or a list of them (nested) for a tuple type. A type
    with no dimensions in brackets (``token[]`` aside, which has them) reads as ``("token", ())``."""
    type_text = type_text.strip()
    if type_text.startswith("("):
        return [shape(t) for t in split_top(type_text[1:-1])]
    found = _ARRAY.match(type_text)
    if not found:
        return ("token", ())
    return (found.group(1), _dims(found.group(2)))


def arrays(type_text: str) -> list[Shape]:
    """Every array of a (possibly tuple) type, in order."""
    return [(kind, _dims(dims)) for kind, dims in _ARRAY.findall(type_text)]


def _dims(text: str) -> tuple[int, ...]:
    # "<=8": a dynamic dimension's bound, the size its buffers have
    return tuple(int(d.strip().lstrip("<=")) for d in text.split(",") if d.strip())


# --- brackets ------------------------------------------------------------------------------------

def balanced(text: str, start: int) -> int:
    """The index just past the bracket that closes the one at ``start`` (the end of ``text``
    when none does); quoted strings are skipped."""
    depth, quoted = 0, False
    for i in range(start, len(text)):
        c = text[i]
        if quoted:
            quoted = c != '"' or text[i - 1] == "\\"
        elif c == '"':
            quoted = True
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return len(text)


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quoted strings, each piece stripped
    (none for blank text)."""
    pieces, depth, start, quoted = [], 0, 0, False
    for i, c in enumerate(text):
        if quoted:
            quoted = c != '"' or text[i - 1] == "\\"
        elif c == '"':
            quoted = True
        elif c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            pieces.append(text[start:i])
            start = i + 1
    pieces.append(text[start:])
    return [p.strip() for p in pieces] if text.strip() else []


def _uncommented(line: str) -> str:
    """``line`` without ``/* ... */`` and ``// ...`` comments outside quoted strings."""
    out, i, quoted = [], 0, False
    while i < len(line):
        c = line[i]
        if quoted:
            quoted = c != '"' or line[i - 1] == "\\"
        elif c == '"':
            quoted = True
        elif line.startswith("/*", i):
            end = line.find("*/", i + 2)
            i = len(line) if end < 0 else end + 2
            continue
        elif line.startswith("//", i):
            break
        out.append(c)
        i += 1
    return "".join(out)


# --- instructions and computations ---------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    name: str  # without its "%"
    type: str  # the result type as written: "f32[8,16]{1,0}", "(f32[8], s32[])"
    opcode: str
    operands: list[str]  # operand names (without types or "%"); a parameter's number, a constant's literal
    attributes: str  # the text after the operands: ", dimensions={1}, to_apply=%add"
    root: bool
    line: int  # 1-based, in the text read
    attrs: dict[str, str] = field(init=False, compare=False, repr=False)  # attributes by key

    def __post_init__(self) -> None:
        attrs = {}
        for part in split_top(self.attributes.lstrip(", ")):
            key, _, value = part.partition("=")
            if key.strip():
                attrs[key.strip()] = value.strip()
        object.__setattr__(self, "attrs", attrs)


_NAME = re.compile(r"(ROOT\s+)?%?([^\s=,(){}]+)\s*=\s*")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")


def instruction(line: str, number: int = 0) -> Instruction | None:
    """The instruction on one line (comments already dropped), or None where the line is none."""
    found = _NAME.match(line.strip())
    if not found:
        return None
    rest = line.strip()[found.end():]
    end = balanced(rest, 0) if rest.startswith("(") else (rest.find(" ") if " " in rest else len(rest))
    result, rest = rest[:end], rest[end:]
    op = _OPCODE.match(rest)
    if not op:
        return None
    close = balanced(rest, op.end() - 1)
    operands = [piece.split()[-1].lstrip("%") for piece in split_top(rest[op.end():close - 1]) if piece.split()]
    return Instruction(found.group(2), result, op.group(1), operands, rest[close:].strip(), bool(found.group(1)),
                       number)


def instructions(text: str) -> Iterator[Instruction]:
    """Every instruction line of ``text``, in order, whatever computation it is in (or none)."""
    for number, raw in enumerate(text.splitlines(), 1):
        found = instruction(_uncommented(raw), number)
        if found is not None:
            yield found


@dataclass
class Module:
    computations: dict[str, list[Instruction]]  # by name, each in order
    entry: str  # the ENTRY computation's name (the last computation where none is marked)

    def parameters(self, computation: str) -> list[Instruction]:
        """The ``parameter(n)`` instructions of a computation, by number."""
        return sorted((i for i in self.computations[computation] if i.opcode == "parameter"),
                      key=lambda i: int(i.operands[0]))

    def root(self, computation: str) -> Instruction | None:
        body = self.computations.get(computation) or []
        return next((i for i in body if i.root), body[-1] if body else None)


_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*(->.*)?\{$")


def read(text: str, origin: str = "<hlo>") -> Module:
    """The computations of an HLO text module. Refused (UserError naming ``origin`` and the line)
    where a line inside a computation is not an instruction, or where there is no computation."""
    computations: dict[str, list[Instruction]] = {}
    entry = last = None
    current: list[Instruction] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _uncommented(raw).strip()
        if not line or line.startswith("HloModule"):
            continue
        if current is None:
            header = _HEADER.match(line)
            if header:
                last = header.group(2)
                current = computations.setdefault(last, [])
                if header.group(1):
                    entry = last
            continue
        if line == "}":
            current = None
            continue
        found = instruction(line, number)
        if found is None:
            raise UserError(f"{origin}:{number}: cannot read HLO instruction {line!r}")
        current.append(found)
    if not computations:
        raise UserError(f"{origin}: no HLO computation found; expected text like 'ENTRY main {{ ... }}'")
    return Module(computations, entry or last)


# The ops' source in a compiled program's text (``metadata={...}``; quoted strings hold no braces
# of their own): not what the program computes.
_METADATA = re.compile(r',\s*metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_REFERENCE = re.compile(r"%([\w.\-]+)")


def fingerprint(text: str) -> str:
    """A hash of what a compiled program computes: each instruction by its opcode, result type,
    attributes and operands' hashes (a computation it calls by that computation's hash), each
    computation by its instructions as a multiset and its root, the module by its header and its
    entry computation. Names, the ops' source metadata and the order the scheduler put
    independent instructions in are left out, so two programs built apart (a searched plan's
    step and a built-in plan's, traced by other code) that compile to the same instructions
    print differently and hash alike."""
    module = read(text, "<compiled program>")
    header = next((line for line in text.splitlines() if line.startswith("HloModule ")), "")
    done: dict[str, str] = {}

    def computation(name: str) -> str:
        if name not in done:
            done[name] = ""   # (a computation never calls itself: no cycle to guard beyond this)
            hashes: dict[str, str] = {}
            for ins in module.computations[name]:
                attributes = _REFERENCE.sub(lambda m: hashes.get(m[1]) or (computation(m[1]) if m[1] in
                                            module.computations else m[1]), _METADATA.sub("", ins.attributes))
                operands = [hashes.get(o, o) for o in ins.operands]
                hashes[ins.name] = _sha1("|".join([ins.opcode, ins.type, *operands, attributes]))
            root = module.root(name)
            done[name] = _sha1("|".join([*sorted(hashes.values()), hashes[root.name] if root else ""]))
        return done[name]

    return _sha1(re.sub(r"^HloModule [^,\s]+", "HloModule", header) + "|" + computation(module.entry))


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def ints(text: str | None) -> tuple[int, ...]:
    """Every integer in an attribute's value: ``{1,0}`` -> (1, 0)."""
    return tuple(int(x) for x in re.findall(r"-?\d+", text or ""))


def leaves(value: Any) -> Iterator[Any]:
    """The leaves of a nested list (a tuple-typed value), in order."""
    if isinstance(value, list):
        for v in value:
            yield from leaves(v)
    else:
        yield value
