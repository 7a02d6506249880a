"""autoshard on the programs people write, third round (issue 66): Flax's ``TrainState.create``
state (a Python ``int`` step) under a ``jax.jit`` step, a warm search keyed on the layout it was
given, refusals one short line whose advice works when followed, a ``functools.partial`` named
after its function, XLA's and HiGHS's own output kept off the screen, the program's own layout
hints left out of a plan, and the ILP's plan raced beside CFP's. Programs shaped like Flax's pjit
guide and its Linen examples; the searches run on this process's 8 virtual CPU devices with the
smallest settings."""

from __future__ import annotations

import functools
import os
import re

import highspy
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from launcher.errors import UserError
from launcher.runtime import native_output
from launcher.sharding.apply import AXIS_NAMES, constrained_step, make_mesh
from launcher.sharding.user.api import autoshard, search_options
from launcher.sharding.user.step import step_program
from tests import user_programs

SMALL = dict(repeats=2, iterations=2, run_repeats=3, verify_top_k=1, verify_iterations=2, verify_repeats=2,
             mesh_shape=[8], baselines=["dp", "fsdp"])
quiet = lambda line: None


X, Y = jnp.ones((16, 8)), jnp.arange(16, dtype=jnp.int32) % 10


def created(tx=None, width: int = 32):
    """A TrainState as Flax's examples make it: ``create`` leaves ``step=0`` a Python int."""
    return user_programs.make_created_state(X, width, tx)


def cross_entropy_step(state, batch):
    x, y = batch

    def loss_fn(params):
        logits = state.apply_fn({"params": params}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    loss, grads = jax.value_and_grad(loss_fn)(state.params)
    return state.apply_gradients(grads=grads), loss


jitted_step = jax.jit(cross_entropy_step)   # as Flax's examples decorate it: @jax.jit


# --- Python numbers in the state ---------------------------------------------------------------

def test_a_jitted_step_over_train_state_create_state_is_searched_and_trains_as_its_own_loop(tmp_path):
    state = created()
    assert type(state.step) is int
    plan = autoshard(jitted_step, state, (X, Y), store_dir=str(tmp_path), log=quiet, **SMALL)
    assert plan.scalars and any(a["path"] == "[0].step" and a["dtype"] == "int32" for a in plan.args)
    # The program's own loop, on one device, from the state as create made it.
    reference, s = [], created()
    for _ in range(3):
        s, loss = jitted_step(s, (X, Y))
        reference.append(float(loss))
    step, (s, batch) = plan.apply(jitted_step), plan.place(created(), (X, Y))
    losses = []
    for _ in range(3):
        s, loss = step(s, batch)
        losses.append(float(loss))
    assert losses == pytest.approx(reference, rel=1e-5) and int(s.step) == 3


def test_train_state_create_state_is_read_with_or_without_in_shardings_and_jit():
    state = created()
    program = step_program(jitted_step, (state, (X, Y)))
    assert program.feeds_back == (0,) and program.reading.scalars
    mesh = Mesh(np.array(jax.devices()), ("data",))
    given = (jax.tree.map(lambda _: NamedSharding(mesh, P()), state), NamedSharding(mesh, P("data")))
    with_layout = step_program(jitted_step, (state, (X, Y)), in_shardings=given)
    assert with_layout.feeds_back == (0,) and with_layout.signature == program.signature
    plain = step_program(cross_entropy_step, (state, (X, Y)))   # not jitted: the same program
    assert plain.feeds_back == (0,) and plain.signature == program.signature
    # A float schedule value held in the state, as jax.jit takes it: weakly typed, fed back.
    @jax.jit
    def scheduled(s, x):
        loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w) ** 2))(s["w"])
        return {"w": s["w"] - s["lr"] * g, "lr": s["lr"] * 0.9}, loss

    weak = step_program(scheduled, ({"w": jnp.ones((8, 4)), "lr": 0.5}, X))
    assert weak.feeds_back == (0,) and weak.args[0]["lr"].weak_type


def test_a_python_number_the_step_needs_as_a_python_value_is_closed_over_as_before():
    said = []
    params = {"w": jnp.ones((8, 8)), "repeat": 2}

    def step(p, x):
        def loss_fn(w):
            h = x
            for _ in range(p["repeat"]):   # a Python value: range() of a traced array fails
                h = jnp.tanh(h @ w)
            return jnp.mean(h ** 2)

        loss, g = jax.value_and_grad(loss_fn)(p["w"])
        return {"w": p["w"] - 0.1 * g, "repeat": p["repeat"]}, loss

    program = step_program(step, (params, X), log=said.append)
    assert not program.reading.scalars and program.feeds_back == (0,)
    assert any("used as Python values" in line for line in said)


# --- refusals: one short line, and the advice works --------------------------------------------

