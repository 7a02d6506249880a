"""Everything HLO replay needs from jaxlib that jaxlib does not promise to keep.

JAX has no public API for "compile this HLO module and run it", so replay reaches into jaxlib:
the HLO text parser, the HLO -> StableHLO converter, the client's compile call with hand-made
compile options, the executable's sharding queries and ``execute_sharded``. These move between
jaxlib releases, so they are looked up here, once, at import: each one that moved has a small
function below that picks the spelling this jaxlib has (and says in which releases each holds).

There is no version window: a jaxlib that has every internal listed here is used, however new;
one that lacks any of them is refused at import with one UserError naming the jaxlib found,
what it lacks and the releases replay is known to work with (``KNOWN_WORKING``: the releases
tests/test_hlo_replay.py passed on).
"""

from __future__ import annotations

import importlib
import inspect
import types
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax
import jax.extend  # jax.extend.backend, .mlir, .sharding are looked up below
import jaxlib
import numpy as np
from jaxlib import xla_client as xc
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func, stablehlo

from launcher import jaxcompat
from launcher.errors import UserError

# The jaxlib releases the replay tests (tests/test_hlo_replay.py) passed on, oldest first, each
# in its own venv on CPU. Releases between and after these are used as long as they have the
# internals below.
KNOWN_WORKING = ("0.4.35", "0.4.38", "0.5.3", "0.6.2", "0.7.2", "0.8.3", "0.9.2", "0.10.0", "0.10.2")


class HloParseError(ValueError):
    """XLA rejected a module's text or proto; the message is XLA's own."""


class CompileError(RuntimeError):
    """XLA could not compile a module; the message is XLA's own."""


# --- finding the internals -----------------------------------------------------------------------

class _Missing(Exception):
    """An internal that this jaxlib does not have; ``args[0]`` names it (every spelling tried)."""


def _attr(root: Any, root_name: str, path: str) -> Any:
    """``root.<path>``, importing submodules on the way; _Missing names the full dotted path."""
    obj = root
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                if not isinstance(obj, types.ModuleType):
                    raise ImportError
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except ImportError:
                raise _Missing(f"{root_name}.{path}") from None
    return obj


def _first(root: Any, root_name: str, *paths: str) -> Any:
    """The first of ``paths`` this release has (newest spelling first)."""
    for path in paths:
        try:
            return _attr(root, root_name, path)
        except _Missing:
            pass
    raise _Missing(" or ".join(f"{root_name}.{p}" for p in paths))


# One function per internal that moved between releases, each returning what replay calls.

def _hlo_text_parser(xc: Any) -> Callable[[str], Any]:
    """HLO text -> HloModule: ``xla_client.hlo.hlo_module_from_text`` since 0.10,
    ``xla_client._xla.hlo_module_from_text`` before."""
    return _first(xc, "jaxlib.xla_client", "hlo.hlo_module_from_text", "_xla.hlo_module_from_text")


def _hlo_module_class(xc: Any) -> Any:
    """``HloModule`` (its ``from_serialized_hlo_module_proto``): ``xla_client.hlo`` since 0.10,
    ``xla_client._xla`` before."""
    cls = _first(xc, "jaxlib.xla_client", "hlo.HloModule", "_xla.HloModule")
    for method in ("from_serialized_hlo_module_proto", "as_serialized_hlo_module_proto", "to_string", "name"):
        if not hasattr(cls, method):
            raise _Missing(f"jaxlib.xla_client HloModule.{method}")
    return cls


def _mlir_converter(jax: Any, xc: Any) -> Callable[[bytes], bytes | str]:
    """Serialized HloModuleProto -> the MLIR module the client compiles.

    Since 0.7: ``jax.extend.mlir.hlo_to_stablehlo`` (StableHLO bytecode; tuple parameters and
    results flattened into their leaves). Before: ``xla_computation_to_mlir_module`` on an
    ``XlaComputation`` (MLIR text); it flattens tuples since 0.6 and keeps them before, so for
    those releases the entry function is rewrapped with flat signature (``_flatten_tuples``).
    """
    try:
        return _attr(jax, "jax", "extend.mlir.hlo_to_stablehlo")
    except _Missing:
        pass
    try:
        to_mlir = _attr(xc, "jaxlib.xla_client", "_xla.mlir.xla_computation_to_mlir_module")
        computation = _attr(xc, "jaxlib.xla_client", "XlaComputation")
    except _Missing:
        raise _Missing("jax.extend.mlir.hlo_to_stablehlo or "
                       "jaxlib.xla_client._xla.mlir.xla_computation_to_mlir_module") from None
    context = _ir_context(jax)  # for _flatten_tuples
    return lambda proto: _flatten_tuples(to_mlir(computation(proto)), context)


