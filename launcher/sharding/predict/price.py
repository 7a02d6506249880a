"""One model of a plan's step time and memory, from the program XLA compiled for it: what the
race shows beside each plan's measured time (``pipeline.race_plans``) and what ``mode.predict``
ranks plans by (``launcher/sharding/ahead/job.py``).

- computation: what one device computes (``work.py``: its dots' FLOPs at the device's matmul
  rate, the bytes its other instructions read and write at its memory bandwidth), and what
  running a program at all costs (the link model's ``launch_s``);
- communication: every collective of the partitioned program on the link it crosses
  (``collectives.py``, the link model of ``links.py``);
- memory: XLA's own analysis of the program (its buffer assignment's peak), as every run reports it.

The link model is a file (``mode.links``: a shipped one, or one ``mode=check
mode.measure_links=true`` wrote), or, by default in a search, this job's own, measured once on its
kind of devices and kept as a file in this user's cache (``job_links``; ``$XLAUNCH_CACHE_DIR``,
default ``~/.cache/xlaunch``), not in a profile store: it is the machine's, whatever the model or
store, so every later search on as many processes and devices of that kind reads it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import jax
import numpy as np

from launcher import jaxcompat
from launcher.models.train import memory_stats
from launcher.runtime import hosts
from launcher.errors import UserError
from launcher.sharding.predict import links as links_mod
from launcher.sharding.predict.collectives import collectives, comm_seconds, read, summary
from launcher.sharding.predict.work import Work, work

# Bump when what ``measure_links`` measures changes: older cached link models are measured again.
LINK_MODEL_VERSION = 3   # 2: the launch of a step measured too; 3: points at small sizes, the mean run


@dataclass(frozen=True)
class Priced:
    """A compiled plan's predicted step: seconds computing and communicating, bytes per device."""
    compute_s: float
    comm_s: float
    memory_bytes: float
    work: Work
    collectives: dict   # per kind: how many a step runs, bytes per device (``collectives.summary``)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.comm_s

    def against(self, measured_s: float) -> dict:
        """A raced plan's fields of it: the prediction, its halves, and ``model_error``
        (measured over predicted, less 1: +0.1 ran 10% slower than predicted)."""
        return {"model_step_time_s": self.step_s, "model_compute_s": self.compute_s, "model_comm_s": self.comm_s,
                "model_error": measured_s / self.step_s - 1}

    def to_json(self) -> dict:
        return {"step_time_s": self.step_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
                "memory_gb": self.memory_bytes / 2**30, "work": self.work.to_json(), "collectives": self.collectives}


def price(compiled: jax.stages.Compiled, links: links_mod.LinkModel, domain_of: Optional[Sequence[int]] = None) -> Priced:
    """``compiled``'s step on ``links`` (module doc). ``domain_of``: each partition's fast-link
    domain (its process, for a link model measured on the job: ``process_domains``); None: the
    partitions numbered domain by domain (a prediction's virtual devices)."""
    module = read(compiled.as_text())   # once: its collectives and its work
    found = collectives(module, len(jaxcompat.device_order(compiled) or jax.devices()))
    did = work(module)
    compute = did.seconds(links.flops_per_s, links.memory_bytes_per_s) + links.launch_s
    return Priced(compute, comm_seconds(found, links, domain_of),
                  float(memory_stats(compiled)["peak_bytes"]), did, summary(found))


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-a of two orders: +1 the same, -1 reversed (a tie in either counts 0)."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    s = sum((1 if (x[i] - x[j]) * (y[i] - y[j]) > 0 else -1 if (x[i] - x[j]) * (y[i] - y[j]) < 0 else 0)
            for i, j in pairs)
    return s / len(pairs) if pairs else 1.0


