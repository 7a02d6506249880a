"""Calibrating the ILP's communication cost model on the job's mesh, once, into the profile store.

For every group of mesh axes (axis 0, axis 1, both) and every collective Alpa's cost model
prices (all-reduce, all-gather, reduce-scatter, all-to-all), a ``shard_map`` program doing only
that collective (``CHAIN`` times in a row, each on the last one's result) is timed at each of
``SIZES`` bytes per device, in turns with its overhead program (the same arguments and results,
no work: ``timing.py``); the difference of their lower quartiles over ``repeats`` runs
(at least ``MIN_REPEATS``), over ``CHAIN``, is what one collective costs: a cost is a floor that a
shared machine's noise only adds to, as for the profile pass's all-reduce latency. A line
``latency + bytes / bandwidth`` is fitted through the sizes (``costmodel.fit_line``). One more
program times a matmul on every device at once, for the per-device FLOP rate the predicted step
time uses.

The whole model is one store entry (``keys.py: collective_model_key``: mesh shape,
device kind and count, process count), written only once every line is measured: a run that
fails half way leaves nothing behind, and any later run on the same mesh reuses the entry (the
ILP of every model on that mesh prices with the same lines). As in the profile pass, every
process measures, rank 0 writes and its values count everywhere.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.sharding.measuring.costmodel import COLLECTIVES, CommModel, Line, axis_groups, fit_line
from launcher.sharding.measuring.keys import collective_model_key
from launcher.sharding.measuring.store import ProfileStore
from launcher.sharding.measuring.timing import Timer, lower_quartile, overhead_program
from launcher.runtime import compile_share, hosts

if TYPE_CHECKING:
    from jax.sharding import Mesh

# Bytes per device at the collective's larger end: the tiny models' tensors (4-64 KiB a device)
# sit inside the range, so their costs are read off the line, not extrapolated; the largest size
# fixes the bandwidth, the smaller ones the latency that dominates at those sizes.
SIZES = (4 * 2**10, 64 * 2**10, 2**20)
# Timed runs per program at least: on CPU devices a collective of the tiny models' sizes costs
# about what one run's noise is (0.1 ms), so it takes many runs for the lower quartile to settle.
MIN_REPEATS = 12
CHAIN = 8           # collectives per timed program: one run's noise is shared among them
MATMUL_SIZE = 256   # each device multiplies [256, 256] x [256, 256]
STREAM_BYTES = 16 * 2**20   # each device scales a float32 array this large (past a CPU's caches)


def calibrate(mesh: Mesh, store: ProfileStore, *, repeats: int = 10, is_main: bool = True,
              log: Callable[[str], None] = print, kinds: Sequence[str] = COLLECTIVES,
              matmul: bool = True) -> tuple[CommModel, bool, float]:
    """(the model, whether anything was measured now, seconds this took): the store's entry for
    this mesh, with the collectives ``kinds`` (and the matmul rate, with ``matmul``) it lacks
    measured now and the entry written again. The profile pass prices resharding with all-gathers
    and all-to-alls alone; the ILP asks for every collective and the rate.

    On a mesh of several axes, a collective over all of them is the 1-D mesh's over the same
    devices in the same order (one replica group, the same program): its lines come from that
    mesh's entry where the store has them (a search of every mesh calibrates [8] first)."""
    t0 = time.perf_counter()
    mesh_shape = tuple(mesh.devices.shape)
    have = _stored(store, mesh) if is_main else CommModel(mesh_shape, {}, 0.0)
    wanted = [(k, axes) for axes in axis_groups(mesh_shape) for k in kinds]
    borrowed = {}
    if is_main and len(mesh_shape) > 1:
        every = tuple(range(len(mesh_shape)))
        flat = _stored(store, jax.sharding.Mesh(mesh.devices.reshape(-1), ("all",)))
        borrowed = {(k, every): flat.lines[(k, (0,))] for k in kinds
                    if (k, every) not in have.lines and (k, (0,)) in flat.lines}
        have.lines.update(borrowed)
    flags = hosts.broadcast(np.array([int(matmul and not have.matmul_flops_per_s)]
                                     + [int(point not in have.lines) for point in wanted], dtype=np.int32))
    lacking = [point for point, f in zip(wanted, flags[1:], strict=True) if f]
    missing = bool(lacking or flags[0])
    if missing:
        what = f"{len(lacking)} collective lines" + (" and the matmul rate" if flags[0] else "")
        log(f"ILP cost model: calibrating {what} over mesh axes "
            f"{sorted({tuple(axes) for _, axes in lacking})} at {[s // 1024 for s in SIZES]} KiB per device")
        measured = measure(mesh, Timer(1, max(repeats, MIN_REPEATS)), lacking, bool(flags[0]))
        have = CommModel(mesh_shape, {**have.lines, **measured.lines},
                         measured.matmul_flops_per_s or have.matmul_flops_per_s)
    if is_main and (missing or borrowed):
        store.put(collective_model_key(mesh), have.to_json())
    model = _broadcast(have if is_main else None, mesh_shape, kinds)
    return model, missing, time.perf_counter() - t0


