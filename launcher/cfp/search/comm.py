"""Collectives in a compiled program: how many, of which kind, and how many bytes they move.

Read from the compiled HLO text. Result types may be tuples (``(f32[8], f32[8]) all-reduce(...)``)
and asynchronous pairs appear as ``*-start``/``*-done`` (counted once, at the start, by the last
element of its tuple: the result buffer). Bytes are per device: the size of each collective's
result on one device.
"""

from __future__ import annotations

import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_LINE = re.compile(r"=\s*(\([^=]*?\)|[a-z]\w*\[[^\]]*\](?:\{[^}]*\})?)\s+(" + "|".join(KINDS) + r")(-start)?\(")
_SHAPE = re.compile(r"([a-z]\w*)\[([^\]]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


def collectives(hlo_text: str) -> dict[str, dict[str, int]]:
    """{kind: {"count": n, "bytes": b}} for every collective kind present."""
    out: dict[str, dict[str, int]] = {}
    hlo_text = re.sub(r"/\*.*?\*/", "", hlo_text)  # tuple types carry /*index=5*/ comments
    for m in _LINE.finditer(hlo_text):
        typ, kind, is_start = m.group(1), m.group(2), m.group(3)
        shapes = _SHAPE.findall(typ)
        if is_start and typ.startswith("("):
            shapes = shapes[-1:]
        size = 0
        for dtype, dims in shapes:
            n = 1
            for d in dims.split(","):
                if d.strip():
                    n *= int(d.strip().lstrip("<="))
            size += n * _BYTES.get(dtype, 4)
        entry = out.setdefault(kind, {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += size
    return out


def total_bytes(stats: dict[str, dict[str, int]]) -> int:
    return sum(e["bytes"] for e in stats.values())
