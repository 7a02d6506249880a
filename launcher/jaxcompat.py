"""Every difference between the JAX releases xlaunch supports, in one place.

Users run the JAX their platform ships: LUMI's container has 0.4.35 (built for ROCm, and it
must stay), GPU and TPU images the newest. The rest of the code calls these helpers instead of
testing versions itself; each helper is named for what changed, and says in which release.

``MINIMUM`` is the oldest JAX the whole tool (every mode but hlo_replay, whose narrower needs
live in ``launcher/hlo/_xla.py``) is tested on; ``check_version`` refuses anything older with
one line naming what was found.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import pickle
import re
import subprocess
import sys
import threading
import types
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, ContextManager, Mapping, Sequence

from launcher.errors import UserError

MINIMUM = (0, 4, 35)
SUPPORTED = ">=" + ".".join(map(str, MINIMUM))


def version_tuple(text: str) -> tuple[int, ...]:
    """'0.4.35' -> (0, 4, 35); 'rc'/'dev' suffixes are ignored."""
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def installed_version() -> str | None:
    """The installed jax's version, read from its metadata so that nothing imports jax."""
    try:
        return version("jax")
    except PackageNotFoundError:
        return None


def check_version(found: str | None = None) -> None:
    """Raises UserError unless the JAX found (default: the installed one) is in the supported range."""
    found = found if found is not None else installed_version()
    if found is None:
        raise UserError(f"JAX is not installed for this python: install jax{SUPPORTED} (on LUMI, use "
                        "the container's: see the README's 'On LUMI')")
    if version_tuple(found) < MINIMUM:
        raise UserError(f"jax {found} is older than xlaunch supports (jax{SUPPORTED}): use an image "
                        f"or environment with jax {SUPPORTED[2:]} or newer")


def cpu_compilation_cache_works(found: str | None = None) -> bool:
    """Whether CPU executables read back from JAX's persistent compilation cache run (the test
    suite shares one). With jaxlib 0.4.35 a train step read back from it crashed the process
    (a segfault in its first call, seen here); 0.10.2 runs them. The releases between were not
    tried: from 0.5 on they are taken to."""
    found = found if found is not None else installed_version()
    return found is not None and version_tuple(found) >= (0, 5)


def compilation_cache_env(accelerator: str, cache_dir: str, found: str | None = None) -> dict[str, str]:
    """The environment that turns JAX's persistent compilation cache on in ``cache_dir`` for a
    task (before JAX is imported), or {} where it cannot be used safely (CPU executables read
    back crash jaxlib before 0.5: ``cpu_compilation_cache_works``). Every program is kept (no
    minimum compile time: a profile's programs compile in under a second each, and a restart
    should compile none of them again). Not ``jax_share_binary_between_hosts`` (the first process
    compiling a program and the others loading it): with CPU devices, a loaded executable's gloo
    collectives wait for keys its peers never set (0.10.2: "Gloo context initialization failed
    ... GetKeyValue() timed out"), and no accelerator was there to try it on."""
    if accelerator == "cpu" and not cpu_compilation_cache_works(found):
        return {}
    return {"JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def count_compile_cache() -> dict[str, int]:
    """Counts this process's persistent-compilation-cache hits and misses from now on (JAX's
    monitoring events; the dict returned fills as programs compile). Listeners got only the
    event name before 0.4.36 and keyword arguments after: take both."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    counts = {"hits": 0, "misses": 0}
    names = {"/jax/compilation_cache/cache_hits": "hits", "/jax/compilation_cache/cache_misses": "misses"}

    def listen(event, *args, **kwargs):
        if event in names:
            counts[names[event]] += 1

    jax.monitoring.register_event_listener(listen)
    return counts


def time_compiles() -> dict[str, float]:
    """Sums this process's compile time from now on (``{"s": seconds}``, filling as programs
    compile): JAX's duration events for tracing, lowering and XLA's compile, and for loading a
    program from the persistent cache. Listeners got the event and duration before 0.4.36 and
    keyword arguments beside them after: take both."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    total = {"s": 0.0}

    def listen(event, duration, *args, **kwargs):
        if event.startswith("/jax/core/compile/") or event == "/jax/compilation_cache/cache_retrieval_time_sec":
            total["s"] += float(duration)

    jax.monitoring.register_event_duration_secs_listener(listen)
    return total


