"""Meshes a model rules out before they are profiled (``mode.mesh_gate``).

Profiling a logical mesh is most of a cold search's time (the default job: 16 s for [8], 28 s
each for [4, 2] and [2, 4], 40 s for [2, 2, 2], and the shortlist then compiles each mesh's
optimum and its variants), and the meshes grow with the devices (10 for 64 devices over two
processes). The calibrated cost model the ILP solves with (``ilp/``: each collective priced on
the mesh axes it crosses, measured once per mesh and machine into the profile store) prices a
mesh's best plan in a fraction of a second once calibrated. A mesh whose optimum it prices over
``mesh_gate`` times the cheapest mesh's is not profiled; the rest are, and CFP measures their
plans as before.

A gate is only safe beyond the model's error on that choice. Measured on the presets over 2
processes x 4 devices (bench/bench_mesh_gate.py), the mesh CFP then measured fastest was priced
up to 1.61x the cheapest, and pricing every mesh cost more than profiling the one mesh a factor
beyond that leaves out: so the gate is off by default (``SearchOptions.mesh_gate`` 0), there for
searches of many meshes. Where the model cannot be had (no solver, a mesh it cannot formulate),
that mesh is kept: the gate only ever leaves out what it priced.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager, Optional, Sequence

from launcher.errors import UserError

Log = Callable[[str], None]


@dataclass
class Gated:
    """The gate's verdict on each mesh (in the order given)."""
    predicted_s: list[Optional[float]]   # the model's optimum per mesh (None: not priced, kept)
    keep: list[bool]
    seconds: float                       # what the gate cost (calibration and solving)
    variables: list[int]                 # the ILP's variables per mesh, all its arrangements (0: not priced)

    def rows(self, shapes: Sequence[Sequence[int]], ratio: float) -> list[dict]:
        """A ``meshes`` row (result.json) per mesh: the model's prediction, and why a mesh left
        out is."""
        best = min((p for p in self.predicted_s if p is not None), default=None)
        return [{"mesh_shape": list(s), "gate_predicted_step_time_s": p, "gate_ilp_variables": v,
                 **({} if k else {"skipped": why(p, best, ratio)})}
                for s, p, k, v in zip(shapes, self.predicted_s, self.keep, self.variables, strict=True)]


def why(predicted: float, best: float, ratio: float) -> str:
    return (f"not profiled: the ILP's cost model predicts its best plan {predicted / best:.2f}x the best mesh's, "
            f"over mode.mesh_gate={ratio:g} (0 profiles every mesh)")


def arranged_model(model: object, k: int) -> object:
    """The calibrated model of a mesh whose processes change along axis ``k`` (``plans.arranged``),
    from ``model``, the calibration of the mesh with that axis first and the processes along it
    (the same devices in the same grid, its axes in another order): each line moved to the axes
    it covers here."""
    from launcher.sharding.measuring.costmodel import CommModel  # noqa: PLC0415 - JAX

    first = model.mesh_shape   # (shape[k], the other axes in order)
    order = [k] + [a for a in range(len(first)) if a != k]    # that mesh's axis j is this one's order[j]
    shape = [0] * len(first)
    for j, a in enumerate(order):
        shape[a] = first[j]
    lines = {(kind, tuple(sorted(order[j] for j in axes))): line for (kind, axes), line in model.lines.items()}
    return CommModel(tuple(shape), lines, model.matmul_flops_per_s)


