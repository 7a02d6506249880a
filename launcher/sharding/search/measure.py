"""Running whole-model plans: the runners the race times (``race.py``), for the searched plan, the
shortlist's plans and the baselines.

A built-in model's plan runs on the trainer ``mode=train`` uses (``Runner``: a
``models.train.Trainer``, the same state, optimizer, batches and step timing, so the losses are
those ``mode=train`` gives for the same seed); a searched plan's layouts reach it as a step
transform (``apply.assignment_transform``). A user's own step (no model protocol) runs on
``StepRunner``, with the same interface: its example arguments laid out by the plan, the state it
returns fed back as the next step's (the data stay the example batch), each step timed alone; its
baselines are dp, fsdp and the user's own shardings. Which runner a plan gets, the program says
(``TrainingProgram.plan_runner``, ``baseline_runner``: ``model_program.py``, ``user/step.py``), so
this module imports nothing of the user's folder. Memory is per device, from XLA's buffer
assignment (``models.train.memory_stats``); TFLOPS divide the FLOPs per step by a round's time.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

import jax
from jax.sharding import NamedSharding, PartitionSpec

from launcher.sharding.analysis.core import Analysis
from launcher.errors import BAD_INPUT
from launcher.models.plans import Plan
from launcher.models.train import CompiledStep, StepTransform, Trainer
from launcher.runtime import compile_share

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
