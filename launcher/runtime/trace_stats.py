"""Collective and compute time read from a profiler trace, where the backend records them.

GPU and TPU traces have a line of XLA ops per device (``/device:GPU:0`` > ``XLA Ops``), each event
an HLO instruction (``all-reduce-start.3``, ``fusion.12``) or, on the streams, its kernel
(``ncclDevKernel_AllReduce_...``): the seconds a device spends in collectives and in the rest can be
summed. The CPU backend's trace has no device lines (its ops run inside host thunks,
``ThunkExecutor::Execute``), so ``op_times`` says None there and a caller keeps its estimate,
saying that it does. Reads the Perfetto JSON that ``jaxcompat.start_trace`` writes beside the
XPlane, so nothing beyond the standard library is needed.

    times, result = timed(lambda: run_steps(10))   # times: OpTimes or None (no device ops traced)
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax

from launcher import jaxcompat

# HLO collectives (sync and async -start/-done halves) and the NCCL/RCCL kernels that run them.
COLLECTIVE = re.compile(r"all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|collective-broadcast"
                        r"|\bsend\b|\brecv\b|nccl|rccl", re.IGNORECASE)


@dataclass(frozen=True)
class OpTimes:
    """Seconds of device ops over the whole trace, averaged over the devices that ran any."""

    collective_s: float
    compute_s: float
    devices: int


def op_times(trace_dir: Path | str) -> OpTimes | None:
    """Device time in collective ops and in the others, from the newest trace under ``trace_dir``;
    None when it has no device op line (the CPU backend)."""
    found = _device_ops(trace_dir)
    if found is None:
        return None
    devices, ops = found
    collective = {pid: 0.0 for pid in devices}
    compute = dict(collective)
    for pid, name, seconds in ops:
        bucket = collective if COLLECTIVE.search(name) else compute
        bucket[pid] += seconds
    busy = [pid for pid in devices if collective[pid] or compute[pid]]
    if not busy:
        return None
    return OpTimes(sum(collective[p] for p in busy) / len(busy), sum(compute[p] for p in busy) / len(busy), len(busy))


@dataclass(frozen=True)
class OpKinds:
    """Device time by kind of op (an HLO instruction's name without its number: ``fusion.12`` and
    ``fusion.3`` are ``fusion``), averaged over the devices that ran any; the kinds by time."""

    busy_s: float
    kinds: tuple[tuple[str, float], ...]

    def to_dict(self, n: int = 8) -> dict:
        return {"busy_s": self.busy_s, "top": [{"kind": k, "seconds": t, "share": t / self.busy_s if self.busy_s else 0.0}
                                               for k, t in self.kinds[:n]]}


def top_ops(trace_dir: Path | str) -> OpKinds | None:
    """What a traced program's devices spent their time on, by op kind; None as ``op_times``."""
    found = _device_ops(trace_dir)
    if found is None:
        return None
    devices, ops = found
    by_kind: dict[str, float] = {}
    busy = set()
    for pid, name, seconds in ops:
        kind = re.sub(r"([._]\d+)+$", "", name) or name
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
        busy.add(pid)
    if not busy:
        return None
    n = len(busy)
    kinds = tuple(sorted(((k, t / n) for k, t in by_kind.items()), key=lambda kt: -kt[1]))
    return OpKinds(sum(t for _, t in kinds), kinds)


def _device_ops(trace_dir: Path | str) -> tuple[set, list[tuple[Any, str, float]]] | None:
    """(the device lines' pids, each device op as (pid, name, seconds)) of the newest trace under
    ``trace_dir``; None without a trace or device lines."""
    files = sorted(Path(trace_dir).rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not files:
        return None
    data = json.loads(gzip.open(files[-1]).read())
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    devices = {e.get("pid") for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and str(e["args"].get("name", "")).startswith("/device:") and "CPU" not in e["args"]["name"]}
    if not devices:
        return None
    # The op line where there is one (kernels on the stream lines are the same time again).
    op_lines = {k for k, name in names.items() if k[0] in devices and name == "XLA Ops"}
    ops = []
    for e in events:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") != "X" or key[0] not in devices or (op_lines and key not in op_lines):
            continue
        ops.append((key[0], e.get("name", ""), float(e.get("dur", 0.0)) * 1e-6))  # microseconds
    return devices, ops


def timed(fn: Callable[[], Any]) -> tuple[OpTimes | None, Any]:
    """``fn()`` under a trace of its own (a temporary folder): its device ops' times, and its result."""
    with tempfile.TemporaryDirectory(prefix="xlaunch-trace-") as d:
        jaxcompat.start_trace(d)
        try:
            out = fn()
        finally:
            jax.profiler.stop_trace()
        return op_times(d), out
