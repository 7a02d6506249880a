"""Plans within a memory budget as XLA allocates them for the whole step.

The search pass adds a plan's memory up from its segments' (``dp.py``): the profiles' figure,
which over-counts what the whole step allocates under the plan (each segment's temporaries and
copies counted apart, where the step reuses buffers: up to 1.9x on the scanned LM). So under a
budget the sum is a first filter only (``budget.UNITS_OVER_STEP`` times the budget), and what
fits is decided by the whole step compiled under the plan and read by XLA's memory analysis
(``models.train.memory_stats``, the figure the race reports):

- on each mesh, the DP's plans within the filter (its optimum and runners-up) are thinned to
  their Pareto front, fastest predicted first, the segments' sum falling along it; the whole
  step's memory falls with it, so the fastest plan that fits is found by bisection: a few
  compilations, not one per plan;
- from there the next plans along the front that fit, and the plans nearest the baselines that
  fit, make the shortlist the search measures (``pipeline.choose``), compiled once: the runners
  compiled here are the ones raced;
- a plan lays each input out as its first consumer computes with it, so none stores the state
  split while computing otherwise, as fsdp does (ZeRO-3: parameters gathered where used). Where
  fewer than ``k`` plans of a mesh fit, the fastest plans of its front are tried with the state
  stored so too (``apply.plan_constraints``' ``stored``): the plan's compute, fsdp's memory;
- where none fits on any mesh, the plan of least memory among those compiled is raced alone
  beside the baselines, one of which may fit (fsdp); the answer is only ever a plan within the
  budget as measured, and where none is the refusal names the least memory measured
  (``pipeline.answer``).

Every figure is the compiler's: no step runs here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

import jax

from launcher.errors import NoPlanFits
from launcher.sharding.search.dp import Candidate
from launcher.sharding.search.measure import plan_runner

if TYPE_CHECKING:
    from launcher.sharding.program import TrainingProgram


@dataclass
class Fitted:
    """What ``within_budget`` found: the shortlist (mesh index, candidate), fastest predicted
    first, the nearest plans among it, the compiled runners of every plan it compiled, and a row
    per compiled plan (mesh, plan, the segments' sum and the step's memory)."""
    short: list[tuple[int, Candidate]]
    incumbents: list[int]
    runners: dict[tuple[int, tuple[int, ...]], Any] = field(default_factory=dict)
    compiled: list[dict] = field(default_factory=list)


def front(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The candidates not beaten on both predicted time and the segments' memory, fastest first
    (so the memory falls along it)."""
    out: list[Candidate] = []
    for c in sorted(candidates, key=lambda c: (c.predicted_time_s, c.predicted_memory_bytes)):
        if not out or c.predicted_memory_bytes < out[-1].predicted_memory_bytes:
            out.append(c)
    return out


class _Compiler:
    """Each plan compiled once (its runner kept), its whole step's memory read."""

    def __init__(self, on: Sequence[Any], seed: int, log: Callable[[str], None]) -> None:
        self.on, self.seed, self.log = on, seed, log
        self.runners: dict[tuple, Any] = {}
        self.rows: list[dict] = []
        self.least: tuple[int, Candidate] | None = None   # the plan of least memory compiled

    def memory(self, i: int, c: Candidate) -> int:
        key = compiled_key(i, c)
        if key not in self.runners:
            o = self.on[i]
            runner = plan_runner(o.analyzed.analysis, o.analyzed.program, dict(enumerate(c.assignment)), o.mesh,
                                 seed=self.seed, stored=c.stored)
            self.runners[key] = runner
            step = runner.peak_memory_bytes
            if self.least is None or step < self.runners[compiled_key(*self.least)].peak_memory_bytes:
                self.least = (i, c)
            self.rows.append({"mesh_shape": o.shape, "assignment": list(c.assignment), "source": c.source,
                              "stored": len(c.stored),
                              "predicted_time_s": c.predicted_time_s, "segments_memory_bytes": c.predicted_memory_bytes,
                              "step_memory_bytes": step})
            self.log(f"memory budget: {c.source} {list(c.assignment)} on mesh {o.shape}: the whole step allocates "
                     f"{step / 2**20:.2f} MiB per device (its segments add up to "
                     f"{c.predicted_memory_bytes / 2**20:.2f} MiB)")
        return self.runners[key].peak_memory_bytes


