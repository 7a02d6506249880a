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

import statistics

from launcher.sharding.measuring.calibrate import (launch_seconds, matmul_program, matmul_rate, measure_points,
                                                   stream_program, stream_rate)
from launcher.sharding.measuring.costmodel import COLLECTIVES, fit_line
from launcher.sharding.measuring.timing import Timer
from launcher.sharding.predict.links import Link, LinkModel, from_line


# Bytes per device at a collective's larger end: one float (a loss, a norm: a tuple of them ends
# most steps), a bias's few hundred bytes, then the calibration's sizes. On gloo a collective's
# cost rises with its elements up to about one per device and is flat from there to tens of KiB,
# so the small sizes are measured, not read off a line through the large ones.
LINK_SIZES = (4, 256, 4 * 2**10, 64 * 2**10, 2**20)


def measure_links(repeats: int = 12, name: str = "measured") -> LinkModel:
    """The link model of this job's devices: within a process (node) over its local devices,
    across processes over groups strided over them (one device of each process, then more), each
    at every group size that divides them (2, 4, ... up to all); with one process, ``across``
    repeats ``within`` (and the other way round)."""
    processes, local = jax.process_count(), jax.local_device_count()
    devices = np.array(sorted(jax.devices(), key=lambda d: (d.process_index, d.id))).reshape(processes, local)
    timer = Timer(1, repeats)

    def link(axis: int) -> Link | None:
        total = devices.size if axis == 0 else local
        sizes = [n for n in range(2, total + 1) if total % n == 0] if devices.shape[axis] > 1 else []
        if not sizes:
            return None
        by_size, measured = {}, {}
        for n in sizes:
            # Within: n devices of one process, a mesh axis of its own. Across: n devices strided
            # over the processes (as a plan's groups over an outer mesh axis are), the devices
            # numbered process by process: one of each process up to n = processes, more beyond.
            shape = (1, n, devices.size // n) if axis == 0 else (processes, local // n, n)
            grouped = 1 if axis == 0 else 2
            mesh = jax.sharding.Mesh(devices.reshape(shape), ("a", "b", "c"))
            # The mean run, not a floor: a step runs tens of collectives, so it pays their mean,
            # and a collective's runs on a shared host's cores are far from normal (an
            # in-process all-reduce of one float: 0.14 ms at the lower quartile, 1.65 ms at the
            # median); and what starting them costs (a device's threads meeting at the first)
            # left out (a chain of 8 less a chain of 4), as a step of many pays it once. The
            # line through the calibration's sizes, the points kept (``links.Link.measured``).
            points, _ = measure_points(mesh, timer, [(k, (grouped,)) for k in COLLECTIVES], LINK_SIZES,
                                       statistics.mean, differential=True)
            measured[n] = {k: tuple(points[(k, (grouped,))]) for k in COLLECTIVES}
            by_size[n] = {k: from_line(k, n, fit_line([p for p in measured[n][k] if p[0] >= LINK_SIZES[2]]))
                          for k in COLLECTIVES}
        whole = by_size[total]
        lat = float(np.median([v[0] for v in whole.values()]))
        bw = float(np.median([v[1] for v in whole.values() if math.isfinite(v[1])] or [math.inf]))
        return Link(lat, bw, whole, by_size, measured)

    within, across = link(1), link(0)
    within = within or across or Link(0.0, math.inf)
    every = jax.sharding.Mesh(devices.reshape(1, 1, -1), ("a", "b", "c"))
    rate = matmul_rate(matmul_program(every), timer)
    bandwidth = stream_rate(stream_program(every), timer)
    launch = launch_seconds(every, timer)
    kind, platform = jax.devices()[0].device_kind, jax.devices()[0].platform
    return LinkModel(name, f"{kind} ({platform})", {"float32": rate}, _device_memory(), local, local, within,
                     across or within, hierarchical=platform != "cpu", operands_one_by_one=platform == "cpu",
                     memory_bytes_per_s=bandwidth, launch_s=launch,
                     source={"measured": f"on {processes} process(es) x {local} devices with the launcher's "
                                         f"calibration ({repeats} repeats, the mean run, at "
                                         f"{', '.join(map(str, LINK_SIZES))} bytes per device): within over a "
                                         "process's devices, across over groups strided over the processes, at every "
                                         "group size dividing them; "
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
