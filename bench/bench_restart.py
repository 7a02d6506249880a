"""What a restart costs: time from submission to the first step, the first run against its
restart, with JAX's persistent compilation cache in the run dir (``launcher.compile_cache_dir``).

    python bench/bench_restart.py [--repeats 3] [--out FILE]

- ``mode=train`` (gpt-tiny, 2 ranks x 4 CPU devices, checkpoints every 8 steps,
  ``launcher.max_restarts=1``): rank 1 is killed once the first checkpoint is saved; the
  launcher restarts the job in the same run dir and it resumes from the checkpoint. Measured for
  each attempt: from its submission (the launcher's "submitted" line, or its "restarted as job"
  line) to the moment rank 0 starts stepping (its ``train ...: 0/N`` line: imports, joining,
  compiling and restoring done), and the compile cache's hits and misses.
- ``mode=cfp`` (the default job's model and meshes): run to its end, then the same command again
  in the same run dir (what a requeue or a rerun does): the wall time of each and the cache's
  counts (the profile store in the run dir spares the rerun its measurements too).

Medians over ``--repeats`` fresh run dirs; every figure of every repeat goes to the file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "bench_restart.json"
TRAIN = ["mode=train", "model=gpt-tiny", "mode.steps=48", "mode.checkpoint_every=8", "launcher.max_restarts=1"]
CFP = ["mode=cfp"]
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) rank0 INFO train \S+ \[\w+\]: 0/", re.M)


def _env() -> dict:
    # The run dir's own cache, not one a caller's environment names.
    return {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}


def _stamp(text: str) -> float:
    day, ms = text.split(",")
    return time.mktime(time.strptime(day, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000


def train_once(run: Path) -> dict:
    """One training job killed at rank 1 and restarted: per attempt, submission to first step."""
    proc = subprocess.Popen([sys.executable, "-m", "launcher", *TRAIN, f"hydra.run.dir={run}"], cwd=REPO, env=_env(),
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    submitted: list[float] = []

    def read() -> None:
        for line in proc.stderr:
            if line.startswith("submitted job") or "restarted as job" in line:
                submitted.append(time.time())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    first_checkpoint = run / "checkpoints" / "8"
    while not first_checkpoint.exists() and proc.poll() is None:
        time.sleep(0.1)
    pid = json.loads((run / ".xlaunch" / "ranks" / "rank1.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    proc.wait()
    reader.join()
    text = (run / "logs" / "rank0.log").read_text()
    attempts = text.split("=== restart 1 ")
    starts = [_stamp(m.group(1)) for part in attempts for m in [next(STAMP.finditer(part), None)] if m]
    result = json.loads((run / "result.json").read_text())
    return {"returncode": proc.returncode, "to_first_step_s": [s - t for s, t in zip(starts, submitted, strict=True)],
            "resumed_from_step": result["resumed_from_step"], "compile_cache_restart": result.get("compile_cache")}


def cfp_once(run: Path) -> dict:
    """The default job, then the same command in the same run dir."""
    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "launcher", *CFP, f"mode.store_dir={run}/store", f"hydra.run.dir={run}"],
                       cwd=REPO, env=_env(),
                       check=True, capture_output=True)
        r = json.loads((run / "result.json").read_text())
        out.append({"wall_s": time.perf_counter() - t0, "compile_cache": r.get("compile_cache")})
    return {"runs": out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cfp-repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="xlaunch-bench-restart-") as work:
        train = [train_once(Path(work) / f"train{i}") for i in range(args.repeats)]
        cfp = [cfp_once(Path(work) / f"cfp{i}") for i in range(args.cfp_repeats)]
    first = [t["to_first_step_s"][0] for t in train if len(t["to_first_step_s"]) == 2]
    again = [t["to_first_step_s"][1] for t in train if len(t["to_first_step_s"]) == 2]
    summary = {
        "train_to_first_step_s": {"first_run": statistics.median(first), "restart": statistics.median(again),
                                  "restart_over_first": statistics.median(b / a for a, b in zip(first, again,
                                                                                                strict=True))},
        "cfp_wall_s": {"first_run": statistics.median(c["runs"][0]["wall_s"] for c in cfp),
                       "rerun": statistics.median(c["runs"][1]["wall_s"] for c in cfp)},
    }
    record = {"command": {"train": TRAIN, "cfp": CFP}, "summary": summary, "train": train, "cfp": cfp,
              "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
