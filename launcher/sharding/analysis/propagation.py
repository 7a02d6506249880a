"""How a tensor layout flows through one operator, and when that would need communication.

A layout (``Spec``) gives, per tensor dimension, the mesh axes splitting it. ``propagate`` takes
the layouts of an operator's inputs that the current ParallelBlock decides (``None`` for inputs
from elsewhere, which are resharded to follow) and returns the output layouts plus whether
computing them needs any communication. ParallelBlocks grow through operators for which it
never does. Rules, per primitive:

- element-wise operators (arithmetic, comparisons, ``select_n``, ``convert_element_type``,
  ``integer_pow``, transcendental functions, ...): the output is split wherever an input of its
  shape is split (``merge``): an input that leaves a dimension whole holds every shard of it, so
  the softmax gradient ``mul(broadcast(g), p)`` keeps ``p``'s split vocabulary. Inputs that split
  one dimension differently, or one mesh axis over two dimensions, need a reshard
  (communication). Operands of the same rank with unit dimensions where the output has more
  (``eq(argmax[B,S,1], iota[1,1,E])``) count on their other dimensions; scalars do not count;
- ``broadcast_in_dim``: mapped dimensions keep their axes, new and expanded ones are replicated;
- ``transpose``: axes follow the permutation;
- ``reshape`` / ``squeeze`` / ``expand_dims``: dimensions are grouped where the products of the
  two shapes agree; a split dimension must be the major (first non-unit) dimension of its group
  and the group's first non-unit output dimension must be divisible by the split, which keeps
  every shard a contiguous block (e.g. (B, S, H*D) -> (B, S, H, D) with H*D split keeps H split
  when the split divides H); any other split reshape needs communication;
- reductions (``reduce_sum``/``max``/``min``/``prod``/``and``/``or``, ``argmax``/``argmin``):
  free when no reduced dimension is split (partial results would need an all-reduce);
- ``cumsum`` and friends, ``sort``, ``rev``, ``top_k``, ``concatenate``, ``pad``, ``slice``,
  ``dynamic_slice``, ``dynamic_update_slice``, ``split``: free when the dimension they work along
  (or that changes size) is not split;
- pooling and its gradients (``reduce_window_sum``/``max``/``min``, ``reduce_window``,
  ``select_and_scatter_add``, ``select_and_gather_add``): free when no windowed dimension (a
  window, stride, padding or dilation other than 1) is split; the others keep their axes, as a
  convolution's batch and features do;
- ``iota`` and other operators without inputs: replicated, free;
- ``optimization_barrier``, ``sharding_constraint``, ``copy``: layouts pass through;
- a ``gather`` that is not an embedding lookup (``take_along_axis``): an operand dimension it
  slices whole or batches over keeps its split; one it indexes into needs communication;
- anything else (scatters, loops, custom calls, random number generation, collectives...):
  unknown, so it stops propagation (a block boundary).
"""

from __future__ import annotations

import math
from typing import Sequence

from launcher.sharding.analysis.graph import Graph, Op
from launcher.sharding.analysis.strategies import Spec

ELEMENTWISE = frozenset("""
abs acos acosh add add_any and asin asinh atan atan2 atanh cbrt ceil clamp complex conj
convert_element_type copy copy_p cos cosh div eq erf erf_inv erfc exp exp2 expm1 floor ge gt imag
integer_pow is_finite le lgamma digamma log log1p logistic lt max min mul ne neg nextafter not or
population_count pow real reduce_precision rem round rsqrt select_n shift_left shift_right_arithmetic
shift_right_logical sign sin sinh sqrt square stop_gradient sub tan tanh xor
""".split())
PASS_THROUGH = frozenset({"optimization_barrier", "sharding_constraint"})
REDUCTIONS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                        "reduce_xor", "argmax", "argmin"})
ALONG_AXIS = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "sort", "split"})
RESHAPES = frozenset({"reshape", "squeeze", "expand_dims"})
WINDOWED = frozenset({"reduce_window_sum", "reduce_window_max", "reduce_window_min", "reduce_window",
                      "select_and_scatter_add", "select_and_gather_add"})