def _stored(store: ProfileStore, mesh: Mesh) -> CommModel:
    entry = store.get(collective_model_key(mesh))
    return CommModel.from_json(entry) if entry is not None else CommModel(tuple(mesh.devices.shape), {}, 0.0)


def calibrated(mesh: Mesh, store: ProfileStore, kinds: Sequence[str], is_main: bool = True) -> bool:
    """Whether the store holds this mesh's lines of ``kinds`` (rank 0's answer on every process)."""
    have = _stored(store, mesh).lines if is_main else {}
    found = all((k, axes) in have for k in kinds for axes in axis_groups(tuple(mesh.devices.shape)))
    return bool(hosts.broadcast(np.array([int(found)], dtype=np.int32))[0])


def programs(mesh: Mesh, kinds: Sequence[str]) -> int:
    """The programs a calibration of ``kinds`` times on ``mesh``."""
    return len(kinds) * len(axis_groups(tuple(mesh.devices.shape))) * len(SIZES)


def measure(mesh: Mesh, timer: Timer, lines: Sequence[tuple[str, tuple[int, ...]]] | None = None,
            matmul: bool = True) -> CommModel:
    """The collective ``lines`` ((kind, mesh axes); default: every collective over every axis
    group of ``mesh``), and the matmul rate, timed now."""
    mesh_shape = tuple(mesh.devices.shape)
    if lines is None:
        lines = [(kind, axes) for axes in axis_groups(mesh_shape) for kind in COLLECTIVES]
    points, rate = measure_points(mesh, timer, lines, matmul=matmul)
    return CommModel(mesh_shape, {line: fit_line(points[line]) for line in lines}, rate)


def measure_points(mesh: Mesh, timer: Timer, lines: Sequence[tuple[str, tuple[int, ...]]],
                   sizes: Sequence[int] = SIZES, statistic: Callable[[Sequence[float]], float] = lower_quartile,
                   matmul: bool = False, differential: bool = False
                   ) -> tuple[dict[tuple[str, tuple[int, ...]], list[tuple[float, float]]], float]:
    """Each collective line's (bytes per device at its larger end, seconds) at each of ``sizes``
    (as near as its shapes allow: ``chain_bytes``), ``statistic`` of its runs; and the matmul rate
    with ``matmul`` (else 0). ``differential``: the chain less a chain half as long, rather than
    less an overhead program: what starting the collectives costs (the devices' threads meeting
    at the first) cancels, as it does in a step of many."""
    with compile_share.shared():  # each process compiles some of the programs and loads the others
        # Differential: a chain of CHAIN less one of half as many (a shorter base than the
        # overhead program's: the 1 MiB points, 20 ms a collective on gloo, are most of the time).
        base = CHAIN // 2 if differential else CHAIN
        chains = [collective_chain(mesh, kind, axes, nbytes, base) for kind, axes in lines for nbytes in sizes]
        longer = [collective_chain(mesh, kind, axes, nbytes) for kind, axes in lines for nbytes in sizes
                  ] if differential else [None] * len(chains)
        product = matmul_program(mesh) if matmul else None
    seconds = iter([chain_seconds(long, timer, statistic, base=chain) if long is not None
                    else chain_seconds(chain, timer, statistic) for chain, long in zip(chains, longer, strict=True)])
    shape = tuple(mesh.devices.shape)
    points = {(kind, axes): [(float(chain_bytes(kind, math.prod(shape[a] for a in axes), nbytes)), next(seconds))
                             for nbytes in sizes] for kind, axes in lines}
    return points, matmul_rate(product, timer) if product is not None else 0.0


