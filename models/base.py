"""The model protocol every mode relies on, and the base class the built-in models share.

A model is any object with the members of ``Model`` below; modes never look at which model
they run. A user model plugs in through ``model._target_=mypkg.MyModel`` with the same members
(``check_model`` says which one is missing). The built-in language models derive from
``LanguageModel``, which turns a config dataclass and a description of the parameters
(``param_specs``) into the whole protocol; a subclass writes ``param_specs``, ``forward`` and
its FLOP counts.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from .errors import ModelError
from . import data
from .layers import axes_of, init_params, is_spec


@runtime_checkable
class Model(Protocol):
    config: Any  # a dataclass with at least batch_size, seq_len, num_layers, dtype

    def init(self, rng: jax.Array) -> Any: ...  # parameter pytree (nested dicts)
    def loss(self, params: Any, batch: dict) -> jax.Array: ...  # scalar, auxiliary losses included
    def make_batch(self, rng: jax.Array) -> dict: ...  # synthetic data, a function of rng only
    def flops_per_step(self) -> float: ...  # analytic training FLOPs (forward + backward)
    def param_count(self) -> int: ...
    def param_axes(self) -> Any: ...  # like params, leaves are tuples of logical axis names
    def batch_axes(self) -> dict: ...  # like make_batch's output, leaves are logical axis tuples


PROTOCOL = ("config", "init", "loss", "make_batch", "flops_per_step", "param_count", "param_axes", "batch_axes")


def check_model(model: Any) -> None:
    """Raises ModelError naming what a (user) model lacks."""
    missing = [name for name in PROTOCOL if not hasattr(model, name)]
    if missing:
        raise ModelError(f"model {type(model).__module__}.{type(model).__name__} lacks {missing}; a model needs "
                        f"{list(PROTOCOL)} (see models/base.py: Model)")


class SpecModel:
    """What every built-in model shares: its config dataclass made from the ``model.*`` fields
    (refusing unknown ones) and checked as at composition, and the protocol's parameter members
    from a description of the parameters (``param_specs``)."""

    config_class: type = type(None)  # set by each subclass

    def __init__(self, **kwargs: Any) -> None:
        fields = {f.name for f in dataclasses.fields(self.config_class)} - {"_target_"}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            raise ModelError(f"{type(self).__name__}: unknown model field(s) {unknown}; valid fields: {sorted(fields)}")
        self.config = self.config_class(**kwargs)
        self._validate()

    @property
    def name(self) -> str:
        return type(self).__name__

    def _validate(self) -> None:
        # The schema's checks (models/configs.py), the same the launcher runs at composition.
        self.config_class.check(self.config)

    @property
    def dtype(self) -> Any:
        return jnp.dtype(self.config.dtype)

    @property
    def ffn(self) -> int:
        return self.config.ffn_dim or 4 * self.config.hidden

    def param_specs(self) -> Any:
        """The parameters as a pytree of ``layers.ParamSpec`` (shape, logical axes, init)."""
        raise NotImplementedError

    def init(self, rng: jax.Array) -> Any:
        return init_params(self.param_specs(), rng)

    def param_axes(self) -> Any:
        return axes_of(self.param_specs())

    def param_count(self) -> int:
        leaves = jax.tree.leaves(self.param_specs(), is_leaf=is_spec)
        return sum(math.prod(s.shape) for s in leaves)


class LanguageModel(SpecModel):
    """Shared protocol implementation for token-in, logits-out models."""

    causal: bool = True

    # --- what a subclass provides (and param_specs) -----------------------------------------

    def forward(self, params: Any, batch: dict) -> tuple[jax.Array, jax.Array]:
        """(logits (batch, seq, vocab), auxiliary loss already weighted, a scalar)."""
        raise NotImplementedError

    def flops_per_step(self) -> float:
        raise NotImplementedError

    def paper_flops_per_step(self) -> float:
        """FLOPs per step by the convention the CFP paper / Alpa report for this model family."""
        raise NotImplementedError

    # --- the rest of the protocol -----------------------------------------------------------

    def make_batch(self, rng: jax.Array) -> dict[str, jax.Array]:
        c = self.config
        return data.next_token_batch(rng, c.batch_size, c.seq_len, c.vocab_size)

    def batch_axes(self) -> dict:
        return {"tokens": ("batch", "seq"), "targets": ("batch", "seq")}

    def loss(self, params: Any, batch: dict) -> jax.Array:
        logits, aux = self.forward(params, batch)
        return cross_entropy(logits, batch["targets"], batch.get("weights")) + aux


def cross_entropy(logits: jax.Array, targets: jax.Array, weights: jax.Array | None = None) -> jax.Array:
    """Mean token cross-entropy, in float32; with ``weights`` a weighted mean.

    The target's log-probability is picked with a one-hot product rather than a gather, so a
    vocabulary split over devices costs an all-reduce of (batch, seq) sums, not an all-gather
    of the logits (Megatron's vocab-parallel cross-entropy).
    """
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    nll = -jnp.sum(jax.nn.one_hot(targets, logits.shape[-1], dtype=jnp.float32) * logp, axis=-1)
    if weights is None:
        return nll.mean()
    return jnp.sum(nll * weights) / jnp.maximum(jnp.sum(weights), 1.0)
