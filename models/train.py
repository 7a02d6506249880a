"""The trainer: a model's training step compiled once under a plan, then run step by step.

``Trainer`` builds the mesh and shardings from the plan, initializes the state on them,
compiles ``step(state, batch) -> (state, loss)`` (``step.py``) with the plan's activation rules
active while tracing, and ``steps(n)`` runs n more steps, timing each alone (batch generation
excluded). mode=train runs it once (``run_training``); the CFP search races several (its
whole-step measurements). Batches come from ``model.make_batch`` on a key derived from the seed
and the step number, compiled with the plan's input shardings, so every process computes
exactly its own shards of the same global batch whatever the number of devices or processes.

A plan can be laid out by something the plan's rules cannot say: ``transform_step`` (a
``StepTransform``) gets the step, the shapes of its arguments and the mesh, and returns the step
to compile with its input and output shardings. The launcher's CFP passes one for a plan the
search wrote (per-operator layouts in the plan's ``constraints``), which this package cannot
read itself.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from .base import check_model
from .errors import ModelError
from .plans import Plan, Shardings
from .sharding import use_rules
from .step import data_key, init_state, make_optimizer, make_train_step

# (step, (state_shapes, batch_shapes), mesh) -> (step, (state_shardings, batch_shardings), out_shardings)
StepTransform = Callable[[Callable, tuple, Any], tuple[Callable, tuple, Any]]


class CompiledStep:
    """A training step compiled once and run step by step (``steps``), its losses kept: what a
    model's ``Trainer`` and a user's step runner (``launcher/sharding/search/measure.py``)
    share. A subclass compiles in ``__init__`` through ``_compile`` and runs one step in
    ``_one_step``."""

    def _compile(self, lower: Callable[[], Any], since: Optional[float] = None) -> None:
        """``lower()``'s program compiled (``compile_program``), the step count reset. Its compile
        time counts from ``since`` (what was made for it first counts too)."""
        t0 = time.perf_counter() if since is None else since
        self._program = self.compile_program(lower)
        self._lowering_s = time.perf_counter() - t0 - self._program.compile_s_here
        self._memory: Optional[dict[str, int]] = None
        self.step_no = 0
        self.losses: list[float] = []

    def compile_program(self, lower: Callable[[], Any]) -> Any:
        """The program ``lower()`` lowers, compiled, as an object whose ``result()`` is the
        ``jax.stages.Compiled``, ``compile_s`` XLA's seconds and ``compile_s_here`` those spent
        in this call: here and now. A subclass may have it lowered and compiled elsewhere and
        loaded at the first ``result()`` (the launcher's search shares its compiles among a
        job's processes), so nothing here asks for the program before it is used."""
        return _CompiledHere(lower)

    @property
    def compiled(self) -> Any:
        return self._program.result()

    @property
    def compile_time_s(self) -> float:
        return self._lowering_s + self._program.compile_s

    @property
    def memory(self) -> dict[str, int]:
        if self._memory is None:
            self._memory = memory_stats(self._program)  # its compiler's analysis, wherever it was compiled
        return self._memory

    @property
    def peak_memory_bytes(self) -> int:
        return self.memory["peak_bytes"]

    def steps(self, n: int, progress: Any = None) -> list[float]:
        """Runs the next ``n`` steps; the seconds of each. The losses go to ``losses``;
        ``progress`` (anything with ``advance()``) ticks once per step."""
        times = []
        for _ in range(n):
            times.append(self._one_step())
            self.step_no += 1
            if progress is not None:
                progress.advance()
        return times

    def _one_step(self) -> float:
        raise NotImplementedError


class Trainer(CompiledStep):
    """``model``'s training step under ``plan`` on ``devices`` (default: all global devices),
    compiled once, with its state; ``steps(n)`` runs the next n steps. Every process of a
    multi-process job must build it with the same arguments and run the same steps."""

    def __init__(self, model: Any, plan: Plan, devices: Optional[Sequence[jax.Device]] = None, *,
                 optimizer: Optional[optax.GradientTransformation] = None, learning_rate: float = 1e-3,
                 seed: int = 0, transform_step: Optional[StepTransform] = None) -> None:
        check_model(model)
        if plan.constraints and transform_step is None:
            raise ModelError(f"plan {plan.name!r} carries per-operator layouts (constraints) that only a step "
                             "transform can apply: run it with mode=train, which passes the CFP one")
        devices = list(devices) if devices is not None else jax.devices()
        self.model, self.plan, self.seed = model, plan, seed
        self.optimizer = optimizer if optimizer is not None else make_optimizer(learning_rate)
        self.mesh = mesh = plan.mesh(devices)
        sh = plan.shardings(model, mesh, self.optimizer)
        step_fn, out_shardings = make_train_step(model, self.optimizer), (sh.state, NamedSharding(mesh, PartitionSpec()))
        if transform_step is not None:
            shapes = (jax.eval_shape(lambda k: init_state(model, self.optimizer, k), jax.random.key(0)),
                      jax.eval_shape(model.make_batch, jax.random.key(0)))
            step_fn, (state_sh, batch_sh), out_shardings = transform_step(step_fn, shapes, mesh)
            sh = Shardings(params=state_sh["params"], state=state_sh, batch=batch_sh, mesh=mesh)
        self.shardings = sh

        # Three programs (the state's initialisation, the batches, the step), each given to
        # ``compile_program`` before any runs: the step is lowered for the state and batch's
        # types and layouts, and the state is made at its first use (``state``).
        t0 = time.perf_counter()
        key = jax.random.key(seed)
        init = jax.jit(lambda k: init_state(model, self.optimizer, k), out_shardings=sh.state)
        batch = jax.jit(model.make_batch, out_shardings=sh.batch)
        self._init = self.compile_program(lambda: init.lower(key))
        self._batch = self.compile_program(lambda: batch.lower(key))
        self._state: Any = None
        typed = lambda shapes, shardings: jax.tree.map(  # noqa: E731
            lambda s, where: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=where), shapes, shardings)
        step = jax.jit(step_fn, in_shardings=(sh.state, sh.batch), out_shardings=out_shardings, donate_argnums=0)

        def lower() -> Any:
            args = (typed(jax.eval_shape(init, key), sh.state), typed(jax.eval_shape(batch, key), sh.batch))
            with use_rules(mesh, plan.rules_for("activations")):  # constrain() reads the rules while tracing
                return step.lower(*args)

        self._compile(lower, since=t0)

    @property
    def state(self) -> dict:
        """The training state (parameters and optimizer state), laid out as the step takes it."""
        if self._state is None:
            self._state = self._init.result()(jax.random.key(self.seed))
        return self._state

    @state.setter
    def state(self, value: dict) -> None:
        self._state = value

    def make_batch(self, key: Any) -> Any:
        """The model's batch for ``key``, laid out as the plan lays batches out."""
        return self._batch.result()(key)

    def load_state(self, state: dict, step_no: int, losses: Sequence[float] = ()) -> None:
        """Continues from a saved run: ``state`` (laid out as ``self.state``, e.g. restored from
        a checkpoint into its shardings) after ``step_no`` steps, whose ``losses`` they were.
        The next step's batch is step ``step_no``'s, as in the run that saved it."""
        if jax.tree.structure(state) != jax.tree.structure(self.state):
            raise ModelError("load_state: the state's structure is not this trainer's (another model or optimizer)")
        self.state, self.step_no, self.losses = state, step_no, list(losses)

    def _one_step(self) -> float:
        """One step; its seconds, batch generation excluded."""
        # The batch goes where the compiled step takes it: with 0.4.35, a batch program jitted
        # for one plan's layout was seen to hand another plan's trainer a batch in its own layout.
        layout = self.compiled.input_shardings[0][1]
        batch = jax.block_until_ready(jax.device_put(self.make_batch(data_key(self.seed, self.step_no)), layout))
        t = time.perf_counter()
        self.state, loss = self.compiled(self.state, batch)
        self.losses.append(float(loss))  # the replicated loss: fetching it waits for the step
        return time.perf_counter() - t