def scores(predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """How well predicted step times rank and match measured ones: Kendall's tau of the orders,
    the measured time of the plan predicted fastest over the fastest measured, and the mean
    absolute error as a fraction of the measured time (issue 64's three figures)."""
    best = min(range(len(predicted)), key=lambda i: predicted[i])
    return {"kendall_tau": kendall_tau(predicted, measured),
            "predicted_best_over_measured_best": measured[best] / min(measured),
            "mean_abs_error": statistics.mean(abs(p - m) / m for p, m in zip(predicted, measured, strict=True))}


def process_domains(compiled: jax.stages.Compiled, links: links_mod.LinkModel | None = None) -> Optional[list[int]]:
    """Each partition's process, in the compiled program's device order: the domains of a link
    model measured on the job (``measure_links``: within a process, across processes). None
    where the program names no mesh."""
    order = jaxcompat.device_order(compiled)
    if order is None:
        return None
    process = {d.id: d.process_index for d in jax.devices()}
    return [process[i] for i in order]


def node_domains(compiled: jax.stages.Compiled, links: links_mod.LinkModel) -> Optional[list[int]]:
    """Each partition's fast-link domain as a link model file counts them: the job's devices
    numbered process by process, ``links.domain_devices`` to a domain."""
    order = jaxcompat.device_order(compiled)
    if order is None:
        return None
    rank = {d.id: k for k, d in enumerate(sorted(jax.devices(), key=lambda d: (d.process_index, d.id)))}
    return [rank[i] // links.domain_devices for i in order]


def cache_dir() -> Path:
    """Where measured link models are kept: ``$XLAUNCH_CACHE_DIR/link_models`` (default
    ``~/.cache/xlaunch``; on a cluster, a home directory every node sees)."""
    return Path(os.environ.get("XLAUNCH_CACHE_DIR") or Path.home() / ".cache" / "xlaunch").expanduser() / "link_models"


def cached_links_path() -> Path:
    """This job's link model's file in the cache: named for what it was measured on (the device
    kind, processes x devices each, the JAX version) and how (``LINK_MODEL_VERSION``)."""
    d = jax.devices()[0]
    kind = re.sub(r"[^A-Za-z0-9.]+", "-", f"{d.platform}-{getattr(d, 'device_kind', 'device')}").strip("-")
    return cache_dir() / (f"{kind}_{jax.process_count()}x{jax.local_device_count()}_jax{jax.__version__}"
                          f"_v{LINK_MODEL_VERSION}.yaml")


def job_links(*, repeats: int, is_main: bool = True, log: Callable[[str], None] = print
              ) -> tuple[Optional[links_mod.LinkModel], bool, float]:
    """(this job's link model, whether it was measured now, seconds this took): the cache's
    file (``cached_links_path``; read by process 0 alone: the others get None and price
    nothing), else measured on every process now (``measure_links``, ``repeats`` timed runs of each
    collective at each size: ``mode.link_repeats``) and written there by process 0, a YAML file
    like the shipped ones (``mode.links=<it>`` reads it; edit it, or delete it to measure again)."""
    from launcher.sharding.predict.measure_links import measure_links   # noqa: PLC0415  only when measuring

    t0 = time.perf_counter()
    path = cached_links_path()
    model = None
    if is_main and path.is_file():
        try:
            model = links_mod.load(str(path))
        except UserError as e:   # a file broken by hand: measured again, and said why
            log(f"{e}: measuring it again")
    missing = bool(hosts.broadcast(np.array([int(model is None)], dtype=np.int32))[0])
    if not missing:
        return model, False, time.perf_counter() - t0
    log(f"link model of this job's devices ({jax.process_count()} process(es) x {jax.local_device_count()}): "
        f"measuring it once for the race's predictions, kept in {path}")
    model = measure_links(repeats=repeats, name="measured")
    if is_main:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(model.to_yaml())
        os.replace(tmp, path)   # whole or not at all, whatever runs beside it
        model = dataclasses.replace(model, path=str(path))
    return model, True, time.perf_counter() - t0
