"""A node checked before it costs a run (``launcher.preflight``).

Every rank, once it has joined and before the mode starts, spends about a second on two checks:

1. one all-reduce over every device of the job, whose value it checks (each device's 1, summed:
   the device count), timed: a node that cannot take part fails here, not an hour into the run;
2. a matmul on its own first device (``CPU_MATMUL_N`` square on a CPU, ``ACCELERATOR_MATMUL_N``
   on an accelerator, float32, the fastest of ``REPEATS`` after a warm-up): its rate in GFLOP/s,
   by the process's CPU time on a CPU device (``_matmul_rate`` says why), else by the wall.

Every rank's figures and node name are gathered on every rank (``hosts.gather``: no file), so every
rank reaches the same verdict: a node's rate is the median of its ranks', and a node whose rate is
below ``launcher.preflight_min`` times the median of the other nodes' is slow. Then every rank raises
``PreflightFailed`` with the same one line, naming the node; rank 0 first writes
``.xlaunch/preflight.json`` (every node's rate, the slow ones, ``exclude``). A rank whose own check
raises names its node in ``.xlaunch/preflight-failed/<node>`` and fails the job with its reason.
The waiting launcher leaves those nodes out of the restart where the backend can
(``Cluster.prepare_restart``: SLURM's ``--exclude``); with no restart left, the job stops there.

What it cannot see: a node slow in its network alone (the all-reduce is one for the whole job,
every rank waiting for the slowest link), or slow only under a real model's load.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from launcher.runtime.status import STATUS_DIR, _write_json

# The matmul's side: about 20-50 ms on a CPU device at 1,024; on an accelerator a side that
# small is launch and sync latency more than work (a few microseconds of it on an H100), so
# there it is 8,192 (1.1 TFLOP: tens of milliseconds on an MI250X GCD or an H100 in float32).
CPU_MATMUL_N = 1024
ACCELERATOR_MATMUL_N = 8192
REPEATS = 5
PREFLIGHT_FILE = "preflight.json"
FAILED_DIR = "preflight-failed"
_NAME_BYTES = 128


class PreflightFailed(RuntimeError):
    """A node failed the preflight or was found slow: not bad input (a restart without the node
    may well run)."""


def enabled(lc: Any, nodes: int) -> bool:
    """``launcher.preflight``: true, false, or null (the default): on for a job of more than one
    node, where a bad node is one among many and costs every rank."""
    return bool(lc.preflight) if lc.preflight is not None else nodes > 1


def run(run_dir: Path, node: str, process_id: int, minimum: float, slow_on: str = "") -> dict:
    """The checks on this rank, the job's verdict on every rank: returns every node's figures, or
    raises ``PreflightFailed``. ``slow_on``: the tests' ``launcher.fault=slow:<node>``, which
    makes that node's matmul do eight times the work in the time it reports as one."""
    try:
        allreduce_s = _allreduce()
        rate = _matmul_rate(8 if slow_on and slow_on == node else 1)
    except Exception as e:  # noqa: BLE001 - whatever failed, the node is named and left out
        failed = Path(run_dir) / STATUS_DIR / FAILED_DIR
        failed.mkdir(parents=True, exist_ok=True)
        (failed / node).write_text(f"{type(e).__name__}: {e}\n")
        raise PreflightFailed(f"preflight: rank {process_id} on node {node} failed its check: "
                              f"{type(e).__name__}: {e}") from e
    from launcher.runtime import hosts  # noqa: PLC0415  JAX: imported by the task once devices are set

    name = np.zeros(_NAME_BYTES, np.uint8)
    encoded = node.encode()[:_NAME_BYTES]
    name[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    every = hosts.gather(np.concatenate([np.array([rate, allreduce_s], np.float64), name.astype(np.float64)]))
    by_node: dict[str, list[float]] = {}
    for row in every:
        by_node.setdefault(bytes(row[2:].astype(np.uint8)).rstrip(b"\0").decode(errors="replace"), []).append(
            float(row[0]))
    rates = {n: float(statistics.median(rs)) for n, rs in by_node.items()}
    median = statistics.median(rates.values())
    # Each node against the median of the others: of two nodes, one at 0.43x the other is still
    # 0.6x their mean (the median of two), and the slow node would pull its own yardstick down.
    others = {n: statistics.median([r for m, r in rates.items() if m != n] or [r]) for n, r in rates.items()}
    slow = sorted((n for n, r in rates.items() if r < minimum * others[n]), key=lambda n: rates[n])
    found = {"nodes": {n: round(r, 2) for n, r in sorted(rates.items())}, "median_gflops": round(median, 2),
             "allreduce_s": float(np.max(every[:, 1])), "minimum": minimum, "slow": slow, "exclude": slow,
             "time": time.time()}
    if process_id == 0:
        _write_json(Path(run_dir) / STATUS_DIR / PREFLIGHT_FILE, found)
    if slow:
        raise PreflightFailed(
            "preflight: " + "; ".join(f"node {n} is slow: its matmul ran at {rates[n]:.1f} GFLOP/s, "
                                      f"{rates[n] / others[n]:.2f}x the other nodes' median {others[n]:.1f}"
                                      for n in slow)
            + f" (launcher.preflight_min={minimum:g})")
    return found


def excluded(run_dir: Path) -> list[str]:
    """The nodes the last preflight found slow or failing (what a restart leaves out)."""
    out: set[str] = set()
    try:
        out.update(json.loads((Path(run_dir) / STATUS_DIR / PREFLIGHT_FILE).read_text()).get("exclude", []))
    except (OSError, ValueError):
        pass
    failed = Path(run_dir) / STATUS_DIR / FAILED_DIR
    if failed.is_dir():
        out.update(p.name for p in failed.iterdir())
    return sorted(out)


def clear(run_dir: Path) -> None:
    """Forgets the last preflight's verdict (a restart's own preflight writes its own)."""
    (Path(run_dir) / STATUS_DIR / PREFLIGHT_FILE).unlink(missing_ok=True)
    failed = Path(run_dir) / STATUS_DIR / FAILED_DIR
    if failed.is_dir():
        for p in failed.iterdir():
            p.unlink(missing_ok=True)


def _allreduce() -> float:
    """One all-reduce over every device of the job, checked and timed (the second of two: the
    first compiles)."""
    import jax  # noqa: PLC0415  JAX: started by the task before the preflight
    import jax.numpy as jnp  # noqa: PLC0415
    from jax.sharding import NamedSharding  # noqa: PLC0415
    from jax.sharding import PartitionSpec as P  # noqa: PLC0415

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("all",))
    ones = jax.make_array_from_process_local_data(NamedSharding(mesh, P("all")),
                                                  np.ones(jax.local_device_count(), np.float32))
    total = jax.jit(jnp.sum)
    float(total(ones))
    t = time.perf_counter()
    value = float(total(ones))
    seconds = time.perf_counter() - t
    if value != jax.device_count():
        raise RuntimeError(f"an all-reduce of every device's 1 gave {value}, not {jax.device_count()}")
    return seconds


