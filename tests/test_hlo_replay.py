"""HLO replay: dumps of real programs replay to the program's own outputs, and the options and
error cases behave as documented.

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

if jax.config.jax_num_cpu_devices < 8:
    try:
        jax.config.update("jax_num_cpu_devices", 8)
    except RuntimeError:
        pass  # the backend is already up: the `devices` fixture reports it

import numpy as np
import pytest

from launcher.errors import UserError

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures" / "xla_hlo"
SPMD8 = FIXTURES / "spmd_8_devices.hlo"
TUPLED = FIXTURES / "single_device_tupled.hlo"

# A sharded training step (MLP loss and gradients, data over "x", hidden units over "y"),
# dumped by XLA itself as text and proto, with its inputs and outputs saved beside the dump.
DUMP_PROGRAM = textwrap.dedent("""
    import sys
    from pathlib import Path
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
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


@pytest.fixture(scope="module")
def devices():
    have = jax.devices()
    assert len(have) >= 8, (f"these tests need 8 CPU devices but JAX started with {len(have)}: something "
                            "initialised JAX before this file was imported")
    return have[:8]


@pytest.fixture(scope="module")
def sharded_dump(tmp_path_factory):
    """XLA's own dump of the sharded step (run in a fresh process with XLA_FLAGS set)."""
    out = tmp_path_factory.mktemp("dump")
    env = {**os.environ, "XLA_FLAGS": f"--xla_dump_to={out / 'xla'} --xla_dump_hlo_as_text --xla_dump_hlo_as_proto"}
    subprocess.run([sys.executable, "-c", DUMP_PROGRAM, str(out)], check=True, env=env, timeout=180, cwd=REPO)
    (text,) = (out / "xla").glob("*jit_step.before_optimizations.txt")
    (proto,) = (out / "xla").glob("*jit_step.before_optimizations.hlo.pb")
    expected = np.load(out / "outputs.npz")
    return {"text": text, "proto": proto, "inputs": out / "inputs.npz",
            "outputs": [expected[k] for k in expected.files]}


def replay_one(path, devices, **options):
    from launcher.hlo.options import ReplayOptions
    from launcher.hlo.replay import replay_file

    return replay_file(path, ReplayOptions(**options), devices)


def values(result):
    from launcher.hlo.replay import fetch

    return fetch(result.outputs)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


# --- dump, then replay: same outputs as the program itself --------------------------------------

def test_single_device_dump_matches_direct_run(tmp_path, devices):
    import jax.numpy as jnp

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


@pytest.mark.parametrize("kind", ["text", "proto"])
def test_sharded_dump_matches_direct_run(sharded_dump, devices, kind, tmp_path):
    result = replay_one(sharded_dump[kind], devices, argument_mode="file", arguments_file=sharded_dump["inputs"],
                        output_file=tmp_path / "out.npz")
    assert result.num_partitions == 8 and result.partitioner == "shardy"
    # The parameters stay sharded as the program asked: w1 over "y" (4), x over "x" (2).
    shard_shapes = [s.shard_shape(p.shape) for p, s in zip(result.parameters, result.parameter_shardings)]
    assert shard_shapes == [(8, 4), (4, 4), (16, 8), (16, 4)]
    got = values(result)
    assert len(got) == len(sharded_dump["outputs"]) == 3
    for g, e in zip(got, sharded_dump["outputs"]):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    written = np.load(result.outputs_file)
    for g, k in zip(got, written.files):
        np.testing.assert_array_equal(written[k], g)


