"""Applying block plans to a real training step on 4 virtual devices (in a subprocess)."""

from __future__ import annotations

import json

import pytest

from tests.test_cfp_search import run_python
from tests.test_cfp_search import SMALL_GPT
from launcher.sharding.analysis.core import analyze
from launcher.sharding import pipeline
from launcher.sharding.model_program import training_program
from launcher.sharding.apply import plan_json
from launcher.models.plans import Plan
import jax
from launcher.sharding.apply import constraints_transform, make_mesh, spec_from_json
from launcher.sharding.search.comm import collectives
from launcher.sharding.search.measure import plan_runner
from launcher.models.gpt import GPT
from launcher.models.plans import builtin
from launcher.models.train import run_training
from launcher.errors import UserError
from launcher.sharding.search.nearest import axis_map, nearest
from launcher.sharding.apply import plan_constraints
from launcher.sharding.user.step import step_program
import jax.numpy as jnp
import optax

pytestmark = pytest.mark.core

APPLY_MLP = r"""
import json
import jax, jax.numpy as jnp, numpy as np, optax
from tests.test_cfp_analysis import mlp_program
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh, whole_step, constrained_step
from launcher.sharding.search.comm import collectives
from launcher.sharding.apply import plan_json

step, shapes = mlp_program()
a = analyze(step, shapes, [4])
mesh = make_mesh([4])
k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
params = {"w1": jax.random.normal(k1, (16, 32)) * 0.1, "b1": jnp.zeros(32), "w2": jax.random.normal(k2, (32, 6)) * 0.1}
state = {"params": params, "opt_state": optax.adam(1e-3).init(params)}
batch = {"x": jax.random.normal(k3, (8, 16)), "y": jnp.ones((8, 6))}
ref_state, ref_loss = jax.jit(step)(state, batch)

out = {"ref_loss": float(ref_loss), "plans": []}
for k in range(3):
    assignment = {b.id: min(k, b.num_plans - 1) for b in a.blocks}
    fn, ins, outs = whole_step(a, assignment, mesh)
    compiled = jax.jit(fn, in_shardings=ins, out_shardings=outs).lower(*shapes).compile()
    new_state, loss = compiled(jax.device_put(state, ins[0]), jax.device_put(batch, ins[1]))
    constraints = plan_json(a, [assignment[b.id] for b in a.blocks]).constraints
    fn2, ins2, outs2 = constrained_step(step, shapes, constraints, mesh)
    compiled2 = jax.jit(fn2, in_shardings=ins2, out_shardings=outs2).lower(*shapes).compile()
    _, loss2 = compiled2(jax.device_put(state, ins2[0]), jax.device_put(batch, ins2[1]))
    out["plans"].append({
        "loss": float(loss), "loss_from_plan_json": float(loss2),
        "params_match": all(bool(np.allclose(new_state["params"][n], ref_state["params"][n], atol=1e-6))
                            for n in params),
        "w1_spec": [s if s is None or isinstance(s, str) else list(s) for s in new_state["params"]["w1"].sharding.spec],
        "collectives": collectives(compiled.as_text()),
        "collectives_from_plan_json": collectives(compiled2.as_text()),
    })
print(json.dumps(out))
"""


def test_plans_change_the_collectives_not_the_numbers():
    r = run_python(APPLY_MLP)
    dp, column, row = r["plans"]
    for p in r["plans"]:
        assert abs(p["loss"] - r["ref_loss"]) < 1e-5 and p["params_match"]
        # The plan saved in the models' plan format rebuilds the same program.
        assert p["loss_from_plan_json"] == p["loss"]
        assert p["collectives_from_plan_json"] == p["collectives"]
    # Data parallel: weights replicated, one gradient all-reduce; column split: w1 split along its
    # columns and kept there by the optimizer update.
    assert dp["w1_spec"] in ([], [None, None]) and "all-reduce" in dp["collectives"]
    assert column["w1_spec"] == [None, "cfp0"]
    assert row["w1_spec"] == ["cfp0"] or row["w1_spec"] == ["cfp0", None]
    assert len({json.dumps(p["collectives"], sort_keys=True) for p in r["plans"]}) == 3


STUDY = r"""
import json, sys
import jax
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.search.studies import communication_study
from launcher.sharding.model_program import training_program
from launcher.models.gpt import GPT
p = training_program(GPT(**json.loads(sys.argv[1])))
a = analyze(p.step, p.args, [4])
rows = communication_study(a, p, make_mesh([4]), iterations=2, repeats=1, seed=0, log=lambda s: None)
print(json.dumps(rows))
"""


@pytest.mark.slow
def test_communication_study_reads_collectives_of_each_uniform_plan():

    rows = run_python(STUDY, json.dumps(SMALL_GPT))
    assert [r["plan"] for r in rows] == [0, 1]  # the embedding and head offer two plans
    for r in rows:
        assert r["comm_volume_bytes"] == sum(c["bytes"] for c in r["collectives"].values()) > 0
        assert r["step_time_s"] > 0 and 0 <= r["compute_time_s"] <= r["step_time_s"]
        assert r["comm_time_method"].startswith("estimate")
    # Plan 1 splits the vocabulary of the lookup and the head: other collectives than plan 0's.
    assert rows[0]["collectives"] != rows[1]["collectives"]


