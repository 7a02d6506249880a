"""Every figure an accelerator host can give, in one prepared command (one NVIDIA GPU, or --cpu).

    python bench/bench_accelerator.py [--out PATH] [--budget-s 480] [--only STAGE ...] [--skip STAGE ...]
    python bench/bench_accelerator.py --cpu            # the same sequence on this machine's CPU, tiny sizes
    python bench/bench_accelerator.py --wheels DIR     # the wheels a GPU host without network needs

A lent GPU host is there for minutes, every second counted, so the sequence is fixed, runs
unattended, and writes each figure to the results file as soon as it is taken (a run cut short
keeps what it had). The stages, in order:

- ``versions``: the device, its memory, the driver and CUDA (``nvidia-smi``, the JAX backend's
  platform version), JAX and jaxlib, Python.
- ``peak``: a dense matmul's rate, the median of 10 repeats (each a burst of 10 products, the
  device kept busy), measured in this run: 8192^3 bf16 ``jnp.dot`` on the GPU; 1024^3 float32 on
  the CPU. The models' TFLOPS are read against it.
- ``check``: ``mode=check`` with ``cluster.accelerator=cuda`` (one task, one GPU).
- ``train``: ``mode=train`` of llama2, gpt and moe in bf16 at the paper's hidden sizes (conf/model),
  with as many layers as fit: the layer count comes from the model's parameter count and an
  activation estimate against the device's memory, capped by ``--max-layers`` (compile time: the
  layers are unrolled), halved and tried again where the run still runs out of memory. Step time,
  TFLOPS and TFLOPS over the peak. The first model's run dumps its HLO (``launcher.xla_dump``).
- ``trace``: the model furthest below the peak trained again under ``launcher.trace=true``; where
  its ratio is under 40 %, what dominates the step by the trace (``trace_stats.top_ops``).
- ``replay``: ``mode=hlo_replay`` of the dumped step's before-optimizations module (its median
  execution over the native step time), and of the after-optimizations module with
  ``mode.backend_only=true``.
- ``cfp``: CFP's and the ILP's searches as users get them (``bench_cfp_search.py --users``) on the
  host's CPU cores, as the embedded default job (2 processes x 4 virtual devices; on a 16-core
  host, 2 cores per device), model after model as the budget allows: CFP's plan over the best
  baseline beside the A/A floor, and the kept plan's predicted over measured step time.

``--budget-s`` bounds the whole run (the issue's 8 minutes); a stage that cannot start in what is
left is recorded as skipped, with why. Every launcher job is a real one (``python -m launcher``)
with its run dir under ``--work``; each job's command and its run dir are in the results file.

Where the GPU host has no network, the packages the project needs beyond what its CUDA image
ships travel as wheels (``--wheels DIR``, for CPython 3.12 on manylinux x86-64; docs/benchmarks.md
gives the one call that installs them there and runs this). Results go to
``bench/results/accelerator-<device>.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STAGES = ("versions", "peak", "check", "train", "trace", "replay", "cfp")
# The trace's verdict is asked for where a model reaches less than this share of the peak.
LOW_RATIO = 0.40


@dataclass(frozen=True)
class Sizes:
    """What a run measures: the GPU's real sizes, or --cpu's tiny ones."""

    accelerator: str
    peak_n: int
    peak_dtype: str
    dtype: str
    models: dict[str, dict[str, Any]]  # name -> conf/model preset and model.* overrides
    max_layers: int
    steps: int
    warmup: int
    cluster: tuple[str, ...]
    cfp_models: tuple[str, ...]
    cfp_set: tuple[str, ...] = ()
    cfp_flags: tuple[str, ...] = ()
    # Device memory the layer count may plan on (the rest: XLA's workspace, fragmentation).
    memory_share: float = 0.75
    env: dict[str, str] = field(default_factory=dict)


GPU = Sizes(
    accelerator="cuda", peak_n=8192, peak_dtype="bfloat16", dtype="bfloat16",
    # The paper's hidden sizes (conf/model); llama2's batch is 2 sequences of 4096 (its preset's 8
    # leave room for one layer at most), gpt and moe keep the CFP paper's batches.
    models={"gpt": {"preset": "gpt"}, "llama2": {"preset": "llama2", "batch_size": 2}, "moe": {"preset": "moe"}},
    max_layers=16, steps=12, warmup=4,
    cluster=("cluster.accelerator=cuda", "cluster.tasks_per_node=1", "cluster.gpus_per_node=1"),
    cfp_models=("gpt", "llama2", "moe", "bert"),
    # Each task's JAX may take 90 % of the GPU (its default 75 % leaves a larger model out).
    env={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"},
)
CPU = Sizes(
    accelerator="cpu", peak_n=1024, peak_dtype="float32", dtype="float32",
    models={"gpt": {"preset": "gpt-tiny"}, "llama2": {"preset": "llama2-tiny"}, "moe": {"preset": "moe-tiny"}},
    max_layers=2, steps=4, warmup=1,
    cluster=("cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=1"),
    cfp_models=("gpt",),
    # The CPU run keeps the CFP stage's shape (profile, search, race) at its smallest: one mesh,
    # the search's optimum raced unmeasured (no shortlist: measuring it was half the stage).
    cfp_set=("mode.mesh_shape=[8]", "mode.baselines=[dp]", "mode.iterations=2", "mode.run_repeats=3",
             "mode.verify_top_k=1", "mode.verify_nearest=false", "mode.repeats=2"),
    cfp_flags=("--no-ilp",),   # the ILP's collectives calibrated would be most of the stage's time
    memory_share=0.25,
)


# --- the results file -------------------------------------------------------------------------

class Results:
    """The results file, rewritten whole after every figure (a cut-short run keeps what it had)."""

    def __init__(self, path: Path, head: dict):
        self.path, self.data = path, {**head, "stages": {}}
        self.write()

    def put(self, stage: str, value: Any) -> None:
        self.data["stages"][stage] = value
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)


class Clock:
    """The run's time budget."""

    def __init__(self, budget_s: float):
        self.t0, self.budget_s = time.monotonic(), budget_s

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)


