"""The user's own program (mode=run): a function ``module:name`` or a script run as ``__main__``.

Two halves. Before submission, where the tasks run the launcher's own python, the program is
*found* without running any of it (``check_target``): the module's file through the import
system's own finder, the function and its parameters read from the module's source, so a
target that cannot be imported or a keyword argument the function does not take is refused in
one line before anything is queued. What the source does not show plainly (a function made by
a decorator or assigned, a compiled module) is left to the task. In the task the program is
*loaded* and run (``load_target``, ``run_script``), after JAX is initialised, with the same
checks on the real function.

The code directory (``mode.code_dir``, by default the directory the launcher was started from)
comes first on ``sys.path`` and is the program's working directory, as when it is run by hand
from there.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import inspect
import os
import runpy
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from launcher.errors import UserError


# Set on the workers of a backend that copies the code to them (TPU: launcher/clusters/tpu.py):
# where the copy is. Elsewhere the code directory is shared and named by the config.
CODE_DIR_ENV = "XLAUNCH_CODE_DIR"


class ProgramFailed(RuntimeError):
    """The user's program ended with a non-zero exit status."""


def parse_target(target: str, option: str = "mode.target") -> tuple[str, str]:
    """``"pkg.module:function"`` -> ("pkg.module", "function"); refused in one line otherwise.
    ``option``: the config key that names it (mode=search's ``mode.step`` too)."""
    module, sep, name = target.partition(":")
    parts = [*module.split("."), *name.split(".")]
    if not sep or not all(p.isidentifier() for p in parts):
        raise UserError(f"{option}={target}: expected module:function, e.g. {option}=mypkg.train:main "
                        "(a module importable from the code directory, and a function in it)")
    return module, name


def find_module(module: str, search: Iterable[str]) -> importlib.machinery.ModuleSpec | None:
    """Where ``module`` would be imported from, with ``search`` as ``sys.path``, running none of
    its code nor its packages' (``importlib.util.find_spec`` would import the packages)."""
    path: list[str] | None = [str(p) for p in search]
    spec = None
    parts = module.split(".")
    for i in range(len(parts)):
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), path)
        if spec is None:
            return None
        path = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not path:
            return None  # a module, not a package: it has no submodules
    return spec