def _compile_options_factory(jax: Any) -> Callable[..., Any]:
    """The options ``jax.jit`` compiles with: ``jax.extend.backend.get_compile_options`` since
    0.7, ``jax._src.compiler.get_compile_options`` before (same arguments)."""
    return _first(jax, "jax", "extend.backend.get_compile_options", "_src.compiler.get_compile_options")


def _compiler(xc: Any) -> Callable[[Any, Any, list, Any], Any]:
    """(client, MLIR module, devices, options) -> loaded executable.

    Since 0.6: ``Client.compile_and_load(module, DeviceList, options)`` (``compile`` became
    compile-without-load, which the CPU client lacks). Before: ``Client.compile(module, options)``,
    the devices coming from the options' device assignment, which must then include one of this
    process's devices (see ``compile``).
    """
    client = _attr(xc, "jaxlib.xla_client", "Client")
    if hasattr(client, "compile_and_load"):
        device_list = _attr(xc, "jaxlib.xla_client", "DeviceList")
        return lambda backend, module, devices, options: backend.compile_and_load(
            module, device_list(tuple(devices)), options)
    _attr(xc, "jaxlib.xla_client", "Client.compile")
    return lambda backend, module, devices, options: backend.compile(module, options)


def _compiles_for_other_processes(xc: Any) -> bool:
    """Whether the client compiles for devices that are all another process's: since 0.6
    (``compile_and_load``); before, it refuses ("does not have any local devices")."""
    return hasattr(_attr(xc, "jaxlib.xla_client", "Client"), "compile_and_load")


def _ir_context(jax: Any) -> Callable[[], Any]:
    """An MLIR context with JAX's dialects (StableHLO, MHLO, Shardy) registered, for rewriting a
    module before it is compiled: ``jax._src.interpreters.mlir.make_ir_context`` in every release."""
    return _attr(jax, "jax", "_src.interpreters.mlir.make_ir_context")


def _gspmd_sharding_class(jax: Any) -> type:
    """``GSPMDSharding``: ``jax.extend.sharding`` since 0.7, ``jax._src.sharding_impls`` before."""
    return _first(jax, "jax", "extend.sharding.GSPMDSharding", "_src.sharding_impls.GSPMDSharding")


def _array_assembler(jax: Any) -> Callable[[tuple, Any, list, np.dtype], Any]:
    """(shape, sharding, this process's shards, dtype) -> a global jax.Array.

    A process may hold none of an array's shards. ``jax.make_array_from_single_device_arrays``
    builds such an array since 0.7 (given ``dtype=``). In 0.5 and 0.6 it refuses unless
    ``jax_enable_empty_arrays`` is set, so the array is made as that function makes it, an
    ``ArrayImpl`` of no shards. Before 0.5 a jax.Array cannot be empty (making one crashes the
    process): a ``NoShards`` stands for it, which is all replay asks of such an array.
    """
    make = _attr(jax, "jax", "make_array_from_single_device_arrays")
    try:
        takes_dtype = "dtype" in inspect.signature(make).parameters
    except (TypeError, ValueError):  # no Python signature to read: assume the newest form
        takes_dtype = True
    if takes_dtype and not hasattr(jax.config, "jax_enable_empty_arrays"):
        return lambda shape, sharding, shards, dtype: make(shape, sharding, shards, dtype=dtype)
    empty: Callable[[tuple, Any, np.dtype], Any] = NoShards
    if takes_dtype:
        array_impl = _attr(jax, "jax", "_src.array.ArrayImpl")
        shaped_array = _attr(jax, "jax", "core.ShapedArray")

        def empty(shape: tuple, sharding: Any, dtype: np.dtype) -> Any:
            return array_impl(shaped_array(shape, np.dtype(dtype), weak_type=False), sharding, [], committed=True)

    return lambda shape, sharding, shards, dtype: (make(shape, sharding, shards) if shards
                                                   else empty(shape, sharding, dtype))