def say(line: str) -> None:
    print(f"[{datetime.datetime.now():%H:%M:%S}] {line}", flush=True)


# --- workers: this file again, in a process of its own (JAX never in the driver) --------------

def worker(kind: str, args: list[str], env: dict, timeout_s: float) -> dict:
    """``python bench_accelerator.py --worker KIND ARGS``: its last stdout line is its JSON."""
    proc = subprocess.run([sys.executable, __file__, "--worker", kind, *args], env=env, capture_output=True,
                          text=True, timeout=max(timeout_s, 1))
    if proc.returncode != 0:
        raise RuntimeError(f"worker {kind} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def peak_worker(n: int, dtype: str, repeats: int = 10, burst: int = 10) -> dict:
    """Versions, the device and a square matmul's median rate on device 0."""
    import jax
    import jax.numpy as jnp
    import jaxlib

    dev = jax.devices()[0]
    stats = {}
    try:
        stats = dev.memory_stats() or {}
    except Exception:  # noqa: BLE001 - not every backend reports memory
        stats = {}
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(dtype))
    dot = jax.jit(jnp.dot)
    dot(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        # A burst of products per timing: the device runs them back to back, so the wait for
        # the last one is not charged to each (on a GPU it is a quarter of one 8192^3 product).
        t = time.perf_counter()
        for _ in range(burst):
            out = dot(a, b)
        out.block_until_ready()
        times.append((time.perf_counter() - t) / burst)
    median = statistics.median(times)
    return {
        "jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": platform.python_version(),
        "platform": dev.platform, "device_kind": dev.device_kind, "device_count": jax.device_count(),
        "platform_version": getattr(dev.client, "platform_version", ""),
        "memory_bytes": int(stats.get("bytes_limit", 0)) or None,
        "peak": {"n": n, "dtype": dtype, "repeats": repeats, "burst": burst, "times_s": times, "median_s": median,
                 "tflops": 2 * n**3 / median / 1e12},
    }


def plan_worker(spec: str) -> dict:
    """Per model: parameters outside and inside one layer, and the shapes the activation estimate
    needs, from the model the launcher would build (no device touched)."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from launcher.cli import schema

    schema.register()
    preset, overrides = json.loads(spec)
    out = {}
    with initialize_config_dir(config_dir=str(schema.CONF_DIR), version_base="1.3"):
        counts = []
        # Two layers apart: a layer's parameters on average where layers alternate (MoE's
        # expert layers every other one).
        for layers in (2, 4):
            cfg = compose("config", overrides=[f"model={preset}", *overrides, f"model.num_layers={layers}"])
            counts.append(instantiate(cfg.model, _convert_="all").param_count())
        c = cfg.model
        per_layer = (counts[1] - counts[0]) / 2
        out = {"per_layer_params": per_layer, "fixed_params": counts[0] - 2 * per_layer,
               "batch_size": c.batch_size, "seq_len": c.seq_len, "hidden": c.hidden, "heads": c.heads,
               "vocab": c.get("vocab_size", 0),
               "preset_layers": compose("config", overrides=[f"model={preset}"]).model.num_layers}
    return out


def layers_that_fit(shape: dict, memory_bytes: float) -> int:
    """Layers whose training state and activations fit ``memory_bytes``.

    State: 18 bytes a parameter (float32 parameter, gradient and Adam's two moments, a 16-bit
    copy for compute). Activations: Megatron's count for 16-bit activations without
    recomputation, ``s*b*h*(34 + 5*a*s/h)`` bytes a layer, times 0.9; the logits 8 bytes a token
    and word (16-bit logits, their float32 log-softmax and its gradient). On the H200 run
    (bench/results/accelerator-h200.json) XLA's peak was 0.75 (gpt), 0.70 (llama2) and 0.98 (moe)
    of this estimate with the factor 1.25; 0.9 keeps MoE's within the memory and the others
    closer to it. A run that still runs out of memory is tried again with half the layers.
    """
    s, b, h, a = shape["seq_len"], shape["batch_size"], shape["hidden"], shape["heads"]
    per_layer = 18 * shape["per_layer_params"] + 0.9 * s * b * h * (34 + 5 * a * s / h)
    fixed = 18 * shape["fixed_params"] + 8 * s * b * shape.get("vocab", 0)
    return max(int((memory_bytes - fixed) // per_layer), 0)


def trace_worker(trace_dir: str, step_time_s: float, steps: int) -> dict:
    """What dominates a traced step: device time by op kind (``trace_stats.top_ops``)."""
    from launcher.runtime import trace_stats

    ops = trace_stats.top_ops(trace_dir)
    if ops is None:
        return {"device_ops": None, "why": "the trace has no device op line (the CPU backend)"}
    busy = ops.busy_s / max(steps, 1)
    return {"device_ops": ops.to_dict(), "device_busy_per_step_s": busy,
            "device_idle_share": max(0.0, 1 - busy / step_time_s) if step_time_s else None}


# --- the stages -------------------------------------------------------------------------------

class Bench:
    def __init__(self, args: argparse.Namespace, sizes: Sizes, results: Results, clock: Clock):
        self.args, self.sizes, self.results, self.clock = args, sizes, results, clock
        self.work = Path(args.work)
        self.env = {**os.environ, **sizes.env,
                    "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
        # Runs of the same step (the traced run after its timed one) compile once.
        self.env.setdefault("JAX_COMPILATION_CACHE_DIR", str(self.work / "jax-cache"))
        self.device: dict = {}
        self.trained: dict[str, dict] = {}

    def launch(self, name: str, overrides: list[str], timeout_s: float) -> dict:
        """``python -m launcher OVERRIDES`` in a run dir of its own; its result.json."""
        run_dir = self.work / name
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [sys.executable, "-m", "launcher", *overrides, f"hydra.run.dir={run_dir}"]
        say("  $ " + " ".join(cmd[1:]))
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=self.env, capture_output=True, text=True,
                                  timeout=max(timeout_s, 1))
        except subprocess.TimeoutExpired:
            raise StageError(f"{name}: still running after {timeout_s:.0f} s (the budget); run dir {run_dir}",
                             run_dir) from None
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            raise StageError(f"{name}: the job failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}", run_dir)
        result = json.loads((run_dir / "result.json").read_text())
        return {**result, "wall_s": wall, "run_dir": str(run_dir), "command": " ".join(cmd[2:])}

    # versions + peak: one worker
    def versions(self) -> None:
        d = worker("peak", [str(self.sizes.peak_n), self.sizes.peak_dtype], self.env, self.clock.left())
        smi = nvidia_smi()
        self.device = {**d, **smi}
        self.results.data["device"] = smi.get("gpu") or d["device_kind"]
        self.results.put("versions", {k: v for k, v in self.device.items() if k != "peak"})
        self.results.put("peak", d["peak"])
        say(f"device {self.results.data['device']}: jax {d['jax']}, {d['platform_version']}; "
            f"peak {d['peak']['tflops']:.1f} TFLOP/s ({d['peak']['dtype']} {d['peak']['n']}^3)")

    def check(self) -> None:
        r = self.launch("check", ["mode=check", *self.sizes.cluster], self.clock.left())
        keep = ("psum_ok", "global_devices", "platform", "init_time_s", "wall_s", "command", "run_dir")
        self.results.put("check", {k: r.get(k) for k in keep} | {k: v for k, v in r.items() if "gbps" in k})
        say(f"check: psum {'ok' if r.get('psum_ok') else 'WRONG'} on {r.get('global_devices')} {r.get('platform')} "
            f"device(s), {r['wall_s']:.0f} s")

    def train(self) -> None:
        memory = self.device.get("memory_bytes") or 0
        out = {}
        for i, (name, spec) in enumerate(self.sizes.models.items()):
            if self.clock.left() < 30:
                out[name] = {"skipped": f"{self.clock.left():.0f} s of the budget left"}
                continue
            overrides = {k: v for k, v in spec.items() if k != "preset"}
            model_args = [f"model.{k}={v}" for k, v in overrides.items()] + [f"model.dtype={self.sizes.dtype}"]
            shape = worker("plan", [json.dumps([spec["preset"], model_args])], {**self.env, "JAX_PLATFORMS": "cpu"},
                           self.clock.left())
            fit = layers_that_fit(shape, self.sizes.memory_share * memory) if memory else shape["preset_layers"]
            cap = self.sizes.max_layers
            layers = max(1, min(fit, cap))
            row: dict = {"preset": spec["preset"], "overrides": overrides, "layers_fit_estimate": fit,
                         "layers_cap": cap, "preset_layers": shape["preset_layers"], **shape}
            while True:
                args = ["mode=train", f"model={spec['preset']}", *model_args, f"model.num_layers={layers}",
                        f"mode.steps={self.sizes.steps + self.sizes.warmup}", f"mode.warmup_steps={self.sizes.warmup}",
                        "mode.plan=dp", *self.sizes.cluster]
                if i == 0:
                    args.append("launcher.xla_dump=true")  # the step replay reads
                try:
                    r = self.launch(f"train-{name}-{layers}", args, self.clock.left())
                    break
                except StageError as e:
                    if layers > 1 and out_of_memory(e.run_dir):
                        say(f"  {name}: out of memory at {layers} layers; trying {layers // 2}")
                        row.setdefault("out_of_memory_at", []).append(layers)
                        layers //= 2
                        continue
                    raise
            peak = self.results.data["stages"]["peak"]["tflops"]
            row.update(layers=layers, step_time_s=r["step_time_s"], compile_time_s=r["compile_time_s"],
                       tflops=r["tflops"], tflops_over_peak=r["tflops"] / peak, param_count=r["param_count"],
                       peak_memory_gb=r["peak_memory_bytes"] / 2**30, losses=[r["losses"][0], r["losses"][-1]],
                       wall_s=r["wall_s"], command=r["command"], run_dir=r["run_dir"])
            if i == 0:
                row["xla_dump"] = str(Path(r["run_dir"]) / "xla_dump" / "rank0")
            out[name] = row
            self.trained[name] = row
            self.results.put("train", out)
            say(f"train {name}: {layers} layers (fit {fit}, cap {cap}), step {r['step_time_s'] * 1e3:.1f} ms, "
                f"{r['tflops']:.1f} TFLOP/s = {row['tflops_over_peak']:.1%} of the peak, "
                f"{row['peak_memory_gb']:.1f} GiB, compile {r['compile_time_s']:.0f} s")

    def trace(self) -> None:
        if not self.trained:
            raise StageError("no model trained: nothing to trace")
        name, row = min(self.trained.items(), key=lambda kv: kv[1]["tflops_over_peak"])
        args = [a for a in row["command"].split() if a.startswith(("mode=", "model", "mode.", "cluster."))]
        args = [a for a in args if not a.startswith("mode.steps=")] + [f"mode.steps={self.sizes.warmup + 3}",
                                                                        "launcher.trace=true"]
        r = self.launch(f"trace-{name}", args, self.clock.left())
        traced = Path(r["run_dir"]) / "traces" / "rank0"
        ops = worker("trace", [str(traced), str(row["step_time_s"]), str(self.sizes.warmup + 3)], self.env,
                     self.clock.left())
        out = {"model": name, "tflops_over_peak": row["tflops_over_peak"], "below_40_percent":
               row["tflops_over_peak"] < LOW_RATIO, "traced_step_time_s": r["step_time_s"],
               "command": r["command"], "trace_dir": str(traced), **ops}
        if out["below_40_percent"] and ops.get("device_ops"):
            out["dominates"] = verdict(ops, row["step_time_s"])
        self.results.put("trace", out)
        say(f"trace {name}: " + (out.get("dominates") or (ops.get("why") or "at or above 40 % of the peak")))

    def replay(self) -> None:
        first = next(iter(self.trained.values()), None)
        if first is None or "xla_dump" not in first:
            raise StageError("no dumped training step (the train stage's first model)")
        dump = Path(first["xla_dump"])
        out: dict = {"model": first["preset"], "native_step_time_s": first["step_time_s"]}
        for kind, extra in (("before_optimizations", []), ("after_optimizations", ["mode.backend_only=true"])):
            files = sorted(dump.glob(f"*jit_step*{kind}.txt"), key=lambda p: p.stat().st_size)
            if not files:
                out[kind] = {"error": f"no *jit_step*{kind}.txt in {dump}"}
                continue
            try:
                r = self.launch(f"replay-{kind}", ["mode=hlo_replay", f"mode.hlo_file={files[-1]}",
                                                   "mode.num_repeats=10", *extra, *self.sizes.cluster], self.clock.left())
            except StageError as e:
                # Replay's own refusal (launcher/hlo: a module this backend cannot compile as it
                # stands) is a figure of the backend, not a failure of the bench.
                refused = re.search(r"mode\.backend_only: .*", str(e))
                if not refused:
                    raise
                out[kind] = {"hlo_file": files[-1].name, "refused": refused.group(0)}
                self.results.put("replay", out)
                say(f"replay {kind}: refused: {refused.group(0)[:200]}")
                continue
            times = r["execution_times_s"]
            median = statistics.median(times[1:] or times)  # the first execution warms up
            out[kind] = {"hlo_file": files[-1].name, "replay_median_s": median, "compile_time_s": r["compile_time_s"],
                         "over_native": median / first["step_time_s"], "command": r["command"]}
            self.results.put("replay", out)
            say(f"replay {kind}: {median * 1e3:.1f} ms = {out[kind]['over_native']:.3f}x the native step")

    def cfp(self) -> None:
        out_file = self.work / "cfp-users.json"
        rows: list = []
        for model in self.sizes.cfp_models:
            need = 60 if self.sizes.accelerator == "cpu" else 120
            if self.clock.left() < need:
                self.results.put("cfp", {"rows": rows, "skipped": [m for m in self.sizes.cfp_models if m not in
                                                                   {r["model"].removesuffix("-tiny") for r in rows}],
                                         "why": f"{self.clock.left():.0f} s of the budget left"})
                return
            cmd = [sys.executable, str(REPO / "bench" / "bench_cfp_search.py"), "--users", "--models", model,
                   "--out", str(out_file), *self.sizes.cfp_flags, "--set", *self.sizes.cfp_set]
            say("  $ " + " ".join(cmd[1:]))
            env = {k: v for k, v in self.env.items() if k not in self.sizes.env}
            try:
                proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                      timeout=max(self.clock.left(), 1))
            except subprocess.TimeoutExpired:
                self.results.put("cfp", {"rows": rows, "stopped": f"{model}: the budget ran out mid-search"})
                return
            if proc.returncode != 0:
                raise StageError(f"cfp {model}: {proc.stderr.strip()[-1500:]}")
            for run in json.loads(out_file.read_text())["runs"]:
                rows.append(cfp_row(run))
                say(f"cfp {run['model']}: CFP's plan {run['cfp_over_best_paired']:.3f}x {run['best_baseline']} "
                    f"(A/A floor {run['aa_floor']:.3f}), predicted/measured {rows[-1]['predicted_over_measured']}, "
                    f"{run['wall_s']:.0f} s")
            self.results.put("cfp", {"cores": os.cpu_count(), "job": "2 processes x 4 virtual CPU devices",
                                     "set": list(self.sizes.cfp_set), "rows": rows})


class StageError(Exception):
    def __init__(self, message: str, run_dir: Path | None = None):
        super().__init__(message)
        self.run_dir = run_dir


def cfp_row(run: dict) -> dict:
    kept = next((c for c in run.get("candidates", []) if c.get("chosen")), None)
    ratio = None
    if kept and kept.get("measured_step_time_s"):   # measured in the shortlist's rounds
        ratio = kept["predicted_step_time_s"] / kept["measured_step_time_s"]
    elif kept:   # a shortlist of one is not measured (the CPU run): the final race's time
        ratio = kept["predicted_step_time_s"] / run["step_time_s"]["cfp"]
    return {"model": run["model"], "cfp_over_best_paired": run["cfp_over_best_paired"],
            "answer_over_best_paired": run["answer_over_best_paired"], "best_baseline": run["best_baseline"],
            "aa_floor": run["aa_floor"], "cfp_behind_best_beyond_floor": run["cfp_behind_best_beyond_floor"],
            "ilp_over_best_builtin_paired": run["ilp_over_best_builtin_paired"],
            "predicted_over_measured": ratio, "kept": run["kept"], "wall_s": run["wall_s"],
            "profile_s": run["profile_s"], "search_and_race_s": run["search_and_race_s"]}


def out_of_memory(run_dir: Path | None) -> bool:
    if run_dir is None:
        return False
    text = " ".join(p.read_text(errors="replace")[-20000:] for p in (run_dir / "logs").glob("rank*.log"))
    return bool(re.search(r"RESOURCE_EXHAUSTED|[Oo]ut of memory|OOM", text))


def verdict(ops: dict, step_time_s: float) -> str:
    """One line: where a step below 40 % of the peak goes, by its trace."""
    top = ops["device_ops"]["top"]
    busy = ops["device_busy_per_step_s"]
    lead = ", ".join(f"{o['kind']} {o['share']:.0%}" for o in top[:3])
    idle = ops.get("device_idle_share") or 0.0
    if idle > 0.3:
        return (f"the device is idle {idle:.0%} of the step ({busy * 1e3:.1f} of {step_time_s * 1e3:.1f} ms busy): "
                f"launch or host overhead; of the busy time: {lead}")
    return f"device time by op kind: {lead} (busy {busy * 1e3:.1f} of {step_time_s * 1e3:.1f} ms a step)"


def nvidia_smi() -> dict:
    """The GPU's name, driver and CUDA version as nvidia-smi reports them ({} without one)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    q = subprocess.run([exe, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                       capture_output=True, text=True)
    head = subprocess.run([exe], capture_output=True, text=True).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", head)
    if q.returncode != 0 or not q.stdout.strip():
        return {}
    name, driver, memory = [x.strip() for x in q.stdout.strip().splitlines()[0].split(",")]
    return {"gpu": name, "driver": driver, "gpu_memory": memory, "cuda_driver_api": cuda.group(1) if cuda else None}


def device_slug(name: str) -> str:
    """``NVIDIA H200`` -> ``h200``; ``cpu`` for the CPU run."""
    m = re.search(r"\b([A-Z]\d{2,4}[A-Z]?)\b", name or "")
    return m.group(1).lower() if m else re.sub(r"[^a-z0-9]+", "-", (name or "device").lower()).strip("-")


# --- wheels for a host without network --------------------------------------------------------

# What the project needs (pyproject.toml) beyond what the CUDA images of GPU hosts ship (JAX with
# CUDA, optax, numpy, rich, matplotlib, PyYAML, cloudpickle, typing-extensions, packaging, Flax
# and Equinox are there): the config and launch stack, and the ILP's solver.
WHEELS = ("hydra-core>=1.3.2,<1.4", "omegaconf>=2.3,<2.4", "antlr4-python3-runtime==4.9.3",
          "submitit>=1.5.2,<1.6", "highspy>=1.15")
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
          "--platform", "manylinux_2_27_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform",
          "manylinux2014_x86_64", "--platform", "any"]


