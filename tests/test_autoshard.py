"""Auto-sharding a user's own step (issue 27): models written without xlaunch in mind
(``tests/autoshard_models.py``: a Flax NNX transformer block stack, an Equinox MLP, a Flax
Linen MLP) searched by both algorithms through ``launcher.sharding.user.api``, their plans applied
to their own steps, saved and loaded in a fresh process, and the same search from the command
line (``mode=search mode.step=...``).

Device work runs in subprocesses with virtual CPU devices (this process's JAX backend is
shared with other test files); the settings are the smallest that still search (timings on
this machine say nothing, and are not asserted). Only the plain-JAX unit tests are ``core``: the
oldest-JAX venv has no Flax.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from launcher.sharding.user.api import AutoPlan
from launcher.sharding.apply import make_mesh
from launcher.sharding.user.api import autoshard
from launcher.sharding.user.step import baseline_shardings, describe_leaves, step_program
from launcher.errors import UserError
from tests.autoshard_models import make_elementwise_step
from tests.launch import read_result, run_cli
from tests.test_cfp_search import run_python
from launcher.sharding.search.measure import baseline_runner

STEPS = 5  # steps under each plan, compared with one device's
SMALL = dict(repeats=2, max_segment_space=6, iterations=2, run_repeats=2, verify_iterations=2, verify_repeats=2,
             verify_top_k=1)

SEARCHES = r"""
import json, sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from launcher.sharding import pipeline
from launcher.sharding.user.api import AutoPlan, autoshard
from launcher.sharding.user.step import step_program
from launcher.errors import UserError
from tests.autoshard_models import make_equinox_step, make_flax_step, make_linen_step
from tests.user_programs import train, train_on_one_device  # the user's loop, and one device's

store, out_dir, small, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
quiet = lambda line: None


def under(plan, step, args, n, keep):
    given = jax.tree.leaves(plan.shardings(*args))
    placed = [x for x in jax.tree.leaves(plan.place(*args)) if isinstance(x, jax.Array)]
    return {"losses": train(plan.apply(step), plan.place(*args), n, keep),
            "leaves": sum(isinstance(x, jax.Array) for x in jax.tree.leaves(args)), "shardings": len(given),
            "placed_as_said": len(placed) == len(given) and all(x.sharding.is_equivalent_to(s, x.ndim)
                                                                for x, s in zip(placed, given)),
            "devices": sorted({s.mesh.devices.size for s in given}),
            "split": sum(any(s.spec) for s in given)}


def summary(plan):
    return {"source": plan.source, "mesh_shape": plan.mesh_shape, "row": plan.row, "baselines": sorted(plan.baselines),
            "skipped": sorted(plan.skipped), "comparison": plan.comparison(),
            "measured_losses": plan.measured["losses"],
            "predicted": plan.predicted_step_time_s, "table": plan.table(), "why": plan.why}


def both(plan, step, args, n, keep):
    # The answer (the fastest plan measured), and the searched plan itself where another won.
    own = plan.own or plan
    return {**summary(plan), **under(plan, step, args, n, keep),
            "own": {**summary(own), **under(own, step, args, n, keep)}}


out = {}
flax_step, flax_args = make_flax_step()
out["flax_one_device"] = train_on_one_device(flax_step, flax_args, steps, 1)
for algorithm in ("cfp", "ilp"):
    plan = autoshard(flax_step, *flax_args, mesh_shape=[4], algorithm=algorithm, store_dir=store, log=quiet, **small)
    plan.save(f"{out_dir}/flax_{algorithm}.json")
    out[f"flax_{algorithm}"] = both(plan, flax_step, flax_args, steps, 1)

eq = make_equinox_step()
out["eqx_one_device"] = train_on_one_device(eq.fn, eq.args, steps, 2)
# The user's own layout: the batch split over a mesh of their own, raced as the "user" baseline.
mine = Mesh(np.array(jax.devices()), ("batch",))
in_shardings = (NamedSharding(mine, P()), None, NamedSharding(mine, P("batch")), NamedSharding(mine, P("batch")))
for algorithm, mesh_shape in (("cfp", [4]), ("ilp", "auto")):
    plan = autoshard(eq.fn, *eq.args, data_argnums=eq.data_argnums, in_shardings=in_shardings, mesh_shape=mesh_shape,
                     algorithm=algorithm, store_dir=store, log=quiet, **small)
    out[f"eqx_{algorithm}"] = both(plan, eq.fn, eq.args, steps, 2)
    if algorithm == "cfp":  # the shortlist held the plans nearest each baseline, the user's own too
        out["eqx_nearest"] = sorted(plan.searched.nearest)
        # The same plan may be shortlisted under another source (the search optimum where it is
        # the plan nearest dp): the rows by plan, whole or with the state stored split.
        out["eqx_rows"] = [[c["assignment"], c["mesh_shape"], "stored split" in c["source"], c["incumbent"]]
                           for c in plan.searched.candidates]
        out["eqx_near"] = {name: [list(mesh), list(a)] for name, (mesh, a) in plan.searched.nearest.items()}
    if algorithm == "ilp":
        out["eqx_meshes"] = plan.meshes
        try:  # the Flax plan applied to the Equinox step
            AutoPlan.load(f"{out_dir}/flax_cfp.json").apply(eq.fn)(*eq.args)
            out["other_step"] = ""
        except UserError as e:
            out["other_step"] = str(e)

