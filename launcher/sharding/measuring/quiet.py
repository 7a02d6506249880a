"""Timing on a shared virtual machine: a measurement the hypervisor interrupted is taken again.

On a cloud VM the host may run other guests on our virtual CPUs; Linux counts the time taken
from us as *steal* (the eighth field of /proc/stat's ``cpu`` line). A few ticks of it in a
sub-second measurement inflate it noticeably, and it comes in bursts (after a compilation, when
another guest wakes), so it does not average out: profiles taken during a burst predict whole
steps slower than they run (README, Benchmarks). ``quiet`` repeats a measurement while the hypervisor took
more than a small share of the CPU during it, and keeps the least interrupted attempt. Where
/proc/stat has no steal (bare metal, other systems) it measures once.

With several processes every one takes part in each attempt (the programs timed hold
collectives), so the decision to try again is taken together: any process interrupted means all
try again.
"""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

import numpy as np

from launcher.runtime import hosts

T = TypeVar("T")

TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
STOLEN_SHARE = 0.05     # of the CPU time the measurement had, beyond one tick
TRIES = 3
# Measurements taken, and attempts taken again, in this process (the benches report them).
counts = {"measurements": 0, "retakes": 0}


def stolen_ticks() -> int | None:
    """Steal ticks so far, summed over CPUs; None where the system does not count them."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else None
    except (OSError, ValueError):
        return None


def quiet(measure: Callable[[], T], *, tries: int = TRIES) -> T:
    """``measure()`` again (up to ``tries`` times in all) while the hypervisor stole more than
    ``STOLEN_SHARE`` of the CPU during it; the result of the least interrupted attempt."""
    best, least = None, float("inf")
    cpus = os.cpu_count() or 1
    counts["measurements"] += 1
    for attempt in range(tries):
        counts["retakes"] += attempt > 0
        before, t0 = stolen_ticks(), time.perf_counter()
        result = measure()
        after, elapsed = stolen_ticks(), time.perf_counter() - t0
        stolen = after - before if before is not None and after is not None else 0
        ticks = max(elapsed * cpus * TICKS_PER_S, 1e-9)
        share, interrupted = _worst(stolen / ticks, stolen > 1 + STOLEN_SHARE * ticks)
        if not interrupted:
            return result
        if share < least:
            best, least = result, share
    return best


def _worst(share: float, interrupted: bool) -> tuple[float, bool]:
    """(the largest stolen share, whether any process was interrupted) over all processes."""
    gathered = hosts.gather(np.array([share, float(interrupted)]))
    return float(gathered[:, 0].max()), bool(gathered[:, 1].any())
