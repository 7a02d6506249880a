"""mode=train's run: the model trained under the plan (``models.train.Trainer``), checkpointed and
resumed (``launcher/runtime/checkpoint.py``). The options: ``launcher/modes/train.py``."""

from __future__ import annotations

import statistics
import time

import jax
from omegaconf import OmegaConf

from launcher.sharding.apply import constraints_transform
from launcher.errors import UserError
from launcher.models.base import check_model
from launcher.models.plans import load_plan
from launcher.models.step import make_optimizer
from launcher.models.train import Trainer
from launcher.runtime import checkpoint, trace
from launcher.runtime.context import TaskContext


def run(ctx: TaskContext) -> dict:
    cfg = ctx.mode_cfg  # Config.check held the step counts and the plan name before submission
    model = ctx.model()
    check_model(model)
    plan = load_plan(cfg.plan)
    if cfg.mesh_axes:
        plan = plan.with_axis_sizes(**dict(cfg.mesh_axes))
    opts = {"learning_rate": cfg.learning_rate, "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip}
    optimizer = make_optimizer(opts)
    devices = jax.devices()
    mesh_shape = plan.axis_sizes(len(devices))
    ctx.log.info("training %s (%d parameters) for %d steps, plan %s on mesh %s", type(model).__name__,
                 model.param_count(), cfg.steps, plan.name, mesh_shape)

    trainer = Trainer(model, plan, devices, optimizer=optimizer, seed=cfg.seed,
                      transform_step=constraints_transform(plan))
    # What a checkpoint must share with this run to be resumed from (runtime/checkpoint.py).
    fingerprint = {"model": OmegaConf.to_container(ctx.cfg.model, resolve=True),
                   "plan": {**plan.to_dict(), "mesh_shape": mesh_shape}, "optimizer": opts, "seed": cfg.seed}
    clock = ctx.clock
    t = time.perf_counter()
    ckpts, times = _resume(ctx, cfg, trainer, fingerprint)
    clock.add("checkpoint_s", time.perf_counter() - t)  # restoring
    resumed_from = trainer.step_no
    clock.set(resumed_from_step=resumed_from, last_step=resumed_from, steps_done=0)
    every = cfg.checkpoint_every
    curves = _Curves(ctx, model, trainer, len(devices))
    with ctx.progress(cfg.steps, f"train {type(model).__name__} [{plan.name}]") as bar:
        bar.advance(trainer.step_no)
        steps_bar = _StepsSeen(bar, clock, trainer)
        with trace.recording(ctx, "train") as traced:
            while trainer.step_no < cfg.steps:
                # One step at a time: its loss and time reach TensorBoard as it ends.
                new = _traced_steps(trainer, 1, steps_bar) if traced else trainer.steps(1, steps_bar)
                times += new
                curves.step(new[0])
                if ctx.reporter is not None:  # its host work a step, against the other ranks' (runtime/straggler.py)
                    ctx.reporter.stepped(trainer.step_no)
                clock.add("steps_s", sum(new))
                clock.set(steps_done=trainer.step_no - resumed_from, last_step=trainer.step_no)
                if every and (trainer.step_no % every == 0 or trainer.step_no == cfg.steps):
                    # Inside the trace when there is one: saving is part of what the run spends.
                    t = time.perf_counter()
                    # The steps' curves onto disk before the checkpoint that skips those steps
                    # exists: a kill between the two then costs a step run again, never a curve.
                    if ctx.scalars is not None:
                        ctx.scalars.flush()
                    ckpts.save(trainer.step_no, trainer.state, trainer.losses, times)
                    clock.add("checkpoint_s", time.perf_counter() - t)
    if ckpts is not None:
        ckpts.close()

    losses = trainer.losses
    step_time = _median(times[cfg.warmup_steps:] or times)
    flops = float(model.flops_per_step())
    samples, tokens = _batch_size(model)
    out = {
        "model": type(model).__name__,
        "param_count": int(model.param_count()),
        "plan": {**plan.to_dict(), "mesh_shape": mesh_shape},
        "steps": cfg.steps,
        "losses": losses,
        "step_times_s": times,
        "step_time_s": step_time,
        "compile_time_s": trainer.compile_time_s,
        "flops_per_step": flops,
        "tflops": flops / step_time / 1e12,
        "tflops_per_device": flops / step_time / 1e12 / len(devices),
        "samples_per_s": samples / step_time if samples else None,
        "tokens_per_s": tokens / step_time if tokens else None,
        "peak_memory_bytes": trainer.peak_memory_bytes,
        "memory": trainer.memory,
        "resumed_from_step": resumed_from,
    }
    paper = getattr(model, "paper_flops_per_step", None)
    if paper is not None:
        out["paper_flops_per_step"] = float(paper())
        out["paper_tflops"] = out["paper_flops_per_step"] / step_time / 1e12
    ctx.log.info("losses %.4f -> %.4f; median step %.4f s, %.4f TFLOP/s, peak %.1f MB/device",
                 losses[0], losses[-1], step_time, out["tflops"], trainer.peak_memory_bytes / 2**20)
    return out


def _resume(ctx, cfg, trainer, fingerprint) -> tuple:
    """(the run's Checkpoints or None, the step times so far): the trainer continues from the
    newest checkpoint in the run dir when there is one (and ``mode.resume`` allows)."""
    where = checkpoint.directory(ctx.run_dir)
    if not (cfg.checkpoint_every or checkpoint.present(ctx.run_dir)):
        if cfg.resume and not ctx.attempt:
            raise UserError(f"mode.resume=true but there is no checkpoint in {where}: give the run dir of the run "
                            "to resume (hydra.run.dir=...), or leave mode.resume unset")
        return None, []
    ckpts = checkpoint.Checkpoints(ctx.run_dir, fingerprint, ctx.log)
    steps = ckpts.steps()
    if not ctx.attempt:  # a requeued run resumes from what its own earlier run saved, whatever mode.resume says
        if cfg.resume is False and steps:
            raise UserError(f"mode.resume=false but {where} holds checkpoints (steps {', '.join(map(str, steps))}) "
                            "that this run would overwrite; they are left as they are: train in another run dir, "
                            "or leave mode.resume unset to resume from them")
        if cfg.resume and not steps:
            raise UserError(f"mode.resume=true but there is no complete checkpoint in {where}")
    restored = ckpts.restore(trainer.state) if steps else None
    if restored is None:
        return ckpts, []
    state, at = restored
    if at.step > cfg.steps:
        raise UserError(f"the checkpoint in {where} is at step {at.step}, past mode.steps={cfg.steps}: ask for "
                        f"mode.steps={at.step} or more to go on from it")
    trainer.load_state(state, at.step, at.losses)
    return ckpts, list(at.step_times_s)


def _batch_size(model) -> tuple[int, int]:
    """Samples and tokens in one step's batch (0 where the model's config does not say)."""
    c = getattr(model, "config", None)
    samples = int(getattr(c, "batch_size", 0) or 0)
    return samples, samples * int(getattr(c, "seq_len", 0) or 0)


class _Curves:
    """Each step's loss, time, throughput and TFLOPS as TensorBoard scalars (rank 0's, in the run
    dir: ``launcher/runtime/scalars.py``), and the compiled step's memory with the first."""

    def __init__(self, ctx, model, trainer, devices: int) -> None:
        self.scalars, self.trainer, self.devices = ctx.scalars, trainer, devices
        self.flops = float(model.flops_per_step())
        self.samples, self.tokens = _batch_size(model)
        self.first = True

    def step(self, seconds: float) -> None:
        if self.scalars is None:
            return
        at = self.trainer.step_no - 1  # the step that just ran: 0 .. mode.steps - 1
        values = {"loss": self.trainer.losses[-1], "step_time_s": seconds, "tflops": self.flops / seconds / 1e12}
        if self.tokens:
            values["tokens_per_s"] = self.tokens / seconds
        if self.samples:
            values["samples_per_s"] = self.samples / seconds
        self.scalars.add(at, values)
        if self.first:
            self.first = False
            memory = {k.removesuffix("_bytes"): v / 2**20 for k, v in self.trainer.memory.items()}
            self.scalars.add(at, memory, prefix="memory_mib/")


class _StepsSeen:
    """The progress bar, telling this attempt's clock how far the steps got as they go."""

    def __init__(self, bar, clock, trainer) -> None:
        self.bar, self.clock, self.trainer = bar, clock, trainer

    def advance(self, *args, **kwargs) -> None:
        self.bar.advance(*args, **kwargs)
        self.clock.progressed(self.trainer.step_no)


def _traced_steps(trainer, n: int, bar) -> list:
    """``trainer.steps(n)``, each step marked as one in the trace (XProf's step-time views)."""
    times = []
    for _ in range(n):
        with jax.profiler.StepTraceAnnotation("train", step_num=trainer.step_no):
            times += trainer.steps(1, bar)
    return times


def _median(xs: list) -> float:
    return statistics.median(xs)
