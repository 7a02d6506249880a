"""The collectives XLA's partitioned program runs, read from its text, each priced on the link it
crosses: the communication half of a plan's predicted step time.

A plan compiled for a mesh (on the real devices, or on as many virtual CPU devices: the SPMD
partitioner is XLA's, the same on every backend) says in its text what moves: each collective's
kind, its bytes per device, and its replica groups, the partition ids that talk. Partition ``p``
is the mesh's ``p``-th device in row-major order, and the devices are numbered node by node, so a
group's ids say which fast-link domains it joins (``links.LinkModel.line``). A collective inside a
``while`` body (a scan over layers) runs once per iteration: its known trip count multiplies it.
Groups of one collective run at once; the slowest is its cost.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from launcher.hlo import text as hlo_text
from launcher.sharding.predict.links import LinkModel

KINDS = frozenset({"all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute"})


@dataclass(frozen=True)
class Collective:
    kind: str                         # all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    nbytes: float                     # per device, at the larger end
    groups: tuple[tuple[int, ...], ...]  # partition ids talking together (a permute: its pairs)
    count: int                        # how often a step runs it (a scanned body's trip count)
    name: str
    parts: tuple[float, ...] = ()     # a tuple collective's bytes per operand (one: its whole)

    def seconds(self, links: LinkModel, domain_of: Sequence[int] | None = None) -> float:
        """One run of it on ``links`` (its slowest group), times ``count``; ``domain_of``: each
        partition's fast-link domain (default: numbered domain by domain, ``links.py``)."""
        # XLA:CPU's gloo collectives run a tuple's operands one by one (each pays the latency);
        # NCCL, RCCL and the TPU runtime run them as one.
        sizes = self.parts if links.operands_one_by_one and self.parts else (self.nbytes,)
        kind, factor = ("all-gather", 2) if self.kind == "collective-permute" else (self.kind, 1)
        worst = max((sum(links.seconds(kind, g, factor * b, domain_of) for b in sizes) for g in self.groups),
                    default=0.0)
        return worst * self.count


def _bytes(type_text: str) -> float:
    """The bytes of a (tuple) type's arrays, as the HLO reader reads them (tokens hold none)."""
    return float(sum(math.prod(dims) * hlo_text.numpy_dtype(kind).itemsize
                     for kind, dims in hlo_text.arrays(type_text) if kind in hlo_text.ELEMENT_TYPES))