def chain_bytes(kind: str, n: int, nbytes: int) -> int:
    """The bytes per device at the larger end of a ``collective_chain`` asked for ``nbytes``
    among ``n`` devices: float32 elements, a multiple of ``n`` where the collective splits its
    operand (an all-reduce of one element is one element: gloo's cost of a scalar is not that
    of ``n`` elements)."""
    elements = nbytes // 4
    return 4 * (max(elements, 1) if kind == "all-reduce" else max(elements // n, 1) * n)


class _Program(NamedTuple):
    program: compile_share.Compiling
    args: list[Any]
    result: Any   # its result's sharding (the overhead program's)
    length: int = 0   # a collective_chain's collectives


def collective_chain(mesh: Mesh, kind: str, axes: tuple[int, ...], nbytes: int, length: int = CHAIN) -> _Program:
    """The program of ``length`` ``kind``s in a row over mesh ``axes``, with ``nbytes`` per device
    at the collective's larger end, given to be compiled."""
    names = tuple(mesh.axis_names[a] for a in axes)
    n = math.prod(mesh.devices.shape[a] for a in axes)
    every = PartitionSpec(tuple(mesh.axis_names))
    sharding = NamedSharding(mesh, every)
    big = chain_bytes(kind, n, nbytes) // 4        # float32 elements per device at the larger end
    small = max(big // n, 1)

    # Each link's result feeds the next (so XLA can neither merge nor drop them) and has the
    # link's input shape; the glue (a scale, a slice, a copy) is local and cheap beside them.
    def link(y):
        if kind == "all-reduce":
            return jax.lax.psum(y, names) * 0.5
        if kind == "all-gather":
            return jax.lax.all_gather(y, names, tiled=True)[:small]
        if kind == "reduce-scatter":
            return jnp.tile(jax.lax.psum_scatter(y, names, scatter_dimension=0, tiled=True), n)
        return jax.lax.all_to_all(y, names, 0, 0, tiled=True)

    def chain(y):
        for _ in range(length):
            y = link(y)
        return y

    per_device = small if kind == "all-gather" else big
    x = jax.make_array_from_callback((per_device * mesh.devices.size,), sharding,
                                     lambda idx: np.ones((per_device,), np.float32))
    program = jax.jit(jaxcompat.shard_map(chain, mesh=mesh, in_specs=every, out_specs=every))
    return _Program(compile_share.compile(lambda: program.lower(x)), [x], sharding, length)


def chain_seconds(chain: _Program, timer: Timer,
                  statistic: Callable[[Sequence[float]], float] = lower_quartile, base: _Program | None = None
                  ) -> float:
    """Seconds of one collective of a ``collective_chain``: the chain, less its overhead program
    (``statistic`` of each's runs), over its length; with ``base`` (a shorter chain), less that
    instead, over the collectives the chain has more."""
    compiled = chain.program.result()
    jaxcompat.settle_programs()  # another collective program than the one before
    under = base.program.result() if base is not None else overhead_program(chain.args, chain.args, [chain.result])
    entry = timer.entry(compiled, under, chain.args, statistic=statistic)
    return max(entry["time_s"] - entry["overhead_s"], 0.0) / (chain.length - (base.length if base is not None else 0))


def matmul_program(mesh: Mesh) -> _Program:
    """Every device multiplying float32 ``MATMUL_SIZE`` matrices, given to be compiled."""
    k = MATMUL_SIZE
    rows = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names), None))
    whole = NamedSharding(mesh, PartitionSpec())
    x = jax.make_array_from_callback((k * mesh.devices.size, k), rows,
                                     lambda idx: np.full((k, k), 0.5, np.float32))
    w = jax.device_put(np.full((k, k), 0.25, np.float32), whole)
    program = jax.jit(lambda a, b: a @ b, in_shardings=(rows, whole), out_shardings=rows)
    return _Program(compile_share.compile(lambda: program.lower(x, w)), [x, w], rows)


