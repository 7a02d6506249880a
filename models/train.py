"""Training any model under any plan: optimizer, state, step, and the loop mode=train runs.

The step is a pure function ``step(state, batch) -> (state, loss)`` over the state pytree
``{"params": ..., "opt_state": ...}``; ``run_training`` compiles it once with the plan's input
and output shardings (and the plan's activation rules active while tracing), then runs it. A
plan the CFP search wrote carries per-operator ``constraints`` instead of rules; the step is then
re-traced and re-evaluated with them applied (``launcher.cfp.apply.constrained_step``).
Batches come from ``model.make_batch`` on a key derived from the seed and the step number,
compiled with the plan's input shardings, so every process computes exactly its own shards of
the same global batch whatever the number of devices or processes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec

from launcher.errors import UserError
from models.base import check_model
from models.plans import Plan, Shardings
from models.sharding import use_rules

DEFAULTS = {"learning_rate": 1e-3, "weight_decay": 0.1, "b1": 0.9, "b2": 0.95, "grad_clip": 1.0}


def make_optimizer(cfg_or_lr: float | Mapping[str, Any] | Any = 1e-3) -> optax.GradientTransformation:
    """AdamW with global-norm gradient clipping; weight decay on matrices only (not on norms
    and biases, as in GPT-2 / nanoGPT).

    ``cfg_or_lr`` is a learning rate, or a mapping / object with any of ``learning_rate``,
    ``weight_decay``, ``b1``, ``b2``, ``grad_clip`` (0 disables clipping).
    """
    if isinstance(cfg_or_lr, (int, float)):
        opts = {**DEFAULTS, "learning_rate": float(cfg_or_lr)}
    else:
        get = cfg_or_lr.get if isinstance(cfg_or_lr, Mapping) else lambda k, d: getattr(cfg_or_lr, k, d)
        opts = {k: get(k, v) for k, v in DEFAULTS.items()}
    if not opts["learning_rate"] > 0:
        raise UserError(f"learning_rate={opts['learning_rate']}: must be positive, e.g. 1e-3")
    adamw = optax.adamw(opts["learning_rate"], b1=opts["b1"], b2=opts["b2"], weight_decay=opts["weight_decay"],
                        mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params))
    if opts["grad_clip"]:
        return optax.chain(optax.clip_by_global_norm(opts["grad_clip"]), adamw)
    return adamw


def init_state(model: Any, optimizer: optax.GradientTransformation, rng: jax.Array) -> dict:
    params = model.init(rng)
    return {"params": params, "opt_state": optimizer.init(params)}


def make_train_step(model: Any, optimizer: optax.GradientTransformation) -> Callable[[dict, dict], tuple[dict, jax.Array]]:
    def step(state: dict, batch: dict) -> tuple[dict, jax.Array]:
        loss, grads = jax.value_and_grad(model.loss)(state["params"], batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}, loss

    return step


def data_key(seed: int, step: int) -> jax.Array:
    """The key of step ``step``'s batch, a Threefry key with data words (seed + 1, step); the
    parameters use ``jax.random.key(seed)``, whose words are (0, seed). Built directly rather
    than by ``fold_in`` so no random kernel has to be compiled to make it."""
    return jax.random.wrap_key_data(jnp.array([(seed + 1) % 2**32, step % 2**32], jnp.uint32))


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
                 seed: int = 0, progress: Any = None, fixed_batch: bool = False) -> TrainingResult:
    """Trains ``model`` for ``steps`` steps on ``devices`` (default: all global devices) laid
    out by ``plan``; ``progress`` (anything with ``advance()``) ticks once per step.

    With ``fixed_batch`` every step sees the batch of step 0 (useful for overfitting checks).
    Every process of a multi-process job must call this with the same arguments.
    """
    check_model(model)
    if steps < 1:
        raise UserError(f"steps={steps}: must be at least 1")
    devices = list(devices) if devices is not None else jax.devices()
    optimizer = optimizer if optimizer is not None else make_optimizer(learning_rate)
    mesh = plan.mesh(devices)
    sh = plan.shardings(model, mesh, optimizer)
    replicated = NamedSharding(mesh, PartitionSpec())
    step_fn, out_shardings = make_train_step(model, optimizer), (sh.state, replicated)
    if plan.constraints:  # a searched (CFP) plan: per-operator layouts of the traced step
        step_fn, sh, out_shardings = _constrained(step_fn, model, optimizer, plan, sh, mesh)

    t0 = time.perf_counter()
    state = jax.jit(lambda k: init_state(model, optimizer, k), out_shardings=sh.state)(jax.random.key(seed))
    make_batch = jax.jit(model.make_batch, out_shardings=sh.batch)
    batch = make_batch(data_key(seed, 0))
    step = jax.jit(step_fn, in_shardings=(sh.state, sh.batch), out_shardings=out_shardings, donate_argnums=0)
    with use_rules(mesh, plan.rules_for("activations")):  # constrain() reads the rules while tracing
        compiled = step.lower(state, batch).compile()
    compile_time = time.perf_counter() - t0

    losses, times = [], []
    for i in range(steps):
        if i and not fixed_batch:
            batch = make_batch(data_key(seed, i))
        jax.block_until_ready(batch)
        t = time.perf_counter()
        state, loss = compiled(state, batch)
        losses.append(float(loss))  # fetching the replicated loss waits for the step
        times.append(time.perf_counter() - t)
        if progress is not None:
            progress.advance()

    memory = memory_stats(compiled)
    return TrainingResult(losses=losses, step_times_s=times, compile_time_s=compile_time,
                          peak_memory_bytes=memory["peak_bytes"], memory=memory, shardings=sh,
                          compiled=compiled, state=state)


def _constrained(step: Callable, model: Any, optimizer: Any, plan: Plan, sh: Shardings,
                 mesh: Any) -> tuple[Callable, Shardings, Any]:
    """The step under ``plan.constraints`` (keys are operator ids of the traced step, as the CFP
    search writes them), with the state and batch laid out as the plan's ``in:`` entries say."""
    from launcher.cfp.apply import constrained_step

    state_shapes = jax.eval_shape(lambda k: init_state(model, optimizer, k), jax.random.key(0))
    batch_shapes = jax.eval_shape(model.make_batch, jax.random.key(0))
    fn, (state_sh, batch_sh), out_sh = constrained_step(step, (state_shapes, batch_shapes), plan.constraints,
                                                        mesh, plan=plan.name)
    return fn, Shardings(params=state_sh["params"], state=state_sh, batch=batch_sh, mesh=mesh), out_sh


def memory_stats(compiled: Any) -> dict[str, int]:
    """Per-device bytes from XLA's memory analysis of a compiled executable.

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
