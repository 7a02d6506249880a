"""The program CFP works on: a training step and the shapes of its arguments.

One interface, two kinds. ``training_program(model)`` (``model_program.py: ModelProgram``) makes
one from the model protocol (``models/base.py``: the step is ``models.train.make_train_step`` with
the optimizer ``models.train.make_optimizer`` builds, its arguments ``(state, batch)``), and
``step_program(step_fn, args)`` (``user/step.py: StepProgram``) from any function a user jits
(Flax, Equinox, plain JAX). Every pass takes either, and what differs between them it asks of the
program (the methods below): how a plan of it is compiled to race (the models' trainer, or the
step on its own arguments), which baselines it has and how they lay it out (the built-in plans
need the model's logical axes; a user's step gets dp, fsdp and its own shardings), and which
layouts the analysis offers. No pass branches on which kind it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol, Sequence

if TYPE_CHECKING:
    import jax

    from launcher.sharding.analysis.core import Analysis
    from launcher.sharding.analysis.references import Reference
    from launcher.sharding.analysis.strategies import Spec


class CompiledPlan(Protocol):
    """A plan of a program compiled on its mesh, to race: ``search/measure.py``'s ``Runner`` (a
    model's) or ``StepRunner`` (a user's step's), its ``PlanRunner``. Named here by what the race
    asks of it, since the runners hold their program: this module imports none of them."""
    name: str
    compile_time_s: float

    def steps(self, n: int, progress: object = None) -> list[float]: ...


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
        """Built from the model protocol: its plan files are ``models.plans.Plan``s (a user's
        step's, ``AutoPlan``s: ``results.plan_files``, the one reader of this)."""
        return self.model is not None

    @property
    def flops_per_step(self) -> float:
        """Training FLOPs per step: the model's analytic count, or for a user's step twice the
        multiply-adds of its contractions (``user/step.py: contraction_flops``)."""
        return float(self.model.flops_per_step()) if self.model is not None else self.flops

    # -- what the passes ask of it, answered by its kind ----------------------------------------

    # Whether its baselines' layouts are of its inputs alone (a user's step: no logical axes to
    # lay out its activations), which the nearest plans carry through the step.
    layouts_inputs_only = False

    def plan_runner(self, a: Analysis, assignment: Mapping[int, int], mesh: jax.sharding.Mesh, *, seed: int = 0,
                    name: str = "searched", stored: frozenset = frozenset()) -> CompiledPlan:
        """Compiled under a block-plan assignment on ``mesh``, to race as ``name`` (``stored``:
        inputs kept split between steps, ``apply.plan_constraints``)."""
        raise NotImplementedError

    def baseline_runner(self, name: str, devices: Sequence[jax.Device], *, seed: int = 0) -> CompiledPlan:
        """Its baseline ``name`` compiled on ``devices`` (not yet run); ModelError or UserError
        where it has no such baseline, or it does not fit."""
        raise NotImplementedError

    def baseline_layouts(self, a: Analysis, name: str, devices: Sequence[jax.Device]) -> Optional[dict[int, Spec]]:
        """Var id (of ``a``'s graph) -> the layout its baseline ``name`` gives it on ``a``'s mesh
        (on ``devices``), or None where that baseline does not map (``search/nearest.py``)."""
        raise NotImplementedError

    def references(self, natural_only: bool) -> Optional[Callable[..., dict[str, Reference]]]:
        """What the analysis offers besides its own strategies: (graph, mesh shape) -> {baseline
        name: its layout} (``analysis.core.analyze``), or None."""
        return None