def propagate(g: Graph, op: Op, ins: Sequence[Spec | None], mesh_shape: Sequence[int]) -> tuple[list[Spec], bool]:
    shapes = [g.shape(v) for v in op.outputs]
    replicated = [((),) * len(s) for s in shapes]
    known = [(g.shape(v), s) for v, s in zip(op.inputs, ins, strict=True) if v is not None and s is not None]
    if not op.inputs:
        return replicated, False
    if op.prim in ELEMENTWISE:
        out_shape = shapes[0]
        same = [s for shape, s in known if len(shape) == len(out_shape)
                and all(d in (n, 1) for d, n in zip(shape, out_shape, strict=True))]
        if not same:
            return replicated, False
        merged = merge(same)
        return ([merged], False) if merged is not None else ([same[0]], True)
    if op.prim in PASS_THROUGH:
        return [s if s is not None else ((),) * len(sh) for s, sh in zip(ins, shapes, strict=True)], False
    if op.prim in WINDOWED and known:
        return _windowed(op, known, shapes)
    if not known or ins[0] is None:
        # The first operand carries the layout of every structural rule below; without it
        # there is nothing to propagate.
        return replicated, bool(known)
    return _structural(g, op, ins[0], known, shapes, mesh_shape)


def _structural(g: Graph, op: Op, spec: Spec, known: list, shapes: list, mesh_shape: Sequence[int]
                ) -> tuple[list[Spec], bool]:
    """The rules that follow the first operand's layout ``spec`` (module doc)."""
    p, in_shape = op.params, g.shape(op.inputs[0])
    replicated = [((),) * len(s) for s in shapes]
    if op.prim == "broadcast_in_dim":
        out: list = [()] * len(shapes[0])
        for i, d in enumerate(p.get("broadcast_dimensions", ())):
            if in_shape[i] == shapes[0][d]:
                out[d] = spec[i]
        return [tuple(out)], False
    if op.prim == "transpose":
        return [tuple(spec[i] for i in p["permutation"])], False
    if op.prim in RESHAPES:
        out_spec = reshape_spec(in_shape, shapes[0], spec, mesh_shape)
        return ([out_spec], False) if out_spec is not None else (replicated, True)
    if op.prim in REDUCTIONS:
        axes = set(p.get("axes", ()))
        out = tuple(ax for i, ax in enumerate(spec) if i not in axes)
        return [out] * len(shapes), any(spec[i] for i in axes)
    if op.prim in ALONG_AXIS or op.prim in ("rev", "top_k", "concatenate"):
        along = {p["dimension"]} if "dimension" in p else {p["axis"]} if "axis" in p else \
            set(p.get("dimensions", ())) if op.prim == "rev" else {len(in_shape) - 1}
        others = [s for shape, s in known[1:] if len(shape) == len(in_shape)]
        comm = any(spec[i] for i in along) or any(s != spec for s in others)
        outs = [tuple(() if i in along and len(sh) == len(spec) and sh[i] != in_shape[i] else ax
                      for i, ax in enumerate(spec)) if len(sh) == len(spec) else ((),) * len(sh) for sh in shapes]
        return outs, comm
    if op.prim == "gather":
        return _gather(op, spec, in_shape, g.shape(op.inputs[1]), shapes[0])
    if op.prim in ("pad", "slice", "dynamic_slice", "dynamic_update_slice"):
        changed = set(p.get("padded", ())) | {i for i, (a, b) in enumerate(zip(in_shape, shapes[0], strict=True)) if a != b}
        if op.prim == "dynamic_update_slice" and op.inputs[1] is not None:
            changed |= {i for i, (a, b) in enumerate(zip(in_shape, g.shape(op.inputs[1]), strict=True)) if a != b}
        return [spec], any(spec[i] for i in changed)
    return replicated, True