def test_lowered_gspmd_module_replays_with_gspmd(tmp_path, devices):
    """A module lowered with Shardy off carries only GSPMD shardings and compiles with GSPMD."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

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


# --- through the launcher: several processes ----------------------------------------------------

def test_two_processes_match_direct_run(sharded_dump, tmp_path):
    """2 processes x 4 devices replay the 8-device dump together, as `python -m launcher` runs it."""
    from tests.launch import read_result, run_cli

    run = tmp_path / "run"
    run_cli("mode=hlo_replay", f"mode.hlo_file={sharded_dump['text']}", "mode.argument_mode=file",
            f"mode.arguments_file={sharded_dump['inputs']}", "mode.output_file=out.npz", "mode.num_repeats=2",
            "cluster=local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", run_dir=run)
    result = read_result(run)
    assert (result["num_processes"], result["global_devices"], result["num_partitions"]) == (2, 8, 8)
    assert len(result["execution_times_s"]) == 2 and result["compile_time_s"] > 0
    assert result["outputs_file"] == str(run / "out.npz")
    written = np.load(run / "out.npz")
    for k, e in zip(written.files, sharded_dump["outputs"]):
        np.testing.assert_allclose(written[k], e, rtol=1e-5, atol=1e-6)
    for rank in (0, 1):  # the runner's per-repeat profile lines, on every rank
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "execution time for repeat 2/2" in log


def test_process_without_devices_in_the_module(tmp_path):
    """A 2-device module on 2 processes x 4 devices runs on process 0's devices; process 1 still
    joins the output gather."""
    from tests.launch import read_result, run_cli

    run = tmp_path / "run"
    arg = np.array([[1, 2], [3, 4]], np.float32)
    np.savez(tmp_path / "arg.npz", arg)
    run_cli("mode=hlo_replay", f"mode.hlo_file={FIXTURES / 'sharded_2_devices.hlo'}",
            "mode.argument_mode=file", f"mode.arguments_file={tmp_path / 'arg.npz'}", "mode.output_file=out.npz",
            "cluster=local", "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", run_dir=run)
    assert read_result(run)["num_partitions"] == 2
    np.testing.assert_array_equal(np.load(run / "out.npz")["arr_0"], 2 * arg)


@pytest.mark.slow
def test_replay_a_training_step_the_launcher_dumped(tmp_path):
    """launcher.xla_dump=true on a training run, then mode=hlo_replay on the dumped step."""
    from tests.launch import read_result, run_cli

    cluster = ("cluster=local", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=2")
    run_cli("mode=train", "mode.steps=1", "mode.warmup_steps=0", "launcher.xla_dump=true", *cluster, run_dir=tmp_path / "train")
    (dump,) = (tmp_path / "train" / "xla_dump" / "rank0").glob("*jit_step.before_optimizations.txt")
    run_cli("mode=hlo_replay", f"mode.hlo_file={dump}", "mode.output_file=out.npz", *cluster,
            run_dir=tmp_path / "replay")
    result = read_result(tmp_path / "replay")
    assert result["num_partitions"] == 2 and result["partitioner"] == "shardy"
    assert len(result["parameters"]) > 10 and len(result["execution_times_s"]) == 1
    outputs = np.load(tmp_path / "replay" / "out.npz")
    assert len(outputs.files) == len(result["outputs"])
    # The step returns (state, loss): on random parameters and tokens the loss is still a
    # positive cross-entropy (random optimizer moments may be negative, so the new state may not be finite).
    loss = outputs[outputs.files[-1]]
    assert loss.shape == () and np.isfinite(loss) and loss > 0


def test_too_few_devices_through_the_launcher(tmp_path):
    from tests.launch import run_cli

    proc = run_cli("mode=hlo_replay", f"mode.hlo_file={SPMD8}", "cluster=local", "cluster.tasks_per_node=1",
                   "cluster.cpu_devices_per_task=4", run_dir=tmp_path / "run", check=False)
    assert proc.returncode != 0
    assert ("spmd_8_devices.hlo needs 8 devices (num_partitions=8), this job has 4: raise cluster.tasks_per_node "
            "or cluster.cpu_devices_per_task") in proc.stdout + proc.stderr


# --- options ------------------------------------------------------------------------------------------


def test_compile_only(devices):
    result = replay_one(SPMD8, devices, run=False)
    assert result.compile_time_s > 0 and result.execution_times_s == [] and result.outputs == []
    assert result.summary()["parameters"][0]["shard_shape"] == [8, 2]


def test_repeats_are_timed_and_logged(devices, caplog):
    with caplog.at_level(logging.INFO, logger="launcher.hlo"):
        result = replay_one(TUPLED, devices, num_repeats=3)
    assert len(result.execution_times_s) == 3 and all(t > 0 for t in result.execution_times_s)
    lines = [r.getMessage() for r in caplog.records if "execution time for repeat" in r.getMessage()]
    assert [line.split("repeat ")[1].split(":")[0] for line in lines] == ["1/3", "2/3", "3/3"]


def test_random_arguments_are_seeded(devices):
    from launcher.hlo.arguments import random_values

    first, again, other = (values(replay_one(TUPLED, devices, seed=s))[0] for s in (3, 3, 4))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # The module adds its two parameters: the output is the sum of the documented random arrays.
    expected = sum(random_values(3, i, (2, 2), None, np.float32) for i in range(2))
    np.testing.assert_array_equal(first, expected)
    assert -2 <= first.min() and first.max() < 2


def test_random_arguments_do_not_depend_on_sharding():
    """A shard of a random argument is the same block of the one global array, however it is cut."""
    from launcher.hlo.arguments import random_values

    full = random_values(7, 1, (6, 10), None, np.float32)
    block = (slice(2, 4), slice(5, 10))
    np.testing.assert_array_equal(random_values(7, 1, (6, 10), block, np.float32), full[block])
    ints = random_values(7, 2, (1000,), None, np.int32)
    assert ints.min() == 0 and ints.max() == 15
    assert random_values(7, 3, (), None, np.bool_).shape == ()


def test_zeros_and_device_id_arguments(devices):
    zeros = values(replay_one(SPMD8, devices, argument_mode="zeros"))[0]
    assert zeros.shape == (8, 24) and not zeros.any()
    # p0 f32[8,16] is split into 8 column blocks of 2, p1 f32[16,24] into 8 row blocks of 2; the
    # device with logical id d fills its blocks with d.
    p0 = np.repeat(np.arange(8, dtype=np.float32), 2)[None, :].repeat(8, axis=0)
    p1 = np.repeat(np.arange(8, dtype=np.float32), 2)[:, None].repeat(24, axis=1)
    got = values(replay_one(SPMD8, devices, argument_mode="device_id"))[0]
    np.testing.assert_allclose(got, p0 @ p1)  # 2 * sum(d^2) = 280 everywhere


def test_uninitialized_arguments_run(devices):
    result = replay_one(SPMD8, devices, argument_mode="uninitialized", num_repeats=2)
    assert values(result)[0].shape == (8, 24) and len(result.execution_times_s) == 2


def test_replicas_and_partitions_from_the_options(devices):
    """The options override the module's own counts; each device's id goes into the all-reduce."""
    collective = FIXTURES / "gpu_hlo_collective_topology.hlo"  # replica_count=8, all-reduce over 8 ids
    default = replay_one(collective, devices, argument_mode="device_id")
    assert (default.num_replicas, default.num_partitions) == (8, 1)
    chosen = replay_one(collective, devices, argument_mode="device_id", num_replicas=2, num_partitions=4)
    assert (chosen.num_replicas, chosen.num_partitions) == (2, 4)
    for result in (default, chosen):
        np.testing.assert_array_equal(values(result)[0], np.full(1024, sum(range(8)), np.float32))
    with pytest.raises(UserError, match=r"needs 16 devices \(num_partitions=16\), this job has 8"):
        replay_one(SPMD8, devices, num_partitions=16)
    with pytest.raises(UserError, match="num_replicas=2 x num_partitions=4 with a sharded module cannot run"):
        replay_one(SPMD8, devices, num_replicas=2, num_partitions=4)


def test_xla_flags_reach_the_compiler(devices, tmp_path):
    dump = tmp_path / "dump"
    replay_one(TUPLED, devices, xla_flags=f"--xla_dump_to={dump} --xla_dump_hlo_as_text", run=False)
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


def test_several_files_and_globs(devices, tmp_path):
    from launcher.hlo.module import expand
    from launcher.hlo.options import ReplayOptions
    from launcher.hlo.replay import replay

    paths = expand([str(FIXTURES / "single_device_*.hlo"), str(SPMD8)])
    assert [p.name for p in paths] == ["single_device_tupled.hlo", "spmd_8_devices.hlo"]
    results = replay(paths, ReplayOptions(output_file=tmp_path / "out.npz"), devices)
    assert [r.outputs_file.name for r in results] == ["out.single_device_tupled.npz", "out.spmd_8_devices.npz"]


# --- errors ---------------------------------------------------------------------------------------

def test_missing_file_and_empty_glob(tmp_path):
    from launcher.hlo.module import expand

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


def test_proto_wrappers_are_unwrapped(devices, tmp_path):
    """A bare HloModuleProto, and one wrapped in an HloSnapshot's HloProto (field 1 of each)."""
    from jaxlib import xla_client as xc

    def field_1(payload: bytes) -> bytes:
        size, varint = len(payload), b""
        while True:
            varint += bytes([(size & 0x7F) | (0x80 if size > 0x7F else 0)])
            size >>= 7
            if not size:
                return b"\x0a" + varint + payload

    module = xc.hlo.hlo_module_from_text(TUPLED.read_text()).as_serialized_hlo_module_proto()
    for name, data in (("bare.pb", module), ("snapshot.pb", field_1(field_1(module)))):
        (tmp_path / name).write_bytes(data)
        np.savez(tmp_path / "args.npz", np.ones((2, 2), np.float32), np.full((2, 2), 2, np.float32))
        result = replay_one(tmp_path / name, devices, argument_mode="file", arguments_file=tmp_path / "args.npz")
        np.testing.assert_array_equal(values(result)[0], np.full((2, 2), 3, np.float32))


