"""Layers run by ``jax.lax.scan`` over stacked weights, as production trainers write them (a user's
decoder LM, ``tests/user_programs.py``; the built-in models with ``model.scan_layers=true``):
searched as CFP means them (the loop's body one segment, run once per iteration), the plans
nearest the baselines compiling to the baselines' own collectives, and trained with one
device's losses. In this process's 8 virtual CPU devices."""

from __future__ import annotations

import jax
import pytest

from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.user.api import autoshard
from launcher.sharding.model_program import training_program
from launcher.sharding.search.comm import collectives
from launcher.sharding.search.measure import baseline_runner, plan_runner
from launcher.sharding.search.nearest import builtin_references, nearest, nearest_plans
from launcher.sharding.user.step import step_program
from launcher.models.gpt import GPT
from launcher.models.plans import builtin
from launcher.models.train import run_training
from tests import user_programs

SMALL = dict(repeats=2, iterations=2, run_repeats=2, verify_top_k=1, verify_iterations=2, verify_repeats=2)
quiet = lambda line: None


def scanned_lm(layers=4, **kw):
    step = user_programs.make_scanned_lm(layers=layers, **kw)
    return step, step_program(step.fn, step.args, in_shardings=step.in_shardings)


def counts(compiled) -> dict:
    return {kind: (e["count"], e["bytes"]) for kind, e in collectives(compiled.as_text()).items()}


def test_the_loop_body_is_one_segment_run_once_per_layer():
    _, program = scanned_lm(layers=4)
    a = analyze(program.step, program.args, [4, 2])
    (body,) = [s for s in a.segments if s.loop is not None]
    assert body.trips == 4 and a.graph.ops[body.loop].prim == "scan"
    # The backward loop's contractions joined the forward loop's blocks: one block per forward
    # contraction of a layer (QKV, scores, weighted sum, output, MLP in and out), each with its
    # two backward products.
    blocks = [a.blocks[b] for b in body.blocks]
    assert len(blocks) == 6
    assert all(sorted(b.roles.values()) == ["bwd", "bwd", "head"] for b in blocks)
    # Unrolled, the same model has a segment per layer, alike: its template is the body's.
    _, unrolled = scanned_lm(layers=4, unrolled=True)
    u = analyze(unrolled.step, unrolled.args, [4, 2])
    assert len(u.blocks) == 2 + 4 * 6 and max(len(t.instances) for t in u.templates) == 4


@pytest.mark.parametrize("remat", [False, True])
def test_the_plan_nearest_dp_compiles_to_dps_own_collectives_and_trains_as_dp(remat):
    """Nothing pinned inside the loop made "nearest dp" another program (2.36x dp's time, 3.5x
    its memory): now the body's layouts are pinned and the stacked weights keep their layer
    axis whole."""
    _, program = scanned_lm(layers=2, remat=remat)
    a = analyze(program.step, program.args, [4, 2])
    found = nearest(a, program, "dp", jax.devices())
    assert found.exact
    mine = plan_runner(a, program, dict(enumerate(found.assignment)), make_mesh([4, 2]))
    theirs = baseline_runner(program, "dp", jax.devices())
    mine.steps(2)
    theirs.steps(1)
    assert counts(mine.compiled) == counts(theirs.compiled)
    assert mine.losses[:2] == pytest.approx(theirs.losses[:2], rel=1e-5)
    assert mine.peak_memory_bytes <= 1.05 * theirs.peak_memory_bytes


LOOPS = {
    # a fori_loop indexing the stacked weights (a static trip count: a scan whose body picks its layer)
    "fori_loop": lambda: user_programs.make_scanned_lm(layers=2, fori=True),
    "linen nn.scan": lambda: user_programs.make_linen_lm(scan=True),
    "nnx.scan over nnx.vmap'd blocks": lambda: user_programs.make_nnx_scanned_mlp(),
}