def _refused(call) -> str:
    with pytest.raises(UserError) as e:
        call()
    line = str(e.value)
    assert "\n" not in line and len(line) <= 300, line
    return line


def mlp_params():
    return {"w1": jnp.full((8, 16), 0.1), "w2": jnp.full((16, 4), 0.1)}


def mlp_loss(p, x):
    return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2)


def sgd(p, g):
    return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)


def only_loss(p, x):
    return mlp_loss(p, x)


def halves(p, x):
    loss, g = jax.value_and_grad(mlp_loss)(p, x)
    return jax.tree.map(lambda a: a.astype(jnp.bfloat16), sgd(p, g)), loss


def halves_as_it_came(p, x):   # the advice: cast inside the step, return the state as it came
    loss, g = jax.value_and_grad(mlp_loss)(p, x)
    return jax.tree.map(lambda a, b: a.astype(jnp.bfloat16).astype(b.dtype), sgd(p, g), p), loss


def two_scalars(p, x):
    loss, g = jax.value_and_grad(mlp_loss)(p, x)
    return sgd(p, g), {"a": loss, "b": 2 * loss}


def keeps_one(p, q, x):
    loss, g = jax.value_and_grad(mlp_loss)(p, x)
    return sgd(p, g), loss


REFUSALS = {
    # name: (the refused call, what the line says, the call its advice asks for)
    "no state returned": (lambda: step_program(only_loss, (mlp_params(), X)), r"state_argnums=\(\)",
                          lambda: step_program(only_loss, (mlp_params(), X), state_argnums=())),
    "state changes dtype": (lambda: step_program(halves, (mlp_params(), X)), r"return it as it came",
                            lambda: step_program(halves_as_it_came, (mlp_params(), X))),
    "several losses": (lambda: step_program(two_scalars, (mlp_params(), X)), r"""loss=["']\[1\]\['a'\]["']""",
                       lambda: step_program(two_scalars, (mlp_params(), X), loss="[1]['a']")),
    "shared array": (lambda: (lambda p: step_program(keeps_one, (p, {"w1": p["w1"]}, X)))(mlp_params()),
                     r"or pass a copy",
                     lambda: (lambda p: step_program(keeps_one, (p, {"w1": jnp.array(p["w1"])}, X)))(mlp_params())),
    "state_argnums not returned": (
        lambda: step_program(keeps_one, (mlp_params(), mlp_params(), X), state_argnums=(0, 1)),
        r"leave it out of state_argnums",
        lambda: step_program(keeps_one, (mlp_params(), mlp_params(), X), state_argnums=(0,))),
    "unknown loss path": (lambda: step_program(two_scalars, (mlp_params(), X), loss="[1]['c']"),
                          r"give one of them",
                          lambda: step_program(two_scalars, (mlp_params(), X), loss="[1]['b']")),
    "loss in the state": (lambda: step_program(two_scalars, (mlp_params(), X), loss=lambda out: out[0]["w1"]),
                          r"pick the step's loss",
                          lambda: step_program(two_scalars, (mlp_params(), X), loss=lambda out: out[1]["a"])),
    "position out of range": (lambda: step_program(halves_as_it_came, (mlp_params(), X), data_argnums=(2,)),
                              r"give the positions of its data \(batch\) arguments, 0 to 1",
                              lambda: step_program(halves_as_it_came, (mlp_params(), X), data_argnums=(1,))),
    "shardings on two meshes": (
        lambda: step_program(halves_as_it_came, (mlp_params(), X), in_shardings=(
            NamedSharding(Mesh(np.array(jax.devices()), ("a",)), P()),
            NamedSharding(Mesh(np.array(jax.devices())[::-1], ("b",)), P("b")))),
        r"give NamedShardings on one mesh",
        lambda: step_program(halves_as_it_came, (mlp_params(), X), in_shardings=(
            NamedSharding(Mesh(np.array(jax.devices()), ("a",)), P()),
            NamedSharding(Mesh(np.array(jax.devices()), ("a",)), P("a"))))),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_refusal_is_one_short_line_and_following_its_advice_reads_the_step(case):
    refused, says, advised = REFUSALS[case]
    assert re.search(says, _refused(refused))
    assert advised().feeds_back is not None


def test_a_misspelt_option_is_refused_in_one_line_naming_the_option_meant():
    program = step_program(jitted_step, (created(), (X, Y)))
    line = _refused(lambda: search_options(program, {"verify_margn": 0.1}))
    assert "did you mean verify_margin" in line
    assert search_options(program, {"verify_margin": 0.1}).verify_margin == 0.1


def test_in_shardings_unlike_the_state_is_refused_naming_the_first_path_that_differs():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    state = created()
    # The shardings of a TrainState made with another optax object (Linen trainers make their
    # abstract state that way): the whole of either side prints its model and optimizer.
    other = state.replace(tx=optax.adam(1e-2))
    given = (jax.tree.map(lambda _: NamedSharding(mesh, P()), other), NamedSharding(mesh, P("data")))
    line = _refused(lambda: step_program(jitted_step, (state, (X, Y)), in_shardings=given))
    assert line.startswith("in_shardings of cross_entropy_step: at [0] the TrainStates differ in their static field tx")
    # The advice: shardings shaped like the arguments themselves.
    good = (jax.tree.map(lambda _: NamedSharding(mesh, P()), state), NamedSharding(mesh, P("data")))
    assert step_program(jitted_step, (state, (X, Y)), in_shardings=good).in_shardings is not None


# --- names, the warm search and the screen ------------------------------------------------------

def test_a_partial_is_named_after_the_function_it_wraps(tmp_path):
    step = functools.partial(cross_entropy_step)
    assert step_program(step, (created(), (X, Y))).name == "cross_entropy_step"


def test_a_second_search_with_another_layout_searches_again_and_a_stored_answer_is_said_in_one_line(tmp_path,
                                                                                                     capsys):
    mesh = Mesh(np.array(jax.devices()), ("data",))
    state = created()
    split = (jax.tree.map(lambda _: NamedSharding(mesh, P()), state), NamedSharding(mesh, P("data")))
    replicated = (split[0], NamedSharding(mesh, P()))
    settings = dict(store_dir=str(tmp_path / "store"), **{**SMALL, "baselines": ["dp"]})
    first = autoshard(jitted_step, state, (X, Y), in_shardings=split, **settings)
    capsys.readouterr()
    second = autoshard(jitted_step, state, (X, Y), in_shardings=replicated, **settings)
    assert "stored answer" not in capsys.readouterr().out     # another layout: searched and measured anew
    assert second.baselines.get("user", second.measured)["repeat_times_s"] != \
        first.baselines.get("user", first.measured)["repeat_times_s"]
    third = autoshard(jitted_step, state, (X, Y), in_shardings=replicated, **settings)
    said = [line for line in capsys.readouterr().out.splitlines() if "stored answer" in line]
    assert len(said) == 1 and said[0].startswith("autoshard: the stored answer of an earlier search of "
                                                 "cross_entropy_step")
    assert third.constraints == second.constraints


def test_what_xla_and_highs_print_themselves_goes_to_the_log_file_not_the_screen(tmp_path, capfd):
    log = tmp_path / "search.log"
    with native_output.to_file(log) as screen:
        os.write(2, b"W1206 spmd_partitioner.cc:656] [SPMD] Involuntary full rematerialization.\n")
        highspy.Highs()   # its banner, printed by C++ on its first construction
        print("the table", file=screen)
    out, err = capfd.readouterr()
    assert "the table" in out and "Involuntary" not in out + err
    assert "Involuntary full rematerialization" in log.read_text()
    os.write(2, b"after\n")   # the descriptors are back
    assert "after" in capfd.readouterr().err


# --- the program's own layout hints and the ILP's plan -----------------------------------------

def pjit_guide_program():
    return user_programs.make_pjit_guide()


def test_a_plans_program_leaves_the_programs_own_layout_hints_out():
    train_step, state, x, user_mesh = pjit_guide_program()
    program = step_program(train_step, (state, x))
    mesh = make_mesh([4, 2])
    body, in_shardings, _ = constrained_step(program.step, program.args, {"program": program.signature}, mesh)
    jaxpr = jax.make_jaxpr(body)(*program.args)
    meshes = {tuple(e.params["sharding"].mesh.axis_names) for e in jaxpr.eqns if e.primitive.name == "sharding_constraint"}
    assert not any("model" in names for names in meshes)   # none on the program's own mesh
    assert all(set(names) <= set(AXIS_NAMES) for names in meshes)


@pytest.mark.slow
def test_the_ilps_plan_races_beside_cfps_and_the_answer_is_within_1_1x_of_it(tmp_path):
    train_step, state, x, _ = pjit_guide_program()
    settings = {k: v for k, v in SMALL.items() if k not in ("baselines", "mesh_shape")}
    plan = autoshard(train_step, state, x, store_dir=str(tmp_path), log=quiet, mesh_shape=[[8], [2, 4]],
                     **{**settings, "run_repeats": 4})
    runs = {plan.row: plan.measured, **plan.baselines}
    assert {"alpa_ilp", "user", "dp", "fsdp"} <= set(runs)
    compared = plan.compared()
    assert compared.over(plan.row, "alpa_ilp") <= 1.1
    # Each algorithm's prediction beside what the race measured; a built-in plan has none.
    table = plan.table()
    cells = {line.split()[1]: line.split("│")[6].strip() for line in table.splitlines() if line.startswith("│")}
    assert "predicted (ms)" in table and float(cells["alpa_ilp"]) > 0 and cells["dp"] == "", table
