"""Searching several logical meshes of the same devices (``mode.mesh_shape=auto``).

A plan is a layout per block on one logical mesh, and the same 8 devices arranged as [8], [4,2]
or [2,4] offer different plans: a 1-D mesh cannot split the batch 4 ways and the heads 2 ways,
which is what dp_tp does. So, as Alpa searches logical mesh shapes, the auto search analyses,
profiles and searches each mesh on its own, then measures their shortlists together on the whole
step and keeps the fastest plan, whatever its mesh. On the 2-D meshes only plans that split two
different roles are searched (``strategies.enumerate_strategies(two_axis_only=True)``): the rest
are 1-D plans over the same devices, or leave an axis repeating the computation.

The plans nearest the built-in ones (``nearest.py``) are what makes the search never lose to a
baseline it is compared with: each built-in plan is looked for on the mesh shaped like its own
(dp_tp's [4,2]), so every baseline has a point of the search space measured beside the rest. So
that the point is the baseline's own layout, each mesh's analysis is given the layouts of the
built-in plans shaped like it (``nearest.builtin_references``): its blocks then offer the plans
those take where the enumeration, and on a 2-D mesh the two-role rule, leave them out.

Every pass that works mesh by mesh (the analysis, the search's DP, the ILP) goes through
``for_each_mesh``: a mesh that cannot hold the model or a plan is left out while another can.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional, TypeVar

from launcher.errors import BAD_INPUT, UserError

R = TypeVar("R")

AUTO = "auto"


def is_auto(mesh_shape: Any) -> bool:
    return isinstance(mesh_shape, str) and mesh_shape == AUTO


def is_list_of_shapes(mesh_shape: Any) -> bool:
    """A list of mesh shapes (``[[8], [4, 2]]``): the meshes to search, as ``auto`` searches its own."""
    return _is_list(mesh_shape) and len(mesh_shape) > 0 and all(_is_list(s) for s in mesh_shape)


def is_several(mesh_shape: Any) -> bool:
    """Whether ``mode.mesh_shape`` asks for several meshes searched, the fastest plan kept."""
    return is_auto(mesh_shape) or is_list_of_shapes(mesh_shape)


def shown(mesh_shape: Any) -> Any:
    """``mode.mesh_shape`` as written, in plain lists (OmegaConf's print otherwise), for messages."""
    return [shown(s) for s in mesh_shape] if _is_list(mesh_shape) else mesh_shape


def _is_list(x: Any) -> bool:   # a list, a tuple or OmegaConf's ListConfig (a Sequence too)
    return isinstance(x, Sequence) and not isinstance(x, (str, bytes))


def auto_shapes(n: int, processes: int = 1) -> list[list[int]]:
    """The logical meshes worth searching for ``n`` devices: 1-D, then every 2-D factorisation
    with both axes longer than one, the longer first axis first (8: [8], [4, 2], [2, 4]); over
    several processes, then every 3-D mesh whose first axis crosses them and whose other two
    split each process's devices (2 processes x 4: [2, 2, 2]), as multi-host trainers lay data
    across hosts and fsdp or tensor parallelism within them (MaxText's dcn and ici axes)."""
    flat = [[n]] + [[a, n // a] for a in range(n - 1, 1, -1) if n % a == 0]
    local = n // processes if processes > 1 and n % processes == 0 else 0
    return flat + [[processes, a, local // a] for a in range(local - 1, 1, -1) if local % a == 0]


def mesh_shapes(mesh_shape: Any, n: int, processes: int = 1) -> list[list[int]]:
    """``mode.mesh_shape`` as the meshes to search over ``n`` devices (of ``processes``): ``auto``
    gives ``auto_shapes``; a list of shapes those (``[]`` among them the 1-D mesh), in its order;
    ``[]`` the 1-D mesh; anything else is the one shape given."""
    if is_auto(mesh_shape):
        return auto_shapes(n, processes)
    if is_list_of_shapes(mesh_shape):
        shapes = [[int(a) for a in s] or [n] for s in mesh_shape]
        twice = [s for k, s in enumerate(shapes) if s in shapes[:k]]
        if twice:
            raise UserError(f"mode.mesh_shape={shown(mesh_shape)} names the mesh {twice[0]} twice: "
                            "give each mesh once")
        return shapes
    return [list(mesh_shape) or [n]]


def crossings(shape: Sequence[int], processes: int) -> list[int]:
    """The axes of a mesh ``shape`` the processes can change along (``plans.arranged``): those of
    more than one device whose size the process count divides; none in a one-process job."""
    if processes <= 1 or len([s for s in shape if s > 1]) < 2:
        return []
    return [k for k, s in enumerate(shape) if s > 1 and s % processes == 0]


def natural_shape(name: str, n: int) -> list[int] | None:
    """The mesh a built-in plan lays itself out on over ``n`` devices, axes of one left out
    (dp: [8], dp_tp: [4, 2]); None when it does not fit ``n``."""
    from launcher.models.plans import builtin  # noqa: PLC0415  JAX: the CLI imports this module

    try:
        return [s for s in builtin(name).axis_sizes(n).values() if s > 1] or [n]
    except BAD_INPUT:
        return None


def merge_shortlists(shortlists: Sequence[Sequence[Any]], k: int) -> list[tuple[int, Any]]:
    """One shortlist over several meshes: (mesh index, ``dp.Candidate``) for every mesh's
    optimum and every nearest-baseline plan, then the other candidates (uniform plans,
    runners-up) fastest predicted first until ``k`` besides the nearest plans are in. One mesh:
    its shortlist as it is."""
    if len(shortlists) == 1:
        return [(0, c) for c in shortlists[0]]
    kept = [(i, c) for i, short in enumerate(shortlists) for c in short
            if c.source == "search optimum" or c.source.startswith("nearest ")]
    kept.sort(key=lambda ic: (not ic[1].source.startswith("search"), ic[1].predicted_time_s))
    rest = sorted(((i, c) for i, short in enumerate(shortlists) for c in short
                   if not (c.source == "search optimum" or c.source.startswith("nearest "))),
                  key=lambda ic: ic[1].predicted_time_s)
    room = max(k - len(shortlists), 0)
    return kept + rest[:room]


def for_each_mesh(shapes: Sequence[Sequence[int]], attempt: Callable[[int], R], *,
                  refuse: type[Exception] | tuple[type[Exception], ...], none_fit: Callable[[str], Exception],
                  log: Callable[[str], None], what: str = "mesh") -> tuple[list[Optional[R]], list[Optional[str]]]:
    """``attempt(i)`` on each logical mesh ``shapes[i]`` of the same devices, where one mesh may
    refuse (``refuse``: the model does not divide it, no plan on it fits the budget) while another
    does not: its result, or None and why (logged as ``<what> [4, 2]: left out: <why>``). A single
    mesh's refusal is raised as it is; when every one of several refuses, ``none_fit(their
    reasons)`` is raised. Returns the results and the reasons (None where it worked), by mesh."""
    results: list[Optional[R]] = []
    reasons: list[Optional[str]] = []
    for i, shape in enumerate(shapes):
        try:
            results.append(attempt(i))
            reasons.append(None)
        except refuse as e:
            if len(shapes) == 1:
                raise
            results.append(None)
            reasons.append(str(e))
            log(f"{what} {list(shape)}: left out: {e}")
    if all(r is None for r in results):
        raise none_fit("; ".join(f"mesh {list(s)}: {why}" for s, why in zip(shapes, reasons, strict=True)))
    return results, reasons
