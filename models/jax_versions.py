"""What the models need that JAX releases spell differently (0.4.35, LUMI's, to the newest).

The models import no launcher code (docs/architecture.md), so the differences they meet live
here, where they can reach them; ``launcher/jaxcompat.py``, which holds every other one, takes
these from here rather than keeping a second copy.
"""

from __future__ import annotations

from typing import Any, Sequence

from jax.sharding import Mesh


def auto_mesh(devices: Any, names: Sequence[str]) -> Mesh:
    """``jax.sharding.Mesh(devices, names)`` whose axes are Auto on every JAX: sharding constraints
    (the models' ``constrain``, CFP's pinned layouts) name its axes, which Explicit axes refuse
    ("can only refer to Auto axes"). Auto is the constructor's default up to 0.10; 0.11 made an
    AbstractMesh Explicit by default, so the type is given wherever JAX has axis types."""
    return Mesh(devices, tuple(names), **auto_axes(len(names)))


def auto_axes(n: int) -> dict:
    """The keyword that makes ``n`` mesh axes Auto ({} where JAX has no axis types: 0.4.35, where
    every axis is what Auto is now)."""
    try:
        from jax.sharding import AxisType  # noqa: PLC0415  an optional name, by release
    except ImportError:
        return {}
    return {"axis_types": (AxisType.Auto,) * n}