def _windowed(op: Op, known: list, shapes: list) -> tuple[list[Spec], bool]:
    """Pooling and its gradients (module doc). Their operands of the operator's rank (not a
    reduction's scalar initial values) map dimension to dimension, a pooled tensor and an
    unpooled one alike (``select_and_scatter_add``'s gradient and the input it scatters onto,
    either of which the block may decide): each must split as the others do outside the windowed
    dimensions, and none a windowed one."""
    rank = len(shapes[0])
    specs = [s for shape, s in known if len(shape) == rank]
    if not specs:
        return [((),) * len(sh) for sh in shapes], True
    windowed, spec = set(op.params.get("windowed", range(rank))), specs[0]
    comm = any(s[i] for s in specs for i in windowed) or \
        any(s[i] != spec[i] for s in specs for i in range(rank) if i not in windowed)
    out = tuple(() if i in windowed else ax for i, ax in enumerate(spec))
    return [out if len(sh) == rank else ((),) * len(sh) for sh in shapes], comm


def _gather(op: Op, spec: Spec, in_shape: Sequence[int], idx_shape: Sequence[int], out_shape: Sequence[int]
            ) -> tuple[list[Spec], bool]:
    """A gather that is not an embedding lookup (``take_along_axis``, picking the label's
    log-probability): an operand dimension sliced whole (an offset dimension) keeps its split,
    as does a batching dimension (the output's matching batch dimension); a split dimension the
    gather indexes into needs communication."""
    p = op.params
    batching, idx_batching = p.get("operand_batching_dims", ()), p.get("start_indices_batching_dims", ())
    out: list = [()] * len(out_shape)
    comm = False
    batch_out = [j for j in range(len(out_shape)) if j not in p["offset_dims"]]
    idx_dims = [d for d in range(len(idx_shape)) if d != p["index_vector_dim"]]
    for j, i in zip(batch_out, idx_dims, strict=False):
        if i in idx_batching:
            out[j] = spec[batching[idx_batching.index(i)]]
    sliced = [d for d in range(len(in_shape)) if d not in p["collapsed_slice_dims"] and d not in batching]
    for j, d in zip(p["offset_dims"], sliced, strict=False):
        if p["slice_sizes"][d] == in_shape[d]:
            out[j] = spec[d]
        elif spec[d]:
            comm = True
    comm = comm or any(spec[d] for d in p["collapsed_slice_dims"])
    return [tuple(out)], comm


def merge(specs: Sequence[Spec]) -> Spec | None:
    """The layout of an element-wise result whose same-shaped inputs have ``specs``: each
    dimension split as any input splits it (an input that leaves it whole has every shard
    locally), or None when two inputs split one dimension differently or one mesh axis would
    split two dimensions (that needs a reshard)."""
    out: list = [()] * len(specs[0])
    for spec in specs:
        for i, ax in enumerate(spec):
            if ax and out[i] and out[i] != ax:
                return None
            out[i] = out[i] or ax
    used = [a for ax in out for a in ax]
    return tuple(out) if len(used) == len(set(used)) else None


def reshape_spec(a: Sequence[int], b: Sequence[int], spec: Spec, mesh_shape: Sequence[int]) -> Spec | None:
    """The output layout of reshaping shape ``a`` (laid out as ``spec``) to ``b``, or None when
    the reshape cannot keep every split dimension whole (it would need communication)."""
    groups = _groups(a, b)
    if groups is None:
        return None
    out: list = [()] * len(b)
    for ga, gb in groups:
        split = [i for i in ga if spec[i]]
        if not split:
            continue
        if len(split) > 1:
            return None
        i = split[0]
        major_a = next((k for k in ga if a[k] > 1), None)
        major_b = next((k for k in gb if b[k] > 1), None)
        n = math.prod(mesh_shape[ax] for ax in spec[i])
        if i != major_a or major_b is None or b[major_b] % n:
            return None
        out[major_b] = spec[i]
    return tuple(out)


def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]] | None:
    groups = []
    i = j = 0
    try:
        while i < len(a) or j < len(b):
            ga, gb = ([i] if i < len(a) else []), ([j] if j < len(b) else [])
            pa, pb = (a[i] if ga else 1), (b[j] if gb else 1)
            i, j = i + len(ga), j + len(gb)
            while pa != pb:
                if pa < pb:
                    ga.append(i)
                    pa *= a[i]
                    i += 1
                else:
                    gb.append(j)
                    pb *= b[j]
                    j += 1
            groups.append((ga, gb))
    except IndexError:
        return None
    return groups
