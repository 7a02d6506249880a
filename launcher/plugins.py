"""Parts found by name: registered by subclassing (cluster backends, sharding algorithms), where
every module of their package is imported and one module from outside it that a config names;
or named ``"module:function"`` (a mode's run, its console renderers)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

from launcher.errors import UserError

_IMPORTED: set[str] = set()   # packages whose modules are all imported


def import_all(package: ModuleType, outside: Optional[str] = None, option: str = "", cwd: bool = False) -> None:
    """Imports each module of ``package`` (its classes register themselves), then ``outside``
    (set by the config key ``option``); ``cwd``: the working directory is searched too, as for a
    user's code. UserError where ``outside`` cannot be imported."""
    if package.__name__ not in _IMPORTED:   # the registries are read often: list the folder once
        for info in pkgutil.iter_modules(package.__path__):
            importlib.import_module(f"{package.__name__}.{info.name}")
        _IMPORTED.add(package.__name__)
    if not outside:
        return
    if cwd and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        importlib.import_module(outside)
    except ImportError as e:
        raise UserError(f"{option}={outside}: cannot be imported ({e}); put its directory on PYTHONPATH or "
                        "install it") from None


def function(ref: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` reference names, its module imported."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)