@dataclass(frozen=True)
class NoShards:
    """A global array of which this process holds no shard, on releases whose jax.Array cannot
    be empty: its shape, dtype and sharding, as ``fetch`` and the result summary read them."""

    shape: tuple[int, ...]
    sharding: Any
    dtype: np.dtype
    addressable_shards: tuple = ()

    def is_deleted(self) -> bool:
        return False

    def block_until_ready(self) -> "NoShards":
        return self


# Internals every release from 0.4.35 to 0.11.2 spells the same way (array_result_handler's
# arguments aside: _result_handler).
_UNCHANGED = {
    "jaxlib.xla_client": ("XlaRuntimeError", "XlaComputation.program_shape", "HloSharding.replicate",
                          "HloSharding.from_proto", "array_result_handler",
                          "LoadedExecutable.get_parameter_shardings", "LoadedExecutable.get_output_shardings",
                          "LoadedExecutable.cost_analysis", "LoadedExecutable.execute_sharded"),
    "jax": ("core.ShapedArray", "extend.backend.get_backend"),
}


@dataclass(frozen=True)
class Internals:
    parse_text: Callable[[str], Any]
    module_class: Any
    to_mlir: Callable[[bytes], bytes | str]
    compile_options: Callable[..., Any]
    compile_and_load: Callable[[Any, Any, list, Any], Any]
    compiles_for_other_processes: bool
    ir_context: Callable[[], Any]
    gspmd_sharding: type
    make_array: Callable[[tuple, Any, list, np.dtype], Any]
    runtime_error: type


def find_internals(jax_module: Any = jax, xc_module: Any = xc) -> tuple[Internals | None, list[str]]:
    """The internals replay uses, looked up in ``jax_module``/``xc_module``; (None, what is missing)
    when any is not there."""
    missing: list[str] = []

    def get(function: Callable, *roots: Any) -> Any:
        try:
            return function(*roots)
        except _Missing as e:
            if e.args[0] not in missing:
                missing.append(e.args[0])

    roots = {"jaxlib.xla_client": xc_module, "jax": jax_module}
    for root_name, paths in _UNCHANGED.items():
        for path in paths:
            get(_attr, roots[root_name], root_name, path)
    found = Internals(
        parse_text=get(_hlo_text_parser, xc_module),
        module_class=get(_hlo_module_class, xc_module),
        to_mlir=get(_mlir_converter, jax_module, xc_module),
        compile_options=get(_compile_options_factory, jax_module),
        compile_and_load=get(_compiler, xc_module),
        compiles_for_other_processes=get(_compiles_for_other_processes, xc_module),
        ir_context=get(_ir_context, jax_module),
        gspmd_sharding=get(_gspmd_sharding_class, jax_module),
        make_array=get(_array_assembler, jax_module),
        runtime_error=getattr(xc_module, "XlaRuntimeError", None),
    )
    return (None if missing else found), missing


def check_jaxlib(version: str, jax_module: Any = jax, xc_module: Any = xc) -> Internals:
    """The internals, or a UserError naming ``version``, what it lacks and the releases that work."""
    found, missing = find_internals(jax_module, xc_module)
    if found is None:
        raise UserError(
            f"HLO replay cannot run on jaxlib {version}: it lacks {', '.join(missing)} (jaxlib internals "
            f"that replay relies on, see launcher/hlo/_xla.py). Replay is known to work with jaxlib "
            f"{KNOWN_WORKING[0]} to {KNOWN_WORKING[-1]} (tested: {', '.join(KNOWN_WORKING)}): use one of "
            f"those, or port launcher/hlo/_xla.py to jaxlib {version}")
    return found


_X = check_jaxlib(jaxlib.__version__)
# What a failed device operation raises (running out of device memory among others).
DeviceError = _X.runtime_error


# --- parsing and conversion ------------------------------------------------------------------

def parse_text(text: str) -> Any:
    try:
        return _X.parse_text(text)
    except _X.runtime_error as e:
        raise HloParseError(str(e)) from None


