"""The XLA authors' own HLO modules (../shared/fixtures/xla_hlo, see its MANIFEST.md) replay as far
as the MANIFEST says they can, and give the right numbers; the one that cannot says why.

The outside conformance suite: the folder sits beside the checkout (on the development machine
and in CI), never in it. Where it is absent, tests/conftest.py leaves this file uncollected and
says so in one line; tests/test_hlo_replay.py proves the same behaviours on modules it makes.

Needs 8 virtual CPU devices: see tests/test_hlo_replay.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from launcher.errors import UserError
# The 8-device request and the check of it live with the other replay tests.
from tests.test_hlo_replay import eight_devices
from launcher.hlo.options import ReplayOptions
from launcher.hlo.replay import fetch, replay_file
from launcher.hlo.arguments import random_values

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "xla_hlo"


@pytest.fixture(scope="module")
def devices():
    return eight_devices()


def replay(name, devices, tmp_path=None, inputs=None, **options):
    """Replays a fixture; ``inputs`` become an arguments file. Returns (result, output values)."""

    if inputs is not None:
        np.savez(tmp_path / "args.npz", *inputs)
        options.update(argument_mode="file", arguments_file=tmp_path / "args.npz")
    result = replay_file(FIXTURES / name, ReplayOptions(**options), devices)
    return result, fetch(result.outputs)


def shard_shapes(result):
    return [s.shard_shape(p.shape) for p, s in zip(result.parameters, result.parameter_shardings, strict=True)]


def test_every_fixture_is_covered():
    covered = {"graphsage_tf.hlo", "test_hlo.txt", "single_device_tupled.hlo", "while_with_known_trip_count.hlo",
               "multiple_gemm_fusions.hlo", "sharded_2_devices.hlo", "spmd.hlo", "spmd_8_devices.hlo",
               "sharded_computation.hlo", "gpu_hlo_collective_topology.hlo"}
    assert {p.name for p in FIXTURES.iterdir() if p.name != "MANIFEST.md"} == covered


def test_single_device_tupled(devices, tmp_path):
    a, b = np.arange(4, dtype=np.float32).reshape(2, 2), np.full((2, 2), 10, np.float32)
    result, (out,) = replay("single_device_tupled.hlo", devices, tmp_path, inputs=[a, b])
    # One tuple parameter, flattened into its two leaves.
    assert [p.name for p in result.parameters] == ["arg_tuple[0]", "arg_tuple[1]"]
    np.testing.assert_array_equal(out, a + b)


def test_while_with_known_trip_count(devices):
    result, (out,) = replay("while_with_known_trip_count.hlo", devices)
    assert result.parameters == [] and int(out) == 7


@pytest.mark.slow
@pytest.mark.heavy  # the largest modules of the outside suite (18 s, 9 s): the others run by default
def test_graphsage_elided_constants_give_finite_outputs(devices):
    """XLA's parser fills {...} with a counter that reads as NaN in bf16; replay fills them itself."""
    result, (out,) = replay("graphsage_tf.hlo", devices)
    assert result.elided_constants == 11
    assert out.shape == (1, 121) and np.isfinite(out).all()
    # With zero constants (zero weights and biases) every logistic output is exactly 1/2.
    _, (zero_out,) = replay("graphsage_tf.hlo", devices, argument_mode="zeros")
    np.testing.assert_array_equal(zero_out, np.full((1, 121), 0.5, np.float32))


@pytest.mark.slow
@pytest.mark.heavy  # see test_graphsage_elided_constants_give_finite_outputs
def test_large_convolution(devices):
    """1.1 GiB of input: uninitialized arguments skip making the data."""
    result, (out,) = replay("test_hlo.txt", devices, argument_mode="uninitialized")
    assert out.shape == (32, 24, 1024, 1) and out.dtype == np.float32
    assert len(result.execution_times_s) == 1


def test_gpu_fusions_cannot_compile_on_cpu(devices):
    with pytest.raises(UserError, match=r"multiple_gemm_fusions.hlo was already optimized for a backend .*"
                                        r"Fusion must have backend config.*\*before_optimizations\* dump"):
        replay("multiple_gemm_fusions.hlo", devices)


def test_sharded_2_devices(devices, tmp_path):
    arg = np.array([[1, 2], [3, 4]], np.float32)
    result, (out,) = replay("sharded_2_devices.hlo", devices, tmp_path, inputs=[arg])
    assert (result.num_partitions, result.partitioner) == (2, "gspmd")
    assert shard_shapes(result) == [(2, 1)]
    np.testing.assert_array_equal(out, arg + arg)


def test_spmd_partitions_from_header(devices, tmp_path):
    rng = np.random.default_rng(0)
    lhs, rhs = rng.standard_normal((24, 64), np.float32), rng.standard_normal((39296, 64), np.float32)
    result, (out,) = replay("spmd.hlo", devices, tmp_path, inputs=[lhs, rhs])
    assert result.num_partitions == 2  # num_partitions=2 in the header; parameters unannotated
    np.testing.assert_allclose(out, lhs @ rhs.T, rtol=1e-4, atol=1e-4)


def test_spmd_8_devices_keeps_its_parameter_shardings(devices, tmp_path):
    """Only the parameters are annotated (GSPMD): under Shardy they would silently compile
    replicated; replay compiles GSPMD-only modules with GSPMD, so they stay split 8 ways."""
    rng = np.random.default_rng(1)
    p0, p1 = rng.standard_normal((8, 16), np.float32), rng.standard_normal((16, 24), np.float32)
    result, (out,) = replay("spmd_8_devices.hlo", devices, tmp_path, inputs=[p0, p1])
    assert (result.num_partitions, result.partitioner) == (8, "gspmd")
    assert shard_shapes(result) == [(8, 2), (2, 24)]
    np.testing.assert_allclose(out, p0 @ p1, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_sharded_attention_forward_and_backward(devices):
    result, (loss, grad) = replay("sharded_computation.hlo", devices, argument_mode="zeros")
    assert (result.num_partitions, result.partitioner) == (2, "gspmd")
    assert shard_shapes(result) == [(16, 512, 3, 12, 64)]
    assert loss.shape == () and grad.shape == (32, 512, 3, 12, 64) and grad.dtype == np.float16
    assert np.isfinite(loss) and np.isfinite(grad).all()


def test_collective_over_8_replicas(devices, tmp_path):

    result, (out,) = replay("gpu_hlo_collective_topology.hlo", devices, seed=2)
    assert (result.num_replicas, result.num_partitions) == (8, 1)
    # Every replica holds the same random input; the all-reduce sums the 8 copies.
    np.testing.assert_allclose(out, 8 * random_values(2, 0, (1024,), None, np.float32), rtol=1e-6)
