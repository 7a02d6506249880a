"""Convolutional programs as Flax NNX's MNIST tutorial writes them (``tests/user_programs.py:
make_nnx_cnn``): BatchNorm, Dropout, pooling, an ``nnx.Optimizer`` and metrics the step updates
in place. With max pooling the plan nearest dp is dp: the same collectives, no more memory, the
same training. Pooling and its gradients used to stop a block's layouts, and that plan then
pinned the pooled activations whole (3 all-gathers where dp has none, 5x its memory; with
average pooling 7 all-gathers and CFP's own plan 1.48x dp). With average pooling one all-gather
remains, of BatchNorm's backward (a per-channel statistic broadcast over the batch, owned by
another block): docs/autoshard.md. In this process's 8 virtual CPU devices."""

from __future__ import annotations

import jax
import numpy as np

from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.search.comm import collectives
from launcher.sharding.search.measure import baseline_runner, plan_runner
from launcher.sharding.search.nearest import nearest
from launcher.sharding.user.step import step_program
from tests import user_programs


def test_the_plan_nearest_dp_of_a_cnn_with_max_pooling_is_dp():
    step = user_programs.make_nnx_cnn(pool="max")
    program = step_program(step.fn, step.args)
    a = analyze(program.step, program.args, [8])
    found = nearest(a, program, "dp", jax.devices())
    assert found.exact, found.reason(a)
    mine = plan_runner(a, program, dict(enumerate(found.assignment)), make_mesh([8]))
    theirs = baseline_runner(program, "dp", jax.devices())   # and one step
    assert collectives(mine.compiled.as_text()) == collectives(theirs.compiled.as_text())   # kinds, counts, bytes
    assert mine.peak_memory_bytes <= 1.05 * theirs.peak_memory_bytes
    mine.steps(2)
    theirs.steps(1)
    # The model, the optimizer and the metrics (the loss and accuracy summed so far) alike.
    for x, y in zip(jax.tree.leaves(mine.args), jax.tree.leaves(theirs.args), strict=True):
        if jax.numpy.issubdtype(x.dtype, jax.numpy.floating):   # (not the dropout's typed keys)
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)