def _groups(attributes: str, partitions: int) -> tuple[tuple[int, ...], ...]:
    """The replica groups as written: ``{{0,1},{2,3}}``, iota ``[2,4]<=[4,2]T(1,0)``, a named
    mesh (newer XLA: ``mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}``), or
    ``{}`` (one group of every partition)."""
    named = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}",
                      attributes)
    if named:
        axes = re.findall(r"'([^']+)'=(\d+)", named.group(1))
        sizes = [int(n) for _, n in axes]
        ids = _iota(named.group(2)) if named.group(2) else np.arange(math.prod(sizes))
        ids = ids.reshape(sizes)
        over = [k for k, (name, _) in enumerate(axes) if f"'{name}'" in named.group(3)]
        rest = [k for k in range(len(axes)) if k not in over]
        size = math.prod(sizes[k] for k in over)
        return tuple(tuple(int(x) for x in row) for row in ids.transpose(rest + over).reshape(-1, size))
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attributes)
    if iota:
        g, s = int(iota.group(1)), int(iota.group(2))
        dims = [int(x) for x in iota.group(3).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if iota.group(4):
            ids = ids.transpose([int(x) for x in iota.group(4).split(",")])
        return tuple(tuple(int(x) for x in row) for row in ids.reshape(g, s))
    explicit = re.search(r"replica_groups=\{((?:\s*\{[\d,\s]*\}\s*,?)*)\}", attributes)
    if explicit and explicit.group(1).strip():
        return tuple(tuple(int(x) for x in re.findall(r"\d+", grp)) for grp in re.findall(r"\{([\d,\s]*)\}",
                                                                                             explicit.group(1)))
    pairs = re.search(r"source_target_pairs=\{((?:\s*\{[\d,\s]*\}\s*,?)*)\}", attributes)
    if pairs:
        return tuple(tuple(int(x) for x in re.findall(r"\d+", p)) for p in re.findall(r"\{([\d,\s]*)\}",
                                                                                       pairs.group(1)))
    return (tuple(range(partitions)),)


def _iota(text: str) -> np.ndarray:
    """Device ids written ``[4,2]T(1,0)`` (an iota reshaped, then transposed) or ``[8]``, flat."""
    m = re.match(r"\s*\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
    if not m:
        return np.array([int(x) for x in re.findall(r"\d+", text)])
    dims = [int(x) for x in m.group(1).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    return (ids.transpose([int(x) for x in m.group(2).split(",")]) if m.group(2) else ids).reshape(-1)


def _trip_count(ins: hlo_text.Instruction) -> int:
    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)', ins.attributes)
    return int(m.group(1)) if m else 1


def executions(module: hlo_text.Module) -> tuple[list[str], Counter, set[str]]:
    """How often a step runs each computation reached from the entry (a ``while`` body: its
    trip count times its caller's), in call order; and which of them are inlined into an
    instruction (a fusion's body, a reduction's ``to_apply``) rather than run as a sequence."""
    times: Counter = Counter({module.entry: 1})
    order, inlined = [module.entry], set()
    # Computations are called from the ones before them in a call tree: walk it from the entry.
    for name in order:
        for ins in module.computations.get(name, []):
            for key in ("body", "condition", "to_apply", "calls", "branch_computations"):
                value = ins.attrs.get(key)
                for c in re.findall(r"%?([\w.\-]+)", value or ""):
                    if c not in module.computations:
                        continue
                    times[c] += times[name] * (_trip_count(ins) if ins.opcode == "while" and key == "body" else 1)
                    # A call's computation runs as a sequence (XLA writes it ``call(...), to_apply=``);
                    # a fusion's, a reduction's or a sort's is inlined into its instruction.
                    if (key in ("to_apply", "calls") and ins.opcode != "call") or name in inlined:
                        inlined.add(c)
                    if c not in order:
                        order.append(c)
    return order, times, inlined


def read(text: str | hlo_text.Module) -> hlo_text.Module:
    """A compiled program's text read once (the model reads its collectives and its work)."""
    return text if isinstance(text, hlo_text.Module) else hlo_text.read(text, "<compiled program>")


def collectives(text: str | hlo_text.Module, partitions: int) -> list[Collective]:
    """Every collective a step of the compiled program ``text`` (or its module, read) runs
    (module doc)."""
    module = read(text)
    order, times, _ = executions(module)
    shapes = {i.name: i.type for body in module.computations.values() for i in body}
    out = []
    for name in order:
        for ins in module.computations[name]:
            kind = ins.opcode.removesuffix("-start")
            if kind not in KINDS:   # an async pair's -done is not one more
                continue
            operands = [_bytes(shapes.get(o, "")) for o in ins.operands]
            operand = sum(operands)
            result = _bytes(ins.type)
            if ins.opcode.endswith("-start"):   # an async start's result holds its operands too
                result = max(result - operand, operand)
            nbytes = {"all-gather": result, "reduce-scatter": operand}.get(kind, max(operand, result))
            # each operand's share, at the collective's larger end
            parts = tuple(nbytes * b / operand for b in operands) if operand > 0 and len(operands) > 1 else ()
            out.append(Collective(kind, nbytes, _groups(ins.attributes, partitions), times[name], ins.name, parts))
    return out


def comm_seconds(found: Sequence[Collective], links: LinkModel, domain_of: Sequence[int] | None = None) -> float:
    return sum(c.seconds(links, domain_of) for c in found)


def to_json(found: Sequence[Collective]) -> list[dict]:
    return [{"kind": c.kind, "bytes": c.nbytes, "groups": [list(g) for g in c.groups], "count": c.count,
             "name": c.name, "parts": list(c.parts)} for c in found]


def from_json(rows: Sequence[Mapping]) -> list[Collective]:
    return [Collective(r["kind"], float(r["bytes"]), tuple(tuple(g) for g in r["groups"]), int(r["count"]),
                       r.get("name", ""), tuple(float(b) for b in r.get("parts", ()))) for r in rows]


def summary(found: Sequence[Collective]) -> dict:
    """Per kind: how many run a step and their bytes per device, for result.json."""
    out: dict = {}
    for c in found:
        e = out.setdefault(c.kind, {"count": 0, "bytes_per_device": 0.0})
        e["count"] += c.count
        e["bytes_per_device"] += c.nbytes * c.count
    return json.loads(json.dumps(out))
