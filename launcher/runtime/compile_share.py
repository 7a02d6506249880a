"""Compiling a job's programs once between its processes, not once on each.

Every process of an SPMD job builds the same programs in the same order, and JAX lowers and XLA
compiles each on every process: in the default job (2 processes on a 2-core laptop) the search compiled each
candidate twice, side by side, and compiling was three quarters of its profile's time. Inside
``shared()``, the ``i``-th program given to ``compile`` (as a function that lowers it) belongs
to process ``i mod n``: that process lowers and compiles it and puts its executable in the coordination service's key-value store
(``jaxcompat.serialize_executable``); the others load it from there the first time they need it
(``Compiling.result``), and at the latest as the batch ends (leaving ``shared()``), after
which the store forgets it. Callers give programs several at a time before running any (a
shortlist, the baselines, a chunk of a mesh's profile candidates, whose executables stay in the
store until that mesh's profile ends), so each process compiles its share while the others
compile theirs.

Nothing waits in ``compile``: a process waits only in ``result``, for a program whose owner
compiles it in its own ``compile`` call, which comes no later in the order every process
follows; so no two processes can wait on each other. A program the owner cannot serialize (host
callbacks pickle cannot carry, such as ``jax.debug.print``'s) or did not compile in this call
(read back from JAX's persistent compilation cache, which the others read as well, now or
before: such executables do not serialize whole on CPU) every process makes itself. With
one process or outside ``shared()``, ``compile`` compiles here and now, as ``lower().compile()``.

With one process, ``shared()`` still compiles its programs side by side: each is lowered here
(tracing holds the interpreter) and compiled on one of ``workers()`` threads (XLA's compiler lets
go of it), and every one is ready when ``shared()`` ends. XLA compiles a program on a core or two
(1.3 of this machine's 2 for the profile's CPU programs), and a search compiles about a hundred,
so a user's notebook search (one process) left the rest of a larger host idle. A caller that
times programs inside ``shared()`` (the profile's candidate loop) waits for a batch first
(``ready``): a program timed while another compiles on the same cores would time the compiler too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional

import jax

from launcher import jaxcompat
from launcher.errors import UserError

# How long a process waits for a peer's program: the peer compiles its share of the batch first,
# and a large model's program can take many minutes (JAX's own binary sharing waits 20).
_WAIT_MS = 3_600_000
_batches = itertools.count()
# Threads compiling one process's programs side by side (``workers``): half its cores, since XLA's
# CPU compiler already works on 1.3-2 of them for one program (on this 2-core machine two at once
# took the Linen LM's and the scanned LM's cold searches 0.93x and 0.99x as long, medians of 4, in
# the noise: so here one, docs/autoshard.md), at most 4 (each compile holds its program's whole
# HLO and buffers: more at once buys little and can exhaust a host's memory); or
# ``XLAUNCH_COMPILE_WORKERS`` (1: one at a time).
WORKERS_VARIABLE = "XLAUNCH_COMPILE_WORKERS"
DEFAULT_MAX_WORKERS = 4


def workers() -> int:
    """How many programs one process compiles at once (the comment above)."""
    given = os.environ.get(WORKERS_VARIABLE, "").strip()
    if given:
        if not given.isdigit() or int(given) < 1:
            raise UserError(f"{WORKERS_VARIABLE}={given!r}: give how many programs one process compiles at once, "
                            f"a whole number from 1 (one at a time), or unset it for half the host's cores, at most "
                            f"{DEFAULT_MAX_WORKERS}")
        return int(given)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(cores // 2, DEFAULT_MAX_WORKERS))


class Compiling:
    """A program compiled here (``compiled``), or by a peer and loaded at the first ``result()``."""

    def __init__(self, compiled: jax.stages.Compiled | None = None, compile_s: float = 0.0,
                 load: Optional[Callable[[], tuple[Any, float, Any]]] = None) -> None:
        self._compiled, self._compile_s, self._load = compiled, compile_s, load
        self._memory: Any = None   # the compiling process's memory analysis, for a program loaded
        self.compile_s_here = compile_s if load is None else 0.0   # of them, spent in this process's compile()

    def result(self) -> Any:
        """The ``jax.stages.Compiled`` program."""
        if self._load is not None:
            self._compiled, self._compile_s, self._memory = self._load()
            self._load = None
        return self._compiled

    def memory_analysis(self) -> Any:
        """XLA's memory analysis of the program as its compiler made it (``jax.stages.Compiled``'s
        method): a loaded executable's own may differ (``jaxcompat.load_executable``)."""
        compiled = self.result()
        return self._memory if self._memory is not None else compiled.memory_analysis()

    @property
    def compile_s(self) -> float:
        """Seconds XLA took to compile it, on whichever process did."""
        self.result()
        return self._compile_s


Lower = Callable[[], Any]   # makes the program's ``jax.stages.Lowered``


Options = Optional[dict]   # XLA options of the compile (``Lowered.compile``'s), None: XLA's defaults


