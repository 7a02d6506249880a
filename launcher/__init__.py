"""xlaunch: a config-driven launcher for multi-host JAX/XLA work (``python -m launcher``).

What a user's own code imports, from the package itself (these names stay where they are across
releases; README.md and docs/ show them so):

    import launcher
    ctx = launcher.context()               # a mode=run program's job: rank, run dir, stop requests
    from launcher import autoshard, AutoPlan, Step   # auto-sharding your own training step

``context`` and ``Context`` are ``launcher/api.py``'s; ``autoshard``, ``AutoPlan`` (a searched
plan: apply, place, save, load), ``Step`` (what a ``mode.step`` factory may return) and
``Applied`` are ``launcher/sharding/user/api.py``'s. ``import launcher`` imports no JAX: the
command line and every task import the package before the devices are set, so the names that
need JAX are imported when first asked for (PEP 562's module ``__getattr__``). An outside
sharding algorithm's API is ``launcher.sharding.algorithms.base`` (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

from launcher.api import Context, context

# The names whose module imports JAX, looked up on first use.
_AUTOSHARD = ("autoshard", "AutoPlan", "Step", "Applied")

__all__ = ["context", "Context", *_AUTOSHARD]


def __getattr__(name: str) -> Any:
    if name not in _AUTOSHARD:
        raise AttributeError(f"module 'launcher' has no attribute {name!r}")
    from launcher.sharding.user import api  # noqa: PLC0415  JAX: `import launcher` must not start it

    value = getattr(api, name)
    globals()[name] = value   # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
