"""Studies of a mesh's communication for ``mode=profile``: every uniform plan's collectives, their
time and the step's (``communication_study``), and the mesh's all-reduce bandwidth.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Callable

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.measuring.timing import Timer, slowest_process
from launcher.sharding.search.comm import collectives, total_bytes
from launcher.runtime import trace_stats
from launcher.sharding.search.race import run_plan

if TYPE_CHECKING:
    from launcher.sharding.program import TrainingProgram


def communication_study(a: Analysis, program: TrainingProgram, mesh: jax.sharding.Mesh, *, iterations: int, repeats: int, seed: int,
                        log: Callable[[str], None]) -> list[dict]:
    """Every uniform plan (all blocks on plan k, or their last plan) of the whole step: the
    collective volume of its compiled program, the time spent communicating and the step time.

    The communication time is read from a profiler trace of the plan's run where the backend
    records device ops (GPU, TPU: ``launcher/runtime/trace_stats.py``). The CPU backend's trace
    does not separate collectives from computation, so there it is an estimate: collective bytes
    over the all-reduce bandwidth measured on the same mesh (each row says which)."""
    bandwidth = allreduce_bandwidth(mesh)
    log(f"all-reduce bandwidth on the mesh: {bandwidth / 1e9:.3f} GB/s per device")
    rows = []
    for k in range(max(b.num_plans for b in a.blocks)):
        assignment = {b.id: min(k, b.num_plans - 1) for b in a.blocks}
        run = lambda assignment=assignment, k=k: run_plan(a, program, assignment, mesh, iterations=iterations, repeats=repeats, seed=seed,
                               name=f"uniform{k}")
        # Not traced where the trace could not tell anyway (CPU devices): tracing costs step time.
        ops, r = trace_stats.timed(run) if mesh.devices.flat[0].platform != "cpu" else (None, run())
        stats = collectives(r.compiled.as_text())
        volume = total_bytes(stats)
        steps = 1 + iterations * repeats  # race's warm-up step, then the rounds
        if ops is not None:
            comm, method = ops.collective_s / steps, "trace: device time in collective ops per step"
        else:
            comm = volume / bandwidth
            method = ("estimate: collective bytes / measured all-reduce bandwidth (this backend's trace "
                      "records no device ops)")
        rows.append({"plan": k, "comm_volume_bytes": volume, "collectives": stats, "step_time_s": r.step_time_s,
                     "comm_time_s": comm, "compute_time_s": max(r.step_time_s - comm, 0.0),
                     "comm_time_method": method, "memory_gb": r.memory_bytes / 2**30})
        log(f"Uniform plan {k}: Comm Volume: {volume / 1e6:.3f} MB, comm time {comm:.6f} s "
            f"({'trace' if ops is not None else 'estimate'}), compute {rows[-1]['compute_time_s']:.6f} s, "
            f"step {r.step_time_s:.6f} s")
    return rows


def allreduce_bandwidth(mesh: jax.sharding.Mesh, mib: float = 4.0, repeats: int = 5) -> float:
    """Bytes per second per device of an all-reduce over every device of ``mesh``."""
    n = mesh.devices.size
    per = max(int(mib * 2**20 / 4), 1)
    sharded = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    x = jax.make_array_from_callback((n, per), sharded, lambda idx: np.ones((1, per), np.float32))
    f = jax.jit(lambda y: y.sum(axis=0, keepdims=True), in_shardings=sharded,
                out_shardings=NamedSharding(mesh, PartitionSpec())).lower(x).compile()
    return per * 4 / statistics.median(slowest_process(Timer(1, repeats).runs([f], [x])[0]))