def test_not_a_module(devices, tmp_path):
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\x08\x96\x01\xff\xff")
    with pytest.raises(UserError, match="not HLO text and not a readable protobuf"):
        replay_one(junk, devices)
    empty = tmp_path / "empty.hlo"
    empty.write_text("\n")
    with pytest.raises(UserError, match="the file is empty"):
        replay_one(empty, devices)


def test_too_few_devices(devices):
    with pytest.raises(UserError) as e:
        replay_one(SPMD8, devices[:4])
    assert str(e.value) == ("spmd_8_devices.hlo needs 8 devices (num_partitions=8), this job has 4: "
                            "raise cluster.tasks_per_node or cluster.cpu_devices_per_task")


def test_arguments_file_mismatches_name_the_parameter(devices, tmp_path):
    cases = {
        "count": ([np.zeros((8, 16), np.float32)], r"holds 1 arrays but the module has 2 parameters \(p0: f32\[8,16\]"),
        "shape": ([np.zeros((8, 16), np.float32), np.zeros((16, 25), np.float32)],
                  r"entry 'arr_1' is f32\[16,25\], but parameter 1 \(p1: f32\[16,24\]\) needs f32\[16,24\]"),
        "dtype": ([np.zeros((8, 16), np.float64), np.zeros((16, 24), np.float32)],
                  r"entry 'arr_0' is f64\[8,16\], but parameter 0 \(p0: f32\[8,16\]\) needs f32\[8,16\]"),
    }
    for name, (arrays, message) in cases.items():
        np.savez(tmp_path / f"{name}.npz", *arrays)
        with pytest.raises(UserError, match=message):
            replay_one(SPMD8, devices, argument_mode="file", arguments_file=tmp_path / f"{name}.npz")
    with pytest.raises(UserError, match="needs mode.arguments_file"):
        replay_one(SPMD8, devices, argument_mode="file")


def test_jaxlib_outside_the_supported_range_is_named():
    from launcher.hlo import _xla

    _xla._check_jaxlib(jax.__version__)  # the installed one is supported
    with pytest.raises(UserError, match=r"supports jaxlib >=0.10.2,<0.11, but jaxlib 0.11.0 is installed"):
        _xla._check_jaxlib("0.11.0")


def test_bad_options(devices):
    from launcher.hlo.options import ReplayOptions

    with pytest.raises(UserError, match=r"mode.argument_mode='ones': expected one of random, zeros"):
        ReplayOptions(argument_mode="ones")
    with pytest.raises(UserError, match="mode.num_repeats=0"):
        ReplayOptions(num_repeats=0)
    with pytest.raises(UserError, match=r"mode.xla_flags: .*xla_no_such_flag.*not an XLA compile option"):
        replay_one(TUPLED, devices, xla_flags=["--xla_no_such_flag=1"], run=False)
    with pytest.raises(UserError, match="mode.backend_only: spmd_8_devices.hlo has num_partitions=8"):
        replay_one(SPMD8, devices, backend_only=True)


