"""Training checkpoints (issue 18): sharded save and restore with orbax-checkpoint, resumed runs
that continue the uninterrupted run's losses exactly, and checkpoints that are not this run's
refused with one message and left as they were.

In this process (8 virtual CPU devices, conftest): the Checkpoints class and the Trainer. Through
the real CLI (2 processes joined by jax.distributed, each saving and restoring its own shards):
``python -m launcher mode=train mode.checkpoint_every=N launcher.trace=true``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from launcher import jaxcompat
from launcher.errors import UserError
from launcher.runtime.checkpoint import Checkpoints
from launcher.models.plans import builtin
from launcher.models.train import Trainer
from tests.launch import read_result, run_cli
from tests.test_models import load_preset
from tests.train_reference import CHECKPOINT_EVERY, LOCAL, STEPS, TRAIN, uninterrupted
import tomllib

pytestmark = pytest.mark.core

FINGERPRINT = {"model": {"name": "a"}, "plan": {"name": "fsdp", "mesh_shape": {"data": 8}}, "seed": 0}


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` and a hash of its bytes: "left as it was" means this is unchanged."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def sharded_state() -> dict:
    mesh = Mesh(np.array(jax.devices()), ("data",))
    w = jax.device_put(jnp.arange(64.0).reshape(16, 4), NamedSharding(mesh, PartitionSpec("data")))
    return {"params": {"w": w}, "opt_state": {"count": jnp.int32(3)}}


def test_a_restored_trainer_continues_the_uninterrupted_losses_exactly(tmp_path):
    model, plan = load_preset("gpt-tiny"), builtin("fsdp")  # parameters and moments split 8 ways
    full = Trainer(model, plan)
    times = full.steps(3)
    Checkpoints(tmp_path, FINGERPRINT).save(3, full.state, full.losses, times)  # saving changes nothing
    full.steps(3)

    resumed = Trainer(model, plan)
    state, at = Checkpoints(tmp_path, FINGERPRINT).restore(resumed.state)
    assert (at.step, at.losses, at.step_times_s) == (3, full.losses[:3], times)
    # Restored straight into the trainer's layout: each device holds only its shard.
    shardings = lambda tree: jax.tree.leaves(jax.tree.map(lambda a: a.sharding, tree))
    assert shardings(state) == shardings(resumed.state)
    assert any(s.data.shape != a.shape for a in jax.tree.leaves(state) for s in a.addressable_shards)
    resumed.load_state(state, at.step, at.losses)
    resumed.steps(3)
    assert resumed.losses == full.losses  # the same floats, not merely close


def test_steps_are_listed_and_only_the_newest_two_are_kept(tmp_path):
    ckpt = Checkpoints(tmp_path, FINGERPRINT)
    state = sharded_state()
    for step in (2, 4, 6):
        ckpt.save(step, state, [1.0] * step, [0.1] * step)
    assert ckpt.steps() == [4, 6]
    restored, at = Checkpoints(tmp_path, FINGERPRINT).restore(state)
    assert at.step == 6 and np.array_equal(restored["params"]["w"], state["params"]["w"])
    assert Checkpoints(tmp_path / "empty", FINGERPRINT).restore(state) is None


def test_another_runs_checkpoint_is_refused_with_what_differs_and_left_as_it_was(tmp_path):
    state = sharded_state()
    Checkpoints(tmp_path, FINGERPRINT).save(2, state, [1.0, 0.9], [0.1, 0.1])
    before = tree_digest(tmp_path)
    other = {**FINGERPRINT, "plan": {"name": "tp", "mesh_shape": {"model": 8}}}
    with pytest.raises(UserError) as e:
        Checkpoints(tmp_path, other).restore(state)
    message = str(e.value)
    assert "is from another run" in message and "plan.name" in message and "left as it was" in message
    assert "\n" not in message
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("damage", ["state", "meta"])
def test_a_corrupt_checkpoint_is_refused_and_left_as_it_was(tmp_path, damage):
    state = sharded_state()
    Checkpoints(tmp_path, FINGERPRINT).save(2, state, [1.0, 0.9], [0.1, 0.1])
    files = [p for p in (tmp_path / "checkpoints" / "2" / damage).rglob("*") if p.is_file()]
    assert files
    for p in files:  # every byte of the item replaced: what a failing disk or a bad copy leaves
        p.write_bytes(b"\x00garbage" * 8)
    before = tree_digest(tmp_path)
    with pytest.raises(UserError) as e:
        Checkpoints(tmp_path, FINGERPRINT).restore(state)
    assert str(e.value).startswith("the checkpoint ") and "left as it was" in str(e.value)
    assert tree_digest(tmp_path) == before


def test_the_orbax_spec_keeps_the_jax_it_is_for():
    # No orbax-checkpoint release imports on both ends of the range (pyproject.toml says why).
    assert jaxcompat.orbax_requirement("0.4.35") == "orbax-checkpoint>=0.11.5,<0.11.6"
    assert jaxcompat.orbax_requirement("0.10.2") == "orbax-checkpoint>=0.11.5"

    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("orbax") for d in extras["dependencies"])  # pip would replace jax 0.4.35
    assert extras["optional-dependencies"]["checkpoint"] == ["orbax-checkpoint>=0.11.5"]


# --- through the CLI: 2 processes, each saving and restoring its own shards -----------------------

@pytest.mark.heavy  # a profiler trace per rank beside the checkpoints; resumption from them is the default run's
def test_checkpoints_and_a_trace_per_rank_are_left_in_the_run_dir():
    run = uninterrupted()
    result = read_result(run)
    assert result["num_processes"] == 2 and len(result["losses"]) == STEPS and result["resumed_from_step"] == 0
    # orbax keeps the newest two; each holds the state and the JSON item with the losses so far.
    assert sorted(int(p.name) for p in (run / "checkpoints").iterdir()) == [STEPS - CHECKPOINT_EVERY, STEPS]
    meta = json.loads((run / "checkpoints" / str(STEPS) / "meta" / "metadata").read_text())
    assert meta["losses"] == result["losses"] and meta["step"] == STEPS
    for rank in (0, 1):  # one trace per rank, in XProf's layout, with the Perfetto JSON beside it
        (session,) = (run / "traces" / f"rank{rank}" / "plugins" / "profile").iterdir()
        assert len(list(session.glob("*.xplane.pb"))) == 1 and list(session.glob("*trace.json.gz"))


@pytest.mark.heavy  # a rerun in the run dir; a killed rank's restart and SLURM's requeue resume so by default
def test_a_run_resumed_from_its_run_dir_ends_with_the_uninterrupted_losses(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted(), run)
    shutil.rmtree(run / "checkpoints" / str(STEPS))  # as if the job had stopped after the one before
    (run / "result.json").unlink()
    run_cli(*TRAIN, *LOCAL, run_dir=run, timeout=300)
    resumed, reference = read_result(run), read_result(uninterrupted())
    assert resumed["resumed_from_step"] == STEPS - CHECKPOINT_EVERY
    assert resumed["losses"] == reference["losses"]
    assert f"checkpoint: resumed from step {STEPS - CHECKPOINT_EVERY}" in (run / "logs" / "rank1.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("override, message", [
    ("model.hidden=32", "is from another run (model.hidden: checkpoint 64, this run 32)"),
    # the same refusal, the same checkpoint kept, for another reason: in the heavy stage
    pytest.param("mode.resume=false", "mode.resume=false but", marks=pytest.mark.heavy),
])
def test_a_checkpoint_this_run_must_not_resume_from_fails_it_with_one_line_and_is_kept(tmp_path, override, message):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted() / "checkpoints", run / "checkpoints")
    before = tree_digest(run / "checkpoints")
    proc = run_cli(*TRAIN, *LOCAL, override, run_dir=run, timeout=300, check=False)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert tree_digest(run / "checkpoints") == before