# --- before the backend starts -------------------------------------------------------------------

def known_xla_flags(flags: Sequence[str], python: str = sys.executable) -> list[str]:
    """Of ``flags`` (``--name=value``), those the XLA of ``python``'s jaxlib knows. XLA ends a
    process whose ``XLA_FLAGS`` hold a flag it does not know, and its flags come and go between
    releases (``--xla_cpu_use_fusion_emitters``: in 0.10.2, not in 0.4.35), so each is tried in a
    process of its own that starts the CPU backend (about a second each; all at once first)."""
    def accepted(tried: Sequence[str]) -> bool:
        env = {**os.environ, "XLA_FLAGS": " ".join(tried), "JAX_PLATFORMS": "cpu"}
        return subprocess.run([python, "-c", "import jax; jax.devices()"], env=env, capture_output=True,
                              timeout=120).returncode == 0

    if not flags or accepted(flags):
        return list(flags)
    if len(flags) == 1:
        return []
    return [f for f in flags if accepted([f])]


def set_cpu_device_count(n: int) -> None:
    """Asks for ``n`` virtual CPU devices; call after ``import jax``, before the backend starts.

    The config option ``jax_num_cpu_devices`` appeared in 0.5.0; older releases read XLA's
    flag when the CPU client is created, which has not happened yet at this point.
    """
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    try:
        jax.config.update("jax_num_cpu_devices", n)
        return
    except AttributeError:  # "Unrecognized config option" before 0.5.0
        pass
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def cpu_device_count_requested() -> int | None:
    """The virtual CPU device count asked for so far (by either spelling), or None."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    try:
        return int(jax.config.jax_num_cpu_devices)
    except AttributeError:
        m = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
        return int(m.group(1)) if m else None


def use_gloo_cpu_collectives() -> None:
    """Cross-process collectives between CPU devices (every release in range has gloo).

    Call it only with several processes: before 0.5.0 gloo without ``jax.distributed`` fails to
    start the CPU backend. Before 0.5.0 consecutive programs' gloo messages can also cross (see
    ``settle_programs``); CPU programs then run synchronously, which narrows that window.
    """
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if _gloo_messages_cross_programs():
        jax.config.update("jax_cpu_enable_async_dispatch", False)


# The oldest release seen to keep consecutive CPU programs' gloo messages apart.
_GLOO_PROGRAMS_APART = (0, 5, 0)
_settle_count = itertools.count()


def _gloo_messages_cross_programs() -> bool:
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    return version_tuple(jax.__version__) < _GLOO_PROGRAMS_APART


def settle_programs(timeout_s: int = 600) -> None:
    """Waits until every process has finished the programs it ran so far; call between two
    different multi-process programs that run back to back.

    Before 0.5.0, gloo on CPU matched messages by the collective's number within its program,
    so a process that had finished program A could start B while a peer still waited for A's
    last message, and B's message answered A's receive (``gloo::EnforceNotMet ...
    op.preamble.length <= op.nbytes. 20 vs 4``, then an abort: seen in every 2-process CFP
    profile of gpt-tiny tried with 0.4.35 and 0.4.38, in none with 0.5.3 or 0.10.2). A barrier of the
    coordination service (gRPC, no gloo) keeps them apart. A no-op on newer releases, with one
    process, and on accelerators (whose collectives are not gloo's).
    """
    client = exchange_client()
    if client is not None:
        client.wait_at_barrier(f"xlaunch-settle-{next(_settle_count)}", timeout_s * 1000)


def exchange_client() -> Any:
    """The coordination service's client where programs must be fenced apart (``settle_programs``)
    and host-to-host exchanges must go through it (gRPC) instead of a collective program, else
    None: before 0.5 on CPU with several processes. There ``multihost_utils`` returns as soon as
    the first local device has its result, while the process's other devices may still be
    sending, and gloo matched such a late message with the next program's (``op.preamble.length
    <= op.nbytes. 32 vs 4``: a gather's 32 bytes arriving at a 4-byte broadcast, in CI's
    two-process profiles on 0.4.35), which no barrier prevents."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    if jax.process_count() == 1 or not _gloo_messages_cross_programs() or jax.devices()[0].platform != "cpu":
        return None
    return coordination_client()


