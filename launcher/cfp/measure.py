"""Running whole-model plans: the searched plan, the uniform plans, and the built-in baselines.

Every run trains the real model on its real data (``models.train``'s state, optimizer and
batches, so the losses are those ``mode=train`` gives for the same seed). Plans are compiled
first (``Runner``), then timed in interleaved rounds (``race``): ``repeats`` rounds in which every
plan runs ``iterations`` steps, each step timed alone (batch generation excluded), after one
warm-up step. Interleaving matters on a shared machine: a plan timed while the load is high
and another while it is low would compare the load, not the plans; a round the hypervisor
interrupted (steal time, ``quiet.py``) is run again. A round's cost is the mean of its steps and
the median round counts; TFLOPS divide the model's analytic FLOPs per step by it. Memory is per
device, from XLA's buffer assignment (``models.train.memory_stats``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from launcher import jaxcompat
from launcher.cfp.analysis import Analysis
from launcher.cfp.apply import whole_step
from launcher.cfp.quiet import quiet
from launcher.errors import UserError


@dataclass
class PlanRun:
    name: str
    repeat_times_s: list[float]          # mean step time of each round
    losses: list[float]
    memory_bytes: int
    flops: float
    compile_time_s: float
    compiled: Any = field(default=None, repr=False)

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


class Runner:
    """A compiled training step with its state, ready to be timed step by step."""

    def __init__(self, name: str, compiled: Any, state: Any, make_batch: Any, program: Any, seed: int,
                 first_step: int, memory_bytes: int, compile_time_s: float, losses: Sequence[float] = ()) -> None:
        self.name, self.compiled, self.state, self.make_batch = name, compiled, state, make_batch
        self.program, self.seed, self.step_no = program, seed, first_step
        self.memory_bytes, self.compile_time_s = memory_bytes, compile_time_s
        self.losses, self.rounds = list(losses), []
        self.candidate: Any = None  # the search.Candidate it runs, when it runs one

    def steps(self, n: int, progress: Any = None) -> list[float]:
        import jax

        from models.train import data_key

        times = []
        # The batch goes where the compiled step takes it: with 0.4.35, a batch program jitted
        # for one plan's layout was seen to hand another plan's runner a batch in its own layout.
        layout = self.compiled.input_shardings[0][1]
        for _ in range(n):
            batch = jax.block_until_ready(jax.device_put(self.make_batch(data_key(self.seed, self.step_no)), layout))
            t = time.perf_counter()
            self.state, loss = self.compiled(self.state, batch)
            self.losses.append(float(loss))  # the replicated loss: fetching it waits for the step
            times.append(time.perf_counter() - t)
            self.step_no += 1
            if progress is not None:
                progress.advance()
        return times

    def result(self) -> PlanRun:
        return PlanRun(self.name, self.rounds, self.losses, self.memory_bytes,
                       float(self.program.model.flops_per_step()), self.compile_time_s, self.compiled)


def plan_runner(a: Analysis, program: Any, assignment: Mapping[int, int], mesh: Any, *, seed: int = 0,
                name: str = "cfp") -> Runner:
    """``program`` (a TrainingProgram) compiled under a block-plan assignment."""
    import jax

    from models.train import data_key, init_state, memory_stats

    step, in_sh, out_sh = whole_step(a, assignment, mesh)
    t0 = time.perf_counter()
    state = jax.jit(lambda k: init_state(program.model, program.optimizer, k), out_shardings=in_sh[0])(
        jax.random.key(seed))
    make_batch = jax.jit(program.model.make_batch, out_shardings=in_sh[1])
    compiled = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=0).lower(
        state, make_batch(data_key(seed, 0))).compile()
    return Runner(name, compiled, state, make_batch, program, seed, 0, memory_stats(compiled)["peak_bytes"],
                  time.perf_counter() - t0)


def baseline_runner(program: Any, plan_name: str, devices: Sequence[Any], *, seed: int = 0) -> Runner:
    """A built-in plan (``models.plans``), set up and compiled by ``models.train.run_training``
    (one step); raises UserError when the plan does not fit the model or the devices."""
    import jax

    from models.plans import builtin
    from models.train import run_training

    r = run_training(program.model, builtin(plan_name), 1, devices, optimizer=program.optimizer, seed=seed)
    make_batch = jax.jit(program.model.make_batch, out_shardings=r.shardings.batch)
    return Runner(plan_name, r.compiled, r.state, make_batch, program, seed, 1, r.peak_memory_bytes,
                  r.compile_time_s, r.losses)


def race(runners: Sequence[Runner], *, iterations: int, repeats: int, progress: Any = None) -> list[PlanRun]:
    """One warm-up step each, then ``repeats`` rounds of ``iterations`` steps of every runner. A
    round the hypervisor interrupted is run again (``quiet.py``; training goes on meanwhile, so
    the losses stay those of consecutive steps)."""
    for r in runners:
        if r.step_no == 0:
            r.steps(1)
            jaxcompat.settle_programs()
    for _ in range(repeats):
        attempts = 0

        def one_round() -> list[float]:
            nonlocal attempts
            attempts += 1
            bar = progress if attempts == 1 else None  # the bar counts a round once, however often it runs
            means = []
            for r in runners:
                means.append(statistics.mean(r.steps(iterations, bar)))
                jaxcompat.settle_programs()  # the next runner's step is another program
            return means

        for r, seconds in zip(runners, quiet(one_round)):
            r.rounds.append(seconds)
    return [r.result() for r in runners]


def run_plan(a: Analysis, program: Any, assignment: Mapping[int, int], mesh: Any, *, iterations: int,
             repeats: int, seed: int = 0, name: str = "cfp", progress: Any = None) -> PlanRun:
    runner = plan_runner(a, program, assignment, mesh, seed=seed, name=name)
    return race([runner], iterations=iterations, repeats=repeats, progress=progress)[0]


def pick(a: Analysis, program: Any, mesh: Any, shortlist: Sequence[Any], *, iterations: int, repeats: int = 3,
         seed: int = 0, progress: Any = None) -> tuple[Runner, list[dict]]:
    """The fastest of ``shortlist`` (``search.Candidate``s, the search's optimum first) measured
    on the whole step: ``repeats`` interleaved rounds of ``iterations`` steps each, the one
    with the least ``paired_ratios`` wins. Every process measures every candidate and the
    slowest process's round times decide, so all processes pick the same plan. Returns the
    chosen runner (compiled, rounds cleared, its ``candidate`` set) and a row per candidate."""
    from launcher.cfp.timing import slowest_process

    runners = [plan_runner(a, program, dict(enumerate(c.assignment)), mesh, seed=seed) for c in shortlist]
    measured: list[float | None] = [None] * len(runners)
    ratios: list[float | None] = [None] * len(runners)
    best = 0
    if len(runners) > 1:
        race(runners, iterations=iterations, repeats=repeats, progress=progress)
        slowest = slowest_process([t for r in runners for t in r.rounds])
        rounds = [slowest[i * repeats:(i + 1) * repeats] for i in range(len(runners))]
        measured = [statistics.median(ts) for ts in rounds]
        ratios = paired_ratios(rounds)
        best = min(range(len(runners)), key=lambda i: ratios[i])
    chosen = runners[best]
    chosen.rounds = []  # the short rounds choose; they are not the searched plan's timing
    chosen.candidate = shortlist[best]
    rows = [{"assignment": list(c.assignment), "source": c.source, "predicted_step_time_s": c.predicted_time_s,
             "predicted_memory_gb": c.predicted_memory_bytes / 2**30, "measured_step_time_s": seconds,
             "paired_ratio": ratio, "chosen": i == best, "search_optimum": i == 0}
            for i, (c, seconds, ratio) in enumerate(zip(shortlist, measured, ratios))]
    return chosen, rows


def paired_ratios(rounds: Sequence[Sequence[float]]) -> list[float]:
    """Per plan (its time in each round), the median over rounds of its time over that round's
    median plan time. The plans of a round run minutes apart at most, those of different rounds
    further: on a machine whose speed drifts, ratios within a round compare plans where medians
    of raw times would compare the moments they ran at."""
    per_round = [statistics.median(times) for times in zip(*rounds)]
    return [statistics.median(t / m for t, m in zip(times, per_round)) for times in rounds]


BASELINES = ("dp", "tp", "fsdp", "dp_tp", "ep")


def baseline_runners(program: Any, devices: Sequence[Any], *, seed: int, log: Any,
                     names: Sequence[str] = BASELINES) -> tuple[list[Runner], dict[str, str]]:
    """Every built-in plan that fits; the others with the reason they do not."""
    runners, skipped = [], {}
    for name in names:
        try:
            runners.append(baseline_runner(program, name, devices, seed=seed))
        except UserError as e:
            skipped[name] = str(e)
            log(f"baseline {name}: skipped ({e})")
    return runners, skipped


def communication_study(a: Analysis, program: Any, mesh: Any, *, iterations: int, repeats: int, seed: int,
                        log: Any) -> list[dict]:
    """Every uniform plan (all blocks on plan k, or their last plan) of the whole step: the
    collective volume of its compiled program, the time spent communicating and the step time.

    The CPU backend's profiler trace does not separate collectives from computation, so the
    communication time is an estimate: collective bytes over the all-reduce bandwidth measured
    on the same mesh (each row says so)."""
    from launcher.cfp.comm import collectives, total_bytes

    bandwidth = allreduce_bandwidth(mesh)
    log(f"all-reduce bandwidth on the mesh: {bandwidth / 1e9:.3f} GB/s per device")
    rows = []
    for k in range(max(b.num_plans for b in a.blocks)):
        assignment = {b.id: min(k, b.num_plans - 1) for b in a.blocks}
        r = run_plan(a, program, assignment, mesh, iterations=iterations, repeats=repeats, seed=seed,
                     name=f"uniform{k}")
        stats = collectives(r.compiled.as_text())
        volume = total_bytes(stats)
        comm = volume / bandwidth
        rows.append({"plan": k, "comm_volume_bytes": volume, "collectives": stats, "step_time_s": r.step_time_s,
                     "comm_time_s": comm, "compute_time_s": max(r.step_time_s - comm, 0.0),
                     "comm_time_method": "estimate: collective bytes / measured all-reduce bandwidth",
                     "memory_gb": r.memory_bytes / 2**30})
        log(f"Uniform plan {k}: Comm Volume: {volume / 1e6:.3f} MB, comm time {comm:.6f} s (estimate), "
            f"compute {rows[-1]['compute_time_s']:.6f} s, step {r.step_time_s:.6f} s")
    return rows


def allreduce_bandwidth(mesh: Any, mib: float = 4.0, repeats: int = 5) -> float:
    """Bytes per second per device of an all-reduce over every device of ``mesh``."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from launcher.cfp.timing import Timer, slowest_process

    n = mesh.devices.size
    per = max(int(mib * 2**20 / 4), 1)
    sharded = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    x = jax.make_array_from_callback((n, per), sharded, lambda idx: np.ones((1, per), np.float32))
    f = jax.jit(lambda y: y.sum(axis=0, keepdims=True), in_shardings=sharded,
                out_shardings=NamedSharding(mesh, PartitionSpec())).lower(x).compile()
    return per * 4 / statistics.median(slowest_process(Timer(1, repeats).runs([f], [x])[0]))
