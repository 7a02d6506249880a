"""Everything HLO replay needs from jaxlib that jaxlib does not promise to keep.

JAX has no public API for "compile this HLO module and run it", so replay reaches into jaxlib:
the HLO text parser, the HLO -> StableHLO converter, ``Client.compile_and_load`` with hand-made
compile options, the executable's sharding queries and ``execute_sharded``. These move between
jaxlib releases; keeping them here, behind a pinned range checked at import, means a jaxlib
upgrade breaks one small file with a clear message rather than the whole replay path.
pyproject.toml pins the same range.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import jax
import jax.extend as jex
import jaxlib
import numpy as np
from jax.extend.sharding import GSPMDSharding
from jaxlib import xla_client as xc

from launcher.errors import UserError

SUPPORTED_JAXLIB = ">=0.10.2,<0.11"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _check_jaxlib(installed: str) -> None:
    low, high = (_version(part) for part in SUPPORTED_JAXLIB.split(","))
    if not low <= _version(installed) < high:
        raise UserError(
            f"HLO replay supports jaxlib {SUPPORTED_JAXLIB}, but jaxlib {installed} is installed: it relies on "
            f"jaxlib internals (launcher/hlo/_xla.py) that change between releases; install "
            f"'jaxlib{SUPPORTED_JAXLIB}' or port that module to the new release")


_check_jaxlib(jaxlib.__version__)


class HloParseError(ValueError):
    """XLA rejected a module's text or proto; the message is XLA's own."""


class CompileError(RuntimeError):
    """XLA could not compile a module; the message is XLA's own."""


# --- parsing and conversion ------------------------------------------------------------------

def parse_text(text: str) -> xc.hlo.HloModule:
    try:
        return xc.hlo.hlo_module_from_text(text)
    except xc.XlaRuntimeError as e:
        raise HloParseError(str(e)) from None


def parse_proto(proto: bytes) -> xc.hlo.HloModule:
    try:
        return xc.hlo.HloModule.from_serialized_hlo_module_proto(proto)
    except xc.XlaRuntimeError as e:
        raise HloParseError(str(e)) from None


def module_text(module: xc.hlo.HloModule) -> str:
    """The module in XLA's canonical text (ENTRY marked, header with replica/partition counts)."""
    return module.to_string()


def module_proto(module: xc.hlo.HloModule) -> bytes:
    return module.as_serialized_hlo_module_proto()


def to_stablehlo(proto: bytes) -> bytes:
    """StableHLO bytecode for a serialized HloModuleProto: the only input compile_and_load takes."""
    return jex.mlir.hlo_to_stablehlo(proto)


Leaf = tuple[tuple[int, ...], tuple[int, ...], np.dtype]  # (tuple path, shape, dtype)


def _leaves(shape: xc.Shape, path: tuple[int, ...]) -> list[Leaf]:
    if shape.is_tuple():
        return [leaf for i, s in enumerate(shape.tuple_shapes()) for leaf in _leaves(s, path + (i,))]
    return [(path, tuple(shape.dimensions()), np.dtype(shape.numpy_dtype()))]


def program_signature(proto: bytes) -> tuple[list[Leaf], list[Leaf]]:
    """(parameters, results) of the entry computation, tuples flattened to their array leaves.

    hlo_to_stablehlo flattens tuples the same way, so the lists line up with the compiled
    executable's arguments and outputs; a parameter leaf's path starts with its parameter number.
    """
    program = xc.XlaComputation(proto).program_shape()
    params = [leaf for i, p in enumerate(program.parameter_shapes()) for leaf in _leaves(p, (i,))]
    return params, _leaves(program.result_shape(), ())


# --- compiling -------------------------------------------------------------------------------

def _option_value(text: str) -> Any:
    """XLA_FLAGS-style text to the typed value compile-option overrides want ('true' is refused)."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_xla_flags(flags: Sequence[str]) -> dict[str, Any]:
    """``["--xla_foo=1", "--xla_bar"]`` -> ``{"xla_foo": 1, "xla_bar": True}``."""
    out = {}
    for flag in flags:
        name, eq, value = flag.lstrip("-").partition("=")
        if not name.startswith("xla_"):
            raise UserError(f"mode.xla_flags: {flag!r} is not an XLA flag: expected --xla_<name>=<value>")
        out[name] = _option_value(value) if eq else True
    return out


Signature = Sequence[tuple[tuple[int, ...], np.dtype]]  # (shape, dtype) per array


def compile(stablehlo: bytes, assignment: np.ndarray, results: Signature, *, use_shardy: bool,
            overrides: dict[str, Any] | None = None) -> "Executable":
    """Compiles for ``assignment``, devices as a [num_replicas, num_partitions] array; ``results``
    are the module's flattened outputs.

    The options come from JAX's own ``get_compile_options``, the call ``jax.jit`` makes, so a
    replayed module is compiled with the settings the original program was.
    """
    replicas, partitions = assignment.shape
    devices = list(assignment.flat)
    backend = jex.backend.get_backend(devices[0].platform)
    options = jex.backend.get_compile_options(num_replicas=replicas, num_partitions=partitions,
                                              device_assignment=assignment,
                                              env_options_overrides=overrides or None, backend=backend)
    options.executable_build_options.use_shardy_partitioner = use_shardy
    try:
        loaded = backend.compile_and_load(stablehlo, xc.DeviceList(tuple(devices)), options)
    except xc.XlaRuntimeError as e:
        raise CompileError(str(e)) from None
    return Executable(loaded, devices, replicas, results)


class Executable:
    """A compiled module, with jax.sharding objects for its arguments and outputs."""

    def __init__(self, loaded: xc.LoadedExecutable, devices: list[jax.Device], replicas: int,
                 results: Signature):
        self._loaded, self._devices, self._replicas = loaded, devices, replicas
        # The handlers that turn per-device results into global jax.Arrays, made once, as
        # jax.jit makes them: this keeps the per-call overhead at jit's level.
        self._handlers = [xc.array_result_handler(jax.core.ShapedArray(shape, dtype), sharding, True, True)
                          for (shape, dtype), sharding in zip(results, self.output_shardings(len(results)))]

    def _shardings(self, ops: Sequence[Any] | None, count: int) -> list[GSPMDSharding]:
        # None: XLA did not partition the value. With several replicas every replica holds a
        # whole copy (replay.py keeps partitioned modules to one replica).
        return [GSPMDSharding(self._devices, xc.HloSharding.replicate() if op is None or self._replicas > 1
                              else xc.HloSharding.from_proto(op))
                for op in (ops or [None] * count)]

    def parameter_shardings(self, count: int) -> list[GSPMDSharding]:
        return self._shardings(self._loaded.get_parameter_shardings(), count)

    def output_shardings(self, count: int) -> list[GSPMDSharding]:
        return self._shardings(self._loaded.get_output_shardings(), count)

    def flops(self) -> float | None:
        """XLA's cost-analysis flop count of the compiled module (per device once partitioned)."""
        analysis = self._loaded.cost_analysis()
        return float(analysis["flops"]) if isinstance(analysis, dict) and "flops" in analysis else None

    def execute(self, arguments: Sequence[jax.Array]) -> list[jax.Array]:
        return self._loaded.execute_sharded(list(arguments)).consume_with_handlers(self._handlers)