def coordination_client() -> Any:
    """The coordination service's client (``jax.distributed``'s key-value store and barriers), or
    None before ``jax.distributed.initialize``: no public API for it in any release in range."""
    from jax._src import distributed  # noqa: PLC0415  JAX: the CLI imports this module

    return distributed.global_state.client


def distributed_initialize(*, coordinator_address: str, num_processes: int, process_id: int,
                           local_device_ids: list[int] | None, initialization_timeout: int,
                           heartbeat_timeout_seconds: int) -> None:
    """``jax.distributed.initialize`` with every argument explicit.

    ``heartbeat_timeout_seconds`` is newer than 0.4.38; before it the coordinator's own default
    (100 s) applies, which the launcher's watchdog (launcher.peer_timeout_s) undercuts anyway.
    """
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    kwargs: dict[str, Any] = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                                  process_id=process_id, local_device_ids=local_device_ids,
                                  initialization_timeout=initialization_timeout)
    if "heartbeat_timeout_seconds" in inspect.signature(jax.distributed.initialize).parameters:
        kwargs["heartbeat_timeout_seconds"] = heartbeat_timeout_seconds
    jax.distributed.initialize(**kwargs)


# --- programs ------------------------------------------------------------------------------------

def shard_map(f: Callable, *, mesh: Any, in_specs: Any, out_specs: Any) -> Callable:
    """``jax.shard_map`` (top level since 0.6.1, ``check_vma``); before, ``jax.experimental.shard_map``
    (``check_rep``). Replication checking stays on in both."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map as experimental  # noqa: PLC0415  JAX: the CLI imports this module

    return experimental(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def enable_x64() -> ContextManager:
    """A context in which 64-bit element types (f64, s64, u64, c128) stay 64-bit when arrays are
    made (JAX narrows them to 32 bits unless ``jax_enable_x64`` is on): ``jax.enable_x64(True)``
    where the release has it (0.10 does), ``jax.experimental.enable_x64()`` before (0.4.35; gone
    since). Thread-local, like every JAX config context."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64 as experimental  # noqa: PLC0415  JAX: the CLI imports this module

    return experimental()


def abstract_mesh(sizes: dict[str, int]) -> Any:
    """A mesh of axis names and sizes without devices, for tracing under sharding constraints
    (``jax.sharding.AbstractMesh``): 0.4.35 takes ``((name, size), ...)``, newer releases
    ``(sizes, names)``. Its axes are Auto, as ``auto_mesh``'s."""
    from jax.sharding import AbstractMesh  # noqa: PLC0415  JAX: the CLI imports this module

    if "shape_tuple" in inspect.signature(AbstractMesh.__init__).parameters:
        return AbstractMesh(tuple(sizes.items()))
    return AbstractMesh(tuple(sizes.values()), tuple(sizes), **_auto_axes(len(sizes)))


def auto_mesh(devices: Any, names: Sequence[str]) -> Any:
    """``jax.sharding.Mesh(devices, names)`` whose axes are Auto on every JAX (the models' own
    difference: ``models/jax_versions.py``)."""
    from launcher.models.jax_versions import auto_mesh as models_auto_mesh  # noqa: PLC0415  JAX: the CLI imports this module

    return models_auto_mesh(devices, names)


def _auto_axes(n: int) -> dict:
    from launcher.models.jax_versions import auto_axes  # noqa: PLC0415  JAX: the CLI imports this module

    return auto_axes(n)


def outside_mesh_context() -> ContextManager:
    """No mesh in context (``jax.set_mesh(None)``) for what runs inside: a program that set its
    own mesh (``jax.set_mesh``, Explicit axes above all) traces every jit under it, and a step
    jitted on another mesh (a plan's) is refused there ("context mesh ... should match the aval
    mesh"). Before 0.6 there is no such context: nothing to leave."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    return jax.set_mesh(None) if hasattr(jax, "set_mesh") else contextlib.nullcontext()


def wrap_keys(data: Any, key_dtype: Any) -> Any:
    """Typed PRNG keys of ``key_dtype`` (``key<fry>``) from their key data (``key_shape(key_dtype)``
    trailing). The dtype knows its implementation only through a private attribute, in every
    release from 0.4.35 to 0.10."""
    import jax  # noqa: PLC0415  JAX: jaxcompat is imported before a task sets its devices

    return jax.random.wrap_key_data(data, impl=key_dtype._impl)


def key_shape(key_dtype: Any) -> tuple[int, ...]:
    """The trailing shape of one key's data (threefry: (2,))."""
    return tuple(key_dtype._impl.key_shape)