@pytest.mark.parametrize("form", list(LOOPS))
def test_every_way_of_writing_the_layer_loop_is_searched_as_one_and_its_nearest_dp_is_dp(form):
    step = LOOPS[form]()
    program = step_program(step.fn, step.args, data_argnums=step.data_argnums)
    a = analyze(program.step, program.args, [4, 2])
    (body,) = [s for s in a.segments if s.loop is not None]
    assert body.trips in (2, 3) and len(body.blocks) >= 2
    found = nearest(a, program, "dp", jax.devices())
    assert found.exact, found.reason(a)
    mine = plan_runner(a, program, dict(enumerate(found.assignment)), make_mesh([4, 2]))
    theirs = baseline_runner(program, "dp", jax.devices())
    mine.steps(1)
    assert counts(mine.compiled) == counts(theirs.compiled)
    assert mine.losses[:2] == pytest.approx(theirs.losses[:2], rel=1e-5)


@pytest.mark.heavy  # a whole cold search of an LM; the tests below search every way of writing a layer loop
def test_a_scanned_lm_searched_from_python_trains_with_one_devices_losses(tmp_path):
    step, _ = scanned_lm(layers=2)
    reference = []
    jitted, args = jax.jit(step.fn), tuple(step.args)
    for _ in range(3):
        params, opt_state, loss = jitted(*args)
        args = (params, opt_state, args[2])
        reference.append(float(loss))
    said = []
    plan = autoshard(step.fn, *step.args, in_shardings=step.in_shardings, store_dir=str(tmp_path), mesh_shape=[4, 2],
                     log=said.append, **SMALL)
    assert any("run 2 times by loop op" in line for line in said)
    assert sorted([plan.row, *plan.baselines]) == ["alpa_ilp", "cfp", "dp", "fsdp", "user"]   # the ILP's beside CFP's
    again = user_programs.make_scanned_lm(layers=2)
    applied, args = plan.apply(again.fn), plan.place(*again.args)
    losses = []
    for _ in range(3):
        params, opt_state, loss = applied(*args)
        args = (params, opt_state, args[2])
        losses.append(float(loss))
    assert losses == pytest.approx(reference, rel=1e-4)
    # A second search of the same step hands back the first's plan without searching.
    said.clear()
    again_plan = autoshard(step.fn, *step.args, in_shardings=step.in_shardings, store_dir=str(tmp_path),
                           mesh_shape=[4, 2], log=said.append, **SMALL)
    assert len(said) == 1 and said[0].startswith("autoshard: the stored answer of an earlier search of train_step")
    assert again_plan.constraints == plan.constraints


def test_a_built_in_model_with_scanned_layers_trains_under_every_plan_as_on_one_device():
    model = GPT(batch_size=8, seq_len=16, num_layers=2, hidden=32, heads=8, vocab_size=64, scan_layers=True)
    params = model.init(jax.random.key(0))
    assert jax.tree.leaves(params["layers"])[0].shape[0] == 2        # stacked on a layer axis
    one = run_training(model, builtin("dp"), 3, devices=jax.devices()[:1]).losses
    for plan in ("dp", "tp", "fsdp", "dp_tp"):
        assert run_training(model, builtin(plan), 3).losses == pytest.approx(one, rel=1e-4), plan


def test_the_plans_nearest_a_scanned_built_in_models_own_compile_to_their_collectives():
    model = GPT(batch_size=8, seq_len=16, num_layers=2, hidden=32, heads=8, vocab_size=64, scan_layers=True)
    program = training_program(model)
    a = analyze(program.step, program.args, [4, 2], references=builtin_references(program))
    near = nearest_plans(a, program, ["dp", "tp", "dp_tp"], jax.devices())
    assert set(near) == {"dp", "tp", "dp_tp"}
    for name, assignment in near.items():
        mine = plan_runner(a, program, dict(enumerate(assignment)), make_mesh([4, 2]))
        theirs = baseline_runner(program, name, jax.devices())
        assert counts(mine.compiled) == counts(theirs.compiled), name
