"""HLO replay against the program itself: a training step, jitted and run directly, against the
same step dumped as HLO text and replayed, on the same devices and the same inputs.

    python bench/bench_hlo_replay.py [--model gpt-tiny] [--repeats 100] [--compiles 5]

For each layout (one CPU device under plan dp; 8 virtual CPU devices under plan dp_tp):

1. step time: the median over ``--repeats`` executions of each, run in back-to-back pairs whose
   order alternates, so that drift on a shared machine hits both alike; each time is launch to
   outputs ready. Ratio replay / original of the medians, and the median of the pairs' ratios.
2. compile time: the median over ``--compiles`` XLA compilations of the lowered step, the
   original's ``Lowered.compile()`` against replay's compile of the dumped module (interleaved
   too); replay's reading, parsing and conversion to StableHLO is reported apart as load time.
3. checks: the replayed outputs equal the original's, and XLA's cost analysis (flops) of the
   two executables agrees, i.e. the same program was compiled.

Goal: replay costs no more than 2% over running the program itself (ratios <= 1.02).
Results go to bench/results/bench_hlo_replay.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import jax  # noqa: E402

from launcher import jaxcompat  # noqa: E402

jaxcompat.set_cpu_device_count(8)

import numpy as np  # noqa: E402

LAYOUTS = (("dp", 1), ("dp_tp", 8))  # (plan, devices)


def build_model(preset: str):
    """The model of conf/model/<preset>.yaml, built as the launcher builds it."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from launcher.cli import schema

    schema.register()
    with initialize_config_dir(str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=[f"model={preset}"])
    return instantiate(cfg.model, _convert_="all")


def original_step(model, plan_name: str, devices):
    """The jitted training step with its plan's shardings, and its inputs placed accordingly."""
    from jax.sharding import NamedSharding, PartitionSpec

    from launcher.models.plans import builtin
    from launcher.models.sharding import use_rules
    from launcher.models.train import data_key, init_state, make_optimizer, make_train_step

    plan = builtin(plan_name)
    optimizer = make_optimizer(1e-3)
    mesh = plan.mesh(devices)
    sh = plan.shardings(model, mesh, optimizer)
    state = jax.jit(lambda k: init_state(model, optimizer, k), out_shardings=sh.state)(jax.random.key(0))
    batch = jax.jit(model.make_batch, out_shardings=sh.batch)(data_key(0, 0))
    # No donation: both sides run repeatedly on the same inputs.
    step = jax.jit(make_train_step(model, optimizer), in_shardings=(sh.state, sh.batch),
                   out_shardings=(sh.state, NamedSharding(mesh, PartitionSpec())))

    def lower():
        with use_rules(mesh, plan.rules_for("activations")):
            return step.lower(state, batch)

    return lower, (state, batch)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - start, out


def bench_layout(model, plan_name: str, devices, repeats: int, compiles: int, workdir: Path) -> dict:
    from launcher.hlo.options import ReplayOptions
    from launcher.hlo.replay import Replay, fetch

    lower, inputs = original_step(model, plan_name, devices)
    lowered = lower()
    hlo = workdir / f"step_{plan_name}.hlo"
    hlo.write_text(lowered.as_text(dialect="hlo"))
    np.savez(workdir / f"inputs_{plan_name}.npz", *[np.asarray(x) for x in jax.tree.leaves(inputs)])
    options = ReplayOptions(argument_mode="file", arguments_file=workdir / f"inputs_{plan_name}.npz",
                            num_repeats=repeats)

    # Compile: caches cleared, so JAX's in-memory compilation cache cannot serve the original.
    original_compile, replay_compile, replay_load = [], [], []
    for _ in range(compiles):
        jax.clear_caches()
        fresh = lower()
        seconds, compiled = timed(fresh.compile)
        original_compile.append(seconds)
        replay = Replay(hlo, options, devices)
        replay_compile.append(replay.result.compile_time_s)
        replay_load.append(replay.result.load_time_s)

    # Step: after a few warm-up runs of each, pairs of runs in alternating order (original then
    # replay, replay then original), so neither side always runs second.
    for _ in range(3):
        timed(lambda: compiled(*inputs))
        replay.execute()
    replay.result.execution_times_s.clear()
    original_step_s = []
    for i in range(repeats):
        if i % 2:
            replay.execute()
        seconds, expected = timed(lambda: compiled(*inputs))
        original_step_s.append(seconds)
        if not i % 2:
            replay.execute()
    replay_step_s = replay.result.execution_times_s

    got = fetch(replay.result.outputs)
    want = [np.asarray(x) for x in jax.tree.leaves(expected)]
    max_diff = max(float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))) for g, w in zip(got, want, strict=True))

    row = {
        "plan": plan_name,
        "devices": len(devices),
        "num_partitions": replay.result.num_partitions,
        "partitioner": replay.result.partitioner,
        "parameters": len(replay.result.parameters),
        "step_original_s": statistics.median(original_step_s),
        "step_replay_s": statistics.median(replay_step_s),
        "compile_original_s": statistics.median(original_compile),
        "compile_replay_s": statistics.median(replay_compile),
        "replay_load_s": statistics.median(replay_load),
        "outputs_max_abs_diff": max_diff,
        "flops_original": jaxcompat.cost_analysis(compiled).get("flops"),
        "flops_replay": replay.result.flops,
        "step_original_times_s": original_step_s,
        "step_replay_times_s": list(replay_step_s),
        "compile_original_times_s": original_compile,
        "compile_replay_times_s": replay_compile,
    }
    row["step_ratio"] = row["step_replay_s"] / row["step_original_s"]
    # The median of the per-pair ratios: each pair ran back to back, so load drift cancels.
    row["step_ratio_paired"] = statistics.median(r / o for r, o in zip(replay_step_s, original_step_s, strict=True))
    row["compile_ratio"] = row["compile_replay_s"] / row["compile_original_s"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt-tiny", help="a preset in conf/model")
    ap.add_argument("--repeats", type=int, default=100)
    ap.add_argument("--compiles", type=int, default=5)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "bench_hlo_replay.json"))
    args = ap.parse_args()

    model = build_model(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for plan_name, n in LAYOUTS:
            row = bench_layout(model, plan_name, jax.devices()[:n], args.repeats, args.compiles, Path(tmp))
            rows.append(row)
            print(f"{args.model} {plan_name:>5} on {n} device(s): step {row['step_original_s'] * 1e3:8.3f} ms -> "
                  f"replay {row['step_replay_s'] * 1e3:8.3f} ms (x{row['step_ratio']:.3f}, paired x{row['step_ratio_paired']:.3f}); "
                  f"compile "
                  f"{row['compile_original_s']:.3f} s -> {row['compile_replay_s']:.3f} s (x{row['compile_ratio']:.3f}), "
                  f"+ load {row['replay_load_s']:.3f} s; outputs max |diff| {row['outputs_max_abs_diff']:.2e}; "
                  f"flops {row['flops_original']} / {row['flops_replay']}", flush=True)

    result = {"model": args.model, "repeats": args.repeats, "compiles": args.compiles,
              "machine": platform.platform(), "python": platform.python_version(), "jax": jax.__version__,
              "cpu_cores_visible": len(__import__("os").sched_getaffinity(0)),
              "goal": "step_ratio and compile_ratio <= 1.02", "layouts": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