def cost_analysis(compiled_or_lowered: Any) -> dict[str, float]:
    """XLA's cost analysis as one dict: releases before 0.5.0 returned a list with one dict per
    executable (one, here), later ones the dict itself; None (no analysis) becomes {}."""
    analysis = compiled_or_lowered.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return dict(analysis or {})


# The primitive that a nested ``jax.jit`` leaves in a jaxpr: ``pjit`` before 0.7.0, ``jit`` since.
NESTED_JIT_PRIMITIVES = frozenset({"pjit", "jit"})


def bind_equation(eqn: Any, args: list[Any]) -> Any:
    """Re-applies a jaxpr equation's primitive to ``args``, as ``jax.core.eval_jaxpr`` does.

    ``Primitive.get_bind_params`` returned ``(subfuns, params)`` before 0.10.0 (call primitives
    passed their body as a leading argument) and returns ``params`` alone since.
    """
    bind_params = eqn.primitive.get_bind_params(eqn.params)
    if isinstance(bind_params, tuple):
        subfuns, bind_params = bind_params
        return eqn.primitive.bind(*subfuns, *args, **bind_params)
    return eqn.primitive.bind(*args, **bind_params)


_compiles = threading.local()   # this thread's XLA compiles and persistent-cache reads (``compile_fresh``)
_compiles_heard = False
_compiles_lock = threading.Lock()   # compile_fresh runs on several threads at once (compile_share)


def compile_fresh(lowered: Any, options: Mapping[str, Any] | None = None) -> tuple[Any, bool]:
    """``lowered.compile(options)`` (XLA options, ``known_compile_options``), and whether XLA compiled it in this call: not read back from
    JAX's persistent compilation cache, nor given again from JAX's in-memory cache (a program
    compiled before in this process, which may itself have been read back, with no event saying
    so). Only such a program serializes whole on CPU (``serialize_executable``). Counted on the
    calling thread from JAX's monitoring events: the backend compile's duration, said around a
    compile or a cache read alike, and the cache's hits (listeners got only the event name before
    0.4.36, keyword arguments after)."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    global _compiles_heard
    with _compiles_lock:
        if not _compiles_heard:
            _compiles_heard = True

            def hit(event, *args, **kwargs):
                if event == "/jax/compilation_cache/cache_hits":
                    _compiles.hits = getattr(_compiles, "hits", 0) + 1

            def compiled(event, *args, **kwargs):
                if event == "/jax/core/compile/backend_compile_duration":
                    _compiles.backend = getattr(_compiles, "backend", 0) + 1

            jax.monitoring.register_event_listener(hit)
            jax.monitoring.register_event_duration_secs_listener(compiled)
    hits, backend = getattr(_compiles, "hits", 0), getattr(_compiles, "backend", 0)
    program = lowered.compile(dict(options)) if options else lowered.compile()
    return program, getattr(_compiles, "hits", 0) == hits and getattr(_compiles, "backend", 0) == backend + 1


_known_options: dict[tuple[str, str], bool] = {}


def known_compile_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``options`` (XLA's debug options by name, as ``Lowered.compile`` takes them), those this
    jaxlib's XLA knows: they come and go between releases (``xla_cpu_use_fusion_emitters``: in
    0.10.2, not in 0.4.35), and XLA refuses a compile naming one it does not know. Each is tried
    once a process, compiling a one-operation program with it (a few milliseconds)."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module
    import numpy as np  # noqa: PLC0415

    out = {}
    for name, value in options.items():
        key = (name, repr(value))
        if key not in _known_options:
            try:
                jax.jit(lambda x: x + 1).lower(np.float32(0)).compile({name: value})
                _known_options[key] = True
            except Exception as e:  # noqa: BLE001  XLA says "No such compile option" as whichever error its release raises
                if "compile option" not in str(e):
                    raise
                _known_options[key] = False
        if _known_options[key]:
            out[name] = value
    return out


def serialize_executable(compiled: Any) -> bytes:
    """A compiled program as bytes another process of the job can load (``load_executable``),
    its executable with its arguments' and results' pytree structures and XLA's memory analysis
    of it; raises where the backend cannot serialize it (a program with host callbacks) or
    pickle cannot carry a structure. Only for a program XLA compiled in this process: one read
    back from the persistent cache serializes without its kernels on CPU (0.10.2: the loading
    process fails with "Function broadcast_add_fusion not found"), so ``compile_fresh``
    says which is which. ``jax.experimental.serialize_executable``, the same in every release
    in range."""
    from jax.experimental.serialize_executable import serialize  # noqa: PLC0415  JAX: the CLI imports this module

    order = device_order(compiled)
    if order is not None and order != sorted(order) and not _loads_on_devices():
        # 0.4.35 loads an executable on the devices in their default order: one compiled for a
        # mesh of them in another (the processes along another axis) would run on the wrong ones.
        raise ValueError("this JAX cannot load an executable on devices in another order")
    return pickle.dumps((*serialize(compiled), memory_analysis(compiled), order))


def load_executable(payload: bytes) -> tuple[Any, Any]:
    """(the ``jax.stages.Compiled`` a peer's ``serialize_executable`` made, XLA's memory
    analysis of it as the peer compiled it). The analysis travels because the loaded
    executable's own is not the same on 0.4.35: it reports no aliased (donated) bytes, so a
    step's memory read on the process that loaded it came out larger than on the one that
    compiled it."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module
    from jax.experimental.serialize_executable import deserialize_and_load  # noqa: PLC0415  likewise

    executable, in_tree, out_tree, memory, order = pickle.loads(payload)
    if order is None or not _loads_on_devices():
        return deserialize_and_load(executable, in_tree, out_tree), memory
    by_id = {d.id: d for d in jax.devices()}
    return deserialize_and_load(executable, in_tree, out_tree, execution_devices=[by_id[i] for i in order]), memory


