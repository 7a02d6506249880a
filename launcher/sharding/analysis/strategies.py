"""Parallel strategies of a contraction on a logical device mesh, in Alpa's notation.

A strategy says which loop dimension (see ``contractions.py``) each mesh axis splits. It fixes the
layout of both operands and the output, and the collective it needs: splitting a contracting
dimension leaves each device a partial sum, so the output is all-reduced over those axes.

Enumeration rule (what ``enumerate_strategies`` offers):

- only mesh axes of size > 1 split anything;
- an axis (or a group of axes) splits one *role*: batch, lhs-free, rhs-free or contracting; the
  dimension it splits is the first loop dimension of that role (in output, then lhs, then rhs
  order) whose size the axis size divides. Window dimensions are never split;
- 1-D mesh: one strategy per role that has such a dimension, in the order batch, lhs-free,
  rhs-free, contracting (so plan k means the same kind of split across similar contractions);
- 2-D mesh: every ordered pair of distinct roles over (axis 0, axis 1); then every role split
  over both axes at once (one dimension split by the product); then every role on one axis with
  the other axis replicated. Two axes never split the same role twice;
- 3-D mesh (a multi-process job's ``auto`` meshes: hosts x a 2-D mesh within each,
  ``search/meshes.py``): the first axis, the one crossing processes, splits the batch, and the
  other two take the 2-D rule's assignments beside it (a pair's batch split over the first axis
  and its own at once); where no batch dimension divides, the 2-D rule alone;
- a contraction no axis can split offers the one replicated strategy.

``two_axis_only`` (the 2-D meshes of ``mode.mesh_shape=auto``) keeps only the ordered pairs of
distinct roles. A role split over both axes at once is a 1-D plan over the same devices in the
same order, which the auto search's 1-D mesh already offers; a plan leaving an axis unused
repeats its computation over that axis. A contraction with no such pair keeps the full rule.

Notation: ``OUT = LHS x RHS @ {axes}``: one letter per tensor dimension, ``S`` split and ``R``
replicated, in each tensor's own dimension order; ``@ {…}`` gives, for each split dimension in
reading order (lhs dimensions, then rhs dimensions, then output-only ones), its mesh axis
(``01`` for a dimension split over axes 0 and 1); ``(allreduce @ a)`` names the axes of the
all-reduce a split contracting dimension implies. For a matmul ``C[i,j] = A[i,k] B[k,j]`` on a 2-D
mesh: ``SS = SR x RS @ {0,1}`` splits i over axis 0 and j over axis 1; ``RS = RS x SS @ {1,0}
(allreduce @ 1)`` splits k over axis 1 and j over axis 0. An embedding lookup's lhs is its index
tensor (its trailing index-vector dimension always ``R``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Sequence

from launcher.sharding.analysis.contractions import ROLES, Contraction

Axes = tuple[int, ...]
Spec = tuple[Axes, ...]  # per tensor dimension, the mesh axes splitting it


@dataclass(frozen=True)
class Strategy:
    axes: tuple[Axes, ...]  # aligned with Contraction.dims

    @property
    def replicated(self) -> bool:
        return not any(self.axes)


def enumerate_strategies(c: Contraction, mesh_shape: Sequence[int], two_axis_only: bool = False) -> list[Strategy]:
    live = [a for a, n in enumerate(mesh_shape) if n > 1]
    out: list[Strategy] = []
    seen: set[Strategy] = set()

    def add(assign: dict[str, Axes]) -> None:
        axes: list[Axes] = [()] * len(c.dims)
        for role, ax in assign.items():
            d = _candidate(c, role, math.prod(mesh_shape[a] for a in ax))
            if d is None:
                return
            axes[d] = tuple(sorted(ax))
        s = Strategy(tuple(axes))
        if s not in seen and not s.replicated:
            seen.add(s)
            out.append(s)

    if len(live) == 1:
        for role in ROLES:
            add({role: (live[0],)})
    elif len(live) == 2:
        pairs, rest = _two_axes(live)
        for assign in pairs:
            add(assign)
        if two_axis_only and out:
            return out
        for assign in rest:
            add(assign)
    elif len(live) >= 3:
        # The first axis crosses hosts (``search/meshes.py``): it splits the batch, besides
        # whatever role the others' plan gives it, and the other two are searched as a 2-D mesh.
        host, (pairs, rest) = live[0], _two_axes(live[1:3])
        for assign in pairs if two_axis_only else pairs + rest:
            add({**assign, "batch": (host, *assign.get("batch", ()))})
        if not out:   # no batch the host axis divides: the hosts repeat the computation
            for assign in pairs + rest:
                add(assign)
    return out or [Strategy(((),) * len(c.dims))]


def _two_axes(axes: Sequence[int]) -> tuple[list[dict], list[dict]]:
    """The role assignments of a 2-D mesh's ``axes`` (the module doc): every ordered pair of
    distinct roles; and the rest, each role over both axes at once, then on one axis alone."""
    pairs = [{r0: (axes[0],), r1: (axes[1],)} for r0, r1 in itertools.permutations(ROLES, 2)]
    rest = [{role: tuple(axes)} for role in ROLES] + [{role: (a,)} for a in axes for role in ROLES]
    return pairs, rest


def sub_strategies(strategies: Sequence[Strategy]) -> list[Strategy]:
    """What ``strategies`` offer with fewer axes used: each with one mesh axis (or group of axes
    splitting one dimension) left unused, and the replicated strategy; those not among them
    already. A split left out never adds communication, so the operators a block's plans keep
    communication-free stay so (``references.py``)."""
    out: list[Strategy] = []
    seen = set(strategies)
    for s in strategies:
        for d, ax in enumerate(s.axes):
            if ax:
                out.append(Strategy(s.axes[:d] + ((),) + s.axes[d + 1:]))
    if strategies:
        out.append(Strategy(((),) * len(strategies[0].axes)))
    return [s for s in dict.fromkeys(out) if s not in seen]


def _candidate(c: Contraction, role: str, n: int) -> int | None:
    for i in c.of_role(role):
        if c.dims[i].size % n == 0:
            return i
    return None


def operand_specs(c: Contraction, s: Strategy) -> tuple[Spec, Spec, Spec]:
    """(lhs, rhs, out) layouts a strategy implies; the output is after the all-reduce."""
    lhs: list[Axes] = [()] * len(c.lhs_shape)
    rhs: list[Axes] = [()] * len(c.rhs_shape)
    out: list[Axes] = [()] * len(c.out_shape)
    for d, ax in zip(c.dims, s.axes, strict=True):
        if d.lhs is not None:
            lhs[d.lhs] = ax
        if d.rhs is not None:
            rhs[d.rhs] = ax
        if d.out is not None and d.role != "contracting":
            out[d.out] = ax
    return tuple(lhs), tuple(rhs), tuple(out)


def allreduce_axes(c: Contraction, s: Strategy) -> Axes:
    return tuple(sorted({a for d, ax in zip(c.dims, s.axes, strict=True) if d.role == "contracting" for a in ax}))


def from_operand_specs(c: Contraction, lhs: Spec, rhs: Spec) -> tuple[Strategy, bool]:
    """The strategy operand layouts imply, and whether it runs with no communication at all.

    Batch and contracting dimensions must be split the same way in both operands, window
    dimensions not at all, no axis may split two loop dimensions, and no contracting dimension
    may be split (that needs an all-reduce)."""
    axes: list[Axes] = []
    ok = True
    for d in c.dims:
        la = lhs[d.lhs] if d.lhs is not None else ()
        ra = rhs[d.rhs] if d.rhs is not None else ()
        if d.role in ("batch", "contracting", "window") and d.lhs is not None and d.rhs is not None and la != ra:
            ok = False
        ax = la or ra
        if d.role in ("contracting", "window") and ax:
            ok = False
        axes.append(ax)
    used = [a for ax in axes for a in ax]
    ok = ok and len(used) == len(set(used))
    return Strategy(tuple(axes)), ok


def notation(c: Contraction, s: Strategy) -> str:
    lhs, rhs, out = operand_specs(c, s)
    letters = lambda spec: "".join("S" if ax else "R" for ax in spec) or "-"
    order: list[int] = []
    for side in ("lhs", "rhs", "out"):
        for i in sorted(range(len(c.dims)), key=lambda i: (getattr(c.dims[i], side) is None, getattr(c.dims[i], side))):
            if getattr(c.dims[i], side) is not None and s.axes[i] and i not in order:
                order.append(i)
    text = f"{letters(out)} = {letters(lhs)} x {letters(rhs)}"
    if order:
        text += " @ {" + ",".join("".join(map(str, s.axes[i])) for i in order) + "}"
    ar = allreduce_axes(c, s)
    if ar:
        text += " (allreduce @ " + (str(ar[0]) if len(ar) == 1 else "{" + ",".join(map(str, ar)) + "}") + ")"
    return text


def collective(c: Contraction, s: Strategy, dtype_bytes: int = 4) -> dict:
    """The collective a strategy implies (none, or an all-reduce of the output)."""
    ar = allreduce_axes(c, s)
    if not ar:
        return {"kind": "none"}
    _, _, out = operand_specs(c, s)
    return {"kind": "all-reduce", "axes": list(ar), "bytes": shard_bytes(c.out_shape, out, dtype_bytes, None)}


def shard_bytes(shape: Sequence[int], spec: Spec, dtype_bytes: int, mesh_shape: Sequence[int] | None) -> int:
    """Bytes of one device's shard (of the whole tensor when ``mesh_shape`` is None)."""
    n = math.prod(shape) * dtype_bytes
    if mesh_shape is None:
        return n
    for ax in spec:
        for a in ax:
            n //= mesh_shape[a]
    return n