def _here(lower: Lower, options: Options = None) -> tuple[Any, float]:
    return _compile(lower(), options)[:2]


def _compile(lowered: Any, options: Options = None) -> tuple[Any, float, bool]:
    """(the program, seconds, whether XLA compiled it in this call: ``jaxcompat.compile_fresh``)."""
    t0 = time.perf_counter()
    compiled, fresh = jaxcompat.compile_fresh(lowered, options)
    return compiled, time.perf_counter() - t0, fresh


class _Share:
    """One batch of programs split among the job's processes (the module doc)."""

    def __init__(self, client: Any) -> None:
        self.client, self.n, self.me = client, jax.process_count(), jax.process_index()
        self.prefix = f"xlaunch-compiled-{next(_batches)}"
        self.count, self.lock = 0, threading.Lock()
        self.mine: list[str] = []              # keys of the programs this process compiled
        self.theirs: list[Compiling] = []      # the peers' programs

    def compile(self, lower: Lower, options: Options = None) -> Compiling:
        with self.lock:  # the profile may compile on a worker thread; the numbering is the order given
            i, self.count = self.count, self.count + 1
        key = f"{self.prefix}/{i}"
        if i % self.n != self.me:  # not even lowered here, unless its owner cannot send it
            self.theirs.append(Compiling(load=lambda: self._load(key, lower, options)))
            return self.theirs[-1]
        self.mine.append(key)
        try:
            compiled, seconds, fresh = _compile(lower(), options)
        except Exception:
            self._publish(key, 0.0, b"")  # the peers make it themselves, and fail alike
            raise
        payload = b""
        # Read back from the persistent cache (which the peers read too) now or before (given
        # again from JAX's in-memory cache), or refused by the backend or by pickle (a host
        # callback that is a local function): each process makes it itself.
        if fresh:
            try:
                payload = jaxcompat.serialize_executable(compiled)
            except Exception:  # noqa: BLE001  whatever the backend or pickle refuses
                payload = b""
        self._publish(key, seconds, payload)
        return Compiling(compiled, seconds)

    def _publish(self, key: str, seconds: float, payload: bytes) -> None:
        self.client.key_value_set_bytes(key, pickle.dumps((seconds, payload)))

    def _load(self, key: str, lower: Lower, options: Options) -> tuple[Any, float, Any]:
        seconds, payload = pickle.loads(self.client.blocking_key_value_get_bytes(key, _WAIT_MS))
        if not payload:
            return (*_here(lower, options), None)
        compiled, memory = jaxcompat.load_executable(payload)
        return compiled, seconds, memory

    def close(self) -> None:
        """Loads whatever of the batch was not asked for yet; then, once every process has,
        the batch's executables leave the store."""
        for program in self.theirs:
            program.result()
        self.client.wait_at_barrier(f"{self.prefix}-done", _WAIT_MS)
        for key in self.mine:
            self.client.key_value_delete(key)


class _Side:
    """One process's batch of programs: lowered here, compiled on ``workers`` threads."""

    def __init__(self, workers: int) -> None:
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xlaunch-compile")
        self.programs: list[Compiling] = []

    def compile(self, lower: Lower, options: Options = None) -> Compiling:
        future = self.pool.submit(_compile, lower(), options)
        self.programs.append(Compiling(load=lambda: (*future.result()[:2], None)))
        return self.programs[-1]

    def close(self, wait_for_all: bool = True) -> None:
        """Every program ready (``wait_for_all``), else those not started dropped; the threads end."""
        try:
            if wait_for_all:
                ready(self.programs)
        finally:
            self.pool.shutdown(wait=True, cancel_futures=True)


_current: Optional[_Share | _Side] = None


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Programs given to ``compile`` inside are compiled once in the job, each by one process
    (with one process, on ``workers()`` threads side by side); all are ready when it ends. Every
    process must enter and leave it at the same point of the same program order. Nested, the
    outermost counts."""
    global _current
    if _current is not None:
        yield
        return
    client = jaxcompat.coordination_client()
    if client is None or jax.process_count() == 1:
        n = workers()
        if n == 1:
            yield
            return
        _current = side = _Side(n)
        try:
            yield
        except BaseException:
            side.close(wait_for_all=False)
            raise
        finally:
            _current = None
        side.close()
        return
    _current = share = _Share(client)
    try:
        yield
    finally:
        _current = None
    share.close()  # not after an error: a peer may never come to the barrier


def ready(programs: Any) -> None:
    """Waits until every one of ``programs`` (``Compiling``) is compiled (or loaded)."""
    for program in programs:
        program.result()


def compile(lower: Lower, options: Options = None) -> Compiling:  # noqa: A001  what it does, as lowered.compile()
    """The program ``lower()`` makes, compiled with XLA's ``options`` (None: its defaults): by its
    share's owner inside ``shared()`` (only the owner lowers it), else here and now."""
    share = _current
    if share is not None:
        return share.compile(lower, options)
    return Compiling(*_here(lower, options))
