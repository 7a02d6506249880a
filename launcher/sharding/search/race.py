"""The race every algorithm's plan runs, beside the baselines and beside each other (CFP's
shortlist, ``algorithms/cfp/shortlist.py``): plans compiled first (``measure.py``'s runners),
then timed in interleaved rounds (``race``): ``repeats`` rounds in which every plan runs
``iterations`` steps, each step timed alone (batch generation excluded), after one warm-up step.
Interleaving matters on a shared machine: a plan timed while the load is high and another while it
is low would compare the load, not the plans; a round the hypervisor interrupted (steal time,
``measuring/quiet.py``) is run again. A round's cost is the mean of its steps and the median round
counts. Plans clearly behind stop early (``Cut``); every process holds the slowest process's
rounds (``agreed``); a plan compiled to another's program races once (``same_program``). What a
race decides is ``comparison.py``'s.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import jax
import numpy as np

from launcher import jaxcompat
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.comparison import paired_over
from launcher.sharding.measuring.quiet import quiet
from launcher.sharding.measuring.timing import slowest_process
from launcher.errors import UserError
from launcher.hlo.text import fingerprint
from launcher.runtime import hosts
from launcher.sharding.search.measure import PlanRun, Runner, plan_runner

if TYPE_CHECKING:
    from launcher.sharding.program import TrainingProgram


@dataclass(frozen=True)
class Cut:
    """Which plans stop racing early, as racing algorithms drop configurations (F-Race,
    successive halving): after ``after`` rounds, each plan of ``among`` (indices into the race's
    runners) whose every round took over ``factor`` times the fastest of ``among`` in the same
    round runs no more rounds; its time stays the median of those it ran. A plan over ``factor``
    squared in every one of half as many rounds (at least 2) stops then: half the evidence settles
    a gap that wide (a user's step raced dp at 11x the fastest plan, 650 ms a step, for 3 rounds).
    The rounds it no longer takes go to the plans still close, where more rounds narrow the ratio
    that matters."""
    among: frozenset
    after: int = 4
    factor: float = 1.25
    keep: frozenset = frozenset()   # of these, the fastest so far stays, however slow

    def at(self, rounds: int) -> float | None:
        """The factor the cut applies after ``rounds`` rounds, None where it does not look."""
        if rounds < 1:
            return None
        if rounds == self.after:
            return self.factor
        return self.factor ** 2 if rounds == max(self.after // 2, 2) < self.after else None

    def out(self, rounds: Mapping[int, Sequence[float]], factor: float) -> set[int]:
        """The plans to drop, given the time in each round so far of every plan still racing (the
        same on every process: the slowest process's, ``slowest_process``)."""
        among = self.among & rounds.keys()
        if not among:
            return set()
        fastest = [min(rounds[i][k] for i in among) for k in range(len(rounds[min(among)]))]
        out = {i for i in among if all(t > factor * f for t, f in zip(rounds[i], fastest, strict=True))}
        kept = self.keep & among
        if kept:
            out.discard(min(sorted(kept), key=lambda i: paired_over(rounds[i], fastest)))   # ties: the first
        return out


# Steps a plan runs in a round at the least where ``round_s`` sizes its rounds: a round's first
# step follows another plan's program, and one step alone would weigh that.
MIN_ROUND_STEPS = 2


def steps_per_round(step_s: float, iterations: int, round_s: float) -> int:
    """The steps a plan taking ``step_s`` a step runs in a round: ``iterations``, or as many as
    take about ``round_s`` seconds where fewer do (at least ``MIN_ROUND_STEPS``; ``round_s`` 0:
    always ``iterations``)."""
    if not round_s or step_s <= 0:
        return iterations
    return min(iterations, max(MIN_ROUND_STEPS, math.ceil(round_s / step_s)))


def race(runners: Sequence[Runner], *, iterations: int, repeats: int, progress: Any = None,
         cut: Cut | None = None, until: Callable[[list[list[float]]], bool] | None = None,
         round_s: float = 0.0) -> list[PlanRun]:
    """One warm-up step each, then ``repeats`` rounds of ``iterations`` steps of every runner. A
    round the hypervisor interrupted is run again (``quiet.py``; training goes on meanwhile, so
    the losses stay those of consecutive steps). ``cut``: plans clearly behind stop early;
    ``until``: the race ends after a round where it says so, given every runner's times in this
    race's rounds (the slowest process's). ``round_s``: a plan whose ``iterations`` steps take
    longer runs only as many steps a round as take about that long (``steps_per_round``), as its
    warm-up step says for the first round and the first round for the others (the slowest
    process's times, so every process runs the same steps).
    A round's time is the mean of its steps, whatever their number, and the rounds, not the
    steps within one, are what pairing and the median work on: on a user's step of 200 ms the
    race spent 2 s a plan a round on 10 steps whose mean moved less than the rounds did.

    Every other round runs the plans in reverse order. The machine's speed drifts within a round
    too: in the default job (2 processes on 2 cores) the time of the plan run first over that of
    the plan run last, seconds later, went from 0.66 to 1.57 over 10 rounds. In a fixed order the
    plans run first and last always meet different moments; reversed, a drift counts against
    each in turn."""
    warm = [0.0] * len(runners)
    for i, r in enumerate(runners):
        if r.step_no == 0:
            warm[i] = r.steps(1)[0]
            jaxcompat.settle_programs()
    live = list(range(len(runners)))
    # The first round sized by the warm-up step where there was one (a first run can be slower:
    # fewer steps then, never more), the others by the first round.
    steps = [steps_per_round(t, iterations, round_s) for t in slowest_process(warm)] if round_s \
        else [iterations] * len(runners)
    for k in range(repeats):
        factor = cut.at(k) if cut is not None and cut.among else None
        if factor is not None:
            # Every process drops the same plans: each runs every plan's collectives.
            slowest = slowest_process([t for i in live for t in runners[i].rounds[-k:]])  # this race's rounds
            dropped = cut.out({i: slowest[j * k:(j + 1) * k] for j, i in enumerate(live)}, factor)
            live = [i for i in live if i not in dropped]
            if progress is not None:
                progress.advance(len(dropped) * iterations * (repeats - k))
        attempts = 0
        order = live if k % 2 == 0 else live[::-1]

        def one_round(order: list[int] = order) -> list[float]:
            nonlocal attempts
            attempts += 1
            bar = progress if attempts == 1 else None  # the bar counts a round once, however often it runs
            means = [0.0] * len(order)
            for j, i in enumerate(order):
                means[j] = statistics.mean(runners[i].steps(steps[i], bar))
                if bar is not None and steps[i] < iterations:
                    bar.advance(iterations - steps[i])   # the bar counts rounds, not steps
                jaxcompat.settle_programs()  # the next runner's step is another program
            return means

        for i, seconds in zip(order, quiet(one_round), strict=True):
            runners[i].rounds.append(seconds)
        if progress is not None:
            progress.stepped()   # a round: every rank's step, its host work compared with the others'
        if k == 0 and round_s:
            first = slowest_process([runners[i].rounds[-1] for i in live])
            for i, step_s in zip(live, first, strict=True):
                steps[i] = steps_per_round(step_s, iterations, round_s)
        if until is not None and k + 1 < repeats:
            slowest = iter(slowest_process([t for r in runners for t in r.rounds[-(k + 1):]]))
            if until([[next(slowest) for _ in range(k + 1)] for _ in runners]):
                break
    return [r.result() for r in runners]


def same_program(runner: Runner, others: Sequence[Runner]) -> int | None:
    """The first of ``others`` compiled to ``runner``'s program (``hlo.text.fingerprint``: the
    same instructions, names and schedule aside) on the same devices in the same order, or None;
    rank 0's answer on every process, which must race the same plans. A searched plan nearest a
    baseline is often the baseline's own layout, and its step may then compile to the baseline's:
    raced apart, two compiles of one program (miniGPT's dp step) ran 0.95-1.06x each other by the
    race's noise alone (docs/benchmarks.md). The devices' order is no part of the text: a plan
    that differs from a baseline only in which mesh axis crosses processes compiles to the same
    instructions on devices in another order, and is another program to run (the default job's
    dp_tp layout with its second axis across processes ran 0.905x dp_tp's in the shortlist).
    Which ``others`` are looked at closer is decided by their devices, then by their texts'
    headers (the arguments' and results' layouts) and instruction counts."""
    found = -1
    if jax.process_index() == 0:
        try:
            mine, devices = runner.compiled.as_text(), _device_order(runner)
            outline, mine_hash = _outline(mine), None
            for k, other in enumerate(others):
                if _device_order(other) != devices:
                    continue
                text = other.compiled.as_text()
                if _outline(text) != outline:
                    continue
                mine_hash = mine_hash or fingerprint(mine)
                if fingerprint(text) == mine_hash:
                    found = k
                    break
        except UserError:   # a text the reader does not know: raced apart, as any other plan
            found = -1
    found = int(hosts.broadcast(np.array([found], dtype=np.int32))[0])
    return None if found < 0 else found


def _device_order(runner: Runner) -> list[int]:
    """The ids of the devices a runner's program runs on, in its mesh's order: partition ``i`` of
    the compiled program runs on the ``i``-th."""
    return [d.id for d in runner.mesh.devices.flat]


def _outline(text: str) -> tuple[str, int]:
    """A compiled program's header less its name, and its count of instruction lines."""
    header = text.split("\n", 1)[0]
    return header[header.find(","):], text.count("\n  ")


def agreed(runs: Sequence[PlanRun]) -> list[PlanRun]:
    """``runs`` (one race's, in the same order on every process) with each round's time the
    slowest process's: one SPMD step ends when its slowest process does, and every process then
    holds the same figures, so each decides (``comparison.verdict``) and reports alike."""
    slowest = slowest_process([t for r in runs for t in r.repeat_times_s])
    out, at = [], 0
    for r in runs:
        out.append(replace(r, repeat_times_s=slowest[at:at + len(r.repeat_times_s)]))
        at += len(r.repeat_times_s)
    return out


def run_plan(a: Analysis, program: TrainingProgram, assignment: Mapping[int, int], mesh: jax.sharding.Mesh, *, iterations: int,
             repeats: int, seed: int = 0, name: str = "searched", progress: Any = None) -> PlanRun:
    runner = plan_runner(a, program, assignment, mesh, seed=seed, name=name)
    return race([runner], iterations=iterations, repeats=repeats, progress=progress)[0]
