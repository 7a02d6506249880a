"""How the profile pass times programs (launcher/sharding/measuring/timing.py): turns, cache flushes, store keys.

In-process, on the 8 virtual CPU devices conftest.py sets up. No timing is asserted here (that is
bench/bench_cfp_additivity.py's business): what runs, how often, and what it leaves behind."""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.sharding.options import ProfileOptions
from launcher.sharding.profile.candidates import QUICK_CPU_COMPILE, CandidateLoop, quick_compile_options
from launcher.sharding.profile.keys import StoreKeys
from launcher.sharding.measuring.timing import CacheFlush, Timer, flush_bytes, host_cache_bytes
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.profile.profiler import Profiler
from launcher.sharding.measuring.store import ProfileStore
from tests.test_cfp_analysis import mlp_program


def mesh_4x2() -> Mesh:
    return Mesh(np.asarray(jax.devices()[:8]).reshape(4, 2), ("a", "b"))


def test_timer_takes_turns_and_flushes_before_every_run():
    mesh = mesh_4x2()
    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, PartitionSpec("a", "b")))
    calls: list[str] = []

    def program(tag: str):
        f = jax.jit(lambda y: y * 2.0).lower(x).compile()
        return lambda *args: calls.append(tag) or f(*args)

    timer = Timer(warmup=1, repeats=3, flush=lambda: calls.append("flush"))
    first, second = timer.runs([program("p"), program("q")], [x])
    assert len(first) == len(second) == 3 and all(t > 0 for t in first + second)
    # one warm-up run each, then three turns; a flush before every run
    assert calls == ["flush", "p", "flush", "q"] * 4


def test_cache_flush_rewrites_a_buffer_on_every_device():
    mesh = mesh_4x2()
    flush = CacheFlush(mesh, bytes_per_device=2**20)
    flush()
    flush()
    buffer = flush._buffer
    assert buffer.shape == (8, 2**20 // 4)
    assert {s.device for s in buffer.addressable_shards} == set(mesh.devices.flat)
    assert all(float(jnp.min(s.data)) == float(jnp.max(s.data)) == 2.0 for s in buffer.addressable_shards)


def test_cpu_devices_share_twice_the_hosts_largest_cache():
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        sizes.append(int(text[:-1]) * {"K": 2**10, "M": 2**20}[text[-1]])
    assert host_cache_bytes() == max(sizes)
    assert flush_bytes(mesh_4x2()) == 2 * max(sizes) // 8


def test_cold_and_warm_profiles_are_stored_apart(tmp_path):

    a = analyze(*mlp_program(), [4])
    mesh = make_mesh([4], jax.devices()[:4])
    store = ProfileStore(tmp_path)
    warm, cold = (Profiler(a, mesh, store, ProfileOptions.exhaustive(repeats=3, cold_caches=c, overlap_compile=True),
                           log=lambda s: None) for c in (False, True))
    assert warm.timer.flush is None and isinstance(cold.timer.flush, CacheFlush)
    unit, combo = warm.loop.candidates()[0]
    assert warm.keys.segment(unit, combo) != cold.keys.segment(unit, combo)
    assert (warm.keys.segment(unit, combo)["caches"], cold.keys.segment(unit, combo)["caches"]) == ("warm", "cold")


@pytest.mark.core   # which options a jaxlib knows differs by release: the oldest supported JAX runs it too
def test_cpu_profiles_compile_quicker_unless_told_or_flagged(tmp_path, monkeypatch):
    """``quick_compile``: on one process's CPU devices the profiled programs compile with XLA:CPU's
    quicker code generation, each option where the jaxlib knows it and ``XLA_FLAGS`` does not set it; their
    entries are stored apart from those compiled under XLA's defaults, whose keys stay as they were."""
    a = analyze(*mlp_program(), [4])
    mesh = make_mesh([4], jax.devices()[:4])
    monkeypatch.setenv("XLA_FLAGS", "")   # (conftest.py's set both options process-wide)
    known = jaxcompat.known_compile_options(QUICK_CPU_COMPILE)
    assert known["xla_backend_optimization_level"] == 1   # every jaxlib in range has it
    assert jaxcompat.known_compile_options({"xla_no_such_option": True}) == {}
    assert quick_compile_options(ProfileOptions(), mesh) == known
    assert quick_compile_options(ProfileOptions(quick_compile=False), mesh) == {}
    with monkeypatch.context() as m:   # a job of several processes: the defaults unless asked
        m.setattr(jax, "process_count", lambda: 2)
        assert quick_compile_options(ProfileOptions(), mesh) == {}
        assert quick_compile_options(ProfileOptions(quick_compile=True), mesh) == known
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0")
    assert "xla_backend_optimization_level" not in quick_compile_options(ProfileOptions(), mesh)
    monkeypatch.setenv("XLA_FLAGS", "")

    store = ProfileStore(tmp_path)
    quick, plain = (Profiler(a, mesh, store, ProfileOptions.exhaustive(repeats=2, quick_compile=q), log=lambda s: None)
                    for q in (True, False))
    unit, combo = quick.loop.candidates()[0]
    assert quick.keys.segment(unit, combo)["compile"] == known
    assert "compile" not in plain.keys.segment(unit, combo)
    assert {k: v for k, v in quick.keys.segment(unit, combo).items() if k != "compile"} == plain.keys.segment(unit, combo)

    # The options reach XLA's compile of every profiled program: one XLA does not know is refused there.
    keys = StoreKeys(a, mesh, compile_options={"xla_no_such_option": True})
    loop = CandidateLoop(a, mesh, store, keys, Timer(0, 1), quick.units, ProfileOptions())
    with pytest.raises(Exception, match="xla_no_such_option"):
        loop.measure(loop.candidates()[:1])

    first = quick.run()
    assert first.measured == len(quick.loop.candidates()) and first.reused == 0
    assert plain.run().reused == 0   # measured again under the defaults
    assert quick.run().reused == first.measured
