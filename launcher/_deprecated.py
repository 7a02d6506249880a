"""Modules a release documented and a later one moved: each is a module ``__getattr__`` (PEP 562)
handing out the names of the module that replaced it, with a DeprecationWarning naming the
import to write instead. Attributed to the line that asked (``from old import name`` asks from
the caller's frame), so Python shows it there by default in ``__main__`` and in tests."""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Callable

# The user's-step API: where it lives, and how the documentation imports it.
TARGET = "launcher.sharding.user.api"
PUBLIC = ("autoshard", "AutoPlan", "Step", "Applied")


def forward(old: str, target: str = TARGET) -> Callable[[str], Any]:
    """The ``__getattr__`` of deprecated module ``old``: ``target``'s names, with a warning."""

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):   # import machinery and introspection: not the user's names
            raise AttributeError(name)
        value = getattr(importlib.import_module(target), name)
        instead = f"from launcher import {name}" if name in PUBLIC else f"from {target} import {name}"
        warnings.warn(f"{old} is deprecated; write `{instead}`", DeprecationWarning, stacklevel=2)
        return value

    return __getattr__
