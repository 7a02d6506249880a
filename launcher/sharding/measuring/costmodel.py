"""The communication cost model the ILP prices plans with (pure: no JAX).

Every collective over a group of mesh axes is a straight line, ``latency + bytes / bandwidth``,
fitted to measurements on the mesh itself (``calibrate.py``), one line per (collective, axes):
all-reduce, all-gather, reduce-scatter and all-to-all over axis 0, over axis 1, and over both
at once (a 2-D mesh's data-parallel strategies all-reduce over both). ``bytes`` is always the
per-device buffer at the collective's larger end: an all-reduce's buffer, an all-gather's
output, a reduce-scatter's input, an all-to-all's buffer (its input and output are alike).

Resharding a tensor from one layout to another is priced the way Alpa's cost model does it,
axis by axis (``reshard_seconds``): a mesh axis that the target splits and the source leaves
whole is a local slice (free); one that splits another dimension in the target is an
all-to-all; one that the target leaves whole is an all-gather. Slices come first (they shrink
what moves), all-to-alls next, all-gathers last (they grow it).

Alpa's ILP gives computation no cost: every strategy it allows divides a heavy operator's work
evenly over the devices, so computation is the same whatever the plan. The model still keeps
the per-device matmul rate it measured (``matmul_flops_per_s``) so that a plan's predicted step
time (contractions' FLOPs over that rate, plus communication) can be set against a measured one.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from launcher.sharding.analysis.strategies import Spec

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")
Axes = tuple[int, ...]


@dataclass(frozen=True)
class Line:
    """Seconds of one collective: ``latency_s + bytes / bytes_per_s``."""
    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


def axis_groups(mesh_shape: Sequence[int]) -> list[Axes]:
    """Every non-empty group of the mesh's axes of size > 1 (what a strategy can communicate over)."""
    live = [a for a, n in enumerate(mesh_shape) if n > 1]
    return [g for k in range(1, len(live) + 1) for g in itertools.combinations(live, k)]


def fit_line(points: Sequence[tuple[float, float]]) -> Line:
    """The least-squares line through (bytes, seconds) points, with a latency and a slope that
    are not negative (noise on a shared machine can tilt a free fit either way)."""
    x = np.array([p[0] for p in points], dtype=np.float64)
    t = np.array([p[1] for p in points], dtype=np.float64)
    slope, latency = np.polyfit(x, t, 1) if len(set(x)) > 1 else (0.0, float(t.mean()))
    if latency < 0:  # the points show no latency: the line through the origin
        latency, slope = 0.0, float(np.dot(x, t) / np.dot(x, x))
    if slope <= 0:   # nor a bandwidth: every size costs the same
        latency, slope = float(t.mean()), 0.0
    return Line(float(latency), 1.0 / slope if slope > 0 else math.inf)


@dataclass
class CommModel:
    """Fitted lines by (collective, mesh axes), and the per-device matmul rate, of one mesh."""
    mesh_shape: tuple[int, ...]
    lines: dict[tuple[str, Axes], Line]
    matmul_flops_per_s: float

    def seconds(self, kind: str, axes: Sequence[int], nbytes: float) -> float:
        """Seconds of collective ``kind`` over mesh ``axes`` with ``nbytes`` per device (see the
        module doc for which end); axes of size 1 communicate with no one."""
        live = tuple(sorted({a for a in axes if self.mesh_shape[a] > 1}))
        if not live or nbytes <= 0:
            return 0.0
        return self.lines[(kind, live)].seconds(nbytes)

    def shard_bytes(self, shape: Sequence[int], itemsize: int, spec: Spec) -> float:
        n = math.prod(shape) * itemsize
        for axes in spec:
            for a in axes:
                n /= self.mesh_shape[a]
        return n

    @staticmethod
    def moves_an_axis(src: Spec, dst: Spec) -> bool:
        """Whether turning ``src`` into ``dst`` moves a mesh axis from one dimension to another
        (``reshard_seconds``' all-to-all). XLA does that in several steps whose copies no line
        prices: on 8 CPU devices ``[cfp1, cfp0] -> [-, cfp1]`` of a 4 MiB tensor took 3.2 ms, priced
        0.8 ms, and a step doing it to its eight weights 36 ms (``profiler.reshard_costs`` times
        such pairs rather than price them)."""
        was = {a: d for d, axes in enumerate(src) for a in axes}
        return any(a in was and was[a] != d for d, axes in enumerate(dst) for a in axes)

    def reshard_seconds(self, shape: Sequence[int], itemsize: int, src: Spec, dst: Spec) -> float:
        """Turning layout ``src`` of a tensor into ``dst``, axis by axis (module doc)."""
        if tuple(src) == tuple(dst):
            return 0.0
        was = {a: d for d, axes in enumerate(src) for a in axes}
        wants = {a: d for d, axes in enumerate(dst) for a in axes}
        nbytes = self.shard_bytes(shape, itemsize, src)
        for a in wants:
            if a not in was:
                nbytes /= self.mesh_shape[a]
        seconds = 0.0
        moved = [a for a in was if a in wants and was[a] != wants[a]]
        if moved:
            seconds += self.seconds("all-to-all", moved, nbytes)
        gathered = [a for a in was if a not in wants]
        if gathered:
            nbytes *= math.prod(self.mesh_shape[a] for a in gathered)
            seconds += self.seconds("all-gather", gathered, nbytes)
        return seconds

    # --- the store entry ----------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"mesh_shape": list(self.mesh_shape), "matmul_flops_per_s": self.matmul_flops_per_s,
                "lines": [{"collective": k, "axes": list(axes), "latency_s": line.latency_s,
                           "bytes_per_s": line.bytes_per_s if math.isfinite(line.bytes_per_s) else None}
                          for (k, axes), line in sorted(self.lines.items())]}

    @classmethod
    def from_json(cls, d: Mapping) -> "CommModel":
        lines = {(e["collective"], tuple(e["axes"])): Line(e["latency_s"], e["bytes_per_s"] or math.inf)
                 for e in d["lines"]}
        return cls(tuple(d["mesh_shape"]), lines, d["matmul_flops_per_s"])

    def describe(self) -> list[str]:
        """One line per fitted collective, for the log."""
        out = []
        for (kind, axes), line in sorted(self.lines.items()):
            bw = "inf" if not math.isfinite(line.bytes_per_s) else f"{line.bytes_per_s / 1e9:.3f} GB/s"
            out.append(f"{kind} over mesh axes {list(axes)}: {line.latency_s * 1e6:.1f} us + bytes / {bw}")
        return out