# ---------------------------------------------------------------------------------------------
# A searched plan under models.train.run_training with the CFP step transform (mode=train
# mode.plan=plan.json), in process


def _searched_plan(model, assignment_of):

    program = training_program(model)
    a = analyze(program.step, program.args, [4, 2])
    plan = plan_json(a, [assignment_of(b) for b in a.blocks])
    return a, program, Plan.from_dict(json.loads(plan.to_json()))  # through JSON, as mode=train reads it


def test_run_training_applies_the_searched_layouts():

    model = GPT(batch_size=8, seq_len=16, num_layers=1, hidden=32, heads=4, vocab_size=64)
    a, program, plan = _searched_plan(model, lambda b: b.num_plans - 1)  # the last plan: splits over both axes
    trained = run_training(model, plan, 3, optimizer=program.optimizer, transform_step=constraints_transform(plan))
    reference = run_training(model, builtin("dp"), 3, optimizer=program.optimizer)
    assert trained.losses == pytest.approx(reference.losses, rel=1e-5, abs=1e-6)

    # Every input laid out as the plan says (not replicated), and the state stays so after steps.
    leaves = jax.tree_util.tree_leaves(trained.state)
    names = a.graph.input_names[:len(leaves)]
    split = 0
    for name, leaf in zip(names, leaves, strict=True):
        want = spec_from_json(plan.constraints[f"in:{name}"]) if f"in:{name}" in plan.constraints else ()
        got = tuple(() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in leaf.sharding.spec)
        axes = {n: i for i, n in enumerate(("cfp0", "cfp1"))}
        got = tuple(tuple(axes[n] for n in dim) for dim in got)
        assert got + ((),) * (len(want) - len(got)) == tuple(want)[:max(len(got), len(want))] or \
            (not any(want) and not any(got)), name
        split += any(want)
    assert split > 0
    # The compiled step communicates exactly as the search's own run of the plan does.
    searched = plan_runner(a, program, {b.id: b.num_plans - 1 for b in a.blocks}, make_mesh([4, 2]))
    assert collectives(trained.compiled.as_text()) == collectives(searched.compiled.as_text())
    assert collectives(trained.compiled.as_text()) != collectives(reference.compiled.as_text())