def matmul_rate(product: _Program, timer: Timer) -> float:
    """FLOP/s of one device multiplying float32 matrices while every device does the same (on
    CPU devices they share the host's cores, as the training step's do)."""
    k = MATMUL_SIZE
    compiled = product.program.result()
    jaxcompat.settle_programs()
    x = product.args[0]
    times, overhead = timer.beside_overhead(compiled, overhead_program(product.args, [x], [product.result]),
                                            product.args)
    seconds = max(lower_quartile(times) - lower_quartile(overhead), 1e-9)
    return 2.0 * k ** 3 / seconds


def stream_program(mesh: Mesh) -> _Program:
    """Every device scaling its float32 ``STREAM_BYTES`` array (reads it, writes as much), given
    to be compiled: the memory bandwidth the step's other instructions run at."""
    n = STREAM_BYTES // 4
    rows = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    x = jax.make_array_from_callback((n * mesh.devices.size,), rows, lambda idx: np.full(n, 0.5, np.float32))
    program = jax.jit(lambda a: a * 1.0001 + 0.5, in_shardings=rows, out_shardings=rows)
    return _Program(compile_share.compile(lambda: program.lower(x)), [x], rows)


def stream_rate(stream: _Program, timer: Timer) -> float:
    """Bytes/s one device reads and writes while every device does the same (on CPU devices
    they share the host's cores and memory, as the training step's do). Not less an overhead
    program: it would write as many bytes; a run's own overhead is microseconds beside the
    milliseconds these bytes take."""
    compiled = stream.program.result()
    jaxcompat.settle_programs()
    (times,) = timer.runs([compiled], stream.args)
    return 2.0 * STREAM_BYTES / max(lower_quartile(times), 1e-9)


def launch_seconds(mesh: Mesh, timer: Timer) -> float:
    """Seconds to run a program over every device of ``mesh`` that computes nothing (an overhead
    program of one float per device): what each step pays however little it computes, most of a
    step of a small model on CPU devices sharing a host's cores."""
    rows = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names)))
    x = jax.make_array_from_callback((mesh.devices.size,), rows, lambda idx: np.zeros(1, np.float32))
    program = overhead_program([x], [x], [rows])
    jaxcompat.settle_programs()
    (times,) = timer.runs([program], [x])
    return lower_quartile(times)


def _broadcast(model: CommModel | None, mesh_shape: tuple[int, ...], kinds: Sequence[str]) -> CommModel:
    """Rank 0's model (its lines of ``kinds``) on every process (as numbers in a fixed order; a
    no-op with one process)."""
    order = [(kind, axes) for axes in axis_groups(mesh_shape) for kind in COLLECTIVES if kind in kinds]
    if model is not None:
        flat = [x for k in order for x in (model.lines[k].latency_s, model.lines[k].bytes_per_s)]
        flat.append(model.matmul_flops_per_s)
    else:
        flat = [0.0] * (2 * len(order) + 1)
    flat = [float(x) for x in hosts.broadcast(np.array(flat, dtype=np.float64))]
    lines = {k: Line(flat[2 * i], flat[2 * i + 1]) for i, k in enumerate(order)}
    return CommModel(mesh_shape, lines, flat[-1])
