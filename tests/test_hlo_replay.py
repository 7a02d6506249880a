"""HLO replay: dumps of real programs replay to the program's own outputs, and the options and
error cases behave as documented.

Every module these tests replay is made here: by JAX (``jit(f).lower(...).as_text(dialect="hlo")``),
by XLA's own dump in a subprocess, or written out below (``MODULES``: GSPMD annotations on
parameters only, tuple parameters, an all-reduce over replicas, shapes JAX does not emit). The XLA
authors' modules are the outside conformance suite, tests/test_hlo_replay_fixtures.py.

Needs 8 virtual CPU devices: the count is requested when this file is imported (pytest imports
every test file before running any test, so before JAX's backend starts).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax

from launcher import jaxcompat

if (jaxcompat.cpu_device_count_requested() or 0) < 8:
    try:
        jaxcompat.set_cpu_device_count(8)
    except RuntimeError:
        pass  # the backend is already up: the `devices` fixture reports it

import numpy as np
import pytest

from launcher.errors import UserError
from launcher.hlo.options import ReplayOptions
from launcher.hlo.replay import replay_file
from launcher.hlo.replay import fetch
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tests.launch import read_result, run_cli, xla_flags
from launcher.hlo.arguments import random_values
from launcher.hlo.module import collective_needs, load
from launcher.hlo.module import expand
from launcher.hlo.replay import replay
from launcher.hlo import replay as replay_module
from launcher.hlo import _xla
import jaxlib
from jaxlib import xla_client

REPO = Path(__file__).resolve().parents[1]

# Hand-written modules, by file name.
MODULES = {
    # 8 partitions that only the parameters' GSPMD annotations ask for (no num_partitions in the
    # header, nothing on the dot): the contracting dimension is split 8 ways, so the partitioned
    # program needs an all-reduce. Under Shardy such annotations are silently dropped.
    "spmd8.hlo": """
        HloModule spmd8

        ENTRY main {
          lhs = f32[4,16] parameter(0), sharding={devices=[1,8]<=[8]}
          rhs = f32[16,6] parameter(1), sharding={devices=[8,1]<=[8]}
          ROOT product = f32[4,6] dot(lhs, rhs), lhs_contracting_dims={1}, rhs_contracting_dims={0}
        }
    """,
    # One tuple parameter: its two leaves become the executable's two arguments.
    "tupled.hlo": """
        HloModule tupled

        ENTRY main {
          pair = (f32[3,2], f32[3,2]) parameter(0)
          first = f32[3,2] get-tuple-element(pair), index=0
          second = f32[3,2] get-tuple-element(pair), index=1
          ROOT sum = f32[3,2] add(first, second)
        }
    """,
    # Nested tuples on both sides, beside a plain parameter.
    "nested.hlo": """
        HloModule nested

        ENTRY main {
          scale = f32[] parameter(0)
          tree = (f32[2], (s32[2], f32[3])) parameter(1)
          a = f32[2] get-tuple-element(tree), index=0
          inner = (s32[2], f32[3]) get-tuple-element(tree), index=1
          b = s32[2] get-tuple-element(inner), index=0
          c = f32[3] get-tuple-element(inner), index=1
          scale2 = f32[2] broadcast(scale), dimensions={}
          scaled = f32[2] multiply(a, scale2)
          bf = f32[2] convert(b)
          total = f32[2] add(scaled, bf)
          negated = f32[3] negate(c)
          pair = (f32[3], s32[2]) tuple(negated, b)
          ROOT out = (f32[2], (f32[3], s32[2])) tuple(total, pair)
        }
    """,
    # 2 partitions from the annotations: rows split over devices 0 and 1.
    "two_devices.hlo": """
        HloModule two_devices

        ENTRY main {
          x = f32[2,3] parameter(0), sharding={devices=[2,1]0,1}
          ROOT twice = f32[2,3] add(x, x), sharding={devices=[2,1]0,1}
        }
    """,
    # replica_count=8 in the header; the all-reduce sums the 8 devices' copies.
    "replica_sum.hlo": """
        HloModule replica_sum, replica_count=8, num_partitions=1

        plus {
          x = f32[] parameter(0)
          y = f32[] parameter(1)
          ROOT z = f32[] add(x, y)
        }

        ENTRY main {
          values = f32[256] parameter(0)
          ROOT summed = f32[256] all-reduce(values), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}},
            use_global_device_ids=true, to_apply=plus
        }
    """,
    # 64-bit element types, as a JAX program dumped with jax_enable_x64 on has them; x and n split
    # over 4 devices. JAX would narrow such arguments to 32 bits unless told otherwise.
    "wide.hlo": """
        HloModule wide

        ENTRY main {
          x = f64[16] parameter(0), sharding={devices=[4]<=[4]}
          n = s64[16] parameter(1), sharding={devices=[4]<=[4]}
          z = c128[16] parameter(2), sharding={replicated}
          u = u64[16] parameter(3), sharding={replicated}
          third = f64[] constant(0.3333333333333333)
          thirds = f64[16] broadcast(third), dimensions={}
          y = f64[16] multiply(x, thirds)
          one = s64[] constant(1)
          ones = s64[16] broadcast(one), dimensions={}
          m = s64[16] add(n, ones)
          w = c128[16] multiply(z, z)
          v = u64[16] add(u, u)
          ROOT out = (f64[16], s64[16], c128[16], u64[16]) tuple(y, m, w, v)
        }
    """,
}


def wide_arguments() -> list:
    """Arguments for wide.hlo that 32 bits cannot hold: steps of 1e-12 about 1, integers past
    2**31 and 2**32."""
    k = np.arange(16)
    return [1 + k * 1e-12, 2**40 + k, k + 1j * (1 + k * 1e-12), (2**62 + k).astype(np.uint64)]


def check_wide_outputs(outputs: list, inputs: list) -> None:
    """wide.hlo's outputs are numpy's, exactly, in their own types."""
    x, n, z, u = inputs
    assert [o.dtype for o in outputs] == [np.float64, np.int64, np.complex128, np.uint64]
    for got, expected in zip(outputs, [x * 0.3333333333333333, n + 1, z * z, u + u], strict=True):
        np.testing.assert_array_equal(got, expected)

# A sharded training step (MLP loss and gradients, data over "x", hidden units over "y"),
# lowered with Shardy, dumped by XLA itself as text and proto, with its inputs and outputs saved
# beside the dump.
DUMP_PROGRAM = textwrap.dedent("""
    import sys
    from pathlib import Path
    import jax
    from launcher import jaxcompat
    jaxcompat.set_cpu_device_count(8)
    jax.config.update("jax_use_shardy_partitioner", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    out = Path(sys.argv[1])
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("x", "y"))

    def step(w1, w2, x, y):
        def loss(w1, w2):
            h = jnp.tanh(x @ w1)
            return jnp.mean((h @ w2 - y) ** 2)
        value, grads = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return value, grads

    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 4), (32, 8), (32, 4)]]
    specs = [P(None, "y"), P("y", None), P("x", None), P("x", None)]
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(inputs, specs)]
    outputs = jax.tree.leaves(jax.jit(step)(*args))
    np.savez(out / "inputs.npz", *inputs)
    np.savez(out / "outputs.npz", *[np.asarray(o) for o in outputs])
