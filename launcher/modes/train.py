"""mode=train: trains the configured model for ``mode.steps`` steps under a sharding plan over
every global device, and reports losses, step time, throughput and memory.

    python -m launcher mode=train model=gpt-tiny mode.plan=dp_tp mode.mesh_axes={model:4}

``mode.plan`` is a built-in plan (dp, tp, fsdp, dp_tp, ep), a search's run dir (its plan.json:
``launcher.after=<that run dir>`` waits for the search to end), or the path of a plan JSON file
(the format ``models/plans.py`` documents; the search writes the same, with its per-operator
layouts in ``constraints``, which apply to the model and optimizer settings it was searched for:
``launcher.sharding.apply.constraints_transform`` hands them to ``models.train`` as a step transform).

``mode.checkpoint_every=N`` saves the training state every N steps (and after the last) into
``<run dir>/checkpoints/`` (``launcher/runtime/checkpoint.py``); a run whose run dir holds a
checkpoint resumes from the newest (``mode.resume``), as a requeued SLURM job does, and goes on
with exactly the losses the uninterrupted run has. ``launcher/modes/runs/train.py`` runs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional

from launcher.errors import UserError
from launcher.figures import Figure, Figures, devices, mib, seconds
from launcher.modes.base import ModeConfig


@dataclass
class Config(ModeConfig):
    name: str = "train"
    code: str = "train"
    steps: int = 20
    plan: str = "dp"  # dp | tp | fsdp | dp_tp | ep | path/to/plan.json | a search's run dir
    mesh_axes: Dict[str, int] = field(default_factory=dict)  # resize plan axes, e.g. {model: 4}
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # global-norm clipping; 0 disables
    warmup_steps: int = 2  # first steps left out of the median step time (compilation, caches)
    seed: int = 0
    checkpoint_every: int = 0  # save the state every N steps into <run dir>/checkpoints/; 0: never
    # null: resume from the run dir's newest checkpoint when there is one; true: there must be
    # one; false: there must be none (a requeued run resumes from its own all the same).
    resume: Optional[bool] = None

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.cli.schema.validate``): the plan exists, the steps leave some to
        time, the axis sizes are positive, a built-in plan's mesh splits the model's batch (and
        experts) where the device count is known. ``job``: ``launcher.modes.checks.Job``."""
        from launcher.models.plans import BUILTINS  # noqa: PLC0415  JAX: the CLI imports this module

        if not 0 <= mode.warmup_steps < mode.steps:
            raise UserError(f"mode.warmup_steps={mode.warmup_steps} must be at least 0 and below "
                            f"mode.steps={mode.steps}, so some steps are left to time")
        plan = mode.plan
        if plan not in BUILTINS:
            if not (plan.endswith(".json") or "/" in plan):
                raise UserError(f"mode.plan={plan}: unknown plan {plan!r}; give a built-in plan "
                                f"({', '.join(BUILTINS)}) or the path of a plan JSON file")
            # A search's run dir holds its plan.json once it ends; one that launcher.after waits
            # for may not hold it yet.
            waits = job.after and Path(plan).resolve() == Path(job.after).resolve()
            builtins = f"or a built-in plan ({', '.join(BUILTINS)})"
            if job.files_here and not waits and Path(plan).is_dir() and not (Path(plan) / "plan.json").is_file():
                raise UserError(f"mode.plan={plan}: the run dir holds no plan.json (its search has not ended, or "
                                f"failed: xlaunch status; or wait for it with launcher.after={plan}) {builtins}")
            if job.files_here and not waits and not Path(plan).exists():
                raise UserError(f"mode.plan={plan}: no such plan file; give an existing plan JSON file (the search "
                                f"writes <run dir>/plan.json), a search's run dir {builtins}")
        for axis, size in mode.mesh_axes.items():
            if size < 1:
                raise UserError(f"mode.mesh_axes.{axis}={size}: must be at least 1")
        model = job.model
        if plan in BUILTINS and job.devices is not None and model is not None and "batch_size" in model:
            dims = {"batch": ("model.batch_size", model.batch_size)}
            if "num_experts" in model:
                dims["expert"] = ("model.num_experts", model.num_experts)
            BUILTINS[plan].with_axis_sizes(**dict(mode.mesh_axes)).check_divides(job.devices, dims)
        if mode.checkpoint_every < 0:
            raise UserError(f"mode.checkpoint_every={mode.checkpoint_every}: must be 0 (no checkpoints) or a "
                            "number of steps")


# --- what a run of it says (launcher/cli/console.py; a sweep's table: figures) ------------------------

figures = Figures((
    Figure("step_time", "step time", "s", True, lambda r: r["step_time_s"]),
    Figure("loss", "final loss", "", True, lambda r: r["losses"][-1]),
    Figure("tokens_per_s", "tokens/s", "", False, lambda r: r["tokens_per_s"]),
    Figure("tflops", "TFLOPS", "", False, lambda r: r["tflops"]),
    Figure("peak_memory", "memory", "MiB", True, lambda r: r["peak_memory_bytes"] / 2**20),
))


def answer(r: dict) -> str:
    losses = r.get("losses") or [math.nan]
    plan = (r.get("plan") or {})
    mesh = plan.get("mesh_shape") or {}
    lines = [
        f"train {r.get('model')} under plan {plan.get('name')} {mesh} on {devices(r)}: "
        f"{r.get('steps')} steps, loss {losses[0]:.4g} -> {losses[-1]:.4g}",
        f"step time {seconds(r.get('step_time_s', math.nan))} (median), {r.get('tflops', math.nan):.3g} TFLOPS "
        f"({r.get('tflops_per_device', math.nan):.3g} per device), peak memory "
        f"{mib(r.get('peak_memory_bytes', 0))} per device, compile {seconds(r.get('compile_time_s', 0.0))}",
    ]
    if r.get("resumed_from_step"):
        lines.append(f"resumed from the checkpoint of step {r['resumed_from_step']}")
    return "\n".join(lines)


def line(r: dict) -> str:
    losses = r.get("losses") or [math.nan]
    return (f"loss {losses[-1]:.4g}, {seconds(r.get('step_time_s', math.nan))}/step, "
            f"{r.get('tflops', math.nan):.3g} TFLOPS")