class _CompiledHere:
    def __init__(self, lower: Callable[[], Any]) -> None:
        lowered = lower()
        t0 = time.perf_counter()
        self.program = lowered.compile()
        self.compile_s = self.compile_s_here = time.perf_counter() - t0

    def result(self) -> Any:
        return self.program

    def memory_analysis(self) -> Any:
        return self.program.memory_analysis()


@dataclass
class TrainingResult:
    losses: list[float]
    step_times_s: list[float]
    compile_time_s: float
    peak_memory_bytes: int  # per device, from XLA's buffer assignment of the compiled step
    memory: dict[str, int]
    shardings: Shardings
    compiled: Any  # jax.stages.Compiled of the step
    state: dict = field(repr=False)

    def median_step_time(self, warmup_steps: int = 0) -> float:
        times = self.step_times_s[warmup_steps:] or self.step_times_s
        return statistics.median(times)


def run_training(model: Any, plan: Plan, steps: int, devices: Optional[Sequence[jax.Device]] = None, *,
                 optimizer: Optional[optax.GradientTransformation] = None, learning_rate: float = 1e-3,
                 seed: int = 0, progress: Any = None, transform_step: Optional[StepTransform] = None) -> TrainingResult:
    """Trains ``model`` for ``steps`` steps on ``devices`` (default: all global devices) laid
    out by ``plan`` (``Trainer``); ``progress`` (anything with ``advance()``) ticks once per step.
    Every process of a multi-process job must call this with the same arguments.
    """
    check_model(model)
    if steps < 1:
        raise ModelError(f"steps={steps}: must be at least 1")
    trainer = Trainer(model, plan, devices, optimizer=optimizer, learning_rate=learning_rate, seed=seed,
                      transform_step=transform_step)
    times = trainer.steps(steps, progress)
    return TrainingResult(losses=trainer.losses, step_times_s=times, compile_time_s=trainer.compile_time_s,
                          peak_memory_bytes=trainer.peak_memory_bytes, memory=trainer.memory,
                          shardings=trainer.shardings, compiled=trainer.compiled, state=trainer.state)


def memory_stats(compiled: Any) -> dict[str, int]:
    """Per-device bytes from XLA's memory analysis of a compiled executable (anything with
    ``jax.stages.Compiled``'s ``memory_analysis()``).

    ``peak_bytes`` = arguments + outputs + temporaries - aliased (donated) bytes: everything
    the step holds at once by XLA's buffer assignment. (XLA's own ``peak_memory_in_bytes``
    is not used: on CPU it comes out below the temporaries alone.)
    """
    m = compiled.memory_analysis()
    if m is None:  # some backends do not report
        return {"peak_bytes": 0}
    stats = {k: int(getattr(m, f"{k}_size_in_bytes", 0)) for k in ("argument", "output", "temp", "alias")}
    stats["peak_bytes"] = stats["argument"] + stats["output"] + stats["temp"] - stats["alias"]
    return stats