""")


def eight_devices() -> list:
    have = jax.devices()
    assert len(have) >= 8, (f"these tests need 8 CPU devices but JAX started with {len(have)}: something "
                            "initialised JAX before this file was imported")
    return have[:8]


@pytest.fixture(scope="module")
def devices():
    return eight_devices()


@pytest.fixture(scope="module")
def modules(tmp_path_factory) -> Path:
    """The folder ``MODULES`` are written to, one file each."""
    folder = tmp_path_factory.mktemp("modules")
    for name, text in MODULES.items():
        (folder / name).write_text(textwrap.dedent(text).lstrip())
    return folder


@pytest.fixture(scope="module")
def spmd8(modules) -> Path:
    return modules / "spmd8.hlo"


@pytest.fixture(scope="module")
def tupled(modules) -> Path:
    return modules / "tupled.hlo"


@pytest.fixture(scope="module")
def sharded_dump(tmp_path_factory):
    """XLA's own dump of the sharded step (run in a fresh process with XLA_FLAGS set)."""
    out = tmp_path_factory.mktemp("dump")
    # A step from the session's compilation cache (tests/conftest.py) would not be dumped: compiled here.
    dump = xla_flags(f"--xla_dump_to={out / 'xla'}", "--xla_dump_hlo_as_text", "--xla_dump_hlo_as_proto")
    env = {**os.environ, "XLA_FLAGS": dump, "JAX_ENABLE_COMPILATION_CACHE": "false"}
    subprocess.run([sys.executable, "-c", DUMP_PROGRAM, str(out)], check=True, env=env, timeout=180, cwd=REPO)
    (text,) = (out / "xla").glob("*jit_step.before_optimizations.txt")
    (proto,) = (out / "xla").glob("*jit_step.before_optimizations.hlo.pb")
    expected = np.load(out / "outputs.npz")
    return {"text": text, "proto": proto, "inputs": out / "inputs.npz",
            "outputs": [expected[k] for k in expected.files]}


def replay_one(path, devices, **options):

    return replay_file(path, ReplayOptions(**options), devices)


def values(result):

    return fetch(result.outputs)


def shard_shapes(result):
    return [s.shard_shape(p.shape) for p, s in zip(result.parameters, result.parameter_shardings, strict=True)]


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def default_partitioner() -> str:
    """What a module JAX lowers today carries: Shardy by default since 0.7, GSPMD before."""
    return "shardy" if jax.config.jax_use_shardy_partitioner else "gspmd"


# --- dump, then replay: same outputs as the program itself --------------------------------------

def test_single_device_dump_matches_direct_run(tmp_path, devices):

    def f(a, b, c):
        return jnp.tanh(a @ b) * c[0] + 1, (a.sum(axis=1) > 0).astype(jnp.int32)

    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in [(6, 5), (5, 3), (3,)]]
    expected = jax.jit(f)(*inputs)
    hlo = tmp_path / "f.hlo"
    hlo.write_text(jax.jit(f).lower(*inputs).as_text(dialect="hlo"))
    np.savez(tmp_path / "args.npz", *inputs)

    result = replay_one(hlo, devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
    assert (result.num_replicas, result.num_partitions, result.partitioner) == (1, 1, "none")
    got = values(result)
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)
    np.testing.assert_array_equal(got[1], expected[1])


