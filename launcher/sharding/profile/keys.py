"""Profile-store keys. The store on disk is shared by runs and reused across them, so every key
field here is part of its format: change one and every stored entry is measured again.

A segment combination's key holds the model's signature (its analysis), the mesh, the devices,
the timing (warm or cold caches), the template (its blocks' signatures) and the combination;
measurements that depend on the mesh only (resharding, all-reduce latency) leave the model out.
The devices' part of every key, and the collective cost model's key, are ``measuring/keys.py``'s.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.measuring.keys import device_signature
from launcher.sharding.profile.units import Unit

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


class StoreKeys:
    """The keys of one profile run's entries (an analysis on a mesh, warm or cold caches)."""

    def __init__(self, a: Analysis, mesh: Any, cold: bool = False, compile_options: Mapping[str, Any] | None = None
                 ) -> None:
        """``compile_options``: the XLA options the segments' programs compile with
        (``candidates.quick_compile_options``; none: XLA's defaults)."""
        self.a = a
        self.compile_options = dict(compile_options or {})
        # Keys of measurements that depend on the mesh only (resharding, all-reduce latency), and
        # of those that depend on the model too.
        self.mesh_base = {"version": PROFILE_VERSION, "mesh": list(a.mesh_shape), "devices": device_signature(mesh),
                          "caches": "cold" if cold else "warm"}
        self.base = {**self.mesh_base, "model": model_signature(a)}

    def segment(self, u: Unit, combo: Sequence[int]) -> dict:
        """A unit's combination (units of one kind share it: the template is their blocks'). Its
        compile options only where there are some: a segment compiled under XLA's defaults keeps
        the key it always had, so stores measured so are reused as they are."""
        sigs = self.a.signatures[u.start:u.end]
        template = hashlib.sha1("|".join(sigs).encode()).hexdigest()[:16]
        compiled = {"compile": dict(sorted(self.compile_options.items()))} if self.compile_options else {}
        return {**self.base, **compiled, "template": template, "combination": list(combo)}

    def reshard(self, pair: tuple) -> dict:
        """Turning layout src into dst for ``pair`` = ((shape, dtype), src, dst)."""
        (shape, dtype), src, dst = pair
        return {**self.mesh_base, "kind": "reshard", "shape": list(shape), "dtype": dtype,
                "src": [list(a) for a in src], "dst": [list(a) for a in dst]}

    def allreduce_latency(self, axes: Sequence[int]) -> dict:
        return {**self.mesh_base, "kind": "allreduce-latency", "axes": list(axes), "statistic": "q25"}

    def whole_overhead(self) -> dict:
        return {**self.base, "kind": "whole-overhead"}
