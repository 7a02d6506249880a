"""How the profile pass times a program on the mesh.

- Programs compared with each other (a segment and its overhead program) run in turns, so a
  change in the machine's load falls on all of them alike.
- A run ends when its first result is ready: every result spans every device of the mesh and a
  device's results are ready together, so that is when the program has finished everywhere.
  Waiting on each of a hundred results in turn would time Python, not the program.
- Repeats the hypervisor interrupted are taken again (``quiet.py``).
- With ``cold=True`` every run starts from cold caches (``CacheFlush``).
- With several processes every process runs the same programs in the same order (their
  collectives need it) and, run by run, the slowest process's time counts.
- ``rounds`` with a stop ends the programs it names after their first runs: CFP's profiling
  shortcut (``EarlyStop``'s rule, over a ratio of the best so far; ``candidates.py`` keeps the
  best and, one after another, times each candidate as rounds of one).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.sharding.measuring.quiet import quiet
from launcher.runtime import hosts

if TYPE_CHECKING:
    from jax.sharding import Mesh

# Bytes each accelerator (GPU, TPU) rewrites to evict its cache: triton.testing.do_bench's 256
# MiB, several times any current GPU's L2 (50 MiB on an H100, 8 MiB per MI250X die).
ACCELERATOR_FLUSH_BYTES = 256 * 2**20


class CacheFlush:
    """Evicts the caches of every device of ``mesh``: a program in which each device rewrites a
    buffer larger than its last-level cache, called before each timed run (what
    ``triton.testing.do_bench`` does on a GPU).

    Why: a segment program timed again and again on the same arguments runs from warm caches and
    a warm runtime, which the same operators inside the whole step do not find.
    ``bench/bench_cfp_additivity.py`` times segments both ways beside the whole step and reports
    how much of it each adds up to (README, Benchmarks)."""

    def __init__(self, mesh: Mesh, bytes_per_device: int | None = None) -> None:
        n = mesh.devices.size
        self.bytes_per_device = bytes_per_device or flush_bytes(mesh)
        sharding = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
        per = max(self.bytes_per_device // 4, 1)
        self._buffer = jax.make_array_from_callback((n, per), sharding, lambda idx: np.zeros((1, per), np.float32))
        self._rewrite = jax.jit(lambda x: x + 1.0, in_shardings=sharding, out_shardings=sharding, donate_argnums=0)

    def __call__(self) -> None:
        self._buffer = self._rewrite(self._buffer)
        self._buffer.block_until_ready()


def flush_bytes(mesh: Mesh) -> int:
    """Per device: ``ACCELERATOR_FLUSH_BYTES`` on accelerators; on CPU devices, which share their
    host's caches, twice the host's largest cache split among the devices this process has."""
    device = mesh.devices.flat[0]
    if device.platform != "cpu":
        return ACCELERATOR_FLUSH_BYTES
    local = max(sum(d.process_index == jax.process_index() for d in mesh.devices.flat), 1)
    return 2 * host_cache_bytes() // local


def host_cache_bytes(default: int = 32 * 2**20) -> int:
    """The largest CPU cache this host reports (Linux sysfs), else ``default``."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * scale)
        except ValueError:
            continue
    return max(sizes, default=default)


@dataclass
class Timer:
    """Timing settings: untimed runs first, timed runs, and an optional cache flush before each
    run (warm-up runs included, so they warm the code, not the data)."""
    warmup: int = 1
    repeats: int = 10
    flush: Callable[[], None] | None = field(default=None, repr=False)

    def run_once(self, program: jax.stages.Compiled, args: Sequence[jax.Array]) -> float:
        """Seconds of one run of ``program`` on ``args``, after the cache flush if any."""
        if self.flush is not None:
            self.flush()
        t = time.perf_counter()
        # Every output: one that merely forwards an input is ready at once, while the rest of the
        # program (and its collectives) may still run.
        jax.block_until_ready(program(*args))
        seconds = time.perf_counter() - t
        # Outside the timed span: before JAX 0.5, runs of multi-process programs are fenced apart
        # as race.race fences its runners. (A precaution: the gloo abort CI showed in
        # two-process profiles on 0.4.35 came from host exchanges, see hosts.py.)
        jaxcompat.settle_programs()
        return seconds

    def runs(self, programs: Sequence[jax.stages.Compiled], args: Sequence[jax.Array], repeats: int | None = None) -> list[list[float]]:
        """Seconds per run of each program on ``args``, the programs taking turns (this
        process's own times)."""
        def measure() -> list[list[float]]:
            times: list[list[float]] = [[] for _ in programs]
            for _ in range(repeats or self.repeats):
                for program, ts in zip(programs, times, strict=True):
                    ts.append(self.run_once(program, args))
            return times

        for _ in range(self.warmup):
            for program in programs:
                self.run_once(program, args)
        return quiet(measure)

    def beside_overhead(self, program: jax.stages.Compiled, overhead: jax.stages.Compiled, args: Sequence[jax.Array],
                        repeats: int | None = None) -> tuple[list[float], list[float]]:
        """Seconds per run of ``program`` and of its overhead program, timed in turn (the
        slowest process's, run by run): ``rounds`` of one entry."""
        (out,) = self.rounds([(program, overhead, args)], repeats)
        return out

    def rounds(self, entries: Sequence[tuple[jax.stages.Compiled, jax.stages.Compiled, Sequence[jax.Array]]], repeats: int | None = None,
               stop: "Callable[[list[list[float]], list[list[float]]], list[bool]] | None" = None, after: int = 2
               ) -> list[tuple[list[float], list[float]]]:
        """Seconds per run of each ``(program, overhead program, arguments)`` of ``entries`` and of
        its overhead program (the slowest process's, run by run), timed in rounds: every round
        runs each program once, beside its overhead program, so a change in the machine's load
        falls on all of them alike, as the races time whole steps. With ``stop``, after ``after``
        rounds (when more were to come) ``stop(times, overhead_times)`` (the slowest process's,
        the same on every process) says which entries end there: their lists are then that short.
        Rank 0's decision counts, so every process runs the same programs in the same rounds."""
        run = self.run_once   # (program, args)

        def measure() -> list[list[list[float]]]:
            times: list[list[list[float]]] = [[[], []] for _ in entries]
            n, going = repeats or self.repeats, list(range(len(entries)))
            for turn in range(n):
                for k in going:
                    program, overhead, args = entries[k]
                    times[k][0].append(run(program, args))
                    times[k][1].append(run(overhead, args))
                if stop is not None and turn + 1 == after < n:
                    slowest = [[slowest_process(t), slowest_process(o)] for t, o in times]
                    ends = stop([t for t, _ in slowest], [o for _, o in slowest])
                    ends = hosts.broadcast(np.array([int(e) for e in ends], dtype=np.int32))
                    going = [k for k in going if not ends[k]]
            return times

        for _ in range(self.warmup):
            for program, overhead, args in entries:
                run(program, args)
                run(overhead, args)
        return [(slowest_process(t), slowest_process(o)) for t, o in quiet(measure)]

    def entry(self, program: jax.stages.Compiled, overhead: jax.stages.Compiled, args: Sequence[jax.Array], repeats: int | None = None,
              statistic: Callable[[Sequence[float]], float] = statistics.median) -> dict:
        """A store entry: ``statistic`` (the median) of the seconds of ``program`` and of its
        overhead program."""
        times, overhead_times = self.beside_overhead(program, overhead, args, repeats)
        return {"time_s": statistic(times), "overhead_s": statistic(overhead_times)}


