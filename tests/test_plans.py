"""Sharding plans (issue 3): JSON round trips, training under every plan on 8 virtual devices
giving the losses of 1 device, the layouts and collectives each plan implies, and plans that
do not fit.

Multi-device work runs in one subprocess per model (8 virtual CPU devices there; the test
process keeps whatever devices it has). Each worker trains the tiny preset 20 steps on 1
device and then under every plan that applies, and reports losses, the compiled step's
collectives, the layouts of a weight and its Adam moment, and the errors of plans that do
not fit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launcher.models.errors import ModelError
from launcher.models.plans import BUILTINS, Plan, builtin, load_plan

pytestmark = pytest.mark.core

REPO = Path(__file__).resolve().parents[1]
STEPS = 20  # on 1 device, where the loss must fall
PLAN_STEPS = 6  # under each plan: compiling dominates, and layout errors show in the first steps
# Float32 sums are split differently over 8 shards than on 1 device, and AdamW divides by
# the square root of tiny second moments in its first steps, which magnifies rounding: losses
# drift apart by ~1e-6 over the first steps. 2e-4 is far below what a wrong layout does (a missing
# gradient all-reduce or a mis-split head changes the loss by >1e-2 within a few steps).
TOLERANCE = 2e-4

WORKER = r"""
import json, re, sys
import jax
from launcher import jaxcompat
jaxcompat.set_cpu_device_count(8)
from launcher.models.errors import ModelError
from launcher.models.plans import builtin
from launcher.models.train import run_training
from tests.test_models import load_preset

