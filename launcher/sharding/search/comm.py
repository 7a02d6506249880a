"""Collectives in a compiled program: how many, of which kind, and how many bytes they move.

Read from the compiled HLO text by ``launcher/hlo/text.py``, the one reader of it. Result types
may be tuples (``(f32[8], f32[8]) all-reduce(...)``) and asynchronous pairs appear as
``*-start``/``*-done`` (counted once, at the start, by the last element of its tuple: the result
buffer). Bytes are per device: the size of each collective's result on one device.
"""

from __future__ import annotations

import math

from launcher.hlo.text import arrays, instructions

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count": n, "bytes": b}} for every collective kind present."""
    out: dict[str, dict[str, int]] = {}
    for ins in instructions(hlo_text):
        kind = ins.opcode.removesuffix("-start")
        if kind not in KINDS:
            continue
        shapes = arrays(ins.type)
        if ins.opcode.endswith("-start") and ins.type.startswith("("):
            shapes = shapes[-1:]
        size = sum(math.prod(dims) * _BYTES.get(dtype, 4) for dtype, dims in shapes)
        entry = out.setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += size
    return out


def total_bytes(stats: dict[str, dict[str, int]]) -> int:
    return sum(e["bytes"] for e in stats.values())
