"""A runnable program of one segment alone: its blocks' operators, nothing else.

Its arguments are the tensors those operators read but do not produce (parameters, optimizer
state, batch, activations from the segment before, gradients from the segment after); its
results are the tensors they produce that something outside reads. Arguments get synthetic
values (small non-negative floats, zero integers: valid indices, safe square roots) laid out as
the segment's plan wants them, so the program measures the segment's own computation and
communication; the cost of resharding what a neighbour produced into that layout is measured
separately (``profile.reshard_cost``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from launcher.sharding.analysis.core import Analysis
from launcher.sharding.analysis.graph import dtype_of, is_key_dtype, itemsize
from launcher.sharding.analysis.strategies import Spec, shard_bytes
from launcher.jaxcompat import key_shape, wrap_keys
from launcher.sharding.apply import Layouts, constants, evaluate, pins_for, pspec

if TYPE_CHECKING:
    from jax.sharding import Mesh


@dataclass
class SegmentProgram:
    start: int            # first block
    end: int              # one past the last block
    ops: list[int]        # top-level operators, program order
    inputs: list[int]     # var ids of the arguments
    outputs: list[int]    # var ids of the results
    boundary: list[int]   # the inputs another segment produces (activations, gradients)


def segment_program(a: Analysis, start: int, end: int, top_level: bool = False) -> SegmentProgram:
    """The program of blocks ``[start, end)``: their operators that segment programs evaluate
    (``Analysis.evaluable``: a scanned model's layer, forward and backward, as one iteration of
    each loop body). ``top_level``: the step's top-level operators instead, loops whole."""
    g = a.graph
    if top_level:
        ops = [op.id for op in g.ops if op.loop is None and start <= a.owner[op.id] < end]
    else:
        # A loop body's blocks also own the top-level operators their results feed (the
        # optimizer's update of the stacked weights, laid out as the body's plan lays out each
        # layer): they run once a step, on every layer at once, not once an iteration, so the
        # body's program leaves them out.
        in_loop = g.ops[a.blocks[start].head].loop is not None
        ops = [op.id for op in g.ops if a.evaluable(op.id) and start <= a.owner[op.id] < end
               and (op.loop is not None) == in_loop]
    mine = set(ops)
    produced = {v for i in ops for v in g.ops[i].outputs}
    inputs, seen = [], set()
    for i in ops:
        for v in g.ops[i].inputs:
            if v is not None and v not in produced and v not in g.const_values and v not in seen:
                seen.add(v)
                inputs.append(v)
    # What leaves: read outside the segment, a result of the step, or a result of a loop body
    # (the next iteration's carry, a layer stacked for the backward loop).
    leaving = {v for v in g.outputs if v is not None}
    leaving.update(v for loop in a.expanded for _, outs in g.loop_io[loop] for v in outs if v is not None)
    outputs = [v for i in ops for v in g.ops[i].outputs
               if v in leaving or any(u not in mine for u in g.consumers[v])]
    boundary = [v for v in inputs if g.producer[v] is not None]
    return SegmentProgram(start, end, ops, inputs, outputs, boundary)


def input_layouts(a: Analysis, sp: SegmentProgram, assignment: Mapping[int, int]) -> list[Spec]:
    layouts, within = Layouts(a, assignment), set(sp.ops)
    return [layouts.wanted(v, within=within) for v in sp.inputs]


def build(a: Analysis, sp: SegmentProgram, assignment: Mapping[int, int], mesh: Mesh) -> tuple[Any, list[Any]]:
    """(function of the inputs, their shardings) under ``assignment`` (block -> plan)."""
    g = a.graph
    pins = pins_for(Layouts(a, assignment).pinned(), mesh)
    needed = {v for i in sp.ops for v in g.ops[i].inputs if v is not None}
    consts = constants(g, needed)

    def run(*args: Any) -> list[Any]:
        env = dict(zip(sp.inputs, args, strict=True))
        env.update(consts)
        env = evaluate(g, sp.ops, env, pins)
        return [env[v] for v in sp.outputs]

    shardings = [NamedSharding(mesh, pspec(s)) for s in input_layouts(a, sp, assignment)]
    return run, shardings


def synthetic_inputs(a: Analysis, sp: SegmentProgram, shardings: list[Any], seed: int = 0) -> list[Any]:
    """Arguments with the given shardings; every process builds the same global values."""
    out = []
    for v, sharding in zip(sp.inputs, shardings, strict=True):
        var = a.graph.vars[v]
        dtype = dtype_of(var.dtype)
        if is_key_dtype(dtype):  # a typed key: its key data laid out so, wrapped
            out.append(synthetic_key(var.shape, dtype, sharding, seed * 1_000_003 + v))
            continue
        host = _host_value(var.shape, dtype, seed * 1_000_003 + v)
        out.append(jax.make_array_from_callback(var.shape, sharding, lambda idx, h=host: h[idx]))
    return out


def synthetic_key(shape: tuple[int, ...], dtype: Any, sharding: NamedSharding, seed: int) -> Any:
    """Typed PRNG keys of ``dtype`` (``key<fry>``) of ``shape`` laid out as ``sharding``, the same on
    every process."""
    data_shape = key_shape(dtype)
    host = np.random.default_rng(seed).integers(0, 2**32, (*shape, *data_shape), dtype=np.uint32)
    spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec) + len(data_shape))
    data = jax.make_array_from_callback(host.shape, NamedSharding(sharding.mesh, PartitionSpec(*spec)),
                                        lambda idx: host[idx])
    return wrap_keys(data, dtype)


def _host_value(shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    dt = jnp.dtype(dtype)
    if jnp.issubdtype(dt, jnp.floating):
        return (np.random.default_rng(seed).random(shape, dtype=np.float32) * 0.1).astype(dt)
    return np.zeros(shape, dtype=dt)


def boundary_bytes(a: Analysis, sp: SegmentProgram, layouts: list[Spec]) -> int:
    """Per-device bytes of the arguments another segment produces (counted there, as results)."""
    g, boundary = a.graph, set(sp.boundary)
    return sum(shard_bytes(g.vars[v].shape, spec, itemsize(g.vars[v].dtype), a.mesh_shape)
               for v, spec in zip(sp.inputs, layouts, strict=True) if v in boundary)