def _matmul_rate(work: int = 1) -> float:
    """GFLOP/s of a float32 matmul on this rank's first device (``work`` matmuls timed as one)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    device = jax.local_devices()[0]
    on_cpu = device.platform == "cpu"
    n = CPU_MATMUL_N if on_cpu else ACCELERATOR_MATMUL_N
    a = jax.device_put(jnp.ones((n, n), jnp.float32), device)
    mm = jax.jit(lambda x: x @ x)
    mm(a).block_until_ready()
    # On a CPU device the work is this process's CPU time, not the wall's: where ranks share
    # cores (pretend nodes on one host, an oversubscribed node), a rank that waited for a core
    # took longer on the wall without being slower (8 ranks on 2 cores: 36-42 GFLOP/s by the
    # wall, 152-163 by CPU time, a rank doing 8x the work 20).
    clock = time.process_time if on_cpu else time.perf_counter
    times = []
    for _ in range(REPEATS):
        t = clock()
        for _ in range(work):
            mm(a).block_until_ready()
        times.append(clock() - t)
    # The fastest run, not the median: a node slow in its hardware is slow in every run, while
    # a run that shared its cores with another job's is slow once (a false verdict ends the job).
    return 2 * n ** 3 / max(min(times), 1e-9) / 1e9


__all__ = ["run", "enabled", "excluded", "clear", "PreflightFailed", "CPU_MATMUL_N", "ACCELERATOR_MATMUL_N",
           "REPEATS"]