def device_order(compiled: Any) -> list[int] | None:
    """The ids of the devices a compiled program runs on, in its mesh's order (its first
    argument or result laid out on a mesh), or None."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    for s in jax.tree.leaves((compiled.input_shardings, compiled.output_shardings)):
        devices = getattr(getattr(s, "mesh", None), "devices", None)
        if devices is not None:
            return [int(d.id) for d in devices.flat]
    return None


def _loads_on_devices() -> bool:
    """Whether ``deserialize_and_load`` takes the devices to load on (``execution_devices``:
    releases after 0.4.35)."""
    from jax.experimental.serialize_executable import deserialize_and_load  # noqa: PLC0415  JAX, likewise

    return "execution_devices" in inspect.signature(deserialize_and_load).parameters


_MEMORY_FIELDS = ("argument", "output", "temp", "alias", "generated_code", "host_temp")


def memory_analysis(compiled: Any) -> Any:
    """``compiled.memory_analysis()`` as a plain, picklable object with the same
    ``*_size_in_bytes`` attributes (None where the backend gives none)."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return types.SimpleNamespace(**{f"{k}_size_in_bytes": int(getattr(m, f"{k}_size_in_bytes", 0))
                                    for k in _MEMORY_FIELDS})


# --- orbax-checkpoint (training checkpoints: launcher/runtime/checkpoint.py) ---------------------

# The last orbax-checkpoint release that takes jax 0.4.x (0.11.6 asks jax>=0.5.0, 0.11.28 and
# later jax>=0.6.0), and it fails to import on jax 0.10 (jax.experimental.layout lost
# DeviceLocalLayout): no release serves both ends of the range, so the spec follows the JAX.
_ORBAX_FOR_JAX_04 = "orbax-checkpoint>=0.11.5,<0.11.6"
_ORBAX = "orbax-checkpoint>=0.11.5"


def orbax_requirement(jax_version: str | None = None) -> str:
    """The pip spec of an orbax-checkpoint that works with (and keeps) the JAX given (default:
    the installed one)."""
    found = jax_version if jax_version is not None else installed_version()
    if found is not None and version_tuple(found) < (0, 5, 0):
        return _ORBAX_FOR_JAX_04
    return _ORBAX