def test_a_step_that_donates_its_arguments_is_replayed_on_copies_of_the_first_ones(tmp_path, devices, monkeypatch):
    """A training step donates its state (input_output_alias): every run consumes its arguments.
    They are made once and each run gets a device copy, so every repeat computes the same thing
    (making them again costs minutes on a large step: 97 s a repeat on an H200's 1.4e9-parameter
    GPT, bench/results/accelerator-h200.json)."""
    made = []
    real = replay_module.make_arguments
    monkeypatch.setattr(replay_module, "make_arguments", lambda *a: made.append(1) or real(*a))

    step = jax.jit(lambda s, x: (s * 0.5 + x.sum(), (s * x).sum()), donate_argnums=0)
    hlo = tmp_path / "step.hlo"
    hlo.write_text(step.lower(jnp.ones(64), jnp.ones(64)).as_text(dialect="hlo"))
    assert load(hlo).aliases_inputs
    result = replay_one(hlo, devices, num_repeats=4)
    assert len(result.execution_times_s) == 4 and len(made) == 1
    # The same arguments each time: the last run's outputs are the first run's.
    first = replay_one(hlo, devices, num_repeats=1)
    for a, b in zip(values(result), values(first), strict=True):
        np.testing.assert_array_equal(a, b)
    # A module that donates nothing keeps its arguments as they are.
    plain = tmp_path / "plain.hlo"
    plain.write_text(jax.jit(lambda s, x: s * x).lower(jnp.ones(8), jnp.ones(8)).as_text(dialect="hlo"))
    assert not load(plain).aliases_inputs
    made.clear()
    assert len(replay_one(plain, devices, num_repeats=3).execution_times_s) == 3 and len(made) == 1


