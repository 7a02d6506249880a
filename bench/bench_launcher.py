"""The launcher's own overhead, measured end to end.

1. ``python -m launcher mode=check`` on cluster=local (2 processes x 4 CPU devices), against a
   bare hand-written script that starts the same two processes with jax.distributed and does
   the same work (psum over all 8 devices, one small all-gather): the ratio of wall times is
   what the launcher adds (Hydra, submitit, rank files, logs, the result).
2. Submit-to-result time of the same check on a real local SLURM (2 nodes x 2 tasks), started
   by the test fixture's code.

Runs alternate between the variants so that background load hits both alike; medians of
``--repeats`` runs are written to bench/results/launcher.json.

    python bench/bench_launcher.py [--repeats 3] [--no-slurm]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "launcher.json"
CHECK = ["mode=check", "mode.allgather_mb=0.25", "mode.repeats=1"]

# Two processes, four CPU devices each: the psum and all-gather that mode=check does, no launcher.
BARE = textwrap.dedent("""
    import sys
    import jax
    from launcher import jaxcompat
    jaxcompat.set_cpu_device_count(4)
    jaxcompat.use_gloo_cpu_collectives()
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    port, pid = int(sys.argv[1]), int(sys.argv[2])
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    n = jax.device_count()
    mesh = Mesh(np.array(jax.devices()), ("d",))
    shard = NamedSharding(mesh, P("d"))
    x = jax.make_array_from_callback((n,), shard, lambda i: np.arange(n, dtype=np.float32)[i])
    total = jax.jit(jaxcompat.shard_map(lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"), out_specs=P("d")))(x)
    per = 2**16
    y = jax.make_array_from_callback((n * per,), shard, lambda i: np.ones(per, np.float32))
    g = jax.jit(jaxcompat.shard_map(lambda v: jax.lax.all_gather(v, "d", tiled=True), mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))(y)
    g.block_until_ready()
    from jax.experimental import multihost_utils
    got = np.asarray(multihost_utils.process_allgather(total, tiled=True))
    assert np.allclose(got, n * (n - 1) / 2), got
    jax.distributed.shutdown()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_launcher(overrides: list[str], env: dict | None = None) -> float:
    with tempfile.TemporaryDirectory(prefix="xlaunch-bench-") as tmp:
        run = Path(tmp) / "run"
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "launcher", *overrides, f"hydra.run.dir={run}"], cwd=REPO,
                              capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
        elapsed = time.perf_counter() - t0
        if proc.returncode or not json.loads((run / "result.json").read_text())["psum_ok"]:
            raise RuntimeError(f"launcher run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return elapsed


def time_bare() -> float:
    with tempfile.TemporaryDirectory(prefix="xlaunch-bench-") as tmp:
        script = Path(tmp) / "bare.py"
        script.write_text(BARE)
        port = free_port()
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        t0 = time.perf_counter()
        logs = [Path(tmp) / f"bare{i}.log" for i in (0, 1)]
        procs = [subprocess.Popen([sys.executable, str(script), str(port), str(i)], env=env,
                                  stdout=log.open("w"), stderr=subprocess.STDOUT) for i, log in enumerate(logs)]
        codes = [p.wait(timeout=600) for p in procs]
        elapsed = time.perf_counter() - t0
        if any(codes):
            raise RuntimeError(f"bare script failed: exit codes {codes}\n" + logs[0].read_text()[-2000:])
        return elapsed


def summary(samples: list[float]) -> dict:
    return {"median_s": statistics.median(samples), "samples_s": samples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-slurm", action="store_true", help="skip the local SLURM measurement")
    args = ap.parse_args()

    load_at_start = os.getloadavg()[0]  # other work on the machine slows both variants alike
    launcher_local, bare = [], []
    for i in range(args.repeats):
        launcher_local.append(time_launcher(["cluster=local", "cluster.tasks_per_node=2",
                                             "cluster.cpu_devices_per_task=4", *CHECK]))
        bare.append(time_bare())
        print(f"[{i + 1}/{args.repeats}] launcher {launcher_local[-1]:.2f} s, bare {bare[-1]:.2f} s", flush=True)
    result = {
        "what": "wall time of mode=check (2 processes x 4 CPU devices) through the launcher vs a bare "
                "two-process jax.distributed script doing the same psum and all-gather",
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "load_average_1min_at_start": load_at_start},
        "repeats": args.repeats,
        "local": {"launcher": summary(launcher_local), "bare_jax_distributed": summary(bare),
                  "ratio_launcher_over_bare": statistics.median(launcher_local) / statistics.median(bare),
                  "overhead_s": statistics.median(launcher_local) - statistics.median(bare)},
    }
    if not args.no_slurm:
        sys.path.insert(0, str(REPO))
        from tests.clusterkit.slurm import LocalSlurm

        root = Path(tempfile.mkdtemp(prefix="xlaunch-slurm-", dir="/tmp"))
        root.chmod(0o755)
        t0 = time.perf_counter()
        slurm = LocalSlurm(root).start()
        start_s = time.perf_counter() - t0
        try:
            samples = []
            for i in range(args.repeats):
                samples.append(time_launcher(["cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=2",
                                              "cluster.cpu_devices_per_task=2", *CHECK], env=slurm.env))
                print(f"[{i + 1}/{args.repeats}] slurm submit-to-result {samples[-1]:.2f} s", flush=True)
        finally:
            slurm.stop()
            shutil.rmtree(root, ignore_errors=True)
        result["slurm"] = {"what": "submit-to-result wall time of the CLI, mode=check on the local SLURM, "
                                   "2 nodes x 2 tasks x 2 CPU devices", "submit_to_result": summary(samples),
                           "cluster_start_s": start_s}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(RESULTS)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
