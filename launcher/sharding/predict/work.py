"""What one device computes in a step of a compiled program, read from its text: the computation
half of a plan's predicted step time (``price.py``), beside its collectives (``collectives.py``).

Two figures, each counted once per run of the computation holding it (a ``while`` body: its trip
count, as ``collectives.executions`` walks the program; XLA's own ``cost_analysis`` counts a
scanned body once, whatever its trip count):

- ``flops``, by dtype: each ``dot``'s ``2 x output elements x contracted elements``, where it
  is (a fusion's body included): the contractions run at the device's matmul rate;
- ``nbytes``: what each instruction run in sequence reads and writes (a fusion's operands and
  result, not its body's intermediates, which stay in registers or cache; of a buffer sliced or
  updated in place, the slice: ``_moved``), at the device's memory bandwidth. Bookkeeping that
  moves nothing (parameters, tuples, bitcasts, constants, control flow, whose bodies count on
  their own) and the collectives (priced on their links) are left out.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from launcher.hlo import text as hlo_text
from launcher.sharding.predict.collectives import KINDS, _bytes, executions, read

# Instructions that move no bytes of their own (their bodies, if any, are counted where they run).
_FREE = frozenset({"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "while", "call", "conditional",
                   "after-all", "partition-id", "replica-id", "add-dependency", "opt-barrier", "iota"})


@dataclass(frozen=True)
class Work:
    flops: Mapping[str, float] = field(default_factory=dict)   # dot FLOPs per device by result dtype
    nbytes: float = 0.0                                         # bytes read and written per device

    def seconds(self, flops_per_s: Mapping[str, float] | None, bytes_per_s: float) -> float:
        """At a device's matmul rates (by dtype; float32's for any other) and memory bandwidth."""
        def rate(dtype: str) -> float:
            rates = flops_per_s or {}
            return float(rates.get(dtype) or rates.get("float32") or next(iter(rates.values()), math.inf))
        return sum(f / rate(d) for d, f in self.flops.items()) + self.nbytes / bytes_per_s

    def to_json(self) -> dict:
        return {"flops": dict(self.flops), "bytes": self.nbytes}


def work(text: str | hlo_text.Module) -> Work:
    """The FLOPs and bytes one device's step of the compiled program ``text`` (or its module,
    read) runs (module doc)."""
    module = read(text)
    order, times, inlined = executions(module)
    types = {i.name: i.type for body in module.computations.values() for i in body}
    flops: Counter = Counter()
    nbytes = 0.0
    for name in order:
        for ins in module.computations[name]:
            if ins.opcode == "dot":
                flops[_dtype(ins.type)] += times[name] * _dot_flops(ins, types)
            if name in inlined or ins.opcode in _FREE or ins.opcode.removesuffix("-start") in KINDS \
                    or ins.opcode.endswith("-done"):
                continue
            nbytes += times[name] * _moved(ins, module, types)
    return Work(dict(flops), nbytes)


# Instructions that read only part of their first operand: what they read is what they make.
_SLICES = frozenset({"dynamic-slice", "slice", "gather"})


def _moved(ins: hlo_text.Instruction, module: hlo_text.Module, types: Mapping[str, str]) -> float:
    """Bytes an instruction run in sequence reads and writes, as XLA's cost analysis counts them:
    a slice reads what it makes; an update in place (``dynamic-update-slice``, a fusion whose
    root is one on a parameter: a scanned body writing its layer's slot) reads and writes its
    update, not the whole buffer; a fusion reads of each operand only the slices its body takes
    of it where that is all its body does with it."""
    result = _bytes(ins.type)
    if ins.opcode in _SLICES:
        return 2 * result
    if ins.opcode == "dynamic-update-slice":
        return 2 * _bytes(types.get(ins.operands[1], "")) if len(ins.operands) > 1 else result
    body = module.computations.get((ins.attrs.get("calls") or "").lstrip("%")) if ins.opcode == "fusion" else None
    if not body:
        return result + sum(_bytes(types.get(o, "")) for o in ins.operands)
    params = {i.name: int(i.operands[0]) for i in body if i.opcode == "parameter"}
    uses: dict[int, list[tuple[hlo_text.Instruction, int]]] = {}   # each parameter's users, and at which operand
    for i in body:
        for at, o in enumerate(i.operands):
            if o in params:
                uses.setdefault(params[o], []).append((i, at))
    root = next((i for i in body if i.root), body[-1])
    in_place = params.get(root.operands[0]) if root.opcode == "dynamic-update-slice" and root.operands else None
    if in_place is not None:   # the buffer updated where it lies: its update written, not the whole
        result = _bytes(types.get(root.operands[1], "")) if len(root.operands) > 1 else result
    moved = result
    for k, operand in enumerate(ins.operands):
        users = uses.get(k, [])
        if k == in_place and all(u is root and at == 0 for u, at in users):
            continue
        if users and all(u.opcode in _SLICES and at == 0 for u, at in users):   # only sliced: the slices read
            moved += sum(_bytes(u.type) for u, _ in users)
        else:
            moved += _bytes(types.get(operand, ""))
    return moved


def _dtype(type_text: str) -> str:
    arrays = hlo_text.arrays(type_text)
    return hlo_text.numpy_dtype(arrays[0][0]).name if arrays else "float32"


def _dot_flops(ins: hlo_text.Instruction, types: Mapping[str, str]) -> float:
    """``2 x output elements x contracted elements``: the lhs's contracting dimensions' sizes."""
    out = hlo_text.arrays(ins.type)
    lhs = hlo_text.arrays(types.get(ins.operands[0], "")) if ins.operands else []
    if not out or not lhs:
        return 0.0
    contracted = math.prod(lhs[0][1][int(d)] for d in hlo_text.ints(ins.attrs.get("lhs_contracting_dims")))
    return 2.0 * math.prod(out[0][1]) * contracted