def wheels(folder: Path) -> None:
    """Downloads the wheels, builds the one that PyPI has as source only (antlr4's 4.9.3, pure
    Python), and checks that pip installs the set for the target with no index."""
    folder.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip"]
    for req in WHEELS:
        got = subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", *TARGET, "-d", str(folder),
                              req], capture_output=True, text=True)
        if got.returncode != 0:  # no wheel on PyPI: build one (pure Python only: the target is another machine)
            subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", str(folder), req], check=True)
            built = [p for p in folder.glob("*.whl") if not p.name.endswith("-py3-none-any.whl")
                     and p.name.lower().startswith(req.split("=")[0].replace("-", "_").lower())]
            if built:
                raise SystemExit(f"{req}: PyPI has no wheel for the target and the one built here is not "
                                 f"pure Python ({built[0].name})")
    with tempfile.TemporaryDirectory() as target:
        subprocess.run([*pip, "install", "-q", "--no-index", "--no-deps", "--only-binary=:all:", *TARGET[:-2],
                        "--target", target, *map(str, sorted(folder.glob("*.whl")))], check=True)
    say(f"{len(list(folder.glob('*.whl')))} wheels in {folder}, installable for CPython 3.12 manylinux x86-64:")
    for p in sorted(folder.glob("*.whl")):
        print(f"  {p.name}")