def parse_proto(proto: bytes) -> Any:
    try:
        return _X.module_class.from_serialized_hlo_module_proto(proto)
    except _X.runtime_error as e:
        raise HloParseError(str(e)) from None


def module_text(module: Any) -> str:
    """The module in XLA's canonical text (ENTRY marked, header with replica/partition counts)."""
    return module.to_string()


def module_proto(module: Any) -> bytes:
    return module.as_serialized_hlo_module_proto()


def to_stablehlo(proto: bytes) -> bytes | str:
    """The MLIR module (StableHLO bytecode, or text on releases before 0.7) that the client
    compiles, for a serialized HloModuleProto: the client takes no HLO."""
    try:
        return _X.to_mlir(proto)
    except _X.runtime_error as e:
        raise CompileError(str(e)) from None


def _split_tuple_sharding(text: str, count: int) -> list[str | None]:
    """``"{{replicated}, {devices=[2]0,1}}"`` -> its element shardings (HLO sharding text)."""
    inner = text.strip()
    if not (inner.startswith("{{") and inner.endswith("}}")):
        return [text] * count  # one sharding for every element
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(inner[1:-1], start=1):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(inner[start:i].strip())
            start = i + 1
    parts.append(inner[start:-1].strip())
    return parts if len(parts) == count else [None] * count


def _flatten_tuples(module_text: str, context: Callable[[], Any]) -> str:
    """MLIR text whose ``main`` takes and returns tuples -> the same module with a ``main`` that
    takes and returns the tuples' array leaves, in order (what hlo_to_stablehlo makes since 0.6),
    wrapping the original as a private function. Modules without tuples come back unchanged.

    Needed only with ``xla_computation_to_mlir_module`` before 0.6: the executable's arguments
    and outputs must be arrays. Array parameters and results keep their attributes (GSPMD and
    Shardy shardings); a tuple's GSPMD sharding is split over its leaves; entry layouts and
    input/output aliases, which name tuple positions, are dropped.
    """
    if "tuple<" not in module_text:
        return module_text

    with context(), ir.Location.unknown():
        module = ir.Module.parse(module_text)
        main = next(op for op in module.body.operations
                    if isinstance(op, func.FuncOp) and ir.StringAttr(op.attributes["sym_name"]).value == "main")
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        inputs, results = list(ftype.inputs), list(ftype.results)
        if not any(ir.TupleType.isinstance(t) for t in inputs + results):
            return module_text

        def leaves(t: ir.Type) -> list[ir.Type]:
            if ir.TupleType.isinstance(t):
                tt = ir.TupleType(t)
                return [leaf for i in range(tt.num_types) for leaf in leaves(tt.get_type(i))]
            return [t]

        def leaf_attrs(attrs: Any, index: int, t: ir.Type) -> list[ir.Attribute]:
            """An array's attributes as they are; a tuple's sharding split over its leaves."""
            attr = attrs[index] if index < len(attrs) else ir.DictAttr.get({})
            if not ir.TupleType.isinstance(t):
                return [attr]
            count = len(leaves(t))
            attr = ir.DictAttr(attr)
            if "mhlo.sharding" not in attr:
                return [ir.DictAttr.get({}) for _ in range(count)]
            parts = _split_tuple_sharding(ir.StringAttr(attr["mhlo.sharding"]).value, count)
            return [ir.DictAttr.get({"mhlo.sharding": ir.StringAttr.get(p)} if p else {}) for p in parts]

        arg_attrs = list(main.attributes["arg_attrs"]) if "arg_attrs" in main.attributes else []
        res_attrs = list(main.attributes["res_attrs"]) if "res_attrs" in main.attributes else []
        flat_args = [(leaf, a) for i, t in enumerate(inputs)
                     for leaf, a in zip(leaves(t), leaf_attrs(arg_attrs, i, t), strict=True)]
        flat_results = [(leaf, a) for i, t in enumerate(results)
                        for leaf, a in zip(leaves(t), leaf_attrs(res_attrs, i, t), strict=True)]

        main.attributes["sym_name"] = ir.StringAttr.get("main_tupled")
        main.attributes["sym_visibility"] = ir.StringAttr.get("private")
        for name in ("mhlo.xla_entry_computation_parameter_layouts", "mhlo.xla_entry_computation_parameter_tiles",
                     "mhlo.xla_entry_computation_result_layout", "mhlo.xla_entry_computation_result_tiles"):
            if name in module.operation.attributes:
                del module.operation.attributes[name]
        if "mhlo.input_output_alias" in module.operation.attributes:
            module.operation.attributes["mhlo.input_output_alias"] = ir.ArrayAttr.get([])

        with ir.InsertionPoint(module.body):
            wrapper = func.FuncOp("main", ([t for t, _ in flat_args], [t for t, _ in flat_results]))
        wrapper.attributes["arg_attrs"] = ir.ArrayAttr.get([a for _, a in flat_args])
        wrapper.attributes["res_attrs"] = ir.ArrayAttr.get([a for _, a in flat_results])
        block = wrapper.add_entry_block()
        with ir.InsertionPoint(block):
            flat = iter(block.arguments)

            def build(t: ir.Type) -> ir.Value:
                if ir.TupleType.isinstance(t):
                    tt = ir.TupleType(t)
                    return stablehlo.TupleOp([build(tt.get_type(i)) for i in range(tt.num_types)]).result
                return next(flat)

            call = func.CallOp(results, ir.FlatSymbolRefAttr.get("main_tupled"), [build(t) for t in inputs])

            def unpack(value: ir.Value, t: ir.Type) -> list[ir.Value]:
                if ir.TupleType.isinstance(t):
                    tt = ir.TupleType(t)
                    return [leaf for i in range(tt.num_types)
                            for leaf in unpack(stablehlo.GetTupleElementOp(value, i).result, tt.get_type(i))]
                return [value]

            func.ReturnOp([leaf for value, t in zip(call.results, results, strict=True) for leaf in unpack(value, t)])
        return str(module)