family, plans = sys.argv[1], sys.argv[2].split(",")
model = load_preset(f"{family}-tiny", num_layers=1)  # one layer: every plan shows, compiles faster
ref = run_training(model, builtin("dp"), STEPS, jax.devices()[:1])
out = {"reference": ref.losses, "plans": {}, "errors": {}}
COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute)(?:-start)?\(")

def spec(arr):
    return [list(e) if isinstance(e, tuple) else e for e in arr.sharding.spec]

def find(state, *parts):
    for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
        p = jax.tree_util.keystr(path)
        if all(x in p for x in parts):
            return spec(leaf)
    return None

weight = {"gpt": "['layers'][0]['mlp']['w_in']", "bert": "['layers'][0]['mlp']['w_in']",
          "llama2": "['layers'][0]['mlp']['w_up']", "moe": "['layers'][0]['moe']['w_in']"}[family]
for name in plans:
    try:
        r = run_training(model, builtin(name), PLAN_STEPS, jax.devices())
    except ModelError as e:
        out["errors"][name] = str(e)
        continue
    hlo = r.compiled.as_text()
    counts = {}
    for m in COLLECTIVE.finditer(hlo):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    out["plans"][name] = {"losses": r.losses, "collectives": counts,
                          "weight": find(r.state["params"], weight),
                          "weight_mu": find(r.state["opt_state"], ".mu", weight)}
if family == "gpt":  # plans that do not fit, checked before anything compiles
    cases = {
        "tp_heads": (load_preset("gpt-tiny", num_layers=1, heads=4), builtin("tp")),
        "dp_tp_axis": (model, builtin("dp_tp").with_axis_sizes(model=3)),
        "dp_batch": (load_preset("gpt-tiny", num_layers=1, batch_size=4), builtin("dp")),
        "ep_dense": (model, builtin("ep")),
    }
    for key, (m, plan) in cases.items():
        try:
            run_training(m, plan, 1, jax.devices())
            out["errors"][key] = None
        except ModelError as e:
            out["errors"][key] = str(e)
print("RESULT " + json.dumps(out))
""".replace("PLAN_STEPS", str(PLAN_STEPS)).replace("STEPS", str(STEPS))

APPLICABLE = {
    "gpt": ["dp", "tp", "fsdp", "dp_tp", "ep"],  # ep must refuse a dense model
    "bert": ["dp", "tp", "fsdp", "dp_tp"],
    "llama2": ["dp", "tp", "fsdp", "dp_tp"],
    "moe": ["dp", "tp", "fsdp", "dp_tp", "ep"],
}
_RUNNING: dict[str, subprocess.Popen] = {}
_RESULTS: dict[str, dict] = {}
_SELECTED: set[str] = set()   # the models of this session's selected parametrized tests (_stop_workers)


def worker(family: str) -> dict:
    """The worker's report for one model. The first call starts the workers of every model the
    session's selected tests name at once (XLA compiles on one thread, so they share the cores
    instead of queueing); a model no selected test names (bert's, 66 s, by default) is never
    started, and one asked for later starts then."""
    # XLA's backend optimisations are off, as for the whole session (tests/conftest.py).
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    wanted = {family} if _RUNNING else {family, *_SELECTED}
    for name in sorted(wanted - set(_RUNNING)):
        _RUNNING[name] = subprocess.Popen([sys.executable, "-c", WORKER, name, ",".join(APPLICABLE[name])], cwd=REPO,
                                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if family not in _RESULTS:
        proc = _RUNNING[family]
        try:
            stdout, stderr = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
        assert proc.returncode == 0 and lines, f"worker for {family} failed:\n{stdout}\n{stderr}"
        _RESULTS[family] = json.loads(lines[-1][len("RESULT "):])
    return _RESULTS[family]


@pytest.fixture(scope="module", autouse=True)
def _stop_workers(request):
    # The models of the parametrized tests selected (-m 'not heavy' leaves gpt's and bert's out;
    # gpt's worker still starts for the tests below that read its plans).
    _SELECTED.update(item.callspec.params["family"] for item in request.session.items
                     if item.module is request.module and "family" in getattr(getattr(item, "callspec", None), "params", {}))
    yield
    for proc in _RUNNING.values():  # a test that failed early leaves workers running
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
# gpt and bert in the heavy stage (45 s of compiles alone; bert 66 s beside the other worker): the plans are the same rules on
# every family, and llama2 (decoder) and moe (experts, ep) still run every plan by default.
@pytest.mark.parametrize("family", [pytest.param("gpt", marks=pytest.mark.heavy),
                                    pytest.param("bert", marks=pytest.mark.heavy), "llama2", "moe"])
def test_every_plan_on_8_devices_gives_the_single_device_losses(family):
    r = worker(family)
    ref = np.array(r["reference"])
    assert len(ref) == STEPS
    # The loss falls: the synthetic data has a learnable signal (models/data.py).
    assert ref[-5:].mean() < ref[0] - 0.3, ref
    expected = [p for p in APPLICABLE[family] if not (p == "ep" and family != "moe")]
    assert sorted(r["plans"]) == sorted(expected)
    for name, got in r["plans"].items():
        diff = np.abs(np.array(got["losses"]) - ref[:PLAN_STEPS]).max()
        assert diff < TOLERANCE, (name, diff)


@pytest.mark.slow
def test_plans_lay_out_weights_and_communicate_as_named():
    gpt, moe = worker("gpt")["plans"], worker("moe")["plans"]
    # dp: weights replicated, gradients all-reduced.
    assert gpt["dp"]["weight"] == [] and gpt["dp"]["collectives"].get("all-reduce", 0) > 0
    assert "all-gather" not in gpt["dp"]["collectives"]
    # tp: the MLP's columns split over "model", and so are their Adam moments.
    assert gpt["tp"]["weight"] == [None, "model"] == gpt["tp"]["weight_mu"]
    # fsdp: weights and moments split along the embedding dimension, gathered where used.
    assert gpt["fsdp"]["weight"] == ["data"] == gpt["fsdp"]["weight_mu"]
    assert gpt["fsdp"]["collectives"].get("all-gather", 0) > 0
    # dp_tp: columns split over "model" only (the "data" axis replicates them).
    assert gpt["dp_tp"]["weight"] == [None, "model"]
    # ep: each device holds one expert of the 8, tokens travel to their experts by all-to-all.
    assert moe["ep"]["weight"] == ["data"] == moe["ep"]["weight_mu"]
    assert moe["ep"]["collectives"].get("all-to-all", 0) > 0
    assert "all-to-all" not in moe["dp"]["collectives"]


@pytest.mark.slow
def test_plans_that_do_not_fit_name_the_dimension_and_mesh_axis():
    errors = worker("gpt")["errors"]
    assert "ep" in errors and "no parameter with those axes" in errors["ep"]
    assert errors["ep"].endswith("use a plan that applies to it: dp, tp, fsdp, dp_tp")  # not ep itself
    assert "'heads', size 4" in errors["tp_heads"] and "mesh axis 'model' (size 8)" in errors["tp_heads"]
    assert "parameter layers.0.attn." in errors["tp_heads"]
    assert "'model'=3" in errors["dp_tp_axis"] and "8 devices" in errors["dp_tp_axis"]
    assert re.search(r"input (tokens|targets) \(4, 32\): dimension 0 \('batch', size 4\)", errors["dp_batch"])
    assert "mesh axis 'data' (size 8)" in errors["dp_batch"]


# --- JSON -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_plans_round_trip_through_json(name, tmp_path):
    plan = builtin(name)
    path = tmp_path / f"{name}.json"
    plan.to_json(path)
    again = Plan.from_json(path)
    assert again == plan
    assert load_plan(str(path)) == plan
    assert json.loads(path.read_text())["mesh_axes"][0][1] is None  # sized from the device count


def test_search_constraints_are_carried_through_json(tmp_path):
    plan = Plan("searched", (("data", 4), ("model", 2)),
                {"params": {"mlp": ["data", "model"]}, "activations": {"batch": "data"}, "inputs": {"batch": "data"}},
                constraints={"dot_3": [["data"], None, "model"]})
    plan.to_json(tmp_path / "p.json")
    again = Plan.from_json(tmp_path / "p.json")
    assert again.constraints == {"dot_3": [["data"], None, "model"]}
    assert again.rules["params"]["mlp"] == ["data", "model"]
    assert again.axis_sizes(8) == {"data": 4, "model": 2}


def test_mesh_sizes_derive_from_the_device_count():
    assert builtin("dp").axis_sizes(8) == {"data": 8}
    assert builtin("dp_tp").axis_sizes(8) == {"data": 4, "model": 2}
    assert builtin("dp_tp").with_axis_sizes(model=4).axis_sizes(8) == {"data": 2, "model": 4}
    with pytest.raises(ModelError, match=r"'model'=3 need a device count divisible by 3, but there are 8"):
        builtin("dp_tp").with_axis_sizes(model=3).axis_sizes(8)
    with pytest.raises(ModelError, match=r"has mesh axes \['data'\]; cannot size \['model'\]"):
        builtin("dp").with_axis_sizes(model=2)


def test_bad_plan_files_say_what_is_wrong(tmp_path):
    with pytest.raises(ModelError, match=r"unknown plan 'zero3'.*built-in plans are"):
        load_plan("zero3")
    with pytest.raises(ModelError, match=r"does not exist"):
        load_plan(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ModelError, match=r"is not valid JSON"):
        load_plan(str(bad))
    d = builtin("dp").to_dict()
    for mutate, message in [
        (lambda d: d.update(mesh={"data": 8}), r"unknown keys \['mesh'\]"),
        (lambda d: d.update(mesh_axes={"data": None}), r"mesh_axes must be a list of \[name, size or null\] pairs"),
        (lambda d: d["rules"]["params"].update(heads="model"), r"params rule 'heads' -> 'model' names a mesh axis that is not in"),
        (lambda d: d["rules"]["inputs"].update(batch=3), r"rule inputs.batch = 3"),
        (lambda d: d.update(mesh_axes=[["data", None], ["model", None]]), r"at most one mesh axis may have size null"),
        (lambda d: d["rules"].update(weights={}), r"unknown rule set\(s\) \['weights'\]"),
    ]:
        d2 = json.loads(json.dumps(d))
        mutate(d2)
        path = tmp_path / "p.json"
        path.write_text(json.dumps(d2))
        with pytest.raises(ModelError, match=message):
            Plan.from_json(path)
