"""Every difference between the JAX releases xlaunch supports, in one place.

Users run the JAX their platform ships: LUMI's container has 0.4.35 (built for ROCm, and it
must stay), GPU and TPU images the newest. The rest of the code calls these helpers instead of
testing versions itself; each helper is named for what changed, and says in which release.

``MINIMUM`` is the oldest JAX the whole tool (every mode but hlo_replay, whose narrower needs
live in ``launcher/hlo/_xla.py``) is tested on; ``check_version`` refuses anything older with
one line naming what was found.
"""

from __future__ import annotations

import itertools
import os
import re
from typing import Any, Callable

MINIMUM = (0, 4, 35)
SUPPORTED = ">=" + ".".join(map(str, MINIMUM))


def version_tuple(text: str) -> tuple[int, ...]:
    """'0.4.35' -> (0, 4, 35); 'rc'/'dev' suffixes are ignored."""
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def installed_version() -> str | None:
    """The installed jax's version, read from its metadata so that nothing imports jax."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("jax")
    except PackageNotFoundError:
        return None


def check_version(found: str | None = None) -> None:
    """Raises UserError unless the JAX found (default: the installed one) is in the supported range."""
    from launcher.errors import UserError

    found = found if found is not None else installed_version()
    if found is None:
        raise UserError(f"JAX is not installed for this python: install jax{SUPPORTED} (on LUMI, use "
                        "the container's: see the README's 'On LUMI')")
    if version_tuple(found) < MINIMUM:
        raise UserError(f"jax {found} is older than xlaunch supports (jax{SUPPORTED}): use an image "
                        f"or environment with jax {SUPPORTED[2:]} or newer")


# --- before the backend starts -------------------------------------------------------------------

def set_cpu_device_count(n: int) -> None:
    """Asks for ``n`` virtual CPU devices; call after ``import jax``, before the backend starts.

    The config option ``jax_num_cpu_devices`` appeared in 0.5.0; older releases read XLA's
    flag when the CPU client is created, which has not happened yet at this point.
    """
    import jax

    try:
        jax.config.update("jax_num_cpu_devices", n)
        return
    except AttributeError:  # "Unrecognized config option" before 0.5.0
        pass
    flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def cpu_device_count_requested() -> int | None:
    """The virtual CPU device count asked for so far (by either spelling), or None."""
    import jax

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
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if _gloo_messages_cross_programs():
        jax.config.update("jax_cpu_enable_async_dispatch", False)


# The oldest release seen to keep consecutive CPU programs' gloo messages apart.
_GLOO_PROGRAMS_APART = (0, 5, 0)
_settle_count = itertools.count()


def _gloo_messages_cross_programs() -> bool:
    import jax

    return version_tuple(jax.__version__) < _GLOO_PROGRAMS_APART


def settle_programs(timeout_s: int = 600) -> None:
    """Waits until every process has finished the programs it ran so far; call between two
    different multi-process programs (and around host-to-host exchanges) that run back to back.

    Before 0.5.0, gloo on CPU matched messages by the collective's number within its program,
    so a process that had finished program A could start B while a peer still waited for A's
    last message, and B's message answered A's receive (``gloo::EnforceNotMet ...
    op.preamble.length <= op.nbytes. 20 vs 4``, then an abort: seen in every 2-process CFP
    profile of gpt-tiny tried with 0.4.35 and 0.4.38, in none with 0.5.3 or 0.10.2). A barrier of the
    coordination service (gRPC, no gloo) keeps them apart. A no-op on newer releases, with one
    process, and on accelerators (whose collectives are not gloo's).
    """
    import jax

    if jax.process_count() == 1 or not _gloo_messages_cross_programs() or jax.devices()[0].platform != "cpu":
        return
    from jax._src import distributed  # the coordination service's client: no public API before 0.5

    distributed.global_state.client.wait_at_barrier(f"xlaunch-settle-{next(_settle_count)}", timeout_s * 1000)


def distributed_initialize(*, coordinator_address: str, num_processes: int, process_id: int,
                           local_device_ids: list[int] | None, initialization_timeout: int,
                           heartbeat_timeout_seconds: int) -> None:
    """``jax.distributed.initialize`` with every argument explicit.

    ``heartbeat_timeout_seconds`` is newer than 0.4.38; before it the coordinator's own default
    (100 s) applies, which the launcher's watchdog (launcher.peer_timeout_s) undercuts anyway.
    """
    import inspect

    import jax

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
    import jax

    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    from jax.experimental.shard_map import shard_map as experimental

    return experimental(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


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