Leaf = tuple[tuple[int, ...], tuple[int, ...], np.dtype]  # (tuple path, shape, dtype)


def _leaves(shape: Any, path: tuple[int, ...]) -> list[Leaf]:
    if shape.is_tuple():
        return [leaf for i, s in enumerate(shape.tuple_shapes()) for leaf in _leaves(s, path + (i,))]
    return [(path, tuple(shape.dimensions()), np.dtype(shape.numpy_dtype()))]


def program_signature(proto: bytes) -> tuple[list[Leaf], list[Leaf]]:
    """(parameters, results) of the entry computation, tuples flattened to their array leaves.

    The MLIR conversion flattens tuples the same way, so the lists line up with the compiled
    executable's arguments and outputs; a parameter leaf's path starts with its parameter number.
    """
    program = xc.XlaComputation(proto).program_shape()
    params = [leaf for i, p in enumerate(program.parameter_shapes()) for leaf in _leaves(p, (i,))]
    return params, _leaves(program.result_shape(), ())


def make_array(shape: tuple[int, ...], sharding: Any, shards: list[jax.Array], dtype: np.dtype) -> jax.Array:
    """The global array of ``shape`` whose shards on this process's devices are ``shards``
    (possibly none)."""
    return _X.make_array(shape, sharding, shards, dtype)


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


def compile(module: bytes | str, assignment: np.ndarray, results: Signature, *, use_shardy: bool,
            overrides: dict[str, Any] | None = None) -> "Executable":
    """Compiles ``module`` (from ``to_stablehlo``) for ``assignment``, devices as a
    [num_replicas, num_partitions] array; ``results`` are the module's flattened outputs.

    The options come from JAX's own ``get_compile_options``, the call ``jax.jit`` makes, so a
    replayed module is compiled with the settings the original program was.
    """
    replicas, partitions = assignment.shape
    devices = list(assignment.flat)
    backend = jax.extend.backend.get_backend(devices[0].platform)
    stand_in = (not _X.compiles_for_other_processes
                and not any(d.process_index == backend.process_index() for d in devices))
    compiled_for = assignment
    if stand_in:
        # This process takes no part, but needs the shardings XLA chooses (to make arguments and
        # gather outputs like the others): it compiles for the same assignment with its first
        # device standing in for the first one (shardings name positions, not devices), and
        # never runs the result.
        compiled_for = assignment.copy()
        compiled_for.flat[0] = backend.local_devices()[0]
    options = _X.compile_options(num_replicas=replicas, num_partitions=partitions, device_assignment=compiled_for,
                                 env_options_overrides=overrides or None, backend=backend)
    options.executable_build_options.use_shardy_partitioner = use_shardy
    try:
        try:
            loaded = _X.compile_and_load(backend, module, list(compiled_for.flat), options)
        except _X.runtime_error as e:
            if "custom call named 'xla.sdy" not in str(e):
                raise
            # Some releases (0.7) cannot import the result shardings that a Shardy module's nested
            # computations carry (xla.sdy.FuncResultSharding calls) and fail in the partitioner:
            # compile again without them (hints for propagation, not part of the computation).
            loaded = _X.compile_and_load(backend, _without_func_result_shardings(module, _X.ir_context),
                                         list(compiled_for.flat), options)
    except _X.runtime_error as e:
        raise CompileError(str(e)) from None
    return Executable(loaded, devices, replicas, results, stand_in)