def within_budget(on: Sequence[Any], live: Sequence[int], fronts: Sequence[Sequence[Candidate]],
                  nearest: dict[str, tuple[int, Candidate]], budget: float, k: int, *, seed: int = 0,
                  log: Callable[[str], None] = lambda line: None, split_incumbents: Collection[str] = ()) -> Fitted:
    """The shortlist within ``budget`` bytes per device as the whole step allocates it (the
    module doc): ``fronts[j]`` the DP's plans on mesh ``live[j]``, ``nearest`` the plans nearest
    the baselines (name -> (mesh index, candidate)), ``k`` plans besides those. The nearest plans
    that fit are incumbents, and so are the twins, the state stored split, of those named in
    ``split_incumbents`` (``cfp.choose``: where the nearest plan is not the baseline's layout).
    NoPlanFits where no plan compiled fits, naming the least memory measured."""
    compiler = _Compiler(on, seed, log)
    fitting: list[tuple[int, Candidate]] = []
    for i, plans in zip(live, fronts, strict=True):
        plans = front(plans)
        if not plans or compiler.memory(i, plans[-1]) > budget:   # not even its least
            continue
        lo, hi = 0, len(plans) - 1      # plans[hi] fits; the first that does is in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            if compiler.memory(i, plans[mid]) <= budget:
                hi = mid
            else:
                lo = mid + 1
        for c in plans[lo:]:
            if len([f for f in fitting if f[0] == i]) >= k:
                break
            if compiler.memory(i, c) <= budget:
                fitting.append((i, c))
    for i, plans in zip(live, fronts, strict=True):
        stored = state_inputs(on[i].analyzed.program)
        for c in front(plans)[:k + 1] if stored and len([f for f in fitting if f[0] == i]) < k else ():
            variant = replace(c, source=f"{c.source}, state stored split", stored=stored)
            if len([f for f in fitting if f[0] == i]) < k and compiler.memory(i, variant) <= budget:
                fitting.append((i, variant))
    stored_near = {n: (i, replace(c, source=f"{c.source}, state stored split",
                                  stored=state_inputs(on[i].analyzed.program)))
                   for n, (i, c) in nearest.items() if state_inputs(on[i].analyzed.program)}
    near = [(i, c) for i, c in [*nearest.values(), *stored_near.values()] if compiler.memory(i, c) <= budget]
    safe = [(i, c) for i, c in [*nearest.values(), *(stored_near[n] for n in split_incumbents if n in stored_near)]
            if compiler.memory(i, c) <= budget]
    short: list[tuple[int, Candidate]] = []
    for i, c in sorted(fitting, key=lambda ic: ic[1].predicted_time_s)[:k] + near:
        if all(compiled_key(i, c) != compiled_key(j, d) for j, d in short):
            short.append((i, c))
    if not short:
        if compiler.least is None:
            raise NoPlanFits(f"no plan fits mode.memory_budget_gb={budget / 2**30:.6g} on any mesh searched")
        i, c = compiler.least
        step = compiler.runners[compiled_key(i, c)].peak_memory_bytes
        log(f"memory budget: no searched plan fits mode.memory_budget_gb={budget / 2**30:.6g} (the least, {c.source} "
            f"on mesh {on[i].shape}, allocates {step / 2**30:.6g} GB per device, of {len(compiler.rows)} compiled): it "
            "races beside the baselines, and only a plan within the budget is the answer")
        short = [(i, c)]
    incumbents = [k for k, (i, c) in enumerate(short) if any(compiled_key(i, c) == compiled_key(j, d) for j, d in safe)]
    return Fitted(short, incumbents, dict(compiler.runners), compiler.rows)


def compiled_key(i: int, c: Candidate) -> tuple:
    """A compiled plan's key: its mesh, its plan per block, its stored inputs."""
    return i, tuple(c.assignment), tuple(sorted(c.stored)), c.across


def state_inputs(program: TrainingProgram) -> frozenset:
    """The positions, among the step's inputs (its arguments' leaves), of the state it feeds
    back (a user's state arguments; a model's training state)."""
    out, k = set(), 0
    for i, arg in enumerate(program.args):
        n = len(jax.tree.leaves(arg))
        if i in program.feeds_back:
            out.update(range(k, k + n))
        k += n
    return frozenset(out)