# --- main -------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu", action="store_true", help="the same sequence on this machine's CPU at tiny sizes")
    ap.add_argument("--out", help="results file (default bench/results/accelerator-<device>.json)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time (default 8 minutes)")
    ap.add_argument("--only", nargs="+", choices=STAGES, help="these stages alone (in their order)")
    ap.add_argument("--skip", nargs="+", choices=STAGES, default=[], help="stages left out")
    ap.add_argument("--max-layers", type=int, help="cap on the models' layers (default 16: their compile time; --cpu 2)")
    ap.add_argument("--cfp-models", nargs="+", help="tiny models for the cfp stage, in order")
    ap.add_argument("--train-models", nargs="+", help="the train stage's models, of gpt, llama2, moe (default all; "
                    "the first one's dumped step is what replay replays)")
    ap.add_argument("--work", help="where the jobs' run dirs go (default a fresh temporary folder)")
    ap.add_argument("--wheels", metavar="DIR", help="download the wheels a GPU host needs into DIR, and stop")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.worker:
        fn = {"peak": lambda: peak_worker(int(rest[0]), rest[1]), "plan": lambda: plan_worker(rest[0]),
              "trace": lambda: trace_worker(rest[0], float(rest[1]), int(rest[2]))}[args.worker]
        print(json.dumps(fn()))
        return
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.wheels:
        wheels(Path(args.wheels))
        return
    sizes = CPU if args.cpu else GPU
    if args.max_layers or args.cfp_models:
        sizes = Sizes(**{**sizes.__dict__, **({"max_layers": args.max_layers} if args.max_layers else {}),
                         **({"cfp_models": tuple(args.cfp_models)} if args.cfp_models else {})})
    if args.train_models:
        unknown = sorted(set(args.train_models) - set(sizes.models))
        if unknown:
            ap.error(f"--train-models: no model {', '.join(unknown)} (known: {', '.join(sizes.models)})")
        sizes = Sizes(**{**sizes.__dict__, "models": {m: sizes.models[m] for m in args.train_models}})
    missing = [m for m in ("hydra", "omegaconf", "submitit", "highspy", "jax", "optax", "rich") if not _importable(m)]
    if missing:
        raise SystemExit(f"missing Python packages: {', '.join(missing)}; on a host without network, carry "
                         f"them as wheels (python bench/bench_accelerator.py --wheels DIR; docs/benchmarks.md)")
    if not args.cpu and shutil.which("nvidia-smi") is None:
        raise SystemExit("no NVIDIA GPU here (nvidia-smi not found): run with --cpu for the CPU sequence")
    args.work = args.work or tempfile.mkdtemp(prefix="bench-accelerator-")
    clock = Clock(args.budget_s)
    stages = [s for s in (args.only or STAGES) if s not in args.skip]
    if "train" in stages or "peak" in stages:
        stages = ["versions", *[s for s in stages if s not in ("versions", "peak")]]
    head = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.platform(), "cores": os.cpu_count(), "mode": "cpu" if args.cpu else "gpu",
            "budget_s": args.budget_s, "work": args.work,
            "command": " ".join(["python", "bench/bench_accelerator.py", *sys.argv[1:]])}
    provisional = Path(args.out) if args.out else Path(args.work) / "accelerator.json"
    results = Results(provisional, head)
    bench = Bench(args, sizes, results, clock)
    failed = []
    for stage in stages:
        if clock.left() <= 0:
            results.put(stage, {"skipped": "the budget ran out"})
            continue
        say(f"{stage} ({clock.left():.0f} s of the budget left)")
        t = time.perf_counter()
        try:
            getattr(bench, "versions" if stage == "peak" else stage)()
        except (StageError, RuntimeError, subprocess.TimeoutExpired, KeyError, ValueError) as e:
            failed.append(stage)
            results.put(stage, {**results.data["stages"].get(stage, {}), "error": str(e)})
            say(f"{stage} FAILED: {e}")
        results.data.setdefault("stage_wall_s", {})[stage] = round(time.perf_counter() - t, 1)
        if stage == "versions" and not args.out:  # the file is named for the device, known now
            name = "cpu" if args.cpu else device_slug(results.data.get("device", ""))
            final = REPO / "bench" / "results" / f"accelerator-{name}.json"
            provisional.unlink(missing_ok=True)
            results.path = final
        results.write()
    results.data["wall_s"] = round(clock.budget_s - clock.left(), 1)
    results.data["failed"] = failed
    results.write()
    say(f"wrote {results.path}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if failed:
        sys.exit(1)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    main()