def _without_func_result_shardings(module: bytes | str, context: Callable[[], Any]) -> str:
    """``module`` with every ``xla.sdy.FuncResultSharding`` custom call replaced by its operand."""
    with context():
        parsed = ir.Module.parse(module)
        calls = []

        def visit(op: Any) -> None:
            for region in op.regions:
                for block in region.blocks:
                    for inner in block.operations:
                        if (inner.operation.name == "stablehlo.custom_call"
                                and ir.StringAttr(inner.attributes["call_target_name"]).value
                                == "xla.sdy.FuncResultSharding"):
                            calls.append(inner)
                        visit(inner.operation)

        visit(parsed.operation)
        for call in calls:
            call.results[0].replace_all_uses_with(call.operands[0])
            call.operation.erase()
        return str(parsed)


def _result_handler(aval: Any, sharding: Any) -> Any:
    """jaxlib's handler turning per-device results into one committed jax.Array. Up to 0.10 it
    takes a fourth argument (``_skip_checks``, true as jit passes it); 0.11 dropped it."""
    try:
        return xc.array_result_handler(aval, sharding, True, True)
    except TypeError:
        return xc.array_result_handler(aval, sharding, True)


class Executable:
    """A compiled module, with jax.sharding objects for its arguments and outputs."""

    def __init__(self, loaded: Any, devices: list[jax.Device], replicas: int, results: Signature,
                 stand_in: bool = False):
        # stand_in: compiled only for its shardings, on a process that holds none of ``devices``
        self._loaded, self._devices, self._replicas, self._stand_in = loaded, devices, replicas, stand_in
        self._results = list(results)
        # The handlers that turn per-device results into global jax.Arrays, made once, as
        # jax.jit makes them: this keeps the per-call overhead at jit's level.
        self._handlers = [_result_handler(jax.core.ShapedArray(shape, dtype), sharding)
                          for (shape, dtype), sharding in zip(results, self.output_shardings(len(results)), strict=True)]

    def _shardings(self, ops: Sequence[Any] | None, count: int) -> list[Any]:
        # None: XLA did not partition the value. With several replicas every replica holds a
        # whole copy (replay.py keeps partitioned modules to one replica).
        return [_X.gspmd_sharding(self._devices, xc.HloSharding.replicate() if op is None or self._replicas > 1
                                  else xc.HloSharding.from_proto(op))
                for op in (ops or [None] * count)]

    def parameter_shardings(self, count: int) -> list[Any]:
        return self._shardings(self._loaded.get_parameter_shardings(), count)

    def output_shardings(self, count: int) -> list[Any]:
        return self._shardings(self._loaded.get_output_shardings(), count)

    def flops(self) -> float | None:
        """XLA's cost-analysis flop count of the compiled module (per device once partitioned)."""
        analysis = jaxcompat.cost_analysis(self._loaded)
        return float(analysis["flops"]) if "flops" in analysis else None

    def execute(self, arguments: Sequence[jax.Array]) -> list[jax.Array]:
        if self._stand_in:  # none of the devices is this process's: outputs with no shards here
            return [make_array(shape, sharding, [], dtype) for (shape, dtype), sharding
                    in zip(self._results, self.output_shardings(len(self._results)), strict=True)]
        return self._loaded.execute_sharded(list(arguments)).consume_with_handlers(self._handlers)
