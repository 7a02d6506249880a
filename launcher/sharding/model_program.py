"""A built-in model's program (the model protocol, ``models/base.py``): the ``TrainingProgram``
its plans run on the models' trainer (``search/measure.py: Runner``, what ``mode=train`` runs),
whose baselines are the built-in plans (``models/plans.py``), laid out by the model's logical
axes. A user's step is the interface's other kind (``user/step.py: StepProgram``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import jax

from launcher.models.base import check_model
from launcher.models.plans import Plan, builtin
from launcher.models.train import init_state, make_optimizer, make_train_step
from launcher.sharding.apply import across_of, assignment_transform
from launcher.sharding.program import TrainingProgram
from launcher.sharding.search.measure import Runner
from launcher.sharding.search.nearest import builtin_layouts, builtin_references

if TYPE_CHECKING:
    from launcher.sharding.analysis.core import Analysis
    from launcher.sharding.analysis.references import Reference
    from launcher.sharding.analysis.strategies import Spec


class ModelProgram(TrainingProgram):
    """The program of a model of the protocol (``training_program``)."""

    def plan_runner(self, a: Analysis, assignment: Mapping[int, int], mesh: jax.sharding.Mesh, *, seed: int = 0,
                    name: str = "searched", stored: frozenset = frozenset()) -> Runner:
        # No rules of its own: the assignment's layouts reach the trainer's step as a transform.
        plan = Plan(name, tuple(zip(mesh.axis_names, mesh.devices.shape, strict=True)),
                    {"params": {}, "activations": {}, "inputs": {}}, across=across_of(mesh))
        return Runner(name, self, plan, list(mesh.devices.flat), seed=seed,
                      transform_step=assignment_transform(a, assignment, stored))

    def baseline_runner(self, name: str, devices: Sequence[jax.Device], *, seed: int = 0) -> Runner:
        return Runner(name, self, builtin(name), devices, seed=seed)

    def baseline_layouts(self, a: Analysis, name: str, devices: Sequence[jax.Device]) -> Optional[dict[int, Spec]]:
        return builtin_layouts(a, self, builtin(name))

    def references(self, natural_only: bool) -> Optional[Callable[..., dict[str, Reference]]]:
        # The built-in plans' layouts, so that the blocks offer them (analysis/references.py).
        return builtin_references(self, natural_only=natural_only)


def training_program(model: Any, learning_rate: float = 1e-3) -> ModelProgram:
    check_model(model)
    optimizer = make_optimizer(learning_rate)
    state = jax.eval_shape(lambda k: init_state(model, optimizer, k), jax.random.key(0))
    batch = jax.eval_shape(model.make_batch, jax.random.key(0))
    return ModelProgram(make_train_step(model, optimizer), (state, batch), model=model, optimizer=optimizer,
                        data_argnums=(1,), feeds_back=(0,), name=type(model).__name__)