def gate(meshes: Sequence[tuple[object, object]], ratio: float, store: object, *, processes: int = 1,
         repeats: int = 10, memory_budget_bytes: Optional[float] = None, time_limit_s: float = 30.0,
         is_main: bool = True, log: Log = lambda line: None,
         progress: Optional[Callable[[int, str], ContextManager]] = None) -> Gated:
    """The meshes to profile of ``meshes`` ((analysis, mesh) each): those whose optimum under
    the ILP's calibrated model is within ``ratio`` times the best mesh's (module doc); a mesh of
    a job of several ``processes`` is priced at its best arrangement (which axis crosses them,
    ``meshes.crossings``), as CFP's shortlist measures each. ``ratio`` 0, or one mesh: every
    one."""
    from launcher.sharding.apply import make_mesh  # noqa: PLC0415 - JAX
    from launcher.sharding.ilp.formulate import formulate  # noqa: PLC0415 - JAX
    from launcher.sharding.ilp.operators import check_decidable, operator_graph  # noqa: PLC0415 - JAX
    from launcher.sharding.ilp.solve import require_solver, solve  # noqa: PLC0415 - JAX
    from launcher.sharding.measuring.calibrate import calibrate  # noqa: PLC0415 - JAX
    from launcher.sharding.search.meshes import crossings  # noqa: PLC0415

    if not ratio or len(meshes) < 2:
        return Gated([None] * len(meshes), [True] * len(meshes), 0.0, [0] * len(meshes))
    t0 = time.perf_counter()
    models: dict[tuple[int, ...], object] = {}

    def calibrated(shape: tuple[int, ...], devices: Sequence[object]) -> object:
        if shape not in models:   # the store's entry, or measured now into it (once per mesh and machine)
            models[shape] = calibrate(make_mesh(shape, devices), store, repeats=repeats, is_main=is_main,
                                      log=lambda line: None)[0]
        return models[shape]

    def price(analysis: object, mesh: object) -> tuple[float, int, int]:
        """(its cheapest arrangement's optimum, that arrangement's axis across processes, the
        ILP's variables over every arrangement)."""
        require_solver()
        og = operator_graph(analysis)
        check_decidable(og)
        shape, devices = tuple(analysis.mesh_shape), list(mesh.devices.flat)
        priced, variables = [], 0
        for k in [0] + [k for k in crossings(shape, processes) if k != 0]:
            model = calibrated((shape[k], *(s for a, s in enumerate(shape) if a != k)), devices)
            problem = formulate(og, arranged_model(model, k) if k else model)
            solution = solve(problem, memory_budget_bytes, time_limit_s)
            variables += solution.num_variables
            priced.append((problem.time_s(solution.choice), k))
        seconds, k = min(priced)
        return seconds, k, variables

    predicted: list[Optional[float]] = []
    across: list[Optional[int]] = []
    variables: list[int] = []
    with (progress or (lambda total, what: nullcontext()))(len(meshes), "mesh gate: pricing each mesh") as bar:
        for analysis, mesh in meshes:
            try:
                seconds, k, n = price(analysis, mesh)
            except UserError as e:   # no solver, no plan within the budget, ...: kept, CFP's profile decides
                log(f"mesh gate: mesh {list(analysis.mesh_shape)} kept unpriced ({e})")
                seconds, k, n = None, None, 0
            predicted.append(seconds)
            across.append(k)
            variables.append(n)
            if bar is not None:
                bar.advance()
    priced = [p for p in predicted if p is not None]
    best = min(priced, default=None)
    keep = [p is None or best is None or p <= ratio * best for p in predicted]
    gated = Gated(predicted, keep, time.perf_counter() - t0, variables)
    shown = ", ".join(f"{list(a.mesh_shape)}: " + (f"{p * 1e3:.3f} ms ({p / best:.2f}x{f', axis {k} across processes' if k else ''})"
                                                   if p is not None else "unpriced")
                      for (a, _), p, k in zip(meshes, predicted, across, strict=True))
    left = [list(a.mesh_shape) for (a, _), k in zip(meshes, keep, strict=True) if not k]
    log(f"mesh gate: the ILP's cost model predicts each mesh's best plan at {shown} ({gated.seconds:.1f} s); "
        + (f"not profiled, over mode.mesh_gate={ratio:g} times the best: {left}" if left
           else f"every mesh within mode.mesh_gate={ratio:g} times the best is profiled"))
    return gated
