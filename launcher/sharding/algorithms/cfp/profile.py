"""CFP's profile pass (pass 2 of three, after the orchestration's analysis): every plan
combination of each unique segment timed once on the mesh, into the profile store, with the
shortcuts the options allow (``launcher/sharding/profile/``: the profiler, its candidates, units
and store keys), and ``profiles.json``, what the search pass works from.

    analyzed = pipeline.analyze(model, mesh_shape=[4, 2])                       # -> Analyzed
    mesh = pipeline.make_mesh(analyzed.analysis.mesh_shape)
    profiled = profile(analyzed, mesh, ProfileOptions(store_dir="store"))      # -> Profiled

``mode=profile`` runs it alone (and ``communication_study``, every uniform plan's collectives);
``Cfp.plan`` runs it on each mesh before its search (``profile_meshes``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

import jax
from jax.sharding import Mesh

from launcher.sharding.algorithms.base import (Analyzed, Log, OnMesh, Progress, builtin_baselines, no_progress,
                                               silent)
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.options import ProfileOptions
from launcher.sharding.profile.budget import refuse_if_nothing_fits
from launcher.sharding.profile.profiler import Profiler, Profiles
from launcher.sharding.profile.units import split_parts
from launcher.sharding.search.studies import communication_study as study
from launcher.sharding.search.nearest import nearest_on_meshes



@dataclass
class Profiled:
    profiles: Profiles
    store_dir: str

    def to_json(self, analysis: Analysis) -> dict:
        """``profiles.json``: every unit, entry and resharding cost the search works from."""
        return profiles_json(self.profiles, analysis)


def profiles_json(p: Profiles, analysis: Analysis) -> dict:
    """``profiles.json`` of profiles ``p`` (``launcher.sharding.profile.profiler.Profiles``) of ``analysis``."""
    return {
        "units": [{"index": u.index, "segment": u.segment, "template": u.kind[0], "part": u.kind[1],
                   "blocks": [u.start, u.end], "plan_counts": u.plan_counts} for u in p.units],
        "profiles": [{"template": k[0], "part": k[1], "combination": list(c), "time_s": e["time_s"],
                      "overhead_s": e.get("overhead_s", 0.0), "mem_bytes": e["mem_bytes"]}
                     for k, combos in p.table.items() for c, e in combos.items()],
        "reshard": [{"shape": list(k[0][0]), "dtype": k[0][1], "src": [list(a) for a in k[1]],
                     "dst": [list(a) for a in k[2]], "time_s": v} for k, v in p.reshard.items()],
        "whole_overhead_s": p.whole_overhead_s,
        "allreduce_latency_s": [{"axes": list(axes), "time_s": t} for axes, t in p.allreduce_latency_s.items()],
        "gradient_allreduces": [[sorted(map(list, c)) for c in u] for u in p.gradient_allreduces or []],
        "exhaustive_space": analysis.exhaustive_space, "segment_space": analysis.segment_space,
    }


def profile(analyzed: Analyzed, mesh: Mesh, options: ProfileOptions = ProfileOptions(), *, is_main: bool = True,
            log: Log = silent, progress: Optional[Progress] = None, keep: Sequence[Sequence[int]] = ()) -> Profiled:
    """The profile pass: measures every segment combination the store at ``options.store_dir``
    lacks. ``options.overlap_compile`` None: compile the next candidate while timing this one on
    accelerators, not on CPU devices (where the compiler would share the timed program's cores).
    CFP's shortcuts (``profile/candidates.py``): with ``skip_over_budget``, a combination no plan
    within the memory budget can hold is not timed (search under a budget no larger); with
    ``early_stop_ratio`` > 0, one whose first runs are over that many times its unit's best is
    timed no further. ``options.interleave``: a unit's combinations timed in rounds, else one after
    another. ``options.profile_top_k``: of each unit's combinations, those a rough cost
    model ranks first, and those of the whole plans ``keep`` (a plan per block).
    ``options.quick_compile`` None: on one process's CPU devices the profiled programs compile with XLA:CPU's
    quicker code generation (``candidates.QUICK_CPU_COMPILE``), stored apart from the defaults'."""
    o = options
    a = analyzed.analysis
    store = ProfileStore(Path(o.store_dir).expanduser().resolve())
    log("profile store: %s (%d entries)" % (store.root, len(store)))
    profiler = Profiler(a, mesh, store, o, keep=keep, log=log, is_main=is_main)
    log("profile: compiling the next candidates %s; %s" % (
        "while timing these" if profiler.overlap else "after timing these (mode.overlap_compile=true to overlap)",
        "a segment's combinations timed in rounds (mode.interleave=false: each in full in turn)" if o.interleave
        else "each combination timed in full in turn (mode.interleave=false)"))
    if profiler.keys.compile_options:
        log("profile: its programs compiled with XLA's quicker code generation, %s (mode.quick_compile=false: XLA's "
            "defaults, as the step's)" % ", ".join(f"{k}={v}" for k, v in profiler.keys.compile_options.items()))
    shortcuts = profiler.shortcuts
    if shortcuts.memory_budget_bytes:
        skip = "combinations no plan within the memory budget (%.6g GB per device) can hold are not timed" \
            % o.memory_budget_gb
    else:
        skip = "every combination timed (%s)" % ("no budget: mode.memory_budget_gb=0" if o.skip_over_budget
                                                 else "mode.skip_over_budget=false")
    stop = ("early stop after %d runs over %gx their segment's best" % (shortcuts.early_stop_after, o.early_stop_ratio)
            if o.early_stop_ratio > 0 else "no early stop (mode.early_stop_ratio=0)")
    log("profile: %s; %s" % (skip, stop))
    for t in a.templates:
        if t.space > o.max_segment_space:
            parts = [t.plan_counts[lo:hi] for lo, hi in split_parts(t.plan_counts, o.max_segment_space)]
            log("template %d: %d combinations exceed mode.max_segment_space=%d; profiled in parts %s"
                % (t.id, t.space, o.max_segment_space, parts))
    return Profiled(profiler.run(progress or no_progress), str(store.root))


def profile_meshes(on: Sequence[OnMesh], options: ProfileOptions = ProfileOptions(), *, is_main: bool = True,
                   log: Log = silent, progress: Optional[Progress] = None,
                   baselines: Sequence[str] = ()) -> list[OnMesh]:
    """``profile`` on each mesh of ``on`` (``analyze_meshes``'): the same meshes, profiled; with
    the plans nearest ``baselines`` (where the search looks for them) profiled whatever
    ``options.profile_top_k`` keeps."""
    keep: dict[int, list[list[int]]] = {}
    program = on[0].analyzed.program if on else None
    if options.profile_top_k and program is not None and baselines:
        names = builtin_baselines(baselines)
        for near in nearest_on_meshes([o.analyzed.analysis for o in on], program, names, jax.devices()).values():
            keep.setdefault(near.mesh, []).append(near.assignment)
    out = []
    for i, o in enumerate(on):
        p = profile(o.analyzed, o.mesh, options, is_main=is_main, log=log, progress=progress,
                    keep=keep.get(i, ())).profiles
        log("mesh %s: %d of %d segment combinations reused from the profile store (%d as the same per-device "
            "program measured on another mesh), %d were missing and measured now"
            % (o.shape, p.reused, p.profiled_configs, p.same_program, p.measured))
        out.append(replace(o, profiles=p))
    refuse_if_nothing_fits([o.shape for o in out], [o.profiles for o in out])  # no mesh holds a plan within budget
    return out


def communication_study(analyzed: Analyzed, mesh: Mesh, *, iterations: int, repeats: int, seed: int = 0,
                        log: Log = silent) -> list[dict]:
    """Every uniform plan of the whole step: collective volume, communication and step time."""
    return study(analyzed.analysis, analyzed.program, mesh, iterations=iterations, repeats=repeats, seed=seed, log=log)
