"""Programs compiled once in a job, each by one process (launcher/runtime/compile_share.py), on
two real processes joined by jax.distributed (cluster=local, gloo between them): every process
runs every program, and gets what compiling it itself gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher import jaxcompat
from launcher.errors import UserError
from tests.launch import read_result, run_cli

pytestmark = pytest.mark.core


def share_programs(out: str, warm: bool = False) -> None:
    """mode=run's target, on every process: six programs (each a collective over all 8 devices;
    the first donates its argument) and one with a host callback, given inside ``shared()``
    (with ``warm``, each compiled once before, as a job compiles a step it later shares);
    writes what this process compiled, what each program computed and XLA's memory analysis of
    it, beside the same programs compiled here without sharing."""
    import jax  # noqa: PLC0415  a task imports JAX once its devices are set
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415
    from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: PLC0415

    from launcher.runtime import compile_share, hosts  # noqa: PLC0415
    from launcher.models.train import memory_stats  # noqa: PLC0415

    compiled = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, *a, **k: compiled.append(1) if event == "/jax/core/compile/backend_compile_duration" else None)
    mesh = Mesh(np.array(jax.devices()), ("x",))
    x = jax.make_array_from_callback((8, 4), NamedSharding(mesh, PartitionSpec("x")),
                                     lambda i: np.arange(32, dtype=np.float32).reshape(8, 4)[i])
    steps = [lambda y, k=k: jnp.sin(y) * k + jnp.sum(y) for k in range(6)]   # the sum crosses processes

    def noisy(y):
        jax.debug.callback(lambda v: None, jnp.sum(y))   # host callbacks: an executable that cannot travel
        return y * 2

    jits = [jax.jit(f, donate_argnums=(0,) if k == 0 else ()) for k, f in enumerate([*steps, noisy])]
    if warm:
        for f in jits:
            f.lower(x).compile()
    compiled.clear()
    with compile_share.shared():   # leaving it, each process has loaded or made every program
        shared = [compile_share.compile(lambda f=f: f.lower(x)) for f in jits]
    compiled_here = len(compiled)
    loaded = [hosts.fetch(p.result()(x + 0)).tolist() for p in shared]   # a copy: the first one donates it
    mine = [f.lower(x).compile() for f in jits]
    here = [hosts.fetch(p(x + 0)).tolist() for p in mine]
    Path(out, f"rank{jax.process_index()}.json").write_text(json.dumps(
        {"compiled_in_batch": compiled_here, "loaded": loaded, "here": here,
         "compile_s": [p.compile_s for p in shared],
         "memory": [memory_stats(p) for p in shared], "memory_here": [memory_stats(p) for p in mine]}))


def test_each_process_compiles_its_share_and_runs_every_program(tmp_path):
    cache = tmp_path / "jax_cache"   # JAX's persistent compilation cache, of both runs
    for run in ("first", "again"):
        out = tmp_path / run
        out.mkdir()
        run_cli("mode=run", "mode.target=tests.test_compile_share:share_programs", f"mode.kwargs.out={out}",
                f"mode.kwargs.warm={run == 'again'}",
                "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", f"launcher.compile_cache_dir={cache}",
                run_dir=tmp_path / f"run-{run}", timeout=300)
        result = read_result(tmp_path / f"run-{run}")
        assert result["global_devices"] == 8
        ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
        for r in ranks:
            # A peer's executable computes what this process's own compile of the program does,
            # and its memory is read as its compiler laid it out: the donated argument's bytes
            # aliased (a loaded executable's own analysis reports none on JAX 0.4.35).
            assert r["loaded"] == r["here"]
            assert r["memory"] == r["memory_here"] and r["memory"][0]["alias"] > 0
            assert all(s > 0 for s in r["compile_s"])
        assert ranks[0]["loaded"] == ranks[1]["loaded"]
        if run == "first":
            # Three of the six each, and the host-callback program on both (its owner cannot send it).
            assert [r["compiled_in_batch"] for r in ranks] == [4, 4]
        elif jaxcompat.cpu_compilation_cache_works():   # (none before JAX 0.5 on CPU)
            # Process 0 read its programs back from the cache before the batch, and such an
            # executable does not travel whole (its kernels stay behind), also when compiling it
            # again in the batch gives it from JAX's in-memory cache with no cache hit said: process
            # 1 made them itself, or its runs above would fail ("Function ... not found").
            assert result["compile_cache"]["hits"] >= 3


def test_one_process_compiles_a_batch_side_by_side(monkeypatch):
    """With one process, ``shared()`` lowers each program here and compiles it on a worker
    thread, several at once: each program computes what ``lower().compile()`` gives, says its
    compile seconds, and every one is ready when ``shared()`` ends. An error inside ``shared()``
    leaves it (the programs not started yet dropped) and is the caller's to see."""
    import threading  # noqa: PLC0415

    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    from launcher.runtime import compile_share  # noqa: PLC0415

    monkeypatch.setenv(compile_share.WORKERS_VARIABLE, "2")
    threads, listening = [], []

    def heard(event, *args, **kwargs):
        if listening and event == "/jax/core/compile/backend_compile_duration":
            threads.append(threading.current_thread().name)

    jax.monitoring.register_event_duration_secs_listener(heard)
    x = jnp.asarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    jits = [jax.jit(lambda y, k=k: jnp.tanh(y * (k + 1)) @ y.T + k) for k in range(4)]
    listening.append(True)
    with compile_share.shared():
        given = [compile_share.compile(lambda f=f: f.lower(x)) for f in jits]
    listening.clear()   # (JAX keeps its listeners for the session)
    assert all(n.startswith("xlaunch-compile") for n in threads) and len(threads) == len(jits)
    assert all(p._load is None for p in given)   # every one compiled (and taken) by the time shared() ended
    assert [np.asarray(p.result()(x)).tolist() for p in given] == \
        [np.asarray(f.lower(x).compile()(x)).tolist() for f in jits]
    assert all(p.compile_s > 0 and p.compile_s_here == 0 for p in given)

    with pytest.raises(ValueError, match="the caller's"):
        with compile_share.shared():
            compile_share.compile(lambda: jax.jit(lambda y: y + 1).lower(x))
            raise ValueError("the caller's")
    assert compile_share._current is None   # the next batch starts afresh

    monkeypatch.setenv(compile_share.WORKERS_VARIABLE, "two")
    with pytest.raises(UserError, match="XLAUNCH_COMPILE_WORKERS='two': give how many programs"):
        with compile_share.shared():
            pass
