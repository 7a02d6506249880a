"""Logical axis names and the rules that map them onto a device mesh.

Models name the dimensions of their parameters and activations with logical axes ("batch",
"embed", "heads", "mlp", "vocab", "expert", ...). A plan maps those names to mesh axes. Models
call ``constrain(x, ("batch", "seq", "embed"))`` at the points where a layout matters; it is a
no-op unless ``use_rules(mesh, rules)`` is active while the step is traced, so the same model
code runs unsharded, under a built-in plan or under a searched one.

A rule's value is a mesh axis name, a list of mesh axis names (the dimension is split over
their product) or None (replicated). Names without a rule are replicated. If a mesh axis is
already used by an earlier dimension of the same array, the later dimension stays replicated:
a mesh axis can split an array only once.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Sequence, Union

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .errors import ModelError

Axes = Optional[Sequence[Optional[str]]]  # one logical name (or None) per dimension
Rule = Union[None, str, Sequence[str]]
Rules = Mapping[str, Rule]


def mesh_axes_of(rule: Rule) -> tuple[str, ...]:
    if rule is None:
        return ()
    if isinstance(rule, str):
        return (rule,)
    return tuple(rule)


def spec_for(axes: Axes, rules: Rules, mesh: Mesh, shape: Optional[Sequence[int]] = None,
             what: str = "array") -> PartitionSpec:
    """The PartitionSpec that ``rules`` give an array whose dimensions are named ``axes``.

    With ``shape``, checks that every split dimension divides evenly, raising ModelError that
    names ``what``, the dimension, its size and the mesh axis.
    """
    if axes is None:
        return PartitionSpec()
    used: set[str] = set()
    entries: list = []
    for dim, name in enumerate(axes):
        targets = mesh_axes_of(rules.get(name)) if name is not None else ()
        for axis in targets:
            if axis not in mesh.shape:
                raise ModelError(f"{what}: rule {name!r} -> {axis!r} names a mesh axis that the mesh "
                                f"{dict(mesh.shape)} does not have; use one of {list(mesh.shape)}")
        if not targets or used.intersection(targets):
            entries.append(None)
            continue
        if shape is not None:
            ways = math.prod(mesh.shape[a] for a in targets)
            if shape[dim] % ways:
                over = " x ".join(f"{a!r} (size {mesh.shape[a]})" for a in targets)
                raise ModelError(
                    f"{what}: dimension {dim} ({name!r}, size {shape[dim]}) is not divisible by mesh "
                    f"axis {over}; choose a plan or mesh size that divides {shape[dim]}, "
                    f"or change the model's {name!r} size")
        used.update(targets)
        entries.append(targets[0] if len(targets) == 1 else targets)
    while entries and entries[-1] is None:  # P("data", None) and P("data") are the same layout
        entries.pop()
    return PartitionSpec(*entries)


@dataclass(frozen=True)
class _Active:
    mesh: Mesh
    rules: Rules


_ACTIVE: contextvars.ContextVar[Optional[_Active]] = contextvars.ContextVar("logical_rules", default=None)


@contextlib.contextmanager
def use_rules(mesh: Mesh, rules: Rules) -> Iterator[None]:
    """Makes ``constrain`` lay activations out on ``mesh`` by ``rules`` while tracing."""
    token = _ACTIVE.set(_Active(mesh, dict(rules)))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
    """Pins ``x``'s layout to what the active rules say for ``axes``; a no-op without rules."""
    active = _ACTIVE.get()
    if active is None:
        return x
    if len(axes) != x.ndim:
        raise ValueError(f"constrain: {len(axes)} axis names {tuple(axes)} for an array of shape {x.shape}")
    spec = spec_for(axes, active.rules, active.mesh, x.shape, what=f"activation {tuple(axes)}")
    return jax.lax.with_sharding_constraint(x, NamedSharding(active.mesh, spec))
