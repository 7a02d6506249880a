"""How a user's step is read (``launcher/sharding/user/reading.py``), with steps shaped as users write them
(``tests/user_programs.py``): NNX objects sharing variables, float64 host data, state returned in
any order, the loss named or refused, and what cannot be read refused in one line before any
profile. The searches here run on this process's 8 virtual CPU devices with the smallest settings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from launcher.sharding.user.api import AutoPlan, autoshard
from launcher.sharding.user.step import step_program
from launcher.errors import UserError
from tests import user_programs

SMALL = dict(repeats=2, iterations=2, run_repeats=2, verify_top_k=1, verify_iterations=2, verify_repeats=2,
             mesh_shape=[8])
quiet = lambda line: None


def mlp_params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w1": jax.random.normal(k1, (16, 32)) * 0.1, "w2": jax.random.normal(k2, (32, 4)) * 0.1}


def mlp_loss(p, x):
    return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"]) ** 2)


X = jnp.ones((8, 16))


# --- state and loss ---------------------------------------------------------------------------

def test_state_is_fed_back_in_whatever_order_the_step_returns_it():
    def loss_first(p, x):
        loss, g = jax.value_and_grad(mlp_loss)(p, x)
        return loss, jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    program = step_program(loss_first, (mlp_params(), X))
    assert program.feeds_back == (0,) and program.reading.returned_at == (1,)
    # The program returns the state first; the plan's step gives the user's order back.
    assert [s.shape for s in jax.tree.leaves(program.out_shapes)][:2] == [(16, 32), (32, 4)]
    assert program.loss_leaf == 2


def test_the_loss_is_the_scalar_named_loss_among_several_and_otherwise_asked_for():
    def with_metrics(p, x):
        loss, g = jax.value_and_grad(mlp_loss)(p, x)
        new = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
        return new, {"accuracy": loss * 0 + 0.5, "loss": loss}

    said = []
    program = step_program(with_metrics, (mlp_params(), X), log=said.append)
    assert program.reading.loss_path == "[1]['loss']" and "the loss is [1]['loss']" in said[0]

    def unnamed(p, x):
        new, m = with_metrics(p, x)
        return new, m["accuracy"], m["loss"]

    with pytest.raises(UserError, match=r"returns 2 floating-point scalars besides its state \(\[1\], \[2\]\) "
                                        r"and none is named loss: say which is the loss with loss='\[1\]'"):
        step_program(unnamed, (mlp_params(), X))
    assert step_program(unnamed, (mlp_params(), X), loss="[2]").reading.loss_path == "[2]"
    assert step_program(unnamed, (mlp_params(), X), loss=lambda out: out[2]).reading.loss_path == "[2]"
    with pytest.raises(UserError, match="give a function returning one of the outputs"):
        step_program(unnamed, (mlp_params(), X), loss=lambda out: out[1] + out[2])
    with pytest.raises(UserError, match=r"picks \[0\]\['w1'\], a float32\[16, 32\]: the loss is a floating-point "
                                        "scalar"):
        step_program(unnamed, (mlp_params(), X), loss="[0]['w1']")


def test_the_loss_is_read_from_metrics_as_trainers_name_it_and_a_refusal_stays_one_short_line():
    """nanodo's metrics: the loss under "__train_loss" and "train_loss" (one value), beside
    hundreds of statistics; a dict of statistics none of which is named loss is asked about in one
    line of about 300 characters, whatever their number."""
    def with_stats(p, x, named=True):
        loss, g = jax.value_and_grad(mlp_loss)(p, x)
        new = jax.tree.map(lambda a, b: a - 0.1 * b, p, g)
        stats = {f"grads/all/layer_{i}/rms_of_the_gradient_of_that_layer": jnp.sqrt(jnp.mean(g["w1"] ** 2)) * i
                 for i in range(300)}
        named_so = {"__train_loss": loss, "train_loss": loss, "log_perplexity": loss * 2} if named else {}
        return new, {**named_so, **stats, "learning_rate": jnp.asarray(0.1)}

    said = []
    program = step_program(with_stats, (mlp_params(), X), log=said.append)
    assert program.reading.loss_path == "[1]['train_loss']"
    assert "the loss is [1]['train_loss']" in said[0] and len(said[0]) < 300

    with pytest.raises(UserError) as e:
        step_program(lambda p, x: with_stats(p, x, named=False), (mlp_params(), X))
    line = str(e.value)
    assert "\n" not in line and len(line) <= 300, line
    assert "301 floating-point scalars" in line and "and none is named loss: say which is the loss with loss=" in line
    # Two values named loss: the plainer name is the loss ("train_loss" over "z_loss").
    def with_aux(p, x):
        new, m = with_stats(p, x)
        return new, {"train_loss": m["train_loss"], "z_loss": m["log_perplexity"]}
    assert step_program(with_aux, (mlp_params(), X)).reading.loss_path == "[1]['train_loss']"


def test_the_batch_is_every_trailing_argument_of_one_leading_dimension_past_a_key():
    # Flax's NNX FSDP toy's shape without NNX: step(params, x, y) returns the loss alone, x and y
    # the batch; and a dropout key after the batch is no data (kept as it is, not split).
    def sgd(p, x, y, key):
        loss, g = jax.value_and_grad(lambda p: jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)
                                     + 0 * jax.random.normal(key))(p)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), loss

    program = step_program(sgd, (mlp_params(), X, jnp.ones((8, 4)), jax.random.key(1)))
    assert program.reading.user_data_argnums == (1, 2) and program.feeds_back == (0,)
    # A batch argument that is one array with the loss's place in the outputs is not taken for
    # state that changed shape: the step returns its loss, not a new batch.
    only_loss = lambda p, x, y: mlp_loss(p, x) + jnp.mean(y)
    program = step_program(only_loss, (mlp_params(), X, jnp.ones((8, 4))), state_argnums=())
    assert program.reading.user_data_argnums == (1, 2) and program.loss_leaf == 0
    # Leaves of several leading dimensions stop the batch: params are state.
    program = step_program(sgd, (mlp_params(), X, jnp.ones((8, 4)), jax.random.key(1)), data_argnums=(2,))
    assert program.reading.user_data_argnums == (2,)


def test_a_step_returning_no_state_is_refused_unless_said_so():
    # nnx.jit's style without NNX objects: the step changes nothing it returns.
    def only_loss(p, x):
        return mlp_loss(p, x)

    with pytest.raises(UserError, match=r"only_loss returns float32\[\]: none of it is the new value of a state "
                                        r"argument \(argument 0\), so the search would time reruns of one step\. "
                                        r"Return the new state .* or give state_argnums=\(\) to time the step's reruns"):
        step_program(only_loss, (mlp_params(), X))
    program = step_program(only_loss, (mlp_params(), X), state_argnums=())
    assert program.feeds_back == () and program.loss_leaf == 0


def test_state_that_changes_type_between_steps_is_refused_naming_the_leaf():
    def to_half(p, x):
        loss, g = jax.value_and_grad(mlp_loss)(p, x)
        return jax.tree.map(lambda a, b: (a - 0.1 * b).astype(jnp.bfloat16), p, g), loss

    with pytest.raises(UserError, match=r"to_half takes \[0\]\['w1'\] as float32\[16, 32\] and returns it \(output 0\) "
                                        r"as bfloat16\[16, 32\]: state must keep its shape and dtype"):
        step_program(to_half, (mlp_params(), X))


def test_one_array_reached_from_two_state_arguments_is_refused_naming_both_paths():
    p = mlp_params()
    shared = {"w1": p["w1"], "w2": jnp.zeros((32, 4))}

    def two_states(p, q, x):
        loss, g = jax.value_and_grad(mlp_loss)(p, x)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), q, loss

    with pytest.raises(UserError, match=r"arguments \[0\]\['w1'\] and \[1\]\['w1'\] are one array: a variable reached "
                                        "from two arguments would be fed back as two"):
        step_program(two_states, (p, shared, X))


def test_float64_host_data_is_taken_as_jax_takes_it_by_the_search_and_by_the_plan(tmp_path):
    """JAX's MNIST example makes its parameters with NumPy: float64, float32 once in JAX."""
    step = user_programs.make_numpy_mlp()
    program = step_program(step.fn, step.args)
    assert {str(x.dtype) for x in jax.tree.leaves(program.args)} == {"float32"}   # x64 off: as jnp.asarray
    assert program.feeds_back == (0,)
    plan = autoshard(step.fn, *step.args, store_dir=str(tmp_path / "store"), log=quiet, **SMALL)
    losses = plan.measured["losses"]
    assert losses[1] < losses[0]   # the search's runs fed the state back: it trained
    for used in (plan, AutoPlan.load(plan.save(tmp_path / "plan.json"))):
        again = user_programs.make_numpy_mlp()
        args = used.place(*again.args)               # the very same float64 NumPy arguments
        new, loss = used.apply(again.fn)(*args)
        assert {x.dtype for x in jax.tree.leaves(new)} == {jnp.dtype("float32")}
        assert float(loss) == pytest.approx(losses[0], rel=1e-5)