def test_the_labels_are_split_as_the_batch_they_label():
    # Labels reach the loss as a one-hot of the vocabulary's iota (the built-in models) or through
    # take_along_axis (optax's integer-label cross-entropy, which users call): either way the
    # plan nearest dp lays them out as dp does, so each host feeds its own share of the batch.
    model = GPT(batch_size=8, seq_len=16, num_layers=1, hidden=32, heads=4, vocab_size=64)
    program = training_program(model)
    a = analyze(program.step, program.args, [8])
    constraints = plan_constraints(a, dict(enumerate(nearest(a, program, "dp").assignment)))
    assert {n: spec_from_json(constraints[f"in:{n}"]) for n in a.graph.input_names if n.startswith("[1]")} == {
        "[1]['targets']": ((0,), ()), "[1]['tokens']": ((0,), ())}

    tx = optax.adam(1e-3)

    def step(params, opt_state, x, labels):
        def loss_fn(p):
            logits = jnp.tanh(x @ p["w1"]) @ p["w2"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = {"w1": jnp.ones((16, 32)), "w2": jnp.ones((32, 64))}
    user = step_program(step, (params, tx.init(params), jnp.ones((32, 8, 16)), jnp.zeros((32, 8), jnp.int32)))
    a = pipeline.analyze(user, mesh_shape=[8]).analysis
    constraints = plan_constraints(a, dict(enumerate(nearest(a, user, "dp").assignment)))
    assert spec_from_json(constraints["in:[2]"]) == ((0,), (), ()) and spec_from_json(constraints["in:[3]"]) == ((0,), ())


def test_a_plan_searched_for_another_program_is_refused():

    small = GPT(batch_size=8, seq_len=16, num_layers=1, hidden=32, heads=4, vocab_size=64)
    _, program, plan = _searched_plan(small, lambda b: 0)
    bigger = GPT(batch_size=8, seq_len=16, num_layers=2, hidden=32, heads=4, vocab_size=64)
    other = GPT(batch_size=8, seq_len=16, num_layers=1, hidden=48, heads=4, vocab_size=64)
    for model in (bigger, other):
        with pytest.raises(UserError, match="searched for another model"):
            try:
                run_training(model, plan, 1, optimizer=program.optimizer, transform_step=constraints_transform(plan))
            except UserError as e:
                assert "mode=search again" in str(e)
                raise


NEAREST_GPT = r"""
import json, sys
import jax
from tests.test_cfp_analysis import gpt
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.search.comm import collectives
from launcher.sharding.search.measure import baseline_runner, plan_runner
from launcher.sharding.search.nearest import nearest_plans
from launcher.sharding.model_program import training_program

program = training_program(gpt(1, heads=8))  # tp splits the heads 8 ways
two_axis_only = sys.argv[1] == "auto"  # the plans mode.mesh_shape=auto searches on a 2-D mesh
a = analyze(program.step, program.args, [4, 2], two_axis_only)
mesh = make_mesh([4, 2])
near = nearest_plans(a, program, ["tp", "dp_tp", "ep"], jax.devices())
out = {"nearest": near, "plans": {}}
for name, assignment in near.items():
    mine = plan_runner(a, program, dict(enumerate(assignment)), mesh)
    theirs = baseline_runner(program, name, jax.devices())
    mine.steps(1)  # step 0, which run_training already took for the baseline
    out["plans"][name] = {"mine": collectives(mine.compiled.as_text()), "theirs": collectives(theirs.compiled.as_text()),
                          "losses": [mine.losses[0], theirs.losses[0]]}
print(json.dumps(out))
"""


# Every plan on every mesh ("all") in the heavy stage: the space mode.mesh_shape=auto searches is the
# one users get, and test_cfp_layouts.py compiles tp's nearest plan there to tp's collectives by default.
@pytest.mark.parametrize("space", [pytest.param("all", marks=pytest.mark.heavy), "auto"])
def test_the_plan_nearest_a_builtin_plan_compiles_to_its_collectives(space):
    r = run_python(NEAREST_GPT, space, devices=8)
    # ep splits experts, which GPT does not have: no nearest plan.
    assert set(r["nearest"]) == {"tp", "dp_tp"}
    # With mode.mesh_shape=auto the 2-D mesh offers only plans splitting two roles, dp_tp's kind;
    # tp (heads over both axes) is searched for on the 1-D mesh (search/meshes.py).
    for name, p in r["plans"].items() if space == "all" else [("dp_tp", r["plans"]["dp_tp"])]:
        counts = {kind: e["count"] for kind, e in p["mine"].items()}
        assert counts == {kind: e["count"] for kind, e in p["theirs"].items()}, name
        assert p["mine"] == p["theirs"], name  # the same bytes moved, too
        assert p["losses"][0] == pytest.approx(p["losses"][1], rel=1e-5)
    # dp_tp mixes two plans (column-split blocks, then row-split ones); tp uses no data axis.
    assert len(set(r["nearest"]["dp_tp"])) == 2 and r["nearest"].get("tp") != r["nearest"]["dp_tp"]
    assert r["plans"]["dp_tp"]["mine"]["all-reduce"]["count"] > 1


NEAREST_CFP_MOE = r"""
import json
import jax
from tests.test_models import load_preset
from launcher.sharding.analysis.core import analyze
from launcher.sharding.apply import make_mesh
from launcher.sharding.search.comm import collectives
from launcher.sharding.search.measure import baseline_runner, plan_runner
from launcher.sharding.search.nearest import nearest_plans
from launcher.sharding.model_program import training_program

program = training_program(load_preset("cfp-moe-tiny"))
a = analyze(program.step, program.args, [4, 2])
near = nearest_plans(a, program, ["dp", "dp_tp", "ep"], jax.devices())
out = {"nearest": near, "plans": {}}
for name in ("dp", "dp_tp"):
    mine = plan_runner(a, program, dict(enumerate(near[name])), make_mesh([4, 2]))
    theirs = baseline_runner(program, name, jax.devices())
    out["plans"][name] = [collectives(mine.compiled.as_text()), collectives(theirs.compiled.as_text())]
print(json.dumps(out))
"""


@pytest.mark.heavy  # cfp-moe's whole model; test_cfp_layouts compiles its one-layer twin's nearest plans by default
def test_a_step_whose_backward_pass_reorders_under_a_plan_still_has_nearest_plans():
    # Under a built-in plan's constraints, cfp-moe's gating gradient accumulates its cotangents in
    # another order than the analysis's trace: the forward pass lines up, the backward does not
    # exactly. The layouts come from the forward pass (inputs, constrained activations), so the
    # nearest plans stand, and compile to the built-in plans' own collectives.
    r = run_python(NEAREST_CFP_MOE, devices=8)
    assert set(r["nearest"]) == {"dp", "dp_tp", "ep"}
    for name, (mine, theirs) in r["plans"].items():
        assert mine == theirs, name


def test_named_mesh_axes_map_onto_runs_of_cfp_axes():

    assert axis_map({"data": 8}, [4, 2]) == {"data": (0, 1)}
    assert axis_map({"data": 4, "model": 2}, [4, 2]) == {"data": (0,), "model": (1,)}
    assert axis_map({"data": 2, "model": 4}, [4, 2]) is None
    assert axis_map({"data": 4}, [4, 2]) is None  # the devices along axis 1 would be left out