def orbax_checkpoint() -> Any:
    """``orbax.checkpoint``, or a UserError saying how to install the one that suits this JAX.
    The calls xlaunch makes (CheckpointManager, args.Composite/StandardSave/StandardRestore/
    JsonSave/JsonRestore) are the same in 0.11.5 and 0.12."""
    try:
        import orbax.checkpoint as ocp  # noqa: PLC0415  optional dependency (the checkpoint extra)
    except ImportError as e:
        raise UserError(f"training checkpoints need orbax-checkpoint, which does not import here ({e}): "
                        f"pip install '{orbax_requirement()}' (or pip install -e '.[checkpoint]' with the "
                        "newest JAX)") from None
    _give_client_key_value_try_get()
    return ocp


_TRY_GET_TIMEOUT_MS = 200


def _give_client_key_value_try_get() -> None:
    """orbax-checkpoint 0.11.5 (the one for jax 0.4.x) calls the coordination client's
    ``key_value_try_get`` in every multi-process save; jaxlib 0.4.35's client lacks it (newer ones
    have it) and the save fails with AttributeError. Given here as what it means: the value now,
    or JaxRuntimeError (what orbax catches as "no such key") when there is none. A key orbax asks
    for is one this process set itself just before, so a short deadline covers the round trip."""
    from jax._src import distributed  # noqa: PLC0415  JAX: the CLI imports this module

    client = distributed.global_state.client
    if client is None or hasattr(client, "key_value_try_get"):
        return

    def key_value_try_get(self: Any, key: str) -> str:
        return self.blocking_key_value_get(key, _TRY_GET_TIMEOUT_MS)

    type(client).key_value_try_get = key_value_try_get


if __name__ == "__main__":  # python -m launcher.jaxcompat orbax: the spec for .ci/install.sh and users
    import sys

    if sys.argv[1:] == ["orbax"]:
        print(orbax_requirement())
    else:
        sys.exit("usage: python -m launcher.jaxcompat orbax")


# --- the profiler (launcher/runtime/trace.py) ----------------------------------------------------

def start_trace(log_dir: str) -> None:
    """``jax.profiler.start_trace`` with a Perfetto ``perfetto_trace.json.gz`` beside the XPlane,
    and without the Python tracer: it records every Python call of every thread (orbax's and the
    host loop's), which made a 20-step trace of gpt-tiny 37 MB and a minute to write on 2 cores,
    and on 0.4.35 pushed a 64-step trace past the 1,000,000 events jax's Perfetto export keeps
    (the last steps went missing); the host's XLA runtime and the devices' ops, what a step's
    time is made of, are kept. ``jax.profiler.ProfileOptions`` turns it off where it exists;
    0.4.35 has no such argument, but its jaxlib's ``ProfilerSession`` takes the options, so the
    session is started as its ``start_trace`` starts one, with them (``jax.profiler.stop_trace``
    ends either)."""
    import jax  # noqa: PLC0415  JAX: the CLI imports this module

    options = getattr(jax.profiler, "ProfileOptions", None)
    if options is not None:
        opts = options()
        opts.python_tracer_level = 0
        jax.profiler.start_trace(log_dir, create_perfetto_trace=True, profiler_options=opts)
        return
    from jax._src import profiler as _profiler  # noqa: PLC0415  JAX: the CLI imports this module
    from jax._src import xla_bridge  # noqa: PLC0415  JAX: the CLI imports this module
    from jax._src.lib import xla_client  # noqa: PLC0415  JAX: the CLI imports this module

    state = getattr(_profiler, "_profile_state", None)
    native = getattr(xla_client.profiler, "ProfileOptions", None)
    if state is None or native is None or not hasattr(state, "profile_session"):
        jax.profiler.start_trace(log_dir, create_perfetto_trace=True)  # with the Python tracer
        return
    with state.lock:
        if state.profile_session is not None:
            raise RuntimeError("Profile has already been started. Only one profile may be run at a time.")
        xla_bridge.get_backend()  # as start_trace does: the backends' tracers must exist first
        opts = native()
        opts.python_tracer_level = 0
        state.profile_session = xla_client.profiler.ProfilerSession(opts)
        state.create_perfetto_link, state.create_perfetto_trace, state.log_dir = False, True, str(log_dir)