# --- Flax NNX ---------------------------------------------------------------------------------

@pytest.mark.slow
def test_an_nnx_optimizer_holding_its_models_params_trains_as_the_programs_own_loop(tmp_path):
    """The Flax FSDP toy: model and optimizer share their Param variables; the nnx.jit step
    updates both in place. Searched and applied as passed, it trains the one copy, exactly as
    the program's own loop does."""
    own = user_programs.make_nnx_fsdp()
    model, optimizer, x, y = own.args
    reference = [float(own.fn(model, optimizer, x, y)) for _ in range(5)]

    searched = user_programs.make_nnx_fsdp()
    program = step_program(searched.fn, searched.args, data_argnums=searched.data_argnums)
    # One input per variable: the shared parameters once, with their momentum (3 + 3), and x, y.
    assert len(jax.tree.leaves(program.args)) == 8 and program.feeds_back == (0,)
    # The program's own layout (its parameters' sharding metadata) is read as the user's.
    assert program.in_shardings is not None
    plan = autoshard(searched.fn, *searched.args, data_argnums=searched.data_argnums, store_dir=str(tmp_path),
                     log=quiet, **SMALL)
    assert "user" in [plan.row, *plan.baselines]
    assert plan.measured["losses"][:5] == pytest.approx(reference, rel=1e-5)

    mine = user_programs.make_nnx_fsdp()
    model, optimizer, x, y = mine.args
    plan.place(model, optimizer, x, y)
    step = plan.apply(mine.fn)
    losses = [float(step(model, optimizer, x, y)) for _ in range(5)]
    assert losses == pytest.approx(reference, rel=1e-5)
    # The model itself trained (its objects were updated in place), and shares with the optimizer.
    assert model.w1[...] is optimizer.params["w1"][...] or np.allclose(model.w1[...], optimizer.params["w1"][...])
    assert float(jnp.mean((y - model(x)) ** 2)) < reference[-1]
