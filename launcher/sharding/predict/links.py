"""The link model: what a plan's collectives cost on a machine, from a file a user can read.

A link model (``conf/links/<name>.yaml``, or any path) says, for one kind of machine:

- ``device``: its name, its matmul rate per dtype (FLOP/s a device sustains on the step's
  contractions: the data sheet's peak times ``matmul_efficiency``), its memory, and that
  memory's bandwidth (``memory_bandwidth_gb_s``, optional: what the step's other instructions
  read and write runs at), and what running a program at all costs (``launch_us``, optional; a
  measured file's);
- ``devices_per_node``: the devices one node (host, worker) holds;
- ``within``: the fast link joining ``within.devices`` devices (a node's xGMI or NVLink, a TPU
  slice's ICI: that domain may span several nodes), and ``across``: the slow one between those
  domains (Slingshot, InfiniBand, a TPU pod's DCN). Each is ``latency_us`` per algorithm step and
  ``bandwidth_gb_s``, one direction, per device (a node's NICs shared by its devices);
- ``hierarchical``: whether a collective spanning domains runs in two levels (NCCL and RCCL
  reduce within the node first, then across on each device's share of the data), or flat over
  the slow link (XLA:CPU's gloo: every participant talks over TCP);
- ``operands_one_by_one``: whether a tuple collective (XLA combines a step's small all-reduces
  into one of many operands) costs one collective per operand, as XLA:CPU's gloo runs it, or one
  for the whole, as NCCL, RCCL and the TPU runtime do (default);
- ``source``: where each figure comes from.

Collectives follow the bandwidth-optimal algorithms' costs (Thakur et al., 2005; NCCL's docs'
"bus bandwidth"), for ``n`` devices each holding ``b`` bytes at the collective's larger end:
all-reduce ``2(n-1)/n b/bw + 2 ceil(log2 n) latency``; all-gather and reduce-scatter
``(n-1)/n b/bw + ceil(log2 n) latency``; all-to-all ``(n-1)/n b/bw + (n-1) latency``. Every one
is a straight line in ``b``, so a mesh's model is a ``CommModel`` like a calibrated one, and the
ILP and every plan are priced through the same code whether the lines were measured or derived.

Which devices a mesh axis joins: devices are numbered node by node (a node's devices adjacent,
as SLURM and the TPU runtime give them), the logical mesh lays them out in row-major order, so
its last axes stay within a node and its first crosses nodes (``make_mesh``'s order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from launcher.errors import UserError
from launcher.sharding.measuring.costmodel import COLLECTIVES, CommModel, Line, axis_groups

LINKS_DIR = Path(__file__).resolve().parents[2] / "conf" / "links"   # the package's conf/links


@dataclass(frozen=True)
class Link:
    latency_s: float      # per algorithm step
    bytes_per_s: float    # one direction, per device
    # A collective's own figures where they differ (a measured file's: XLA:CPU's all-to-all is
    # not its all-reduce), by name: (latency_s, bytes_per_s).
    by_collective: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # The same measured at several group sizes (a measured file's): {n: {name: (latency_s,
    # bytes_per_s)}}; a group of another size takes the nearest size's figures.
    by_group_size: Mapping[int, Mapping[str, tuple[float, float]]] = field(default_factory=dict)
    # The (bytes, seconds) points those figures were fitted through (a measured file's), by group
    # size and name: a collective of a measured size is read off them, not off the line, as a
    # collective's cost need not be one straight line: gloo's ring all-reduce of one float among
    # 8 devices costs a twentieth of its 4 KiB one, the same as its 64 KiB one.
    measured: Mapping[int, Mapping[str, tuple[tuple[float, float], ...]]] = field(default_factory=dict)

    def of(self, kind: str, n: int = 0) -> "Link":
        if self.by_group_size:
            near = min(self.by_group_size, key=lambda k: (abs(math.log2(k) - math.log2(max(n, 1))), k))
            if kind in self.by_group_size[near]:
                return Link(*self.by_group_size[near][kind])
        if kind in self.by_collective:
            return Link(*self.by_collective[kind])
        return self

    def to_json(self) -> dict:
        def figures(own: Mapping[str, tuple[float, float]]) -> dict:
            return {k: {"latency_us": float(lat * 1e6), "bandwidth_gb_s": float(bw / 1e9)}
                    for k, (lat, bw) in sorted(own.items())}

        out = {"latency_us": float(self.latency_s * 1e6), "bandwidth_gb_s": float(self.bytes_per_s / 1e9)}
        if self.by_collective:
            out["by_collective"] = figures(self.by_collective)
        if self.by_group_size:
            out["by_group_size"] = {int(n): figures(own) for n, own in sorted(self.by_group_size.items())}
            for n, own in self.measured.items():
                for k, points in own.items():
                    out["by_group_size"][int(n)][k]["measured"] = [[float(b), float(t * 1e6)] for b, t in points]
        return out


@dataclass(frozen=True)
class LinkModel:
    name: str
    device: str
    flops_per_s: Mapping[str, float]   # matmul FLOP/s per device by dtype, efficiency applied
    memory_bytes: float
    devices_per_node: int
    domain_devices: int                # devices the fast link joins
    within: Link
    across: Link
    hierarchical: bool = True
    source: Mapping[str, str] = field(default_factory=dict)
    path: str = ""
    operands_one_by_one: bool = False  # a tuple collective's operands each a collective (XLA:CPU's gloo)
    # Bytes/s a device's instructions read and write from its memory (the step's work besides
    # its matmuls, ``work.py``); inf where the file gives none: that work then costs nothing.
    memory_bytes_per_s: float = math.inf
    # Seconds every step pays to run a program at all, however little it computes (the runtime's
    # launch over the devices; 0 where the file gives none).
    launch_s: float = 0.0

    # --- one collective -----------------------------------------------------------------------

    def seconds(self, kind: str, devices: Sequence[int], nbytes: float, domain_of: Sequence[int] | None = None
                ) -> float:
        """Seconds of collective ``kind`` among the global devices ``devices`` (one replica
        group), ``nbytes`` per device at its larger end; ``domain_of``: each device's fast-link
        domain where they are not numbered domain by domain (a process's devices, measured).
        Read off the points measured at this group size where the link has them, else the line."""
        if len(devices) <= 1 or nbytes <= 0:
            return 0.0
        flat = self._flat_link(devices, domain_of)
        points = flat.measured.get(len(devices), {}).get(kind) if flat is not None else None
        if points:
            return _read_off(points, nbytes, _flat(kind, len(devices), flat).bytes_per_s)
        return self.line(kind, devices, domain_of).seconds(nbytes)

    def _domains(self, devices: Sequence[int], domain_of: Sequence[int] | None) -> set[int]:
        """The fast-link domains ``devices`` lie in (``seconds``' ``domain_of``)."""
        return {domain_of[d] if domain_of is not None else d // self.domain_devices for d in devices}

    def _flat_link(self, devices: Sequence[int], domain_of: Sequence[int] | None) -> Link | None:
        """The one link a collective among ``devices`` runs over: ``within`` for one domain,
        ``across`` for several when not hierarchical; None for two levels."""
        if len(self._domains(devices, domain_of)) == 1:
            return self.within
        return None if self.hierarchical else self.across

    def line(self, kind: str, devices: Sequence[int], domain_of: Sequence[int] | None = None) -> Line:
        """The collective's cost as ``latency + bytes / bandwidth`` (module doc)."""
        n = len(devices)
        flat = self._flat_link(devices, domain_of)
        if flat is not None:
            return _flat(kind, n, flat)
        domains = self._domains(devices, domain_of)
        m = n // len(domains)          # devices of the group in each domain
        h = len(domains)
        # Two levels: the domain's devices share the data first (or last), and each moves its
        # 1/m share across (an all-reduce is a reduce-scatter within, an all-reduce across, an
        # all-gather within); an all-to-all sends (n-m)/n of its bytes across.
        if kind == "all-to-all":   # one message per domain pair across, one per device pair within
            w, x = self.within.of(kind, m), self.across.of(kind, h)
            return _sum(Line((m - 1) * w.latency_s, w.bytes_per_s * n / max(m - 1, 1e-9)),
                        Line((h - 1) * x.latency_s, x.bytes_per_s * n / (n - m)))
        return _sum(_flat(kind, m, self.within), _scaled(_flat(kind, h, self.across), 1.0 / m))

    def flops(self, dtype: str) -> float:
        if dtype in self.flops_per_s:
            return float(self.flops_per_s[dtype])
        return float(self.flops_per_s.get("float32", next(iter(self.flops_per_s.values()))))

    # --- a mesh -------------------------------------------------------------------------------

    def comm_model(self, mesh_shape: Sequence[int], dtype: str = "float32") -> CommModel:
        """The ``CommModel`` of a logical mesh over devices numbered node by node (module doc):
        each (collective, axis group) line from the group holding device 0."""
        shape = tuple(int(n) for n in mesh_shape)
        lines = {(kind, axes): self.line(kind, group(shape, axes)) for axes in axis_groups(shape) for kind in COLLECTIVES}
        return CommModel(shape, lines, self.flops(dtype))

    def crossing(self, mesh_shape: Sequence[int]) -> list[int]:
        """The mesh axes whose groups join devices of different fast-link domains."""
        shape = tuple(int(n) for n in mesh_shape)
        return [a for a in range(len(shape)) if shape[a] > 1
                and len({d // self.domain_devices for d in group(shape, (a,))}) > 1]

    def describe(self) -> str:
        w, x = self.within.to_json(), self.across.to_json()
        return (f"{self.name} ({self.path or 'built in'}): {self.device}, {self.devices_per_node} per node; within "
                f"{self.domain_devices} devices {w['bandwidth_gb_s']:.3g} GB/s + {w['latency_us']:.3g} us a step, "
                f"across {x['bandwidth_gb_s']:.3g} GB/s + {x['latency_us']:.3g} us a step"
                + ("" if self.hierarchical else " (flat, not hierarchical)"))

    # --- the file -----------------------------------------------------------------------------

    def to_yaml(self) -> str:
        d = {"name": self.name, "device": {"name": self.device, "memory_gb": float(self.memory_bytes / 1e9),
                                           "matmul_tflops": {k: float(v / 1e12) for k, v in self.flops_per_s.items()},
                                           "matmul_efficiency": 1.0,
                                           **({"memory_bandwidth_gb_s": float(self.memory_bytes_per_s / 1e9)}
                                              if math.isfinite(self.memory_bytes_per_s) else {}),
                                           **({"launch_us": float(self.launch_s * 1e6)} if self.launch_s else {})},
             "devices_per_node": self.devices_per_node,
             "within": {"devices": self.domain_devices, **self.within.to_json()},
             "across": self.across.to_json(), "hierarchical": self.hierarchical,
             "operands_one_by_one": self.operands_one_by_one, "source": dict(self.source)}
        return yaml.safe_dump(d, sort_keys=False)


def group(shape: tuple[int, ...], axes: Sequence[int]) -> list[int]:
    """The global device numbers of the replica group over mesh ``axes`` holding device 0 (every
    other index 0), for devices laid out in row-major order."""
    strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    out = [0]
    for a in axes:
        out = [d + k * strides[a] for d in out for k in range(shape[a])]
    return sorted(out)


def _flat(kind: str, n: int, link: Link) -> Line:
    """``kind`` among ``n`` devices over one ``link`` (module doc)."""
    if n <= 1:
        return Line(0.0, math.inf)
    link = link.of(kind, n)
    steps = {"all-reduce": 2 * math.ceil(math.log2(n)), "all-to-all": n - 1}.get(kind, math.ceil(math.log2(n)))
    factor = (2.0 if kind == "all-reduce" else 1.0) * (n - 1) / n
    return Line(steps * link.latency_s, link.bytes_per_s / factor)


def _read_off(points: Sequence[tuple[float, float]], nbytes: float, bytes_per_s: float) -> float:
    """Seconds at ``nbytes`` from measured (bytes, seconds) points: the straight line between the
    two around it; below the smallest, the smallest's (nothing moves for less); beyond the
    largest, the largest's plus the rest at the fitted bandwidth ``bytes_per_s``."""
    pts = sorted(points)
    if nbytes <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:], strict=False):
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0) if b1 > b0 else t1
    b, t = pts[-1]
    return t + (nbytes - b) / bytes_per_s


def _scaled(line: Line, bytes_factor: float) -> Line:
    return Line(line.latency_s, line.bytes_per_s / bytes_factor)


def _sum(a: Line, b: Line) -> Line:
    slope = 1.0 / a.bytes_per_s + 1.0 / b.bytes_per_s
    return Line(a.latency_s + b.latency_s, 1.0 / slope if slope > 0 else math.inf)


# --- reading a file -------------------------------------------------------------------------------

def shipped() -> list[str]:
    return sorted(p.stem for p in LINKS_DIR.glob("*.yaml"))


def load(name_or_path: str) -> LinkModel:
    """A link model by name (``conf/links/<name>.yaml``) or path; bad input names what is wrong."""
    p = Path(str(name_or_path)).expanduser()
    if not p.suffix and not p.exists():
        p = LINKS_DIR / f"{name_or_path}.yaml"
    if not p.is_file():
        raise UserError(f"mode.links={name_or_path}: no such link model; give one of {', '.join(shipped())} "
                        f"(conf/links/) or the path of a YAML file written like them")
    try:
        d = yaml.safe_load(p.read_text())
        return from_dict(d, str(p))
    except (KeyError, TypeError, ValueError, yaml.YAMLError) as e:
        raise UserError(f"mode.links={name_or_path} ({p}): not a link model: {type(e).__name__}: {e}; "
                        f"write it like {LINKS_DIR / 'lumi.yaml'}") from None


def from_dict(d: Mapping[str, Any], path: str = "") -> LinkModel:
    dev = d["device"]
    efficiency = float(dev.get("matmul_efficiency", 1.0))
    rates = {str(k): float(v) * 1e12 * efficiency for k, v in dev["matmul_tflops"].items()}

    def figures(e: Mapping[str, Any], what: str) -> tuple[float, float]:
        lat, bw = float(e["latency_us"]), float(e["bandwidth_gb_s"])
        if lat < 0 or bw <= 0:
            raise ValueError(f"{what}: latency_us must be at least 0 and bandwidth_gb_s more than 0")
        return lat * 1e-6, bw * 1e9

    def points(e: Mapping[str, Any], what: str) -> tuple[tuple[float, float], ...]:
        out = tuple((float(b), float(us) * 1e-6) for b, us in e.get("measured") or ())
        if any(b <= 0 or t < 0 for b, t in out):
            raise ValueError(f"{what}.measured: [bytes, us] pairs with bytes more than 0 and us at least 0")
        return out

    def per_collective(e: Mapping[str, Any], what: str) -> dict:
        own = {str(k): figures(v, f"{what}.{k}") for k, v in (e or {}).items()}
        unknown = sorted(set(own) - set(COLLECTIVES))
        if unknown:
            raise ValueError(f"{what}.{unknown[0]}: not a collective ({', '.join(COLLECTIVES)})")
        return own

    def link(e: Mapping[str, Any], what: str) -> Link:
        by_size = e.get("by_group_size") or {}
        sizes = {int(n): per_collective(v, f"{what}.by_group_size.{n}") for n, v in by_size.items()}
        if any(n < 2 for n in sizes):
            raise ValueError(f"{what}.by_group_size: group sizes are at least 2")
        measured = {int(n): {str(k): p for k, f in v.items() if (p := points(f, f"{what}.by_group_size.{n}.{k}"))}
                    for n, v in by_size.items()}
        return Link(*figures(e, what), per_collective(e.get("by_collective"), f"{what}.by_collective"), sizes,
                    {n: v for n, v in measured.items() if v})

    per_node = int(d["devices_per_node"])
    domain = int(d["within"].get("devices", per_node))
    if per_node < 1 or domain < 1 or not rates or any(r <= 0 for r in rates.values()):
        raise ValueError("devices_per_node, within.devices and device.matmul_tflops must be positive")
    bandwidth = float(dev.get("memory_bandwidth_gb_s") or math.inf) * 1e9
    launch = float(dev.get("launch_us") or 0.0) * 1e-6
    if bandwidth <= 0 or launch < 0:
        raise ValueError("device.memory_bandwidth_gb_s must be positive and device.launch_us at least 0 (or left "
                         "out)")
    return LinkModel(str(d.get("name", Path(path).stem)), str(dev["name"]), rates, float(dev["memory_gb"]) * 1e9,
                     per_node, domain, link(d["within"], "within"), link(d["across"], "across"),
                     bool(d.get("hierarchical", True)), dict(d.get("source") or {}), path,
                     bool(d.get("operands_one_by_one", False)), bandwidth, launch)


def from_line(kind: str, n: int, line: Line) -> tuple[float, float]:
    """The link's (latency per step, bytes/s per device) that make ``_flat(kind, n)`` the
    measured ``line``: how a measured collective becomes a link model's figures."""
    steps = {"all-reduce": 2 * math.ceil(math.log2(n)), "all-to-all": n - 1}.get(kind, math.ceil(math.log2(n)))
    factor = (2.0 if kind == "all-reduce" else 1.0) * (n - 1) / n
    return line.latency_s / steps, line.bytes_per_s * factor