# Flax Linen: its step analysed as it is (the variables dict, optax state, a batch dict).
linen = step_program(*make_linen_step())
a = pipeline.analyze(linen, mesh_shape=[4]).analysis
out["linen"] = {"contractions": len(a.contractions), "blocks": len(a.blocks), "feeds_back": list(linen.feeds_back),
                "loss_leaf": linen.loss_leaf}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("plans")
    result = run_python(SEARCHES, str(out_dir / "store"), str(out_dir), json.dumps(SMALL), str(STEPS), timeout=900)
    return result, out_dir


ONE_DEVICE = r"""
import json, sys
from tests.autoshard_models import make_flax_step
from tests.user_programs import train_on_one_device
print(json.dumps(train_on_one_device(*make_flax_step(), int(sys.argv[1]), 1)))
"""


@pytest.fixture(scope="module")
def flax_one_device():
    """The Flax step's losses on one device, as ``searched`` computes them, without its four
    searches: the heavy stage runs this module's CLI test alone, and the searches took 144 s of
    it there."""
    return run_python(ONE_DEVICE, str(STEPS))


def close(losses, reference):
    return losses == pytest.approx(reference, rel=1e-5, abs=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["flax", "eqx"])
@pytest.mark.parametrize("algorithm", ["cfp", "ilp"])
def test_a_plan_of_either_algorithm_trains_as_one_device_does(searched, model, algorithm):
    r, _ = searched
    answer, reference = r[f"{model}_{algorithm}"], r[f"{model}_one_device"]
    own = answer["own"]
    assert len(reference) == STEPS and reference[-1] < reference[0]   # it trains
    searched_row = "cfp" if algorithm == "cfp" else "alpa_ilp"
    baselines = ["dp", "fsdp"] if model == "flax" else ["dp", "fsdp", "user"]
    baselines += ["alpa_ilp"] if algorithm == "cfp" else []   # the ILP's plan races beside CFP's
    # The searched plan, and the answer handed back (the same plan, or a baseline that beat it).
    assert own["row"] == searched_row and answer["row"] in [searched_row, *baselines] and answer["why"]
    if answer["row"] == searched_row:
        assert (answer["source"], answer["mesh_shape"]) == (own["source"], own["mesh_shape"])
    for plan in (answer, own):
        assert close(plan["losses"], reference), (plan["row"], plan["losses"], reference)
        # The search's own run of the plan was the same training, from the same state.
        assert close(plan["measured_losses"][:STEPS], reference)
        # plan.shardings gives every array leaf a sharding over all 4 devices, and plan.place lays
        # each argument out as it says; the plan splits something.
        assert plan["shardings"] == plan["leaves"] > 0 and plan["placed_as_said"] and plan["devices"] == [4]
        assert plan["split"] > 0
        # Raced beside the baselines a user would compare with (and their own layout, where given).
        assert sorted([plan["row"], *plan["baselines"]]) == sorted([searched_row, *baselines])
        # comparison() names what the race measured: the fastest plan, and the fastest baseline
        # (never the searched plan), which the answer may be.
        comparison, rows = plan["comparison"], [plan["row"], *plan["baselines"]]
        assert comparison["best_baseline"] in baselines and comparison["fastest"] in rows
        assert comparison["answer"] == plan["row"] and comparison["searched_vs_best_baseline_paired"] > 0
        assert ("vs_user_paired" in comparison) == (model == "eqx")
        assert plan["table"].count("│") >= 4 * (1 + len(plan["baselines"]))
    assert own["predicted"] > 0
    assert own["source"] == "ILP" if algorithm == "ilp" else own["source"] != "ILP"


