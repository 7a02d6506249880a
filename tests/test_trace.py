"""launcher.trace=true (issue 18): every rank writes a jax.profiler trace of what it measured into
<run dir>/traces/rank<N>/, in the layout TensorBoard's and XProf's profile tools read, with a
Perfetto JSON beside it. mode=train's trace is checked in tests/test_checkpoint.py (the shared
reference run); here mode=hlo_replay's, and that nothing is traced without the option."""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from omegaconf import OmegaConf

from launcher.runtime import trace
from tests.launch import read_result, run_cli
from tests.train_reference import STEPS, uninterrupted
from launcher.runtime.trace_stats import timed
from launcher.runtime.trace_stats import op_times
from launcher.runtime.trace_stats import top_ops

pytestmark = pytest.mark.core


def trace_events(run: Path, rank: int) -> list[dict]:
    """The events of rank ``rank``'s one trace session (its Perfetto JSON)."""
    (session,) = (run / "traces" / f"rank{rank}" / "plugins" / "profile").iterdir()
    (perfetto,) = session.glob("perfetto_trace.json.gz")
    data = json.loads(gzip.open(perfetto).read())
    return data["traceEvents"] if isinstance(data, dict) else data


def executions(events: list[dict]) -> list[dict]:
    """Runs of compiled programs: ``CommonPjRtLoadedExecutable::Execute (<module>)`` on newer
    JAX, ``TfrtCpuExecutable::Execute`` on 0.4.35."""
    return [e for e in events if e.get("ph") == "X" and "Executable::Execute" in e.get("name", "")
            and "Helper" not in e["name"]]


def test_nothing_is_traced_without_the_option(tmp_path):
    ctx = SimpleNamespace(cfg=OmegaConf.create({"launcher": {"trace": False}}), run_dir=tmp_path,
                          rank=SimpleNamespace(process_id=0), log=logging.getLogger("test"))
    with trace.recording(ctx, "train") as where:
        jnp.ones(4).block_until_ready()
    assert where is None and not (tmp_path / "traces").exists()


@pytest.mark.slow
def test_each_rank_traces_every_measured_training_step():
    run = uninterrupted()  # mode=train ... launcher.trace=true, 2 processes
    for rank in (0, 1):
        events = trace_events(run, rank)
        steps = [e for e in events if e.get("name") == "train" and e.get("ph") == "X"]
        assert len(steps) == STEPS  # one marked step each (XProf's step-time views read them)
        assert len(executions(events)) >= STEPS  # the compiled step's runs, inside them


@pytest.mark.slow
def test_hlo_replay_writes_a_trace_per_rank_with_the_replayed_module(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    step = jax.jit(lambda a: jnp.tanh(a @ a.T).sum(axis=0), in_shardings=NamedSharding(mesh, PartitionSpec("x")))
    hlo = tmp_path / "traced_module.hlo"
    hlo.write_text(step.lower(jnp.ones((8, 8), jnp.float32)).as_text(dialect="hlo"))
    run = tmp_path / "run"
    run_cli("mode=hlo_replay", f"mode.hlo_file={hlo}", "mode.num_repeats=3", "launcher.trace=true", "cluster=local",
            "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=1", run_dir=run, timeout=300)
    assert read_result(run)["num_partitions"] == 2
    for rank in (0, 1):  # both ranks hold a partition: each traced its runs of the module
        assert len(executions(trace_events(run, rank))) >= 3, f"rank {rank}'s trace lacks the replayed runs"


# --- collective time from a trace (launcher/runtime/trace_stats.py) --------------------------------

def test_the_cpu_backends_trace_has_no_device_ops_so_callers_keep_their_estimate():

    mesh = Mesh(np.array(jax.devices()), ("x",))
    f = jax.jit(lambda a: jnp.tanh(a).sum(), in_shardings=NamedSharding(mesh, PartitionSpec("x")))
    f(jnp.ones(64)).block_until_ready()
    times, out = timed(lambda: float(f(jnp.ones(64))))  # a psum across 8 devices, traced
    assert out == pytest.approx(64 * np.tanh(1.0)) and times is None


def _gpu_like_trace(tmp_path):
    """A trace in the layout of a GPU one (written by hand: there is no GPU here): two devices,
    each with an ``XLA Ops`` line and a stream line that repeats its kernels."""

    def meta(pid, tid, kind, name):
        where = {"pid": pid} if tid is None else {"pid": pid, "tid": tid}
        return {"ph": "M", **where, "name": kind, "args": {"name": name}}

    def op(pid, tid, name, us):
        return {"ph": "X", "pid": pid, "tid": tid, "ts": 0, "dur": us, "name": name}

    events = [meta(1, None, "process_name", "/host:CPU"), op(1, 5, "PjitFunction(step)", 9e6)]
    for pid, comm in ((10, 300.0), (11, 500.0)):
        events += [meta(pid, None, "process_name", f"/device:GPU:{pid - 10}"),
                   meta(pid, 1, "thread_name", "XLA Ops"), meta(pid, 2, "thread_name", "Stream #13(compute)"),
                   op(pid, 1, "all-reduce-start.3", comm), op(pid, 1, "fusion.12", 1000.0), op(pid, 1, "dot.4", 200.0),
                   op(pid, 2, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", comm)]
    session = tmp_path / "plugins" / "profile" / "t"
    session.mkdir(parents=True)
    with gzip.open(session / "perfetto_trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_collective_and_compute_time_are_summed_from_each_devices_op_line(tmp_path):
    _gpu_like_trace(tmp_path)
    times = op_times(tmp_path)
    assert times.devices == 2
    assert times.collective_s == pytest.approx(400e-6) and times.compute_s == pytest.approx(1200e-6)


def test_device_time_by_op_kind_groups_numbered_instructions_and_ranks_them(tmp_path):
    _gpu_like_trace(tmp_path)
    ops = top_ops(tmp_path)
    # Per device: all-reduce-start 300 or 500 us (mean 400), fusion 1000, dot 200; the stream
    # line's NCCL kernel is the all-reduce again and is not counted twice.
    assert [k for k, _ in ops.kinds] == ["fusion", "all-reduce-start", "dot"]
    assert dict(ops.kinds)["all-reduce-start"] == pytest.approx(400e-6)
    assert ops.busy_s == pytest.approx(1600e-6)
    top = ops.to_dict(2)["top"]
    assert [t["kind"] for t in top] == ["fusion", "all-reduce-start"] and top[0]["share"] == pytest.approx(1000 / 1600)
    assert top_ops(tmp_path / "nowhere") is None
