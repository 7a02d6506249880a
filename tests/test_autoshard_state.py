"""Plans applied to state as programs hold it (issue 45): arrays already laid out on the program's
own mesh (auto or Explicit axes), a PRNG key the step never returns (typed or old), state as a
list, Flax NNX objects the step returns and the loop rebinds; the program's own layout raced
as ``user``; a later call with other shapes refused in one line. Programs from
``tests/user_programs.py``; the searches run on this process's 8 virtual CPU devices with the
smallest settings, one per program, shared by its assertions."""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

from launcher.errors import UserError
from launcher.sharding.user.api import autoshard
from launcher.sharding.user.step import step_program
from tests import user_programs

SMALL = dict(repeats=2, iterations=2, run_repeats=2, verify_top_k=1, verify_iterations=2, verify_repeats=2,
             mesh_shape=[8])
STEPS = 4


def one_device(fn, args, keep, n=STEPS):
    """The program's own loop on one device (its arrays fetched to the host first): the losses.
    The step returns its first ``keep`` arguments' new values, then the loss."""
    return user_programs.train(jax.jit(fn), jax.device_get(args), n, keep)


@pytest.fixture(scope="module")
def own_mesh(tmp_path_factory):
    """The plain-JAX program on its own (2, 4) mesh with a typed dropout key, searched once."""
    s = user_programs.make_own_mesh_adam()
    said = []
    plan = autoshard(s.fn, *s.args, data_argnums=s.data_argnums, store_dir=str(tmp_path_factory.mktemp("store")),
                     log=said.append, **SMALL)
    return s, plan, said


def test_state_on_its_own_mesh_with_a_typed_key_is_searched_and_applied_to_its_own_arrays(own_mesh):
    s, plan, said = own_mesh
    reference = one_device(s.fn, s.args, keep=2)
    # Read: the key (argument 3) is neither data nor returned: kept as it is.
    assert any("argument 3 not returned" in line for line in said)
    assert plan.measured["losses"][:STEPS] == pytest.approx(reference, rel=1e-5)
    # Applied to the program's own arrays, still on its own mesh: moved to the plan's.
    params, opt_state, batch, key = s.args
    assert params["w1"].sharding.mesh.axis_names == ("data", "model")
    step, losses = plan.apply(s.fn), []
    for _ in range(STEPS):
        params, opt_state, loss = step(params, opt_state, batch, key)
        losses.append(float(loss))
    assert losses == pytest.approx(reference, rel=1e-5)
    assert params["w1"].sharding.mesh == plan.mesh()
    placed = plan.place(*s.args)
    assert jax.random.key_data(placed[3]).tolist() == jax.random.key_data(key).tolist()
    # A later call with another batch size: the documented one line, not a trace's TypeError.
    other = (jnp.ones((32, 32)), jnp.ones((32, 8)))
    with pytest.raises(UserError, match=r"argument \[2\]\[0\] is float32\[32, 32\], and the plan was searched for "
                                        r"float32\[16, 32\]: give arguments shaped as the example ones") as e:
        step(params, opt_state, other, key)
    assert "\n" not in str(e.value)


def test_the_programs_own_layout_is_raced_saying_how_many_leaves_were_read_so(own_mesh):
    _, plan, said = own_mesh
    assert "user" in [plan.row, *plan.baselines]
    # The answer names its row, the search's own plan (the answer or not) "cfp".
    assert plan.name == plan.row and (plan.own or plan).name == "cfp"
    # Parameters and batch laid out on its mesh; Adam's state (jax.jit(tx.init): single-device)
    # and the key replicated.
    line = next(line for line in said if "its own layout, raced as 'user'" in line)
    assert "4 of 10 array leaves read as laid out on its mesh {'data': 2, 'model': 4}, the other 6 replicated" in line