@pytest.mark.slow
def test_the_search_covers_every_mesh_every_baselines_nearest_plan_and_linen_steps(searched):
    r, _ = searched
    assert [m["mesh_shape"] for m in r["eqx_meshes"]] == [[4], [2, 2]]   # mesh_shape="auto"
    assert r["eqx_nearest"] == ["dp", "fsdp", "user"]
    # The plan nearest fsdp stores the state whole, so its twin with the state stored split is
    # an incumbent beside it; the plan nearest dp is dp's layout, so its twin is a challenger.
    # (By plan, not by source: where the search's optimum is a nearest plan, it is shortlisted once,
    # as the optimum.)
    rows = {(str(a), str(mesh), stored): inc for a, mesh, stored, inc in r["eqx_rows"]}
    mesh, near_fsdp = r["eqx_near"]["fsdp"]
    assert rows[(str(near_fsdp), str(mesh), False)] and rows[(str(near_fsdp), str(mesh), True)], rows
    mesh, near_dp = r["eqx_near"]["dp"]
    assert rows[(str(near_dp), str(mesh), False)] and not rows[(str(near_dp), str(mesh), True)], rows
    assert r["eqx_ilp"]["mesh_shape"] in ([4], [2, 2])
    # Linen: params, opt_state, batch -> params, opt_state, loss; two dense layers forward and back.
    assert r["linen"]["feeds_back"] == [0, 1] and r["linen"]["loss_leaf"] is not None
    assert r["linen"]["contractions"] >= 4 and r["linen"]["blocks"] >= 1


@pytest.mark.slow
def test_a_plan_is_refused_for_another_step(searched):
    # The Flax plan handed the Equinox step's arguments (a step with the same arguments but
    # another program: test_a_plan_runs_its_step_and_refuses_other_shapes_steps_and_device_counts).
    r, _ = searched
    assert r["other_step"].startswith("the arguments are not those the plan was searched for (leaves ['[0].layers")
    assert r["other_step"].endswith("give train_step's arguments as autoshard had them, or autoshard again")


LOAD = r"""
import json, sys
import jax
from launcher.sharding.user.api import AutoPlan
from tests.autoshard_models import make_flax_step
plan = AutoPlan.load(sys.argv[1])
step, (state, batch) = make_flax_step()
applied = plan.apply(step)
state, batch = plan.place(state, batch)
losses = []
for _ in range(int(sys.argv[2])):
    state, loss = applied(state, batch)
    losses.append(float(loss))
print(json.dumps({"losses": losses, "source": plan.source,
                  "state_laid_out": all(x.sharding.mesh.devices.size == 4 for x in jax.tree.leaves(state))}))
"""


@pytest.mark.slow
def test_a_saved_plan_loads_in_a_fresh_process_and_trains(searched):
    r, out_dir = searched
    loaded = run_python(LOAD, str(out_dir / "flax_cfp.json"), str(STEPS))
    assert loaded["source"] == r["flax_cfp"]["source"] and loaded["state_laid_out"]
    assert close(loaded["losses"], r["flax_one_device"])


@pytest.mark.heavy  # a whole search from the CLI; the same search from Python is the module's fixture
def test_search_of_a_user_step_from_the_command_line_and_its_plan_under_mode_run(tmp_path, flax_one_device):
    settings = [f"mode.{k}={v}" for k, v in {**SMALL, "run_repeats": 2, "iterations": 2}.items()]
    proc = run_cli("mode=search", "mode.step=tests.autoshard_models:make_flax_step", "mode.mesh_shape=[8]",
                   "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", "mode.verify_nearest=false",
                   "mode.baselines=[dp,fsdp,tp]", f"mode.store_dir={tmp_path / 'store'}", *settings,
                   run_dir=tmp_path / "run", timeout=600)
    result = read_result(tmp_path / "run")
    assert result["step"] == "tests.autoshard_models:make_flax_step" and result["global_devices"] == 8
    # The searched plan trained the model as one device does (a warm-up step, then the rounds).
    assert close(result["losses"][:STEPS], flax_one_device)
    assert set(result["baselines"]) == {"dp", "fsdp"}
    assert "tp lays out the model protocol's logical axes" in result["baselines_skipped"]["tp"]
    table = proc.stdout[proc.stdout.index("CFP plan against the baselines"):]
    assert [line.split()[1] for line in table.splitlines() if line.startswith("│")] == ["cfp", "dp", "fsdp"]
    assert "not run: tp: " in table
    # plan.json is the answer (the fastest plan measured) as an AutoPlan a Python session loads,
    # cfp_plan.json the searched plan whose run the result reports; analysis and profile files
    # as for a model.
    plan, own = (AutoPlan.load(tmp_path / "run" / name) for name in ("plan.json", "cfp_plan.json"))
    assert plan.device_count == 8 and plan.mesh_shape == [8] and plan.step == "train_step"
    assert plan.row == result["answer"]["name"] in ("cfp", "dp", "fsdp") and plan.why == result["answer"]["why"]
    assert plan.name == plan.row and own.name == own.row == "cfp" and own.measured["losses"] == result["losses"]
    assert close(plan.measured["losses"][:STEPS], flax_one_device)
    for name in ("parallel_blocks.txt", "profiles.json", "comparison.txt", "after_ir.txt"):
        assert (tmp_path / "run" / name).stat().st_size > 0, name
    # Loaded by a program of the user's own on every process of another job (mode=run), the plan
    # lays the state out over both processes' devices and trains as one device does.
    run_cli("mode=run", "mode.target=tests.autoshard_models:train_under_plan",
            f"mode.kwargs.plan={tmp_path / 'run' / 'plan.json'}", f"mode.kwargs.steps={STEPS}",
            "cluster.tasks_per_node=2", "cluster.cpu_devices_per_task=4", run_dir=tmp_path / "train", timeout=300)
    trained = read_result(tmp_path / "train")["returned"]
    assert trained["processes"] == 2 and trained["global_state"]
    assert close(trained["losses"], flax_one_device)


