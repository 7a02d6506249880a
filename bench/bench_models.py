"""Step time and throughput of every tiny model under every plan on 8 virtual CPU devices, and
how close the best plan comes to this machine's dense-matmul peak.

    python bench/bench_models.py [--steps 12] [--warmup 3] [--matmul 1024]

For each model preset (gpt-tiny, bert-tiny, llama2-tiny, moe-tiny) and each plan that applies
(dp, tp, fsdp, dp_tp; ep for MoE), ``models.train.run_training`` trains ``--warmup + --steps``
steps; the step time is the median of the last ``--steps``, TFLOP/s is the model's analytic
FLOPs per step over it, and each plan's time is also given as a ratio to dp's for the same
model. The peak is the median time of an n x n float32 matmul (``--matmul``), on one device
(XLA's CPU matmul uses every core) and as 8 shards of a batched matmul over the 8 devices,
before and after the models; the largest is the machine's peak. Results go to bench/results/bench_models.json.

Expect small fractions: the tiny models' matrices (64 x 256) are far too small to keep a
CPU's vector units busy, and 8 virtual devices share 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

from launcher import jaxcompat  # noqa: E402

jaxcompat.set_cpu_device_count(8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

PRESETS = ("gpt-tiny", "bert-tiny", "llama2-tiny", "moe-tiny")
PLANS = ("dp", "tp", "fsdp", "dp_tp", "ep")


def build_model(preset: str):
    """The model of conf/model/<preset>.yaml, composed and built as the launcher does."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from launcher import schema

    schema.register()
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"model={preset}"])
    return instantiate(cfg.model, _convert_="all")


def matmul_peak(n: int, repeats: int) -> dict:
    """Median TFLOP/s of an n x n float32 matmul: on one device, and sharded over all 8."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    from launcher.sharding.measuring.timing import Timer

    def timed(f, *args) -> float:
        return statistics.median(Timer(1, repeats).runs([f], args)[0])

    a = jax.device_put(jnp.ones((n, n), jnp.float32) / n, jax.devices()[0])
    one = 2 * n**3 / timed(jax.jit(lambda x, y: x @ y), a, a) / 1e12
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("d",))
    k = len(devices)
    b = jax.device_put(jnp.ones((k, n, n), jnp.float32) / n, NamedSharding(mesh, P("d")))
    sharded = k * 2 * n**3 / timed(jax.jit(lambda x, y: jnp.einsum("kij,kjl->kil", x, y)), b, b) / 1e12
    return {"n": n, "one_device_tflops": one, "eight_devices_tflops": sharded, "peak_tflops": max(one, sharded)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12, help="timed steps per run (after warmup)")
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--matmul", type=int, default=1024, help="size of the peak-matmul probe")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "bench_models.json"))
    args = ap.parse_args()

    from launcher.models.plans import builtin
    from launcher.models.train import run_training

    # Probed before and after the models, keeping the better: on a shared machine, a probe
    # that lands in a busy moment would otherwise flatter the models' fraction of peak.
    peak = matmul_peak(args.matmul, repeats=10)
    rows = []
    for preset in PRESETS:
        model = build_model(preset)
        flops = model.flops_per_step()
        dp_time = None
        for plan in PLANS:
            if plan == "ep" and not preset.startswith("moe"):
                continue  # expert parallelism needs experts
            r = run_training(model, builtin(plan), args.warmup + args.steps, jax.devices())
            t = r.median_step_time(args.warmup)
            dp_time = t if plan == "dp" else dp_time
            row = {"model": preset, "plan": plan, "step_time_s": t, "flops_per_step": flops,
                   "tflops": flops / t / 1e12, "time_vs_dp": t / dp_time, "compile_time_s": r.compile_time_s,
                   "peak_memory_bytes": r.peak_memory_bytes, "final_loss": r.losses[-1]}
            rows.append(row)
            print(f"{preset:12s} {plan:6s} step {t * 1e3:8.2f} ms  x{row['time_vs_dp']:.2f} of dp  "
                  f"{row['tflops']:.5f} TFLOP/s  peak mem {r.peak_memory_bytes / 2**20:6.2f} MiB  "
                  f"compile {r.compile_time_s:.1f} s")

    after = matmul_peak(args.matmul, repeats=10)
    peak = max(peak, after, key=lambda p: p["peak_tflops"])
    print(f"dense matmul peak: {peak['peak_tflops']:.4f} TFLOP/s "
          f"(1 device {peak['one_device_tflops']:.4f}, 8 devices {peak['eight_devices_tflops']:.4f})")
    best = max(rows, key=lambda r: r["tflops"])
    best_per_model = {p: max((r for r in rows if r["model"] == p), key=lambda r: r["tflops"])["plan"] for p in PRESETS}
    summary = {"best": {"model": best["model"], "plan": best["plan"], "tflops": best["tflops"],
                        "fraction_of_peak": best["tflops"] / peak["peak_tflops"]},
               "best_plan_per_model": best_per_model}
    print(f"best: {best['model']} under {best['plan']}: {best['tflops']:.5f} TFLOP/s = "
          f"{100 * summary['best']['fraction_of_peak']:.2f}% of the matmul peak")
    result = {
        "benchmark": "bench_models",
        "args": vars(args),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "jax": jax.__version__,
                    "devices": len(jax.devices()), "load_average": os.getloadavg()},
        "matmul_peak": peak,
        "runs": rows,
        "summary": summary,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
