"""mode=train: trains the configured model for ``mode.steps`` steps under a sharding plan over
every global device, and reports losses, step time, throughput and memory.

    python -m launcher mode=train model=gpt-tiny mode.plan=dp_tp mode.mesh_axes={model:4}

``mode.plan`` is a built-in plan (dp, tp, fsdp, dp_tp, ep) or the path of a plan JSON file
(the format ``models/plans.py`` documents; the search writes the same, with its per-operator
layouts in ``constraints``, which apply to the model and optimizer settings it was searched for:
``launcher.cfp.apply.constraints_transform`` hands them to ``models.train`` as a step transform).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass
class Config:
    name: str = "train"
    steps: int = 20
    plan: str = "dp"  # dp | tp | fsdp | dp_tp | ep | path/to/plan.json
    mesh_axes: Dict[str, int] = field(default_factory=dict)  # resize plan axes, e.g. {model: 4}
    learning_rate: float = 1e-3
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # global-norm clipping; 0 disables
    warmup_steps: int = 2  # first steps left out of the median step time (compilation, caches)
    seed: int = 0

    @classmethod
    def check(cls, mode, job) -> None:
        """Before submission (``launcher.schema.validate``): the plan exists, the steps leave some to
        time, the axis sizes are positive. ``job``: ``launcher.schema.Job``."""
        from pathlib import Path

        from launcher.errors import UserError
        from models.plans import BUILTINS

        if not 0 <= mode.warmup_steps < mode.steps:
            raise UserError(f"mode.warmup_steps={mode.warmup_steps} must be at least 0 and below "
                            f"mode.steps={mode.steps}, so some steps are left to time")
        plan = mode.plan
        if plan not in BUILTINS:
            if not (plan.endswith(".json") or "/" in plan):
                raise UserError(f"mode.plan={plan}: unknown plan {plan!r}; give a built-in plan "
                                f"({', '.join(BUILTINS)}) or the path of a plan JSON file")
            if job.files_here and not Path(plan).is_file():
                raise UserError(f"mode.plan={plan}: no such plan file; give an existing plan JSON file (the search "
                                f"writes <run dir>/plan.json) or a built-in plan ({', '.join(BUILTINS)})")
        for axis, size in mode.mesh_axes.items():
            if size < 1:
                raise UserError(f"mode.mesh_axes.{axis}={size}: must be at least 1")


def run(ctx) -> dict:
    import jax

    from launcher.cfp.apply import constraints_transform
    from models.base import check_model
    from models.plans import load_plan
    from models.step import make_optimizer
    from models.train import run_training

    cfg = ctx.mode_cfg  # Config.check held the step counts and the plan name before submission
    model = ctx.model()
    check_model(model)
    plan = load_plan(cfg.plan)
    if cfg.mesh_axes:
        plan = plan.with_axis_sizes(**dict(cfg.mesh_axes))
    optimizer = make_optimizer({"learning_rate": cfg.learning_rate, "weight_decay": cfg.weight_decay,
                                "grad_clip": cfg.grad_clip})
    devices = jax.devices()
    mesh_shape = plan.axis_sizes(len(devices))
    ctx.log.info("training %s (%d parameters) for %d steps, plan %s on mesh %s", type(model).__name__,
                 model.param_count(), cfg.steps, plan.name, mesh_shape)

    with ctx.progress(cfg.steps, f"train {type(model).__name__} [{plan.name}]") as bar:
        result = run_training(model, plan, cfg.steps, devices, optimizer=optimizer, seed=cfg.seed, progress=bar,
                              transform_step=constraints_transform(plan))

    step_time = result.median_step_time(cfg.warmup_steps)
    flops = float(model.flops_per_step())
    out = {
        "model": type(model).__name__,
        "param_count": int(model.param_count()),
        "plan": {**plan.to_dict(), "mesh_shape": mesh_shape},
        "steps": cfg.steps,
        "losses": result.losses,
        "step_times_s": result.step_times_s,
        "step_time_s": step_time,
        "compile_time_s": result.compile_time_s,
        "flops_per_step": flops,
        "tflops": flops / step_time / 1e12,
        "tflops_per_device": flops / step_time / 1e12 / len(devices),
        "peak_memory_bytes": result.peak_memory_bytes,
        "memory": result.memory,
    }
    paper = getattr(model, "paper_flops_per_step", None)
    if paper is not None:
        out["paper_flops_per_step"] = float(paper())
        out["paper_tflops"] = out["paper_flops_per_step"] / step_time / 1e12
    ctx.log.info("losses %.4f -> %.4f; median step %.4f s, %.4f TFLOP/s, peak %.1f MB/device",
                 result.losses[0], result.losses[-1], step_time, out["tflops"], result.peak_memory_bytes / 2**20)
    return out
