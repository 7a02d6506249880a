"""The program CFP works on: a model's whole training step, as shapes (nothing is allocated).

Any object with the model protocol (``models/base.py``) works, user models included; the step
is ``models.train.make_train_step`` with the optimizer ``models.train.make_optimizer`` builds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class TrainingProgram:
    model: Any
    optimizer: Any
    step: Callable[[Any, Any], Any]
    state_shapes: Any   # ShapeDtypeStruct pytree of {"params", "opt_state"}
    batch_shapes: Any

    @property
    def args(self) -> tuple[Any, Any]:
        return (self.state_shapes, self.batch_shapes)


def training_program(model: Any, learning_rate: float = 1e-3) -> TrainingProgram:
    import jax

    from launcher.models.base import check_model
    from launcher.models.train import init_state, make_optimizer, make_train_step

    check_model(model)
    optimizer = make_optimizer(learning_rate)
    state = jax.eval_shape(lambda k: init_state(model, optimizer, k), jax.random.key(0))
    batch = jax.eval_shape(model.make_batch, jax.random.key(0))
    return TrainingProgram(model, optimizer, make_train_step(model, optimizer), state, batch)
