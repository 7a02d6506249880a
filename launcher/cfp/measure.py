"""Running whole-model plans: the searched plan, the uniform plans, and the built-in baselines.

Every run trains the real model on its real data (``models.train``'s state, optimizer and
batches, so the losses are those ``mode=train`` gives for the same seed): ``repeats`` repeats of
``iterations`` steps after one warm-up step, each step timed alone (batch generation excluded).
A repeat's cost is the mean of its steps; TFLOPS divide the model's analytic FLOPs per step by
it. Memory is per device, from XLA's buffer assignment (``models.train.memory_stats``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from launcher.cfp.analysis import Analysis
from launcher.cfp.apply import whole_step
from launcher.errors import UserError


@dataclass
class PlanRun:
    name: str
    repeat_times_s: list[float]          # mean step time of each repeat
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


def run_plan(a: Analysis, program: Any, assignment: Mapping[int, int], mesh: Any, *, iterations: int,
             repeats: int, seed: int = 0, name: str = "cfp", progress: Any = None) -> PlanRun:
    """Trains ``program`` (a TrainingProgram) under a block-plan assignment."""
    import jax

    from models.train import data_key, init_state, memory_stats

    step, in_sh, out_sh = whole_step(a, assignment, mesh)
    t0 = time.perf_counter()
    state = jax.jit(lambda k: init_state(program.model, program.optimizer, k), out_shardings=in_sh[0])(
        jax.random.key(seed))
    make_batch = jax.jit(program.model.make_batch, out_shardings=in_sh[1])
    compiled = jax.jit(step, in_shardings=in_sh, out_shardings=out_sh, donate_argnums=0).lower(
        state, make_batch(data_key(seed, 0))).compile()
    compile_time = time.perf_counter() - t0

    def one(i: int) -> tuple[float, float]:
        nonlocal state
        batch = jax.block_until_ready(make_batch(data_key(seed, i)))
        t = time.perf_counter()
        state, loss = compiled(state, batch)
        loss = float(loss)  # the replicated loss: fetching it waits for the step
        return time.perf_counter() - t, loss

    return _loop(name, one, iterations, repeats, memory_stats(compiled)["peak_bytes"], program.model,
                 compile_time, compiled, progress)


def run_baseline(program: Any, plan_name: str, devices: Sequence[Any], *, iterations: int, repeats: int,
                 seed: int = 0, progress: Any = None) -> PlanRun:
    """A built-in plan (``models.plans``) through ``models.train.run_training``; raises UserError
    when the plan does not fit the model or the devices."""
    from models.plans import builtin
    from models.train import run_training

    steps = 1 + iterations * repeats
    r = run_training(program.model, builtin(plan_name), steps, devices, optimizer=program.optimizer, seed=seed,
                     progress=progress)
    times = r.step_times_s[1:]
    per_repeat = [statistics.mean(times[k * iterations:(k + 1) * iterations]) for k in range(repeats)]
    return PlanRun(plan_name, per_repeat, r.losses, r.peak_memory_bytes, float(program.model.flops_per_step()),
                   r.compile_time_s, r.compiled)


def _loop(name: str, one: Any, iterations: int, repeats: int, memory: int, model: Any, compile_time: float,
          compiled: Any, progress: Any) -> PlanRun:
    losses, per_repeat = [], []
    dt, loss = one(0)  # warm-up
    losses.append(loss)
    i = 1
    for _ in range(repeats):
        times = []
        for _ in range(iterations):
            dt, loss = one(i)
            times.append(dt)
            losses.append(loss)
            i += 1
            if progress is not None:
                progress.advance()
        per_repeat.append(statistics.mean(times))
    return PlanRun(name, per_repeat, losses, memory, float(model.flops_per_step()), compile_time, compiled)


BASELINES = ("dp", "tp", "fsdp", "dp_tp", "ep")


def baselines(program: Any, devices: Sequence[Any], *, iterations: int, repeats: int, seed: int, log: Any,
              names: Sequence[str] = BASELINES) -> tuple[dict[str, PlanRun], dict[str, str]]:
    """Every built-in plan that fits; the others with the reason they do not."""
    runs, skipped = {}, {}
    for name in names:
        try:
            runs[name] = run_baseline(program, name, devices, iterations=iterations, repeats=repeats, seed=seed)
            log(f"baseline {name}: step {runs[name].step_time_s * 1e3:.3f} ms, "
                f"{runs[name].memory_bytes / 2**20:.2f} MiB per device")
        except UserError as e:
            skipped[name] = str(e)
            log(f"baseline {name}: skipped ({e})")
    return runs, skipped
