"""The program CFP works on: a training step and the shapes of its arguments.

Two builders make one: ``training_program(model)`` from the model protocol (``models/base.py``:
the step is ``models.train.make_train_step`` with the optimizer ``models.train.make_optimizer``
builds, its arguments ``(state, batch)``), and ``step_program(step_fn, args)`` from any function a
user jits (Flax, Equinox, plain JAX: ``launcher/sharding/user/step.py``, a ``StepProgram``). Every
pass takes either; what differs is how a plan of it is run (``search/measure.py``: the models'
trainer, or ``StepRunner`` on the step's own arguments) and which baselines it has (the built-in
plans need the model's logical axes; a user's step gets dp, fsdp and its own shardings), which a
``StepProgram`` answers itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax

from launcher.models.base import check_model
from launcher.models.train import init_state, make_optimizer, make_train_step


@dataclass
class TrainingProgram:
    step: Callable[..., Any]   # of array pytrees: a user's step has its other leaves closed over
    args: tuple                # ShapeDtypeStruct pytrees, one per argument of ``step``
    model: Any = None          # the model protocol's object, when built from one
    optimizer: Any = None      # the model's optimizer (optax), likewise
    # Which arguments are data: the dp baseline splits their leading dimension; the others are
    # state (parameters, optimizer state), which fsdp splits.
    data_argnums: tuple[int, ...] = (1,)
    # A user's step: the arguments given (arrays; None: shapes only), the state arguments whose
    # new values the step returns first (``state, loss = step(state, batch)``: (0,)), the shapes
    # of what it returns, which of their leaves is the loss, its FLOPs, the user's own shardings
    # of the arguments (raced as the "user" baseline), its name and signature. user/step.py
    # fills them.
    values: Optional[tuple] = None
    feeds_back: tuple[int, ...] = ()
    out_shapes: Any = None
    loss_leaf: Optional[int] = None
    flops: float = 0.0
    in_shardings: Any = None
    name: str = "step"
    signature: str = ""        # of its traced step (apply.program_signature): what a plan is checked against
    reading: Any = None        # how a user's step was read (reading.Reading): its arguments and outputs

    @property
    def is_model(self) -> bool:
        """Built from the model protocol (its plans are run by the models' trainer)."""
        return self.model is not None

    @property
    def flops_per_step(self) -> float:
        """Training FLOPs per step: the model's analytic count, or for a user's step twice the
        multiply-adds of its contractions (``user/step.py: contraction_flops``)."""
        return float(self.model.flops_per_step()) if self.model is not None else self.flops


def training_program(model: Any, learning_rate: float = 1e-3) -> TrainingProgram:
    check_model(model)
    optimizer = make_optimizer(learning_rate)
    state = jax.eval_shape(lambda k: init_state(model, optimizer, k), jax.random.key(0))
    batch = jax.eval_shape(model.make_batch, jax.random.key(0))
    return TrainingProgram(make_train_step(model, optimizer), (state, batch), model=model, optimizer=optimizer,
                           data_argnums=(1,), feeds_back=(0,), name=type(model).__name__)
