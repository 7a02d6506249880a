"""CFP analysis pass: analysis time against model depth, and the search-space reduction.

    python bench/bench_cfp_analysis.py [--repeats 3] [--depths 2 8 32 96]

1. GPT at gpt-tiny's widths with 2, 8, 32 and 96 layers, analysed for a 1-D mesh of 8: the
   median wall time of ``analyze`` (tracing the training step included) over repeats, and the
   time per layer, which should stay flat (linear growth);
2. per tiny model preset (conf/model/*-tiny.yaml), the exhaustive space (product of every
   block's plan count) against CFP's segment space (sum over unique segments of their
   products), and the reduction factor.

Results go to bench/results/bench_cfp_analysis.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MODELS = ("gpt", "bert", "llama2", "moe")


def tiny_model(name: str, **overrides):
    """The model of conf/model/<name>-tiny.yaml, with field overrides."""
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from launcher.models.configs import SCHEMAS

    cfg = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "model" / f"{name}-tiny.yaml"))
    cfg.pop("defaults", None)
    return get_class(SCHEMAS[name]._target_)(**{**cfg, **overrides})


def analyse(model, mesh_shape):
    from launcher.sharding import pipeline

    analyzed = pipeline.analyze(model, mesh_shape=mesh_shape)
    return analyzed.analysis, analyzed.seconds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--depths", type=int, nargs="+", default=[2, 8, 32, 96])
    ap.add_argument("--mesh", type=int, nargs="+", default=[8])
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "bench_cfp_analysis.json"))
    args = ap.parse_args()

    depth_rows = []
    for depth in args.depths:
        times, a = [], None
        for _ in range(args.repeats):
            a, seconds = analyse(tiny_model("gpt", num_layers=depth), args.mesh)
            times.append(seconds)
        median = statistics.median(times)
        row = {"layers": depth, "analysis_time_s": median, "times_s": times, "time_per_layer_s": median / depth,
               "ops": len(a.graph.ops), "blocks": len(a.blocks), "segments": len(a.segments),
               "templates": len(a.templates)}
        depth_rows.append(row)
        print(f"gpt layers={depth:3d}: {median:7.2f} s ({median / depth * 1e3:6.1f} ms/layer), "
              f"{row['ops']} ops, {row['blocks']} blocks, {row['segments']} segments, {row['templates']} templates",
              flush=True)
    first, last = depth_rows[0], depth_rows[-1]
    growth = (last["analysis_time_s"] / first["analysis_time_s"]) / (last["layers"] / first["layers"])

    space_rows = []
    for name in MODELS:
        a, seconds = analyse(tiny_model(name), args.mesh)
        row = {"model": f"{name}-tiny", "blocks": len(a.blocks), "templates": [t.plan_counts for t in a.templates],
               "exhaustive_space": a.exhaustive_space, "segment_space": a.segment_space,
               "reduction": a.exhaustive_space / a.segment_space, "analysis_time_s": seconds}
        space_rows.append(row)
        print(f"{row['model']:>12}: exhaustive {a.exhaustive_space:.3e}, segment {a.segment_space}, "
              f"reduction x{row['reduction']:.3g} ({len(a.blocks)} blocks, templates {row['templates']})", flush=True)

    result = {"machine": platform.platform(), "python": platform.python_version(), "mesh_shape": args.mesh,
              "repeats": args.repeats, "depth": depth_rows,
              "growth_vs_linear": growth, "spaces": space_rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"time growth {first['layers']}->{last['layers']} layers over linear: {growth:.2f} (1.0 = linear)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