@pytest.mark.parametrize("kind", ["text", "proto"])
def test_sharded_dump_matches_direct_run(sharded_dump, devices, kind, tmp_path):
    result = replay_one(sharded_dump[kind], devices, argument_mode="file", arguments_file=sharded_dump["inputs"],
                        output_file=tmp_path / "out.npz")
    assert result.num_partitions == 8 and result.partitioner == "shardy"
    # The parameters stay sharded as the program asked: w1 over "y" (4), x over "x" (2).
    assert shard_shapes(result) == [(8, 4), (4, 4), (16, 8), (16, 4)]
    got = values(result)
    assert len(got) == len(sharded_dump["outputs"]) == 3
    for g, e in zip(got, sharded_dump["outputs"], strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    written = np.load(result.outputs_file)
    for g, k in zip(got, written.files, strict=True):
        np.testing.assert_array_equal(written[k], g)


def test_lowered_gspmd_module_replays_with_gspmd(tmp_path, devices):
    """A module lowered with Shardy off carries only GSPMD shardings and compiles with GSPMD."""

    mesh = Mesh(np.array(devices).reshape(8), ("d",))
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    f = jax.jit(lambda a: (a * 2).sum(axis=0), in_shardings=NamedSharding(mesh, P("d", None)))
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        text = f.lower(a).as_text(dialect="hlo")
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    assert "xla.sdy" not in text
    hlo = tmp_path / "g.hlo"
    hlo.write_text(text)
    np.savez(tmp_path / "a.npz", a)
    result = replay_one(hlo, devices, argument_mode="file", arguments_file=tmp_path / "a.npz")
    assert result.partitioner == "gspmd" and result.num_partitions == 8
    assert result.parameter_shardings[0].shard_shape((8, 8)) == (1, 8)
    np.testing.assert_allclose(values(result)[0], (a * 2).sum(axis=0))


def test_mode_module_does_not_import_jax():
    """The CLI imports every mode to register its schema, before any process has set up JAX."""
    code = "import sys, launcher.modes.hlo_replay as m; m.Config(); assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


# --- hand-written modules: what JAX does not emit ------------------------------------------------

def test_parameter_only_gspmd_annotations_keep_their_shardings(spmd8, devices, tmp_path):
    """Only the parameters are annotated (GSPMD): under Shardy they would silently compile
    replicated; replay compiles GSPMD-only modules with GSPMD, so they stay split 8 ways and the
    partitioned dot sums its partial products across the devices."""
    rng = np.random.default_rng(1)
    lhs, rhs = rng.standard_normal((4, 16), np.float32), rng.standard_normal((16, 6), np.float32)
    np.savez(tmp_path / "args.npz", lhs, rhs)
    result = replay_one(spmd8, devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
    assert (result.num_replicas, result.num_partitions, result.partitioner) == (1, 8, "gspmd")
    assert shard_shapes(result) == [(4, 2), (2, 6)]
    np.testing.assert_allclose(values(result)[0], lhs @ rhs, rtol=1e-5, atol=1e-5)


def test_tuple_parameter_is_flattened_into_its_leaves(tupled, devices, tmp_path):
    a, b = np.arange(6, dtype=np.float32).reshape(3, 2), np.full((3, 2), 10, np.float32)
    np.savez(tmp_path / "args.npz", a, b)
    result = replay_one(tupled, devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
    assert [p.describe() for p in result.parameters] == ["pair[0]: f32[3,2]", "pair[1]: f32[3,2]"]
    np.testing.assert_array_equal(values(result)[0], a + b)


def test_nested_tuples_in_and_out(modules, devices, tmp_path):
    scale, a, b, c = (np.float32(3), np.array([1, 2], np.float32), np.array([5, 7], np.int32),
                      np.array([1, 2, 3], np.float32))
    np.savez(tmp_path / "args.npz", scale, a, b, c)
    result = replay_one(modules / "nested.hlo", devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
    assert [p.describe() for p in result.parameters] == [
        "scale: f32[]", "tree[0]: f32[2]", "tree[1][0]: s32[2]", "tree[1][1]: f32[3]"]
    total, negated, ints = values(result)
    np.testing.assert_array_equal(total, a * scale + b)
    np.testing.assert_array_equal(negated, -c)
    assert ints.dtype == np.int32 and ints.tolist() == [5, 7]


def test_64_bit_parameters_replay_as_written(modules, devices, tmp_path):
    """f64, s64, c128 and u64 parameters stay 64-bit (JAX's x64 mode is off, as by default):
    the outputs are numpy's to the last bit, whether the arguments come from a file or are drawn."""

    inputs = wide_arguments()
    np.savez(tmp_path / "args.npz", *inputs)
    result = replay_one(modules / "wide.hlo", devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
    assert result.num_partitions == 4 and shard_shapes(result) == [(4,), (4,), (16,), (16,)]
    assert [p.describe() for p in result.parameters] == ["x: f64[16]", "n: s64[16]", "z: c128[16]", "u: u64[16]"]
    check_wide_outputs(values(result), inputs)
    drawn = replay_one(modules / "wide.hlo", devices, argument_mode="random", seed=3)
    assert [o.dtype for o in values(drawn)] == [np.float64, np.int64, np.complex128, np.uint64]
    assert jnp.zeros(1).dtype == np.float32  # JAX's own default is untouched after the replay


# --- through the launcher: several processes ----------------------------------------------------

def test_two_processes_match_direct_run(sharded_dump, tmp_path):
    """2 processes x 4 devices replay the 8-device dump together, as `python -m launcher` runs it."""

    run = tmp_path / "run"
    run_cli("mode=hlo_replay", f"mode.hlo_file={sharded_dump['text']}", "mode.argument_mode=file",
            f"mode.arguments_file={sharded_dump['inputs']}", "mode.output_file=out.npz", "mode.num_repeats=2",
            "cluster=local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", run_dir=run)
    result = read_result(run)
    assert (result["num_processes"], result["global_devices"], result["num_partitions"]) == (2, 8, 8)
    assert len(result["execution_times_s"]) == 2 and result["compile_time_s"] > 0
    assert result["outputs_file"] == str(run / "out.npz")
    written = np.load(run / "out.npz")
    for k, e in zip(written.files, sharded_dump["outputs"], strict=True):
        np.testing.assert_allclose(written[k], e, rtol=1e-5, atol=1e-6)
    for rank in (0, 1):  # the runner's per-repeat profile lines, on every rank
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "execution time for repeat 2/2" in log


def test_64_bit_module_on_two_processes(modules, tmp_path):
    """wide.hlo split over 2 processes x 2 devices: each process makes its own shards of 64-bit
    arguments, and gathering the outputs to process 0 keeps their types."""

    run = tmp_path / "run"
    np.savez(tmp_path / "args.npz", *wide_arguments())
    run_cli("mode=hlo_replay", f"mode.hlo_file={modules / 'wide.hlo'}", "mode.argument_mode=file",
            f"mode.arguments_file={tmp_path / 'args.npz'}", "mode.output_file=out.npz",
            "cluster=local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=2", run_dir=run)
    result = read_result(run)
    assert (result["num_processes"], result["num_partitions"]) == (2, 4)
    assert [p["dtype"] for p in result["parameters"]] == ["f64", "s64", "c128", "u64"]
    written = np.load(run / "out.npz")
    check_wide_outputs([written[k] for k in written.files], wide_arguments())


def test_process_without_devices_in_the_module(modules, tmp_path):
    """A 2-device module on 2 processes x 4 devices runs on process 0's devices; process 1 still
    joins the output gather."""

    run = tmp_path / "run"
    arg = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.savez(tmp_path / "arg.npz", arg)
    run_cli("mode=hlo_replay", f"mode.hlo_file={modules / 'two_devices.hlo'}",
            "mode.argument_mode=file", f"mode.arguments_file={tmp_path / 'arg.npz'}", "mode.output_file=out.npz",
            "cluster=local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", run_dir=run)
    result = read_result(run)
    assert result["num_partitions"] == 2 and result["partitioner"] == "gspmd"
    assert result["parameters"][0]["shard_shape"] == [1, 3]
    np.testing.assert_array_equal(np.load(run / "out.npz")["arr_0"], 2 * arg)


@pytest.mark.slow
def test_replay_a_training_step_the_launcher_dumped(tmp_path):
    """launcher.xla_dump=true on a training run, then mode=hlo_replay on the dumped step."""

    cluster = ("cluster=local", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=2")
    run_cli("mode=train", "mode.steps=1", "mode.warmup_steps=0", "launcher.xla_dump=true", *cluster, run_dir=tmp_path / "train")
    (dump,) = (tmp_path / "train" / "xla_dump" / "rank0").glob("*jit_step.before_optimizations.txt")
    run_cli("mode=hlo_replay", f"mode.hlo_file={dump}", "mode.output_file=out.npz", *cluster,
            run_dir=tmp_path / "replay")
    result = read_result(tmp_path / "replay")
    assert result["num_partitions"] == 2 and result["partitioner"] == default_partitioner()
    assert len(result["parameters"]) > 10 and len(result["execution_times_s"]) == 1
    outputs = np.load(tmp_path / "replay" / "out.npz")
    assert len(outputs.files) == len(result["outputs"])
    # The step returns (state, loss): on random parameters and tokens the loss is still a
    # positive cross-entropy (random optimizer moments may be negative, so the new state may not be finite).
    loss = outputs[outputs.files[-1]]
    assert loss.shape == () and np.isfinite(loss) and loss > 0


def test_too_few_devices_through_the_launcher(spmd8, tmp_path):

    proc = run_cli("mode=hlo_replay", f"mode.hlo_file={spmd8}", "cluster=local", "cluster.tasks_per_node=1",
                   "cluster.cpu_devices_per_task=4", run_dir=tmp_path / "run", check=False)
    assert proc.returncode != 0
    assert ("spmd8.hlo needs 8 devices (num_partitions=8), this job has 4: raise cluster.tasks_per_node "
            "or cluster.cpu_devices_per_task") in proc.stdout + proc.stderr


# --- options ------------------------------------------------------------------------------------------


def test_compile_only(spmd8, devices):
    result = replay_one(spmd8, devices, run=False)
    assert result.compile_time_s > 0 and result.execution_times_s == [] and result.outputs == []
    assert result.summary()["parameters"][0]["shard_shape"] == [4, 2]


def test_repeats_are_timed_and_logged(tupled, devices, caplog):
    with caplog.at_level(logging.INFO, logger="launcher.hlo"):
        result = replay_one(tupled, devices, num_repeats=3)
    assert len(result.execution_times_s) == 3 and all(t > 0 for t in result.execution_times_s)
    lines = [r.getMessage() for r in caplog.records if "execution time for repeat" in r.getMessage()]
    assert [line.split("repeat ")[1].split(":")[0] for line in lines] == ["1/3", "2/3", "3/3"]


def test_random_arguments_are_seeded(tupled, devices):

    first, again, other = (values(replay_one(tupled, devices, seed=s))[0] for s in (3, 3, 4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # The module adds its tuple's two leaves: the output is the sum of the documented random arrays.
    expected = sum(random_values(3, i, (3, 2), None, np.float32) for i in range(2))
    np.testing.assert_array_equal(first, expected)
    assert -2 <= first.min() and first.max() < 2


def test_random_arguments_do_not_depend_on_sharding():
    """A shard of a random argument is the same block of the one global array, however it is cut."""

    full = random_values(7, 1, (6, 10), None, np.float32)
    block = (slice(2, 4), slice(5, 10))
    np.testing.assert_array_equal(random_values(7, 1, (6, 10), block, np.float32), full[block])
    ints = random_values(7, 2, (1000,), None, np.int32)
    assert ints.min() == 0 and ints.max() == 15
    assert random_values(7, 3, (), None, np.bool_).shape == ()


def test_zeros_and_device_id_arguments(spmd8, devices):
    zeros = values(replay_one(spmd8, devices, argument_mode="zeros"))[0]
    assert zeros.shape == (4, 6) and not zeros.any()
    # lhs f32[4,16] is split into 8 column blocks of 2, rhs f32[16,6] into 8 row blocks of 2; the
    # device with logical id d fills its blocks with d.
    lhs = np.repeat(np.arange(8, dtype=np.float32), 2)[None, :].repeat(4, axis=0)
    rhs = np.repeat(np.arange(8, dtype=np.float32), 2)[:, None].repeat(6, axis=1)
    got = values(replay_one(spmd8, devices, argument_mode="device_id"))[0]
    np.testing.assert_allclose(got, lhs @ rhs)  # 2 * sum(d^2) = 280 everywhere


def test_uninitialized_arguments_run(spmd8, devices):
    result = replay_one(spmd8, devices, argument_mode="uninitialized", num_repeats=2)
    assert values(result)[0].shape == (4, 6) and len(result.execution_times_s) == 2


def test_collective_over_8_replicas(modules, devices):

    result = replay_one(modules / "replica_sum.hlo", devices, seed=2)
    assert (result.num_replicas, result.num_partitions, result.partitioner) == (8, 1, "none")
    # Every replica holds the same random input; the all-reduce sums the 8 copies.
    np.testing.assert_allclose(values(result)[0], 8 * random_values(2, 0, (256,), None, np.float32), rtol=1e-6)


def test_replicas_and_partitions_from_the_options(modules, spmd8, devices):
    """The options override the module's own counts; each device's id goes into the all-reduce."""
    collective = modules / "replica_sum.hlo"  # replica_count=8, all-reduce over 8 ids
    default = replay_one(collective, devices, argument_mode="device_id")
    assert (default.num_replicas, default.num_partitions) == (8, 1)
    chosen = replay_one(collective, devices, argument_mode="device_id", num_replicas=2, num_partitions=4)
    assert (chosen.num_replicas, chosen.num_partitions) == (2, 4)
    for result in (default, chosen):
        np.testing.assert_array_equal(values(result)[0], np.full(256, sum(range(8)), np.float32))
    with pytest.raises(UserError, match=r"needs 16 devices \(num_partitions=16\), this job has 8"):
        replay_one(spmd8, devices, num_partitions=16)
    with pytest.raises(UserError, match="num_replicas=2 x num_partitions=4 with a sharded module cannot run"):
        replay_one(spmd8, devices, num_replicas=2, num_partitions=4)


# --- counts from the collectives: never fewer participants than they address ----------------------

REDUCER = """
    add {
      x = f32[] parameter(0)
      y = f32[] parameter(1)
      ROOT z = f32[] add(x, y)
    }
"""


def collective_module(tmp_path, name, body, header=""):
    """A module with no counts in its header (unless ``header``) whose entry is ``body``."""
    return write(tmp_path, f"{name}.hlo", f"HloModule {name}{header}\n" + textwrap.dedent(REDUCER)
                 + "\n" + textwrap.dedent(body))


def test_all_gather_without_groups_or_header_runs_on_the_replicas_it_gathers(devices, tmp_path, caplog):
    """f32[2] gathered into f32[8] along dimension 0: 4 replicas, each contributing its id."""
    path = collective_module(tmp_path, "gather", """
        ENTRY main {
          p = f32[2] parameter(0)
          ROOT g = f32[8] all-gather(p), dimensions={0}
        }
    """)
    with caplog.at_level(logging.INFO, logger="launcher.hlo"):
        result = replay_one(path, devices, argument_mode="device_id")
    assert (result.num_replicas, result.num_partitions) == (4, 1)
    np.testing.assert_array_equal(values(result)[0], np.repeat(np.arange(4, dtype=np.float32), 2))
    assert ("gather.hlo: num_replicas=4 from its collectives (all-gather %g: cross-replica, replica_groups={}, "
            "gathers 4 pieces along dimension 0); nothing else gives the replica count") in caplog.messages


def test_replica_groups_in_every_spelling_set_the_replica_count(devices, tmp_path):
    """Explicit groups, iota groups (with and without a transpose), inside a called computation too."""
    cases = {  # replica_groups -> (replicas, what device 0 sums: the ids of its group)
        "{{0,1,2,3}}": (4, 0 + 1 + 2 + 3),
        "[2,4]<=[8]": (8, 0 + 1 + 2 + 3),
        "[4,2]<=[2,4]T(1,0)": (8, 0 + 4),
    }
    for i, (groups, (replicas, total)) in enumerate(cases.items()):
        path = collective_module(tmp_path, f"sum{i}", f"""
            body {{
              b = f32[2] parameter(0)
              ROOT s = f32[2] all-reduce(b), replica_groups={groups}, to_apply=add
            }}

            ENTRY main {{
              p = f32[2] parameter(0)
              ROOT c = f32[2] call(p), to_apply=body
            }}
        """)
        result = replay_one(path, devices, argument_mode="device_id")
        assert (result.num_replicas, result.num_partitions) == (replicas, 1), groups
        np.testing.assert_array_equal(values(result)[0], np.full(2, total, np.float32))


def test_channel_ids_make_the_ids_partitions_or_global_devices(devices, tmp_path):
    """XLA's group modes: a collective-permute with a channel_id addresses partitions; flattened
    ids (channel_id, use_global_device_ids=true) count devices, replicas when nothing says otherwise."""

    permute = collective_module(tmp_path, "permute", """
        ENTRY main {
          p = f32[2] parameter(0)
          ROOT r = f32[2] collective-permute(p), channel_id=1, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
        }
    """)
    result = replay_one(permute, devices, argument_mode="device_id")
    assert (result.num_replicas, result.num_partitions) == (1, 4)
    np.testing.assert_array_equal(values(result)[0], np.full(2, 3, np.float32))  # device 0 hears from 3
    flattened = collective_module(tmp_path, "flattened", """
        ENTRY main {
          p = f32[8] parameter(0)
          ROOT r = f32[2] reduce-scatter(p), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true,
            dimensions={0}, to_apply=add
        }
    """)
    (need,) = load(flattened).collectives
    assert (need.unit, need.count, need.exact) == ("devices", 4, True)
    assert replay_one(flattened, devices).num_replicas == 4
    assert replay_one(flattened, devices, num_partitions=2).num_replicas == 2
    # Each spelling of the groups, as the parser prints them back.
    needs = collective_needs(load(collective_module(tmp_path, "spellings", """
        ENTRY main {
          p = f32[2] parameter(0)
          g = f32[8] all-gather(p), dimensions={0}
          a = f32[8] all-to-all(g), replica_groups=[1,4]<=[4], dimensions={0}
          ROOT s = f32[2] reduce-scatter(a), replica_groups={}, dimensions={0}, to_apply=add
        }
    """)).text)
    assert [(n.instruction, n.unit, n.count) for n in needs] == [
        ("all-gather %g", "replicas", 4), ("all-to-all %a", "replicas", 4), ("reduce-scatter %s", "replicas", 4)]


def test_collectives_that_disagree_are_refused(devices, tmp_path):
    path = collective_module(tmp_path, "disagree", """
        ENTRY main {
          p = f32[2] parameter(0)
          g = f32[8] all-gather(p), dimensions={0}
          ROOT s = f32[8] all-reduce(g), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=add
        }
    """)
    with pytest.raises(UserError) as e:
        replay_one(path, devices)
    assert str(e.value) == (
        "disagree.hlo: its collectives disagree on how many replicas it runs on (all-gather %g (cross-replica, "
        "replica_groups={}, gathers 4 pieces along dimension 0): 4 replicas; all-reduce %s (cross-replica, "
        "replica_groups={{0,1,2,3,4,5,6,7}}): 8 replicas): it needs at least 8 replicas. Set the counts it was "
        "written for with mode.num_replicas=<n> and/or mode.num_partitions=<n>")


def test_counts_given_below_what_the_collectives_need_are_refused(modules, devices, tmp_path):
    permute = collective_module(tmp_path, "permute6", """
        ENTRY main {
          p = f32[2] parameter(0)
          ROOT r = f32[2] collective-permute(p), source_target_pairs={{0,5}}
        }
    """, header=", replica_count=4")
    with pytest.raises(UserError) as e:
        replay_one(permute, devices)
    assert str(e.value) == ("permute6.hlo: its collectives need 6 replicas (collective-permute %r: cross-replica, "
                            "source_target_pairs up to id 5), but the module header's replica_count=4 gives 4: "
                            "set mode.num_replicas=6")
    # replica_sum.hlo: flattened ids 0..7, so num_replicas x num_partitions must reach 8.
    with pytest.raises(UserError) as e:
        replay_one(modules / "replica_sum.hlo", devices, num_replicas=2, num_partitions=2)
    assert str(e.value) == ("replica_sum.hlo: its collectives need 8 devices (replicas x partitions) (all-reduce "
                            "%summed: flattened ids, replica_groups={{0,1,2,3,4,5,6,7}}), but num_replicas=2 x "
                            "num_partitions=2 gives 4: set mode.num_replicas=<r> and mode.num_partitions=<p> with "
                            "r x p = 8")


def test_collectives_needing_more_devices_than_the_job_has(devices, tmp_path):
    path = collective_module(tmp_path, "wide", """
        ENTRY main {
          p = f32[2] parameter(0)
          ROOT s = f32[2] all-reduce(p), replica_groups=[1,16]<=[16], to_apply=add
        }
    """)
    with pytest.raises(UserError) as e:
        replay_one(path, devices)
    assert str(e.value) == ("wide.hlo needs 16 devices (num_replicas=16), this job has 8: "
                            "raise cluster.tasks_per_node or cluster.cpu_devices_per_task")


def test_xla_flags_reach_the_compiler(tupled, devices, tmp_path):
    dump = tmp_path / "dump"
    replay_one(tupled, devices, xla_flags=f"--xla_dump_to={dump} --xla_dump_hlo_as_text", run=False)
    assert list(dump.glob("*after_optimizations.txt")), "the dump flag did not reach XLA"


def test_backend_only_replays_an_optimized_single_device_module(devices, tmp_path):
    optimized = write(tmp_path, "opt.hlo", """
        HloModule opt, is_scheduled=true, entry_computation_layout={(f32[4]{0})->f32[4]{0}}

        ENTRY main {
          p = f32[4]{0} parameter(0)
          ROOT n = f32[4]{0} negate(p)
        }
    """)
    np.savez(tmp_path / "a.npz", np.arange(4, dtype=np.float32))
    result = replay_one(optimized, devices, backend_only=True, argument_mode="file",
                        arguments_file=tmp_path / "a.npz")
    np.testing.assert_array_equal(values(result)[0], -np.arange(4, dtype=np.float32))


def test_elided_constants_are_filled_per_argument_mode(devices, tmp_path, caplog):
    hlo = write(tmp_path, "c.hlo", """
        HloModule c

        ENTRY main {
          p = f32[3,4]{1,0} parameter(0)
          c = f32[3,4]{1,0} constant({...})
          ROOT a = f32[3,4]{1,0} add(p, c)
        }
    """)
    with caplog.at_level(logging.WARNING, logger="launcher.hlo"):
        zeros = replay_one(hlo, devices, argument_mode="zeros")
    assert zeros.elided_constants == 1 and not values(zeros)[0].any()
    assert "1 constants were printed without their values" in caplog.text
    first, again = (values(replay_one(hlo, devices, seed=5))[0] for _ in range(2))
    np.testing.assert_array_equal(first, again)
    np.savez(tmp_path / "z.npz", np.zeros((3, 4), np.float32))
    constant = values(replay_one(hlo, devices, argument_mode="file", arguments_file=tmp_path / "z.npz", seed=5))[0]
    # Random constants sit on the k/64 grid in [-1, 1), and are not all the same value.
    assert np.array_equal(constant * 64, np.round(constant * 64)) and -1 <= constant.min() and constant.max() < 1
    assert len(np.unique(constant)) > 1


def test_several_files_and_globs(modules, spmd8, devices, tmp_path):

    paths = expand([str(modules / "t*.hlo"), str(spmd8)])
    assert [p.name for p in paths] == ["tupled.hlo", "two_devices.hlo", "spmd8.hlo"]
    results = replay(paths, ReplayOptions(output_file=tmp_path / "out.npz"), devices)
    assert [r.outputs_file.name for r in results] == ["out.tupled.npz", "out.two_devices.npz", "out.spmd8.npz"]
    assert [r.num_partitions for r in results] == [1, 2, 8]


# --- errors ---------------------------------------------------------------------------------------

def test_missing_file_and_empty_glob(tmp_path):

    with pytest.raises(UserError, match=r"mode.hlo_file: .*nope.hlo .*does not exist"):
        expand(str(tmp_path / "nope.hlo"))
    with pytest.raises(UserError, match=r"no file matches .*\*.hlo"):
        expand(str(tmp_path / "*.hlo"))
    with pytest.raises(UserError, match="mode.hlo_file is not set"):
        expand(None)


def test_parse_error_names_line_and_column(devices, tmp_path):
    bad = write(tmp_path, "bad.hlo", """
        HloModule bad

        ENTRY main {
          p = f32[2] parameter(0)
          ROOT r = f32[2] frobnicate(p)
        }
    """)
    with pytest.raises(UserError) as e:
        replay_one(bad, devices)
    first = str(e.value).splitlines()[0]
    assert first.startswith(f"{bad}:5:19: ") and "frobnicate" in first
    assert "^" in str(e.value)


def test_parse_error_columns_are_those_of_the_file_even_with_elided_constants(devices, tmp_path):
    bad = write(tmp_path, "bad.hlo", """
        HloModule bad

        ENTRY main {
          c = f32[20]{0} constant({...}), bogus_attribute=1
          ROOT r = f32[20]{0} negate(c)
        }
    """)
    with pytest.raises(UserError, match=rf"^{bad}:4:35: "):
        replay_one(bad, devices)


def test_proto_wrappers_are_unwrapped(tupled, devices, tmp_path):
    """A bare HloModuleProto, and one wrapped in an HloSnapshot's HloProto (field 1 of each)."""

    def field_1(payload: bytes) -> bytes:
        size, varint = len(payload), b""
        while True:
            varint += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
            size >>= 7
            if not size:
                return b"\x0a" + varint + payload

    module = _xla.module_proto(_xla.parse_text(tupled.read_text()))
    for name, data in (("bare.pb", module), ("snapshot.pb", field_1(field_1(module)))):
        (tmp_path / name).write_bytes(data)
        np.savez(tmp_path / "args.npz", np.ones((3, 2), np.float32), np.full((3, 2), 2, np.float32))
        result = replay_one(tmp_path / name, devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
        np.testing.assert_array_equal(values(result)[0], np.full((3, 2), 3, np.float32))


def test_not_a_module(devices, tmp_path):
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\x08\x96\x01\xff\xff")
    with pytest.raises(UserError, match="not HLO text and not a readable protobuf"):
        replay_one(junk, devices)
    empty = tmp_path / "empty.hlo"
    empty.write_text("\n")
    with pytest.raises(UserError, match="the file is empty"):
        replay_one(empty, devices)


def test_too_few_devices(spmd8, devices):
    with pytest.raises(UserError) as e:
        replay_one(spmd8, devices[:4])
    assert str(e.value) == ("spmd8.hlo needs 8 devices (num_partitions=8), this job has 4: "
                            "raise cluster.tasks_per_node or cluster.cpu_devices_per_task")


def test_arguments_file_mismatches_name_the_parameter(spmd8, devices, tmp_path):
    cases = {
        "count": ([np.zeros((4, 16), np.float32)], r"holds 1 arrays but the module has 2 parameters \(lhs: f32\[4,16\]"),
        "shape": ([np.zeros((4, 16), np.float32), np.zeros((16, 7), np.float32)],
                  r"entry 'arr_1' is f32\[16,7\], but parameter 1 \(rhs: f32\[16,6\]\) needs f32\[16,6\]"),
        "dtype": ([np.zeros((4, 16), np.float64), np.zeros((16, 6), np.float32)],
                  r"entry 'arr_0' is f64\[4,16\], but parameter 0 \(lhs: f32\[4,16\]\) needs f32\[4,16\]"),
    }
    for name, (arrays, message) in cases.items():
        np.savez(tmp_path / f"{name}.npz", *arrays)
        with pytest.raises(UserError, match=message):
            replay_one(spmd8, devices, argument_mode="file", arguments_file=tmp_path / f"{name}.npz")
    with pytest.raises(UserError, match="needs mode.arguments_file"):
        replay_one(spmd8, devices, argument_mode="file")


def test_gpu_fused_module_names_the_dump_to_replay(devices, tmp_path):
    """A module XLA already fused for a GPU (a custom fusion, as XLA's GPU pipeline leaves
    them) cannot compile again on CPU: the message says to replay the before-optimizations dump."""
    fused = write(tmp_path, "fused.hlo", """
        HloModule fused

        dot_fusion {
          a = f32[4,4] parameter(0)
          b = f32[4,4] parameter(1)
          ROOT d = f32[4,4] dot(a, b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
        }

        ENTRY main {
          x = f32[4,4] parameter(0)
          y = f32[4,4] parameter(1)
          ROOT f = f32[4,4] fusion(x, y), kind=kCustom, calls=dot_fusion,
            backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
        }
    """)
    with pytest.raises(UserError, match=r"fused.hlo was already optimized for a backend .*"
                                        r"Replay the module's \*before_optimizations\* dump instead"):
        replay_one(fused, devices)


class Without:
    """A stand-in for a module that lacks some attributes and has every other one of ``real``'s."""

    def __init__(self, real, *missing: str, **replaced):
        self._real, self._missing, self._replaced = real, set(missing), replaced

    def __getattr__(self, name):
        if name in self._missing:
            raise AttributeError(name)
        if name in self._replaced:
            return self._replaced[name]
        return getattr(self._real, name)


def test_a_jaxlib_with_the_internals_is_used_whatever_its_version():

    assert _xla.check_jaxlib(jaxlib.__version__) is not None  # the installed one
    assert _xla.check_jaxlib("0.99.0") is not None  # no upper bound: what counts is what it has


def test_a_jaxlib_without_the_internals_is_refused_naming_what_it_lacks():

    known = rf"known to work with jaxlib 0\.4\.35 to {_xla.KNOWN_WORKING[-1]} \(tested: 0\.4\.35, .*\)"
    # No HLO text parser under either spelling.
    with pytest.raises(UserError, match=rf"^HLO replay cannot run on jaxlib 0\.99\.0: it lacks "
                                        rf"jaxlib\.xla_client\.hlo\.hlo_module_from_text or "
                                        rf"jaxlib\.xla_client\._xla\.hlo_module_from_text.*{known}"):
        _xla.check_jaxlib("0.99.0", xc_module=Without(xla_client, "hlo", "_xla"))
    # Neither HLO -> MLIR converter; no executable sharding query: every missing internal is named.
    jax_without_mlir = Without(jax, extend=Without(jax.extend, "mlir"))
    client = Without(xla_client, "_xla", LoadedExecutable=Without(xla_client.LoadedExecutable,
                                                                  "get_parameter_shardings"))
    with pytest.raises(UserError) as e:
        _xla.check_jaxlib("0.3.25", jax_module=jax_without_mlir, xc_module=client)
    message = str(e.value)
    assert message.startswith("HLO replay cannot run on jaxlib 0.3.25: it lacks ")
    for what in ("jaxlib.xla_client.LoadedExecutable.get_parameter_shardings",
                 "jax.extend.mlir.hlo_to_stablehlo or jaxlib.xla_client._xla.mlir.xla_computation_to_mlir_module"):
        assert what in message
    assert "0.4.35" in message and _xla.KNOWN_WORKING[-1] in message


def test_bad_options(tupled, spmd8, devices):

    with pytest.raises(UserError, match=r"mode.argument_mode='ones': expected one of random, zeros"):
        ReplayOptions(argument_mode="ones")
    with pytest.raises(UserError, match="mode.num_repeats=0"):
        ReplayOptions(num_repeats=0)
    with pytest.raises(UserError, match=r"mode.xla_flags: .*xla_no_such_flag.*not an XLA compile option"):
        replay_one(tupled, devices, xla_flags=["--xla_no_such_flag=1"], run=False)
    with pytest.raises(UserError, match="mode.backend_only: spmd8.hlo has num_partitions=8"):
        replay_one(spmd8, devices, backend_only=True)