def check_target(target: str, kwargs: Mapping[str, Any], code_dir: Path, option: str = "mode.target") -> None:
    """Before submission: the module is importable from ``code_dir`` or the launcher's python
    path, defines the function, and the function takes ``kwargs`` (and nothing required beside
    them). Raises UserError naming what is wrong; silent where the source cannot tell."""
    module, name = parse_target(target, option)
    spec = find_module(module, [str(code_dir), *sys.path])
    if spec is None and module in sys.modules:  # imported already, under that name (os.path is posixpath)
        obj: Any = sys.modules[module]
        for part in name.split("."):
            if not hasattr(obj, part):
                raise UserError(f"{option}={target}: {module} has no {name}; name a function of it")
            obj = getattr(obj, part)
        return
    if spec is None:
        raise UserError(f"{option}={target}: no module {module} in the code directory {code_dir} nor on the "
                        "launcher's python path; give an importable module (run from the directory holding it, "
                        "or set mode.code_dir)")
    if spec.origin is None or not spec.origin.endswith(".py") or "." in name:
        return  # a package without __init__, a compiled module, a method: the task checks it
    tree = ast.parse(Path(spec.origin).read_text(), spec.origin)
    defs = {node.name: node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    node = defs.get(name)
    if node is None:
        if not _may_define(tree, name):
            raise UserError(f"{option}={target}: {spec.origin} defines no {name}; name a function of it")
        return
    if node.decorator_list:
        return  # a decorator may change what the function takes
    params = node.args
    names = [a.arg for a in [*params.posonlyargs, *params.args, *params.kwonlyargs]]
    optional = {a.arg for a in [*params.posonlyargs, *params.args][len(params.posonlyargs) + len(params.args)
                                                                  - len(params.defaults):]}
    optional |= {a.arg for a, d in zip(params.kwonlyargs, params.kw_defaults, strict=True) if d is not None}
    _check_arguments(target, kwargs, names, optional, takes_any=params.kwarg is not None,
                     positional_only={a.arg for a in params.posonlyargs}, option=option)


def _may_define(tree: ast.Module, name: str) -> bool:
    """Whether a module's top level might bind ``name`` other than by ``def``."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" or (alias.asname or alias.name.split(".")[0]) == name for alias in node.names):
                return True
        elif isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store):
            return True
        elif isinstance(node, ast.ClassDef) and node.name == name:
            return True
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return True
    return False


def _check_arguments(target: str, kwargs: Mapping[str, Any], names: list[str], optional: set[str],
                     takes_any: bool, positional_only: set[str] = frozenset(), option: str = "mode.target") -> None:
    shown = ", ".join(names) or "none"
    if option != "mode.target":  # a function called with no arguments (mode.step's factory)
        required = [key for key in names if key not in optional]
        if required:
            raise UserError(f"{option}={target}: it is called with no arguments, and {', '.join(required)} "
                            "has no default; give every parameter a default")
        return
    for key in kwargs:
        if key in positional_only or (key not in names and not takes_any):
            raise UserError(f"mode.kwargs.{key}: {target} takes no keyword argument {key!r} (its arguments: {shown})")
    for key in names:
        if key not in optional and key not in kwargs:
            raise UserError(f"mode.kwargs.{key} is required: {target} has no default for it; add "
                            f"mode.kwargs.{key}=<value>")


def load_target(target: str, kwargs: Mapping[str, Any], option: str = "mode.target") -> Callable[..., Any]:
    """In the task: the function ``target`` names, its arguments checked against ``kwargs``."""
    module_name, name = parse_target(target, option)
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise UserError(f"{option}={target}: no module {module_name} on this task's python path "
                            f"(the code directory {Path.cwd()} comes first)") from None
        raise  # the module itself failed to import something: its own error, with its traceback
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{option}={target}: {module_name} has no {name}; name a function of it")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{option}={target}: {name} is a {type(obj).__name__}, not a function")
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return obj  # a builtin without a signature: the call itself will say
    kinds = inspect.Parameter
    names = [p.name for p in params if p.kind not in (kinds.VAR_POSITIONAL, kinds.VAR_KEYWORD)]
    optional = {p.name for p in params if p.default is not kinds.empty}
    _check_arguments(target, kwargs, names, optional, takes_any=any(p.kind == kinds.VAR_KEYWORD for p in params),
                     positional_only={p.name for p in params if p.kind == kinds.POSITIONAL_ONLY}, option=option)
    return obj


def script_path(script: str, code_dir: Path) -> Path:
    """The script ``mode.script`` names: relative to the code directory unless absolute."""
    return Path(script) if Path(script).is_absolute() else Path(code_dir) / script


def check_script(script: str, code_dir: Path) -> None:
    path = script_path(script, code_dir)
    if not path.is_file():
        where = "" if Path(script).is_absolute() else f" (relative to the code directory {code_dir})"
        raise UserError(f"mode.script={script}{where}: no such file; give the path of your script")


def run_script(path: Path, args: list[str]) -> None:
    """Runs ``path`` as ``__main__`` with ``sys.argv`` as if started as ``python path *args``;
    its ``sys.exit(0)`` (or none) is success, any other exit status raises ProgramFailed."""
    argv, syspath = sys.argv, list(sys.path)
    sys.argv = [str(path), *map(str, args)]
    sys.path.insert(0, str(path.parent.resolve()))  # as python puts a script's folder first
    try:
        with _exit_status(str(path)):
            runpy.run_path(str(path), run_name="__main__")
    finally:
        sys.argv, sys.path[:] = argv, syspath


def call_target(target: str, function: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """``function(**kwargs)``; a ``sys.exit(0)`` in it returns None, as a script's does."""
    with _exit_status(f"mode.target={target}"):
        return function(**kwargs)
    return None


@contextlib.contextmanager
def _exit_status(what: str) -> Iterator[None]:
    try:
        yield
    except SystemExit as e:
        if e.code not in (None, 0):
            status = f"exited with status {e.code}" if isinstance(e.code, int) else f"exited: {e.code}"
            raise ProgramFailed(f"{what} {status}") from None


def enter(code_dir: Path) -> None:
    """Makes ``code_dir`` the program's working directory and the first place imports look."""
    code_dir = Path(code_dir).resolve()
    if not code_dir.is_dir():
        raise UserError(f"mode.code_dir={code_dir}: no such directory on this task's host; run from (or set "
                        "mode.code_dir to) a directory every node sees")
    os.chdir(code_dir)
    if str(code_dir) not in sys.path[:1]:
        sys.path.insert(0, str(code_dir))
