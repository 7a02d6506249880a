"""The types the code's seams pass, named once (as ``flax.typing`` and ``jax.typing`` name theirs).

For annotations: every module of the launcher has ``from __future__ import annotations``, so an
annotation is never evaluated, and this module imports nothing of JAX at run time (a rank imports
the launcher before it sets its devices' visibility). JAX's own types (``jax.Array``,
``jax.Device``, ``jax.sharding.Mesh``, ``NamedSharding``) are named where they are used; the
jaxpr's, which moved between JAX's versions (``jax.core`` to ``jax.extend.core``), only here, for
the type checker.

A pytree is ``Any`` to JAX itself: its leaves are arrays and scalars, its nodes any registered
type, a user's Flax struct, NNX state or Equinox module among them. Named, a signature says
that it takes one; ``Json`` says a dict is what result.json, plan and status files hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Union

# A pytree of arrays (and scalars, None): a training state, a batch, a step's outputs.
PyTree = Any
# A function of pytrees: a training step as the user wrote it, or as a plan lays it out.
StepFn = Callable[..., PyTree]
# What a JSON file holds, and a JSON object: result.json, a plan file, a rank's status.
JsonValue = Union[None, bool, int, float, str, list["JsonValue"], dict[str, "JsonValue"]]
Json = dict[str, JsonValue]

if TYPE_CHECKING:
    # Re-exported (``as``): the jaxpr's types, for the type checker only.
    from jax.extend.core import ClosedJaxpr as ClosedJaxpr
    from jax.extend.core import Jaxpr as Jaxpr
    from jax.extend.core import JaxprEqn as JaxprEqn
    from jax.extend.core import Literal as Literal
    from jax.extend.core import Var
    JaxprVar = Var   # a jaxpr's variable (not the launcher's graph's var ids)

__all__ = ["PyTree", "StepFn", "JsonValue", "Json"]
