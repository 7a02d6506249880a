"""Running whole-model plans: the searched plan, the uniform plans, and the built-in baselines.

Every run trains the real model on its real data with the trainer ``mode=train`` uses
(``models.train.Trainer``: the same state, optimizer, batches and step timing, so the losses are
those ``mode=train`` gives for the same seed); a searched plan's layouts reach it as a step
transform (``apply.assignment_transform``). Plans are compiled first (``Runner``), then timed
in interleaved rounds (``race``): ``repeats`` rounds in which every plan runs ``iterations``
steps, each step timed alone (batch generation excluded), after one warm-up step. Interleaving matters on a shared machine: a plan timed while the load is high
and another while it is low would compare the load, not the plans; a round the hypervisor
interrupted (steal time, ``quiet.py``) is run again. A round's cost is the mean of its steps and
the median round counts; TFLOPS divide the model's analytic FLOPs per step by it. Memory is per
device, from XLA's buffer assignment (``models.train.memory_stats``).

A user's own step (no model protocol) runs on ``StepRunner`` instead, with the same interface:
its example arguments laid out by the plan, the state it returns fed back as the next step's (the
data stay the example batch), each step timed alone; its baselines are dp, fsdp and the user's
own shardings. What a run asks of such a step, the program answers itself
(``launcher/sharding/user/step.py: StepProgram``), so this module imports nothing of the user's
folder.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.sharding.analysis.core import Analysis
from launcher.sharding.comparison import paired_over, paired_ratios, winner
from launcher.sharding.measuring.quiet import quiet
from launcher.sharding.measuring.timing import Timer, slowest_process
from launcher.sharding.search.comm import collectives, total_bytes
from launcher.errors import BAD_INPUT, UserError
from launcher.hlo.text import fingerprint
from launcher.models.plans import Plan
from launcher.models.train import CompiledStep, StepTransform, Trainer
from launcher.runtime import compile_share, hosts, trace_stats

if TYPE_CHECKING:
    from launcher.sharding.program import TrainingProgram


@dataclass
class PlanRun:
    name: str
    repeat_times_s: list[float]          # mean step time of each round
    losses: list[float]
    memory_bytes: int
    flops: float
    compile_time_s: float
    compiled: jax.stages.Compiled | None = field(default=None, repr=False)

    @property
    def step_time_s(self) -> float:
        return statistics.median(self.repeat_times_s)

    @property
    def tflops(self) -> float:
        return self.flops / self.step_time_s / 1e12

    def tflops_per_repeat(self) -> list[float]:
        return [self.flops / t / 1e12 for t in self.repeat_times_s]

    def summary(self) -> dict:
        return {"step_time_s": self.step_time_s, "tflops": self.tflops, "memory_gb": self.memory_bytes / 2**30,
                "repeat_times_s": self.repeat_times_s, "compile_time_s": self.compile_time_s}


class _SharedCompile:
    """A plan's step compiled once in the job, by one process, where several build it inside
    ``compile_share.shared()`` (the shortlist, the baselines)."""

    def compile_program(self, lower: Callable[[], jax.stages.Lowered]) -> compile_share.Compiling:
        return compile_share.compile(lower)


class Runner(_SharedCompile, Trainer):
    """A plan's training step compiled with its state (``models.train.Trainer``), and the mean
    step time of each round ``race`` ran it for."""

    def __init__(self, name: str, program: TrainingProgram, plan: Plan, devices: Sequence[jax.Device], *, seed: int = 0,
                 transform_step: StepTransform | None = None) -> None:
        super().__init__(program.model, plan, devices, optimizer=program.optimizer, seed=seed,
                         transform_step=transform_step)
        self.name, self.program = name, program
        self.rounds: list[float] = []
        self.candidate: Any = None  # the search.Candidate it runs, when it runs one
        self.mesh_index = 0         # which of the searched meshes that candidate is on

    def result(self) -> PlanRun:
        return PlanRun(self.name, self.rounds, self.losses, self.peak_memory_bytes,
                       float(self.program.model.flops_per_step()), self.compile_time_s, self.compiled)

    def answer_plan(self) -> Optional[Plan]:
        """Its plan as the answer's plan file, where it raced as a built-in baseline: the plan's
        rules with its mesh axes sized as it ran, so ``mode=train mode.plan=`` runs it on the
        same mesh."""
        sizes = dict(zip(self.mesh.axis_names, map(int, self.mesh.devices.shape), strict=True))
        return self.plan.with_axis_sizes(**sizes)


class StepRunner(_SharedCompile, CompiledStep):
    """A user's step (``program.model`` None) compiled with its arguments laid out as
    ``in_shardings``: ``Runner``'s interface on the step's own arguments (``StepProgram``). The
    state the step returns is fed back (and donated), so successive steps train; its outputs
    besides are replicated, its loss recorded where it has one."""

    def __init__(self, name: str, program: TrainingProgram, step: Any, in_shardings: tuple, *, seed: int = 0) -> None:
        self.name, self.program = name, program
        self.rounds: list[float] = []
        self.candidate: Any = None
        self.mesh_index = 0
        self.mesh = mesh = jax.tree.leaves(in_shardings)[0].mesh  # one mesh: the plan's, a baseline's or the user's
        outs = program.out_shardings(in_shardings, NamedSharding(mesh, PartitionSpec()))
        t0 = time.perf_counter()
        self.args = program.materialize(in_shardings, seed)
        self._compile(lambda: jax.jit(step, in_shardings=tuple(in_shardings), out_shardings=outs,
                                      donate_argnums=program.feeds_back).lower(*self.args), since=t0)

    def _one_step(self) -> float:
        t = time.perf_counter()
        out = jax.block_until_ready(self.compiled(*self.args))
        seconds = time.perf_counter() - t
        loss = self.program.loss_of(out)
        if loss is not None:
            self.losses.append(loss)
        self.args = self.program.next_args(self.args, out)
        return seconds

    def result(self) -> PlanRun:
        return PlanRun(self.name, self.rounds, self.losses, self.peak_memory_bytes, self.program.flops_per_step,
                       self.compile_time_s, self.compiled)

    def answer_plan(self) -> None:
        """None: a user's step's baseline is no ``Plan``; ``AutoPlan.answered`` lays it out."""
        return None


PlanRunner = Union[Runner, StepRunner]   # a plan's program compiled on its mesh, to race


def plan_runner(a: Analysis, program: TrainingProgram, assignment: Mapping[int, int], mesh: jax.sharding.Mesh, *, seed: int = 0,
                name: str = "searched", stored: frozenset = frozenset()) -> PlanRunner:
    """``program`` compiled under a block-plan assignment on ``mesh``, to race as ``name``
    (``OnMesh.runner`` is the algorithms' way to it; ``stored``: inputs kept split between steps,
    ``apply.plan_constraints``): its kind's runner (``TrainingProgram.plan_runner``)."""
    return program.plan_runner(a, assignment, mesh, seed=seed, name=name, stored=stored)


