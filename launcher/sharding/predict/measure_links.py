"""Measuring a link model on the machine at hand (``mode=check mode.measure_links=true``, the
benches): the collectives timed as the ILP's calibration times them (``measuring/calibrate.py``),
over a mesh whose first axis crosses the processes (nodes) and whose second stays within one,
and turned into the figures ``links.py`` reads (``links.from_line``), one pair per collective.
The matmul rate, the memory bandwidth (every device at once) and what running a program at all
costs (a step's launch) are measured too; the memory is
the host's share per device on CPU, else what JAX says a device holds."""

from __future__ import annotations

import math
import os
import jax
import numpy as np

from launcher.sharding.measuring.calibrate import launch_seconds, measure, stream_program, stream_rate
from launcher.sharding.measuring.costmodel import COLLECTIVES
from launcher.sharding.measuring.timing import Timer
from launcher.sharding.predict.links import Link, LinkModel, from_line


def measure_links(repeats: int = 12, name: str = "measured") -> LinkModel:
    """The link model of this job's devices: within a process (node) over its local devices,
    across processes over groups strided over them (one device of each process, then more), each
    at every group size that divides them (2, 4, ... up to all); with one process, ``across``
    repeats ``within`` (and the other way round)."""
    processes, local = jax.process_count(), jax.local_device_count()
    devices = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))).reshape(processes, local)
    timer = Timer(1, repeats)
    rate = 0.0

    def link(axis: int) -> Link | None:
        nonlocal rate
        total = devices.size if axis == 0 else local
        sizes = [n for n in range(2, total + 1) if total % n == 0] if devices.shape[axis] > 1 else []
        if not sizes:
            return None
        by_size = {}
        for n in sizes:
            # Within: n devices of one process, a mesh axis of its own. Across: n devices strided
            # over the processes (as a plan's groups over an outer mesh axis are), the devices
            # numbered process by process: one of each process up to n = processes, more beyond.
            shape = (1, n, devices.size // n) if axis == 0 else (processes, local // n, n)
            grouped = 1 if axis == 0 else 2
            mesh = jax.sharding.Mesh(devices.reshape(shape), ("a", "b", "c"))
            model = measure(mesh, timer, [(k, (grouped,)) for k in COLLECTIVES], matmul=not rate)
            rate = rate or model.matmul_flops_per_s
            by_size[n] = {k: from_line(k, n, model.lines[(k, (grouped,))]) for k in COLLECTIVES}
        whole = by_size[total]
        lat = float(np.median([v[0] for v in whole.values()]))
        bw = float(np.median([v[1] for v in whole.values() if math.isfinite(v[1])] or [math.inf]))
        return Link(lat, bw, whole, by_size)

    within, across = link(1), link(0)
    within = within or across or Link(0.0, math.inf)
    every = jax.sharding.Mesh(devices.reshape(1, 1, -1), ("a", "b", "c"))
    if not rate:   # one device: nothing to communicate, the rate alone
        rate = measure(every, timer, [], matmul=True).matmul_flops_per_s
    bandwidth = stream_rate(stream_program(every), timer)
    launch = launch_seconds(every, timer)
    kind, platform = jax.devices()[0].device_kind, jax.devices()[0].platform
    return LinkModel(name, f"{kind} ({platform})", {"float32": rate}, _device_memory(), local, local, within,
                     across or within, hierarchical=platform != "cpu", operands_one_by_one=platform == "cpu",
                     memory_bytes_per_s=bandwidth, launch_s=launch,
                     source={"measured": f"on {processes} process(es) x {local} devices with the launcher's "
                                         f"calibration ({repeats} repeats): within over a process's devices, across "
                                         "over groups strided over the processes, at every group size dividing them; "
                                         "matmul rate float32; memory bandwidth: every device scaling 16 MiB; launch: a "
                                         "program computing nothing over every device",
                             "hierarchical": "false on CPU: XLA:CPU's cross-process collectives run flat over gloo",
                             "operands_one_by_one": "true on CPU: gloo runs a tuple collective operand by operand"})


def _device_memory() -> float:
    d = jax.local_devices()[0]
    stats = d.memory_stats() if hasattr(d, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return float(stats["bytes_limit"])
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 16e9
    return float(total) / jax.local_device_count()
