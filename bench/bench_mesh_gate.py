"""Is the mesh gate (``mode.mesh_gate``, ``launcher/sharding/ilp/gate.py``) beyond its model's
error, and what does it save? The built-in presets searched cold, two ways in turn.

    python bench/bench_mesh_gate.py [--presets gpt bert llama2 moe] [--runs 1] [--gate 1.25] [--out FILE]

1. **Every mesh profiled and priced** (``mode.mesh_gate=1e9``): CFP's search as it is without the
   gate, with the ILP's calibrated model's price for each mesh's optimum beside it. Per run: for
   each mesh, its price over the cheapest mesh's (the gate's ratio) and the fastest plan CFP
   measured on it (its shortlist, each round's median) over the fastest on any mesh. The
   model's error on the mesh choice is the price ratio of the mesh CFP measured fastest: a gate
   at or below it would have left out the mesh the plan came from.
2. **Gated** (``mode.mesh_gate=<--gate>``): the same job with the gate, its wall time and CFP's
   plan over the best baseline (paired) beside the ungated run's.

Each run is ``bench_default_job.py``'s: a fresh store and run dir, timed from the command line
to its exit. Written to ``bench/results/bench_mesh_gate.json``: every run's rows, per preset the
worst price ratio of a fastest mesh and the wall-time ratio, and over all of them the largest
ratio the gate must stay beyond.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from bench_default_job import one_run  # noqa: E402

RESULTS = REPO / "bench" / "results" / "bench_mesh_gate.json"
PRICE_EVERY_MESH = "1e9"


def mesh_error(row: dict) -> dict:
    """From an every-mesh run's row: each mesh's price ratio and measured ratio, and the price
    ratio of the mesh measured fastest."""
    prices = {tuple(m["mesh_shape"]): m["gate_predicted_step_time_s"] for m in row["meshes"]
              if m.get("gate_predicted_step_time_s")}
    measured: dict[tuple, float] = {}
    for c in row["candidates"]:
        if c.get("paired_ratio") is not None:
            k = tuple(c["mesh_shape"])
            measured[k] = min(measured.get(k, float("inf")), c["paired_ratio"])
    if not prices or not measured:
        return {"meshes": [], "fastest_mesh": None, "fastest_mesh_price_ratio": None}
    cheapest, fastest = min(prices.values()), min(measured.values())
    best = min(measured, key=measured.get)
    return {"meshes": [{"mesh_shape": list(k), "price_ratio": prices[k] / cheapest,
                        "measured_ratio": measured[k] / fastest if k in measured else None} for k in prices],
            "fastest_mesh": list(best), "fastest_mesh_price_ratio": prices.get(best, cheapest) / cheapest}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["gpt", "bert", "llama2", "moe"])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--gate", default=None, help="the gated arm's mode.mesh_gate (default: the option's default)")
    ap.add_argument("--arms", choices=["both", "every"], default="both",
                    help="every: the every-mesh runs alone (the model's error, not what the gate saves)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    gated_override = [f"mode.mesh_gate={args.gate}"] if args.gate else []
    presets = {}
    with tempfile.TemporaryDirectory(prefix="xlaunch-gate-") as tmp:
        for m in args.presets:
            rows = []
            for i in range(args.runs):
                every = one_run([f"model={m}-tiny", f"mode.mesh_gate={PRICE_EVERY_MESH}"], Path(tmp) / m, 2 * i)
                gated = one_run([f"model={m}-tiny", *gated_override], Path(tmp) / m, 2 * i + 1) \
                    if args.arms == "both" else None
                rows.append({"every_mesh": every, "gated": gated,
                             "error": mesh_error(every) if "returncode" not in every else None,
                             "wall_ratio": gated["wall_s"] / every["wall_s"] if gated else None})
                print(f"{m} run {i}: every mesh {every['wall_s']:.0f} s" + (f", gated {gated['wall_s']:.0f} s" if gated
                                                                            else "")
                      + f"; fastest mesh priced {(rows[-1]['error'] or {}).get('fastest_mesh_price_ratio')}",
                      file=sys.stderr, flush=True)
            ok = [r for r in rows if r["error"] and r["error"]["fastest_mesh_price_ratio"] is not None]
            presets[m] = {
                "runs": rows,
                "max_fastest_mesh_price_ratio": max((r["error"]["fastest_mesh_price_ratio"] for r in ok), default=None),
                "median_wall_ratio": statistics.median(r["wall_ratio"] for r in rows) if args.arms == "both" else None,
                "every_mesh_vs_best_baseline_paired": [r["every_mesh"].get("vs_best_baseline_paired") for r in rows],
                "gated_vs_best_baseline_paired": [r["gated"].get("vs_best_baseline_paired") for r in rows if r["gated"]],
                "gated_wall_s": [r["gated"]["wall_s"] for r in rows if r["gated"]],
            }
    worst = max((p["max_fastest_mesh_price_ratio"] for p in presets.values()
                 if p["max_fastest_mesh_price_ratio"] is not None), default=None)
    summary = {"gate": args.gate or "default", "presets": presets, "max_fastest_mesh_price_ratio": worst,
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                           "python": platform.python_version()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "presets"}
                     | {"presets": {m: {k: v for k, v in p.items() if k != "runs"} for m, p in presets.items()}},
                     indent=2))


if __name__ == "__main__":
    main()