def baseline_runner(program: TrainingProgram, plan_name: str, devices: Sequence[jax.Device], *, seed: int = 0) -> PlanRunner:
    """Its baseline ``plan_name`` (a built-in plan, ``models.plans``; a user's step's dp, fsdp or
    its own layout), compiled and run one step; raises ModelError when the plan does not fit the
    model or the devices, UserError where a user's step has no such baseline."""
    runner = program.baseline_runner(plan_name, devices, seed=seed)
    runner.steps(1)
    return runner


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


def run_plan(a: Analysis, program: TrainingProgram, assignment: Mapping[int, int], mesh: jax.sharding.Mesh, *, iterations: int,
             repeats: int, seed: int = 0, name: str = "searched", progress: Any = None) -> PlanRun:
    runner = plan_runner(a, program, assignment, mesh, seed=seed, name=name)
    return race([runner], iterations=iterations, repeats=repeats, progress=progress)[0]


def pick(entries: Sequence[tuple[Analysis, Any, Any, Any]], *, iterations: int, repeats: int = 3, seed: int = 0,
         incumbents: Sequence[int] = (), margin: float = 0.0, progress: Any = None,
         drop_slower_than: float = 0.0, name: str = "searched", compiled: Sequence[Any] = (),
         round_s: float = 0.0) -> tuple[PlanRunner, list[dict]]:
    """The fastest of a shortlist measured on the whole step (``winner``). ``entries``:
    (analysis, program, mesh, ``search.Candidate``) per plan, the search's optimum first; plans
    of different logical meshes of the same devices race together, in ``repeats`` interleaved
    rounds of ``iterations`` steps each. ``incumbents``: the entries nearest the baselines.
    Every process measures every candidate and the slowest process's round times decide, so all
    processes pick the same plan.

    A plan that wins the short rounds against the incumbents by ``margin`` has still won only a
    few short rounds: it then races the fastest incumbent alone, twice as many rounds again, and
    replaces it only if it wins those by ``margin`` as well. In the default job the DP's optimum on
    4x2 beat the plan nearest dp_tp by 5% in 4 rounds of 5 steps and then ran 1.067x dp_tp over
    10 rounds; the duel costs a few seconds beside compiling the shortlist. Not so where the
    incumbent took over ``CLEARLY_AHEAD`` (1.25) times the plan's time, beyond ``margin``, in
    every short round: no round's noise spans that, and on a user's step of 60-250 ms the duel
    cost 20 s of a 125 s search, so the plan replaces it without one (its row's ``won_clearly``).

    ``drop_slower_than`` (0: none) cuts the race as the final race cuts its baselines (``Cut``):
    after half the rounds, a plan over that many times the fastest in each of them runs no more
    (its figures are those of its rounds), except the fastest incumbent, which the winner must
    beat. ``compiled``: a runner per entry compiled already (None: compile it here; ``fit.py``
    compiles the plans within a memory budget first). ``round_s``: ``race``'s, the rounds of slow
    steps shortened. Returns the chosen runner (compiled, to
    race as ``name``, rounds cleared, its ``candidate`` set) and a row per candidate."""
    given = list(compiled) or [None] * len(entries)
    with compile_share.shared():  # each process compiles some of the candidates and loads the others
        runners = [r if r is not None else plan_runner(a, program, dict(enumerate(c.assignment)), mesh, seed=seed,
                                                       name=name, stored=c.stored)
                   for (a, program, mesh, c), r in zip(entries, given, strict=True)]
    for r in runners:
        r.name = name
    measured: list[float | None] = [None] * len(runners)
    ratios: list[float | None] = [None] * len(runners)
    over_incumbent: list[float | None] = [None] * len(runners)
    duel: list[float | None] = [None] * len(runners)   # the duel's time over the incumbent's
    ran = [0] * len(runners)                            # short rounds each ran
    duel_rounds = 0
    won_clearly = False
    best = 0
    if len(runners) > 1:
        cut = Cut(frozenset(range(len(runners))), max(repeats // 2, 1), drop_slower_than, frozenset(incumbents)) \
            if drop_slower_than and repeats > 1 else None
        race(runners, iterations=iterations, repeats=repeats, progress=progress, cut=cut, round_s=round_s)
        slowest = iter(slowest_process([t for r in runners for t in r.rounds]))
        rounds = [[next(slowest) for _ in r.rounds] for r in runners]
        ran = [len(ts) for ts in rounds]
        measured = [statistics.median(ts) for ts in rounds]
        ratios = paired_ratios(rounds)
        full = [i for i, ts in enumerate(rounds) if len(ts) == repeats]   # not cut
        best = full[winner([rounds[i] for i in full], [full.index(i) for i in incumbents if i in full], margin)]
        if incumbents:
            full_ratios = dict(zip(full, paired_ratios([rounds[i] for i in full]), strict=True))
            safe = min((i for i in incumbents if i in full), key=full_ratios.__getitem__)
            over_incumbent = [paired_over(times, rounds[safe][:len(times)]) for times in rounds]
            won_clearly = best not in incumbents and _clearly_ahead(rounds[best], rounds[safe], margin)
            if best not in incumbents and not won_clearly:
                pair = [runners[best], runners[safe]]
                for r in pair:
                    r.rounds = []
                race(pair, iterations=iterations, repeats=2 * repeats, until=lambda ts: _decided(ts, 2 * repeats, margin),
                     round_s=round_s)
                slowest = slowest_process([t for r in pair for t in r.rounds])
                n = duel_rounds = len(pair[0].rounds)
                duel[best] = paired_over(slowest[:n], slowest[n:])
                duel[safe] = 1.0
                if duel[best] > 1 - margin:
                    best = safe
    chosen = runners[best]
    chosen.rounds = []  # the short rounds choose; they are not the searched plan's timing
    chosen.candidate = entries[best][3]
    rows = [{"assignment": list(c.assignment), "mesh_shape": list(a.mesh_shape), "source": c.source,
             "predicted_step_time_s": c.predicted_time_s, "predicted_memory_gb": c.predicted_memory_bytes / 2**30,
             "measured_step_time_s": seconds, "paired_ratio": ratio, "chosen": i == best, "search_optimum": i == 0,
             "incumbent": i in incumbents, "over_incumbent_paired": over, "duel_over_incumbent_paired": duel[i],
             "rounds": ran[i], "duel_rounds": duel_rounds if duel[i] is not None else 0,
             "won_clearly": won_clearly and i == best}
            for i, ((a, _, _, c), seconds, ratio, over) in enumerate(zip(entries, measured, ratios, over_incumbent, strict=True))]
    return chosen, rows


# How far ahead of the incumbent, beyond ``1 - margin``, a plan must be in every short round to
# replace it without a duel: the default ``drop_slower_than``'s gap, which no round's noise spans
# (``bench_race_noise.py``: a round's time moves by 8-10%). Not the option itself: a race cut
# hard (``mode.drop_slower_than=1.01``) would then skip the duels that catch a lead of 5%.
CLEARLY_AHEAD = 1.25


def _clearly_ahead(times: Sequence[float], incumbent: Sequence[float], margin: float) -> bool:
    """Whether a plan beat the incumbent by ``CLEARLY_AHEAD`` beyond ``1 - margin`` in every
    round both ran."""
    return all(t * CLEARLY_AHEAD <= (1 - margin) * u for t, u in zip(times, incumbent, strict=True))


def _decided(rounds: Sequence[Sequence[float]], of: int, margin: float) -> bool:
    """Whether a duel (the challenger's times, then the incumbent's, round by round) of ``of``
    rounds is decided already: once more than half of them fall on one side of ``1 - margin``,
    the median of all of them does too, whatever the rest."""
    below = sum(t / u <= 1 - margin for t, u in zip(*rounds, strict=True))
    return max(below, len(rounds[0]) - below) > of // 2


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


def baseline_runners(program: TrainingProgram, devices: Sequence[jax.Device], *, seed: int, log: Callable[[str], None],
                     names: Sequence[str]) -> tuple[list[Runner], dict[str, str]]:
    """Every built-in plan that fits, compiled, not yet run (inside ``compile_share.shared()``,
    each by one process); the others with the reason they do not."""
    runners, skipped = [], {}
    with compile_share.shared():
        for name in names:
            try:
                runners.append(program.baseline_runner(name, devices, seed=seed))
            except BAD_INPUT as e:
                skipped[name] = str(e)
                log(f"baseline {name}: skipped ({e})")
    return runners, skipped


def communication_study(a: Analysis, program: TrainingProgram, mesh: jax.sharding.Mesh, *, iterations: int, repeats: int, seed: int,
                        log: Callable[[str], None]) -> list[dict]:
    """Every uniform plan (all blocks on plan k, or their last plan) of the whole step: the
    collective volume of its compiled program, the time spent communicating and the step time.

    The communication time is read from a profiler trace of the plan's run where the backend
    records device ops (GPU, TPU: ``launcher/runtime/trace_stats.py``). The CPU backend's trace
    does not separate collectives from computation, so there it is an estimate: collective bytes
    over the all-reduce bandwidth measured on the same mesh (each row says which)."""
    bandwidth = allreduce_bandwidth(mesh)
    log(f"all-reduce bandwidth on the mesh: {bandwidth / 1e9:.3f} GB/s per device")
    rows = []
    for k in range(max(b.num_plans for b in a.blocks)):
        assignment = {b.id: min(k, b.num_plans - 1) for b in a.blocks}
        run = lambda assignment=assignment, k=k: run_plan(a, program, assignment, mesh, iterations=iterations, repeats=repeats, seed=seed,
                               name=f"uniform{k}")
        # Not traced where the trace could not tell anyway (CPU devices): tracing costs step time.
        ops, r = trace_stats.timed(run) if mesh.devices.flat[0].platform != "cpu" else (None, run())
        stats = collectives(r.compiled.as_text())
        volume = total_bytes(stats)
        steps = 1 + iterations * repeats  # race's warm-up step, then the rounds
        if ops is not None:
            comm, method = ops.collective_s / steps, "trace: device time in collective ops per step"
        else:
            comm = volume / bandwidth
            method = ("estimate: collective bytes / measured all-reduce bandwidth (this backend's trace "
                      "records no device ops)")
        rows.append({"plan": k, "comm_volume_bytes": volume, "collectives": stats, "step_time_s": r.step_time_s,
                     "comm_time_s": comm, "compute_time_s": max(r.step_time_s - comm, 0.0),
                     "comm_time_method": method, "memory_gb": r.memory_bytes / 2**30})
        log(f"Uniform plan {k}: Comm Volume: {volume / 1e6:.3f} MB, comm time {comm:.6f} s "
            f"({'trace' if ops is not None else 'estimate'}), compute {rows[-1]['compute_time_s']:.6f} s, "
            f"step {r.step_time_s:.6f} s")
    return rows


def allreduce_bandwidth(mesh: jax.sharding.Mesh, mib: float = 4.0, repeats: int = 5) -> float:
    """Bytes per second per device of an all-reduce over every device of ``mesh``."""
    n = mesh.devices.size
    per = max(int(mib * 2**20 / 4), 1)
    sharded = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    x = jax.make_array_from_callback((n, per), sharded, lambda idx: np.ones((1, per), np.float32))
    f = jax.jit(lambda y: y.sum(axis=0, keepdims=True), in_shardings=sharded,
                out_shardings=NamedSharding(mesh, PartitionSpec())).lower(x).compile()
    return per * 4 / statistics.median(slowest_process(Timer(1, repeats).runs([f], [x])[0]))
