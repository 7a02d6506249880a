"""Is the profile pass flat in depth? ``mode=profile`` of one model at two depths, its layers
unrolled and run by ``lax.scan``, each run from an empty profile store.

    python bench/bench_profile_depth.py [--model gpt-tiny] [--layers 2 16] [--runs 3] [-- overrides]

CFP profiles each unique segment once, so a model's repeated layers cost one layer's profile
whatever their number; what grows with depth is the analysis (outside the profile) and the
programs priced once per step (the whole step's overhead program, the gradients' all-reduce).
Reported per depth and layout, medians over ``--runs``: the profile's seconds (``profile_time_s``
of result.json), the combinations it measured, and the job's wall time; and the ratio of the
deepest to the shallowest profile, per layout (issue #34 asks at most 1.2).
Results: bench/results/bench_profile_depth.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bench_profile_depth.json"


def one_run(model: str, layers: int, scan: bool, extra: list[str], work: Path) -> dict:
    run_dir = work / f"{layers}-{scan}-{time.monotonic_ns()}"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "launcher", "mode=profile", f"model={model}",
                           f"model.num_layers={layers}", f"model.scan_layers={str(scan).lower()}",
                           f"mode.store_dir={run_dir / 'store'}", f"hydra.run.dir={run_dir / 'run'}", *extra],
                          cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"layers={layers} scan={scan}: the job failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    r = json.loads((run_dir / "run" / "result.json").read_text())
    return {"wall_s": wall, "profile_time_s": r["profile_time_s"], "measured_configs": r["measured_configs"],
            "segment_space": r["segment_space"], "num_contractions": r["num_contractions"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt-tiny")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 16])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("extra", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="xlaunch-depth-") as tmp:
        # Interleaved (each depth and layout once per round): a machine that slows down mid-way
        # slows every configuration alike.
        runs: dict[tuple[int, bool], list[dict]] = {}
        for _ in range(args.runs):
            for scan in (False, True):
                for layers in args.layers:
                    runs.setdefault((layers, scan), []).append(one_run(args.model, layers, scan, args.extra, Path(tmp)))
        for (layers, scan), rs in runs.items():
            row = {"layers": layers, "scan_layers": scan, "runs": rs,
                   "profile_time_s": statistics.median(r["profile_time_s"] for r in rs),
                   "wall_s": statistics.median(r["wall_s"] for r in rs),
                   "measured_configs": rs[0]["measured_configs"], "num_contractions": rs[0]["num_contractions"]}
            rows.append(row)
            print(f"layers {layers:>3} {'scanned' if scan else 'unrolled':>8}: profile {row['profile_time_s']:.1f} s "
                  f"({row['measured_configs']} combinations), job {row['wall_s']:.1f} s", flush=True)
    lo, hi = min(args.layers), max(args.layers)
    by = {(r["layers"], r["scan_layers"]): r for r in rows}
    ratios = {("scanned" if scan else "unrolled"): by[hi, scan]["profile_time_s"] / by[lo, scan]["profile_time_s"]
              for scan in (False, True)}
    print(f"profile at {hi} layers over {lo}: " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python bench/bench_profile_depth.py " + " ".join(sys.argv[1:]), "model": args.model,
        "rows": rows, f"profile_{hi}_over_{lo}": ratios,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
    }, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
