"""The training step every plan runs: AdamW, the state ``{"params", "opt_state"}``, the step
function and the key of each step's batch. Plans (``plans.py``) and the trainer (``train.py``)
both build on it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax

from .errors import ModelError

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
        raise ModelError(f"learning_rate={opts['learning_rate']}: must be positive, e.g. 1e-3")
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