# ---------------------------------------------------------------------------------------------
# Bad input: one line saying which and what to do (on this process's devices)


def _plan_for(step, args, **over) -> AutoPlan:
    """A plan of ``step`` on this process's devices, as a search would save it (nothing split)."""
    program = step_program(step, args)
    fields = dict(mesh_shape=[jax.device_count()], constraints={"program": program.signature},
                  args=describe_leaves(program.args), data_argnums=list(program.data_argnums),
                  device_count=jax.device_count(), algorithm="cfp", step=program.name, source="search optimum",
                  predicted_step_time_s=1e-3, predicted_memory_gb=0.0,
                  measured={"step_time_s": 1e-3, "repeat_times_s": [1e-3], "memory_gb": 0.0, "flops": 1.0},
                  baselines={})
    return AutoPlan(**{**fields, **over})


def _mlp_step(w, batch):
    loss, grad = jax.value_and_grad(lambda w: jnp.mean((batch["x"] @ w - batch["y"]) ** 2))(w)
    return w - 0.1 * grad, loss


def _mlp_args(n=8):
    return jnp.ones((4, 2)), {"x": jnp.ones((n, 4)), "y": jnp.zeros((n, 2))}


@pytest.mark.core  # plain JAX: the oldest supported JAX runs these too
def test_a_plan_runs_its_step_and_refuses_other_shapes_steps_and_device_counts(tmp_path):
    plan = _plan_for(_mlp_step, _mlp_args())
    w, loss = plan.apply(_mlp_step)(*_mlp_args())
    assert float(loss) == pytest.approx(16.0) and w.shape == (4, 2)   # (1·4 - 0)² per element
    with pytest.raises(UserError, match=r"argument \[1\]\['x'\] is float32\[16, 4\], and the plan was searched for "
                                        r"float32\[8, 4\]: give arguments shaped as the example ones"):
        plan.apply(_mlp_step)(*_mlp_args(16))
    with pytest.raises(UserError, match="arguments shaped as the example ones"):
        plan.shardings(*_mlp_args(16))
    other = lambda w, batch: _mlp_step(w * 2, batch)
    with pytest.raises(UserError, match="this plan was searched for another step"):
        plan.apply(other)(*_mlp_args())
    with pytest.raises(UserError, match=f"searched on 3 devices, and this job has {jax.device_count()}: run on 3 "):
        _plan_for(_mlp_step, _mlp_args(), device_count=3).shardings(*_mlp_args())
    # Saved and loaded, it is the same plan; a file that is not one is refused.
    path = plan.save(tmp_path / "plan.json")
    assert AutoPlan.load(path).constraints == plan.constraints
    (tmp_path / "other.json").write_text(json.dumps({"name": "dp", "mesh_axes": []}))
    with pytest.raises(UserError, match="is not an auto-sharding plan"):
        AutoPlan.load(tmp_path / "other.json")
    with pytest.raises(UserError, match="no such plan file"):
        AutoPlan.load(tmp_path / "missing.json")


