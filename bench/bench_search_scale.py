"""What does a cold search cost as the devices grow? CFP and the ILP at 8, 16, 32 and 64 devices.

    python bench/bench_search_scale.py [--devices 8 16 32 64] [--algorithms cfp ilp] [--out FILE]
                                       [-- extra overrides, e.g. model=llama2-tiny]

Each point is the default job (``python -m launcher``: 2 processes, gloo between them) with
``cluster.cpu_devices_per_task`` = devices / 2 virtual CPU devices each and the batch grown with
the devices (``model.batch_size`` = devices: one example a device, as a data-parallel job grows;
every mesh's per-device shapes then stay those of 8 devices' 1 x 8 layout), from an empty profile
store. Recorded per point, from its ``result.json`` and rank 0's log:

- the meshes: searched (analysed), priced by the mesh gate, profiled, and those the gate left out;
- the programs: segment combinations profiled, shortlisted plans compiled and measured, the
  baselines raced;
- seconds per pass: analysis (every mesh), the ILP's calibration and solving (the ILP's run), the
  profile, the shortlist (CFP's), the final race (with its baselines' compiles), and the whole
  command;
- the peak resident memory of the largest process (``ru_maxrss`` of the waited-for children).

Written to ``bench/results/bench_search_scale.json``. The question (issue 64, point 1): does
the cold search at 64 devices stay within 2x its 8-device time? On this machine the 64 devices
are virtual CPU devices of two cores, so each timed step costs 8 times the 8-device job's work
(one example a device): the seconds a pass spends running programs grow with the devices here
where on real devices they would not; the compiles and the counts are what carries over.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bench_search_scale.json"

# Rank 0's log lines that open each pass (the first of each), in order.
MARKS = {
    "analysis": r"joined in ",     # from the processes joining: every mesh analysed
    "ilp": r"mesh gate: ",       # the ILP's calibration and solving: the gate's (CFP), or the ILP's run (below)
    "profile": r"profile store: ",
    "shortlist": r"search optimum on mesh ",
    "race": r"searched plan and baselines: 0/",
    "end": r"wrote .*result\.json",
}
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def passes(log: str, algorithm: str = "cfp") -> dict[str, float]:
    """Seconds from each pass's first line to the next pass's (rank 0's log). In CFP's run the
    profile calibrates the ILP's lines too, so only the gate's lines open its "ilp" pass."""
    marks = {**MARKS, "ilp": r"ILP cost model"} if algorithm == "ilp" else MARKS
    first: dict[str, float] = {}
    for line in log.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, pattern in marks.items():
            if name not in first and re.search(pattern, line):
                first[name] = t
    order = sorted(first, key=first.get)
    return {a: round(first[b] - first[a], 2) for a, b in zip(order, order[1:], strict=False)}


def one_point(devices: int, algorithm: str, extra: list[str], work: Path, timeout_s: float) -> dict:
    run_dir, store = work / f"{algorithm}_{devices}", work / f"store_{algorithm}_{devices}"
    cmd = [sys.executable, "-m", "launcher", f"mode.algorithm={algorithm}", f"model.batch_size={devices}",
           f"cluster.cpu_devices_per_task={devices // 2}", f"mode.store_dir={store}", f"hydra.run.dir={run_dir}",
           *extra]
    t0 = time.perf_counter()
    # A session of its own, so that a point over its time is stopped with its ranks.
    # Cold: the link model the race is priced on (predict/price.py) measured in the point too.
    with subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, env={**os.environ, "XLAUNCH_CACHE_DIR": str(store / "cache")}) as popen:
        try:
            out, err = popen.communicate(timeout=timeout_s)
            proc = subprocess.CompletedProcess(cmd, popen.returncode, out, err)
        except subprocess.TimeoutExpired:
            os.killpg(popen.pid, signal.SIGKILL)
            popen.communicate()
            proc = None
    if proc is None:   # recorded as at least that long; its log says how far it got
        log = run_dir / "logs" / "rank0.log"
        return {"devices": devices, "algorithm": algorithm, "wall_s": None, "over_s": timeout_s, "returncode": None,
                "passes_s": passes(log.read_text(), algorithm) if log.exists() else {}}
    wall = time.perf_counter() - t0
    row: dict = {"devices": devices, "algorithm": algorithm, "wall_s": round(wall, 1), "returncode": proc.returncode,
                 "peak_rss_gb_so_far": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20}
    if proc.returncode != 0:
        return {**row, "stderr_tail": proc.stderr[-2000:]}
    r = json.loads((run_dir / "result.json").read_text())
    log = (run_dir / "logs" / "rank0.log").read_text()
    meshes = r.get("meshes") or []
    cands = r.get("candidates") or []
    row.update({
        "meshes_searched": [m["mesh_shape"] for m in meshes],
        "meshes_gated_out": [m["mesh_shape"] for m in meshes if "not profiled" in str(m.get("skipped", ""))],
        "meshes_priced": sum(1 for m in meshes if m.get("gate_predicted_step_time_s")),
        "profiled_configs": r.get("profiled_configs"),
        "measured_configs": r.get("measured_configs"),
        # Of those profiled: another mesh's entry of the same per-device program, not measured again.
        "same_program_configs": r.get("same_program_configs"),
        "shortlist_measured": sum(1 for c in cands if c.get("measured_step_time_s") is not None),
        "baselines_raced": sorted(r.get("baselines", {})),
        "ilp_variables": sum(m.get("num_variables") or m.get("gate_ilp_variables") or 0 for m in meshes) or None,
        "passes_s": passes(log, algorithm),
        "plan_mesh": r.get("mesh_shape"), "vs_best_baseline_paired": r.get("vs_best_baseline_paired"),
        "best_baseline": r.get("best_baseline"),
    })
    print(f"{algorithm} at {devices} devices: {wall:.0f} s, {row['passes_s']}", file=sys.stderr, flush=True)
    return row


def open_files_for_many_devices() -> None:
    """The points' ranks may hold as many files as the kernel allows (``fs.nr_open``): gloo holds
    a socket per pair of devices of a group for a process's life, 2,016 per process for each group
    of 64 devices over two processes, and a 64-device search measures plans over ten meshes (it
    died in its shortlist at this machine's 20,000; launcher/runtime/task.py). A rank raises its
    soft limit to the hard one; only root raises the hard one, here, for the children."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        most = int(Path("/proc/sys/fs/nr_open").read_text())
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, max(hard, most)))
    except (OSError, ValueError):   # not root, or no /proc: the limits stand, and a rank warns
        return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 16, 32, 64])
    ap.add_argument("--algorithms", nargs="+", default=["cfp", "ilp"])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--timeout", type=float, default=1800, help="seconds a point may take (then: over that)")
    ap.add_argument("extra", nargs="*", help="extra Hydra overrides for every run")
    args = ap.parse_args()
    open_files_for_many_devices()
    rows = []
    # The points' run dirs and stores, removed at the end unless a point failed: then its logs
    # are what says why (a point at 64 devices once died in its shortlist, its log gone with them).
    tmp = tempfile.mkdtemp(prefix="xlaunch-scale-")
    try:
        for n in args.devices:
            for a in args.algorithms:
                rows.append(one_point(n, a, args.extra, Path(tmp), args.timeout))
                if rows[-1]["returncode"] != 0:
                    rows[-1]["run_dir"] = str(Path(tmp) / f"{a}_{n}")
                    print(f"{a} at {n} devices failed: its run dir is kept, {rows[-1]['run_dir']}", file=sys.stderr)
                args.out.parent.mkdir(parents=True, exist_ok=True)   # written after each point: nothing lost
                args.out.write_text(json.dumps({"command": "python bench/bench_search_scale.py " + " ".join(sys.argv[1:]),
                                                "rows": rows, "machine": {"cpus": os.cpu_count(),
                                                                         "platform": platform.platform()}},
                                               indent=2) + "\n")
    finally:
        if all(r["returncode"] == 0 for r in rows):
            shutil.rmtree(tmp, ignore_errors=True)
    by = {(r["algorithm"], r["devices"]): r for r in rows if r["returncode"] == 0}   # the ratios to the fewest devices
    for a in args.algorithms:
        if (a, min(args.devices)) in by:
            base = by[a, min(args.devices)]["wall_s"]
            print(a, {n: round(by[a, n]["wall_s"] / base, 2) for n in args.devices if (a, n) in by})


if __name__ == "__main__":
    main()
