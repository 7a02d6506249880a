"""What one device computes in a step of a compiled program, read from its text: the computation
half of a plan's predicted step time (``price.py``), beside its collectives (``collectives.py``).

Two figures, each counted once per run of the computation holding it (a ``while`` body: its trip
count, as ``collectives.executions`` walks the program; XLA's own ``cost_analysis`` counts a
scanned body once, whatever its trip count):

- ``flops``, by dtype: each ``dot``'s ``2 x output elements x contracted elements``, where it
  is (a fusion's body included): the contractions run at the device's matmul rate;
- ``nbytes``: what each instruction run in sequence reads and writes (a fusion's operands and
  result, not its body's intermediates, which stay in registers or cache), at the device's memory
  bandwidth. Bookkeeping that moves nothing (parameters, tuples, bitcasts, constants, control
  flow, whose bodies count on their own) and the collectives (priced on their links) are left out.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Mapping

from launcher.hlo import text as hlo_text
from launcher.sharding.predict.collectives import KINDS, _bytes, executions

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


def work(text: str) -> Work:
    """The FLOPs and bytes one device's step of the compiled program ``text`` runs (module doc)."""
    module = hlo_text.read(text, "<compiled program>")
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
            nbytes += times[name] * (_bytes(ins.type) + sum(_bytes(types.get(o, "")) for o in ins.operands))
    return Work(dict(flops), nbytes)


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