@pytest.mark.core  # plain JAX: the oldest supported JAX runs these too
def test_a_step_without_contractions_or_unlike_its_arguments_is_refused_before_any_profile(tmp_path):
    store = tmp_path / "store"
    with pytest.raises(UserError, match="step has no tensor contraction .* nothing to shard"):
        step, args = make_elementwise_step()
        autoshard(step, *args, store_dir=str(store))
    with pytest.raises(UserError, match=r"_mlp_step cannot be traced on its example arguments \(TypeError: .*\); "
                                        "give example arguments shaped as the step takes them"):
        autoshard(_mlp_step, jnp.ones((3, 2)), _mlp_args()[1], store_dir=str(store))
    with pytest.raises(UserError, match="data_argnums=5: _mlp_step has 2 argument"):
        autoshard(_mlp_step, *_mlp_args(), data_argnums=5, store_dir=str(store))
    with pytest.raises(UserError, match="no option iteratons"):
        autoshard(_mlp_step, *_mlp_args(), iteratons=3, store_dir=str(store))
    assert not store.exists()   # nothing was profiled, nothing written


@pytest.mark.core  # plain JAX: the oldest supported JAX runs these too
def test_the_baselines_of_a_user_step():
    program = step_program(_mlp_step, _mlp_args())
    mesh = make_mesh([4], jax.devices()[:4])
    dp = baseline_shardings(program, "dp", mesh)
    fsdp = baseline_shardings(program, "fsdp", mesh)
    assert tuple(dp[0].spec) in ((), (None, None)) and tuple(dp[1]["x"].spec)[:1] == ("cfp0",)
    assert tuple(fsdp[0].spec) == ("cfp0", None)   # the largest dimension 4 divides, of w's (4, 2)
    with pytest.raises(UserError, match="fsdp: no state leaf has a dimension 8 devices divide"):
        baseline_shardings(program, "fsdp", make_mesh([8]))
    with pytest.raises(UserError, match="tp lays out the model protocol's logical axes"):
        baseline_shardings(program, "tp", mesh)
    with pytest.raises(UserError, match="no shardings of your own were given"):
        baseline_shardings(program, "user", mesh)
    # The state it returns first is fed back; the loss is the scalar after it.
    assert program.feeds_back == (0,) and program.loss_leaf == 1
    assert program.flops == 2 * (2 * 8 * 4 * 2)   # x @ w and its weight gradient: 2 FLOPs per multiply-add


def test_a_step_that_cannot_be_searched_exits_2_with_one_line_and_stores_nothing(tmp_path):
    # Found by the task (reading the step needs JAX): reported as bad input found before
    # submission is, and the profile store stays empty.
    store = tmp_path / "store"
    proc = run_cli("mode=search", "mode.step=tests.autoshard_models:make_step_turning_its_state_to_bf16",
                   "mode.mesh_shape=[8]", f"mode.store_dir={store}", run_dir=tmp_path / "run", check=False, timeout=300)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "to_half takes [0] as float32[16, 8] and returns it (output 0) as bfloat16[16, 8]" in last, proc.stderr
    assert "state must keep its shape and dtype" in last
    assert not (tmp_path / "run" / "result.json").exists()
    assert not store.exists() or not any(store.iterdir())


@pytest.mark.core
def test_a_step_given_as_shapes_runs_on_made_up_values_and_trains():
    # Shapes only: the runs make the values up (floats in [0, 0.02), integers zero), the same on
    # every device; the state the step returns is fed back, so the loss moves.

    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), _mlp_args())
    program = step_program(_mlp_step, shapes)
    assert program.values is None
    runner = baseline_runner(program, "dp", jax.devices())   # compiled, and one step run
    w, batch = runner.args
    assert w.shape == (4, 2) and 0 <= float(w.min()) and float(w.max()) < 0.02
    assert tuple(batch["x"].sharding.spec)[:1] == ("cfp0",) and len(batch["x"].sharding.device_set) == 8
    runner.steps(2)
    assert len(runner.losses) == 3 and runner.losses[2] < runner.losses[0]
    assert runner.result().flops == program.flops and runner.peak_memory_bytes > 0


@pytest.mark.parametrize("override,message", [
    ("mode.step=not_a_module:make", "mode.step=not_a_module:make: no module not_a_module"),
    ("mode.step=tests.autoshard_models:missing", "defines no missing"),
    ("mode.step=tests.autoshard_models", "mode.step=tests.autoshard_models: expected module:function"),
    ("mode.learning_rate=0.1", "mode.learning_rate=0.1 sets the optimizer of the model's step"),
])
def test_bad_mode_step_settings_fail_before_submission(tmp_path, override, message):
    step = "mode.step=tests.autoshard_models:make_flax_step"
    args = [override] if override.startswith("mode.step") else [override, step]
    proc = run_cli("mode=search", *args, run_dir=tmp_path / "run", check=False, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr.strip().splitlines()[-1], proc.stderr
    assert not (tmp_path / "run" / "result.json").exists()