def test_an_old_uint32_key_is_kept_as_it_is_too():
    s = user_programs.make_own_mesh_adam(key="old")
    program = step_program(s.fn, s.args, data_argnums=s.data_argnums)
    assert program.feeds_back == (0, 1) and program.loss_leaf is not None
    # Named state_argnums leave the key out of the state, and it is read the same.
    named = step_program(s.fn, s.args, data_argnums=s.data_argnums, state_argnums=(0, 1))
    assert named.feeds_back == (0, 1)


def test_a_list_of_layers_as_state_on_an_explicit_mesh_trains_as_the_programs_own_loop(tmp_path, capsys):
    """JAX's SPMD MNIST: ``params = [(w, b), ...]`` in, the new list out, nothing else. Searched
    as a user's notebook would (no ``log``): one line saying where the details went, the table."""
    s = user_programs.make_numpy_mlp(returns="params")
    program = step_program(s.fn, s.args)
    assert program.feeds_back == (0,) and not program.reading.returns_tuple and program.loss_leaf is None
    plan = autoshard(s.fn, *s.args, store_dir=str(tmp_path / "store"), **SMALL)
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) <= 12 and "CFP plan of update_only against the baselines" in "\n".join(shown)
    logs = list((tmp_path / "autoshard_logs").glob("update_only-*.log"))
    assert len(logs) == 1 and str(logs[0]) in shown[0]
    assert "searched ParallelBlock Strategies solution" in logs[0].read_text()
    params, batch = s.args
    reference, expected = jax.device_get(params), []
    ref_step = jax.jit(s.fn)
    for _ in range(STEPS):
        reference = ref_step(reference, jax.device_get(batch))
        expected.append(jax.device_get(reference))
    step = plan.apply(s.fn)
    mesh = params[0][0].sharding.mesh
    # Inside its own mesh's context, as a program with Explicit axes runs its loop.
    with jax.set_mesh(mesh) if hasattr(jax, "set_mesh") else contextlib.nullcontext():
        steps = [params := step(params, batch) for _ in range(STEPS)]
    for k, params in enumerate(steps):
        assert isinstance(params, list) and len(params) == 2
        for (w, b), (rw, rb) in zip(params, expected[k], strict=True):
            np.testing.assert_allclose(np.asarray(w), rw, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(np.asarray(b), rb, rtol=1e-5, atol=1e-6)


def test_nnx_objects_returned_and_fed_back_train_as_nnx_jits_loop_and_in_shardings_are_taken(tmp_path):
    """``model, optimizer, loss = train_step(model, optimizer, x, y)``: the applied step returns the
    very objects it was given, updated, their shared Params still shared, as ``nnx.jit`` does."""
    from flax import nnx  # noqa: PLC0415  the frameworks extra: absent where the oldest JAX runs the core tests

    ref = user_programs.make_nnx_fsdp(returns_objects=True)
    model, optimizer, x, y = ref.args
    reference = []
    for _ in range(STEPS):
        model, optimizer, loss = ref.fn(model, optimizer, x, y)
        reference.append(float(loss))

    mine = user_programs.make_nnx_fsdp(returns_objects=True)
    model, optimizer, x, y = mine.args
    # The program's own layout given as nnx.jit takes it: a tree like nnx.state(model) for the
    # model, nothing for the optimizer (replicated), the batch over the mesh's data axis.
    mesh = model.w1[...].sharding.mesh
    batch = NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    given = (nnx.get_named_sharding(nnx.state(model), mesh), None, batch, batch)
    said = []
    plan = autoshard(mine.fn, *mine.args, data_argnums=mine.data_argnums, in_shardings=given, store_dir=str(tmp_path),
                     log=said.append, **SMALL)
    assert "user" in [plan.row, *plan.baselines]
    step, losses = plan.apply(mine.fn), []
    for _ in range(STEPS):
        new_model, new_optimizer, loss = step(model, optimizer, x, y)
        assert new_model is model and new_optimizer is optimizer
        model, optimizer = new_model, new_optimizer
        losses.append(float(loss))
    assert losses == pytest.approx(reference, rel=1e-5)
    assert model.w1[...] is optimizer.params["w1"][...]
