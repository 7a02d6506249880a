"""Profile-store keys. The store on disk is shared by runs and reused across them, so every key
field here is part of its format: change one and every stored entry is measured again.

A segment combination's key holds the model's signature (its analysis), the mesh, the devices,
the timing (warm or cold caches), the template (its blocks' signatures) and the combination;
measurements that depend on the mesh only (resharding, all-reduce latency) leave the model out.
The devices' part of every key, and the collective cost model's key, are ``measuring/keys.py``'s.

A combination's *program* key (``StoreKeys.program``) names what is compiled instead of how it was
asked for: the segment's operators (the traced graph's, not the analysis's, which differs by mesh)
and, for every tensor the program lays out, which part of it each device holds. Two meshes of the
same devices that give a unit the same per-device pieces on the same devices ([8] splitting a
batch eight ways and [4, 2] splitting it over both axes; every replicated combination on every
mesh) compile it to the same program with the same collectives among the same devices, so what
one measured the other reuses (``CandidateLoop.missing``) rather than timing it again.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.graph import Graph
from launcher.sharding.analysis.strategies import Spec
from launcher.sharding.apply import Layouts
from launcher.sharding.measuring.keys import device_signature
from launcher.sharding.profile.segment_program import SegmentProgram, input_layouts
from launcher.sharding.profile.units import Unit

if TYPE_CHECKING:
    from jax.sharding import Mesh

# Part of every store key: bump it when what a measurement means changes (which tensors are
# pinned, what a segment program contains), so old entries are not reused.
# Not bumped for the profiling shortcuts (candidates.py): an entry without their marks is, as
# before, a candidate timed in full, so version-4 stores are read and reused as they are; the
# marked entries (``over_budget``: no time; ``stopped_early``: a bound) are new and are reused
# only where a run's shortcuts allow (``candidates.Shortcuts.reuses``). Version 5: scanned layers
# profiled an iteration at a time (their loops' bodies are segments), and a resharding's overhead
# program is the identity keeping its layout.
PROFILE_VERSION = 5


def model_signature(a: Analysis) -> str:
    return hashlib.sha1(json.dumps(a.to_json(), sort_keys=True).encode()).hexdigest()[:16]


def graph_signature(g: Graph) -> str:
    """The traced program itself (operators, their tensors' shapes and types): the same on every
    mesh, where the analysis's signature holds the mesh's strategies too."""
    h = hashlib.sha1()
    for op in g.ops:
        h.update(f"{op.prim}{op.inputs}{op.outputs}{op.loop};".encode())
    for v in g.vars:
        h.update(f"{v.shape}{v.dtype};".encode())
    return h.hexdigest()[:16]


def device_layout(spec: Spec, mesh: Mesh, ndim: int) -> bytes:
    """Which piece of a tensor each device holds under ``spec`` (per dimension, the mesh axes
    splitting it) on ``mesh``: per dimension the number of pieces, then, by device id, each
    dimension's piece. The same bytes for two meshes whose layouts put the same pieces on the
    same devices, whatever their shapes."""
    shape = mesh.devices.shape
    coords = np.indices(shape).reshape(len(shape), -1)
    ids = np.array([d.id for d in mesh.devices.flat])
    counts, pieces = [], []
    for d in range(ndim):
        axes = spec[d] if d < len(spec) else ()
        piece, n = np.zeros(ids.size, np.int64), 1
        for ax in axes:
            piece, n = piece * shape[ax] + coords[ax], n * shape[ax]
        counts.append(n)
        pieces.append(piece)
    order = np.argsort(ids)
    return np.array(counts, np.int64).tobytes() + np.stack([ids, *pieces])[:, order].astype(np.int64).tobytes()


class StoreKeys:
    """The keys of one profile run's entries (an analysis on a mesh, warm or cold caches)."""

    def __init__(self, a: Analysis, mesh: Mesh, cold: bool = False, compile_options: Mapping[str, Any] | None = None
                 ) -> None:
        """``compile_options``: the XLA options the segments' programs compile with
        (``candidates.quick_compile_options``; none: XLA's defaults)."""
        self.a = a
        self.compile_options = dict(compile_options or {})
        # The compile options' part of a key (``segment`` says why only where there are some).
        self._compiled = {"compile": dict(sorted(self.compile_options.items()))} if self.compile_options else {}
        # Keys of measurements that depend on the mesh only (resharding, all-reduce latency), and
        # of those that depend on the model too.
        self.mesh_base = {"version": PROFILE_VERSION, "mesh": list(a.mesh_shape), "devices": device_signature(mesh),
                          "caches": "cold" if cold else "warm"}
        self.base = {**self.mesh_base, "model": model_signature(a)}
        self.mesh = mesh
        self._graph = graph_signature(a.graph)
        # Every key of the same program on these devices, on any mesh of them: which process
        # holds each device (which links a collective among them crosses).
        self.program_base = {"version": PROFILE_VERSION, "kind": "segment-program",
                             "devices": device_signature(mesh), "caches": self.mesh_base["caches"],
                             "processes": [[d.id, d.process_index] for d in sorted(mesh.devices.flat,
                                                                                   key=lambda d: d.id)]}

    def segment(self, u: Unit, combo: Sequence[int]) -> dict:
        """A unit's combination (units of one kind share it: the template is their blocks'). Its
        compile options only where there are some: a segment compiled under XLA's defaults keeps
        the key it always had, so stores measured so are reused as they are."""
        sigs = self.a.signatures[u.start:u.end]
        template = hashlib.sha1("|".join(sigs).encode()).hexdigest()[:16]
        return {**self.base, **self._compiled, "template": template, "combination": list(combo)}

    def program(self, u: Unit, combo: Sequence[int], sp: SegmentProgram) -> dict:
        """The key of what ``u``'s program ``sp`` compiles to under ``combo`` (the module doc):
        its operators, and each device's piece of every tensor it lays out (its arguments, as
        ``build`` shards them, and every tensor the combination pins)."""
        assignment = u.assignment(combo)
        g, h = self.a.graph, hashlib.sha1()
        h.update(f"{sp.ops}|{sp.inputs}|{sp.outputs}|".encode())
        pinned = Layouts(self.a, assignment).pinned()
        for tag, items in (("in", zip(sp.inputs, input_layouts(self.a, sp, assignment), strict=True)),
                           ("pin", sorted(pinned.items()))):
            for v, spec in items:
                h.update(f"{tag}{v}:".encode())
                h.update(device_layout(spec, self.mesh, len(g.vars[v].shape)))
        return {**self.program_base, **self._compiled, "graph": self._graph, "program": h.hexdigest()}

    def reshard(self, pair: tuple) -> dict:
        """Turning layout src into dst for ``pair`` = ((shape, dtype), src, dst)."""
        (shape, dtype), src, dst = pair
        return {**self.mesh_base, "kind": "reshard", "shape": list(shape), "dtype": dtype,
                "src": [list(a) for a in src], "dst": [list(a) for a in dst]}

    def allreduce_latency(self, axes: Sequence[int]) -> dict:
        return {**self.mesh_base, "kind": "allreduce-latency", "axes": list(axes), "statistic": "q25"}

    def whole_overhead(self) -> dict:
        return {**self.base, "kind": "whole-overhead"}