@dataclass
class EarlyStop:
    """CFP's early stop: a candidate whose first ``after`` timed runs are all over ``ratio``
    times ``best_s`` (the fastest candidate of its unit timed in full so far) is not timed
    further. As in the authors' artifact (``benchmark_func`` in ``alpa/shard_parallel/exp.py``:
    two runs, then ``c > 1.5 * curr_optimal`` returns at once), with two guards, both of which
    only ever stop less:
    - every one of the first runs must be over (the artifact takes their mean), so one run a
      noisy neighbour slowed does not stop a candidate that is not slow;
    - each run is first scaled down by how much slower the overhead program ran beside it (in
      the same turn) than beside the best (``best_overhead_s``), when it did: on a shared
      machine a burst of someone else's work lasts longer than a few runs and slows both alike,
      and without this a burst during the first runs stops a candidate no slower than the best
      (bench/bench_cfp_search.py --shortcuts counts such stops).
    The times compared are whole program runs (``time_s``, before the overhead program is taken
    off), as the artifact's are. The overheads of one unit's candidates are alike (same arguments
    and results), so a run over 1.5x the best is over 1.5x it less the overhead too: the
    comparison only errs towards timing in full. ``ratio`` 0 never stops."""
    ratio: float
    best_s: float
    best_overhead_s: float = 0.0   # the best's overhead program (0: no scaling)
    after: int = 2

    def slower(self, first_runs: Sequence[float], overhead_runs: Sequence[float] = ()) -> bool:
        """Whether runs that started like ``first_runs`` (beside ``overhead_runs`` of the
        overhead program, turn by turn) stop: the decision, on given times."""
        if not (self.ratio > 0 and math.isfinite(self.best_s)):
            return False
        slowdown = [max(o / self.best_overhead_s, 1.0) if self.best_overhead_s > 0 else 1.0 for o in overhead_runs]
        slowdown += [1.0] * (len(first_runs) - len(slowdown))
        return min(t / k for t, k in zip(first_runs, slowdown, strict=True)) > self.ratio * self.best_s


def lower_quartile(xs: Sequence[float]) -> float:
    return statistics.quantiles(xs, n=4)[0] if len(xs) > 1 else xs[0]


def overhead_program(args: Sequence[jax.Array], results: Sequence[jax.ShapeDtypeStruct],
                     result_shardings: Sequence[jax.sharding.Sharding],
                     compile_options: Optional[Mapping[str, Any]] = None) -> jax.stages.Compiled:
    """A compiled program that takes ``args`` and returns zeros shaped like ``results`` (objects
    with ``shape`` and ``dtype``) with ``result_shardings``, computing nothing else: what running
    any program with these arguments and results costs. Compiled once per signature (arguments'
    and results' types and layouts) in a process: a unit's combinations that read and make
    their tensors alike share one. ``compile_options``: XLA's, as the program it stands beside
    was compiled with (None: the defaults)."""
    options = dict(compile_options or {})
    key = (tuple((tuple(x.shape), str(x.dtype), x.sharding) for x in args),
           tuple((tuple(r.shape), str(r.dtype)) for r in results), tuple(result_shardings),
           tuple(sorted(options.items())))
    if key not in _OVERHEAD:
        shapes = [(tuple(r.shape), r.dtype) for r in results]
        if len(_OVERHEAD) >= _OVERHEAD_CAP:
            _OVERHEAD.pop(next(iter(_OVERHEAD)))
        _OVERHEAD[key] = jax.jit(lambda *_: [jnp.zeros(shape, dtype) for shape, dtype in shapes], keep_unused=True,
                                 in_shardings=[x.sharding for x in args],
                                 out_shardings=list(result_shardings)).lower(*args).compile(options or None)
    return _OVERHEAD[key]


_OVERHEAD: dict = {}
_OVERHEAD_CAP = 256


def slowest_process(times: list[float]) -> list[float]:
    return [float(x) for x in hosts.gather(np.asarray(times, dtype=np.float64)).max(axis=0)]
