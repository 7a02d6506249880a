"""Training checkpoints in the run dir: sharded save and restore with orbax-checkpoint.

``<run dir>/checkpoints/<step>/`` holds the training state (parameters and optimizer state, each
process writing its own shards; restored straight into the trainer's shardings) and a JSON item:
the step, the losses and step times so far, and the run's *fingerprint* (the model's config, the
plan with its mesh, the optimizer settings and the seed). A run resumes only from a checkpoint
whose fingerprint is its own: one from another model or plan, or one that cannot be read, is
refused with one message (``UserError``) and left exactly as it was. Batches derive from the
seed and the step number alone (``models.step.data_key``), so the steps after a restore are
the uninterrupted run's steps.

orbax-checkpoint is an optional dependency (``pip install -e .[checkpoint]``; see pyproject for
why), imported only when a run writes or finds checkpoints. Its differences between releases,
and the spec that suits the installed JAX, are in ``launcher/jaxcompat.py``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax

from launcher import jaxcompat
from launcher.errors import UserError

DIRECTORY = "checkpoints"
FORMAT = 1  # of the JSON item; a checkpoint of another format is refused like another run's
KEEP = 2  # the newest two: one to resume from, one more should the newest prove unreadable


@dataclass
class Resumed:
    """Where a restored run stands: the next step to run, and what the steps before it gave."""

    step: int
    losses: list[float]
    step_times_s: list[float]


def directory(run_dir: Path) -> Path:
    return Path(run_dir) / DIRECTORY


def present(run_dir: Path) -> bool:
    """Whether the run dir holds checkpoints (a step folder, whole or not), without orbax."""
    d = directory(run_dir)
    return d.is_dir() and any(p.name.split(".")[0].isdigit() for p in d.iterdir())


class Checkpoints:
    """The checkpoints of one training run; every process must make the same calls in the same
    order (saving and restoring are collective: each process writes and reads its own shards)."""

    def __init__(self, run_dir: Path, fingerprint: dict, log: logging.Logger | None = None) -> None:
        self.dir = directory(run_dir)
        self.fingerprint = _plain(fingerprint)
        self.log = log or logging.getLogger(__name__)
        ocp = jaxcompat.orbax_checkpoint()
        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(max_to_keep=KEEP, create=True,
                                               # a save is complete when save() returns: a signal
                                               # right after it cannot leave it half written
                                               enable_async_checkpointing=False)
        self._manager = _fenced(lambda: ocp.CheckpointManager(self.dir.resolve(), options=options))

    def steps(self) -> list[int]:
        """The steps of the complete checkpoints on disk (orbax leaves an interrupted save in a
        temporary folder, which is not one)."""
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, losses: list[float], step_times_s: list[float]) -> None:
        ocp = self._ocp
        meta = {"format": FORMAT, "fingerprint": self.fingerprint, "step": step, "losses": list(losses),
                "step_times_s": list(step_times_s)}
        _fenced(lambda: self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))))
        _fenced(self._manager.wait_until_finished)
        self.log.info("checkpoint: step %d saved to %s", step, self.dir / str(step))

    def restore(self, state_like: Any) -> tuple[Any, Resumed] | None:
        """The newest checkpoint, restored into ``state_like``'s shapes and shardings (a pytree
        of jax.Arrays, the trainer's state), with where it stands; None when there is none.
        Raises UserError, touching nothing, when it is another run's or cannot be read."""
        steps = self.steps()
        if not steps:
            return None
        step = steps[-1]
        where = self.dir / str(step)
        ocp = self._ocp
        try:
            meta = _fenced(lambda: self._manager.restore(step, args=ocp.args.Composite(
                meta=ocp.args.JsonRestore())))["meta"]
        except Exception as e:  # noqa: BLE001 - whatever orbax or the file system says, one message
            raise UserError(_unreadable(where, e)) from None
        self._check(meta, step, where)
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state_like)
        try:
            state = _fenced(lambda: self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract))))["state"]
        except Exception as e:  # noqa: BLE001
            raise UserError(_unreadable(where, e)) from None
        self.log.info("checkpoint: resumed from step %d (%s)", step, where)
        return state, Resumed(step, [float(x) for x in meta["losses"]], [float(x) for x in meta["step_times_s"]])

    def _check(self, meta: Any, step: int, where: Path) -> None:
        keep = f"it is left as it was: train in another run dir (hydra.run.dir=...), or move {self.dir} away"
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("step") != step or \
                len(meta.get("losses", ())) != step:
            raise UserError(f"the checkpoint {where} is not one xlaunch wrote for step {step} (its JSON item "
                            f"is missing or different); {keep}")
        theirs = meta.get("fingerprint", {})
        if theirs != self.fingerprint:
            diffs = _differences(theirs, self.fingerprint)
            raise UserError(f"the checkpoint {where} is from another run ({'; '.join(diffs[:4])}): resuming from "
                            f"it would train another model or plan; {keep}")

    def close(self) -> None:
        _fenced(self._manager.close)


def _fenced(call: Any) -> Any:
    # orbax's barriers between processes are collective programs (multihost_utils): fenced off
    # from the training step's (jaxcompat.settle_programs).
    jaxcompat.settle_programs()
    out = call()
    jaxcompat.settle_programs()
    return out


def _unreadable(where: Path, e: BaseException) -> str:
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return (f"the checkpoint {where} cannot be read ({type(e).__name__}: {first}); it is left as it was: "
            f"move it away to resume from an earlier one, or train in another run dir")


def _plain(obj: Any) -> Any:
    """JSON's view of ``obj`` (tuples as lists, keys as strings), so a fingerprint read back from
    a checkpoint compares equal to the one computed now."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _differences(theirs: Any, ours: Any, prefix: str = "") -> list[str]:
    if isinstance(theirs, dict) and isinstance(ours, dict):
        out = []
        for k in sorted(set(theirs) | set(ours)):
            key = f"{prefix}.{k}" if prefix else k
            if k not in theirs or k not in ours:
                out.append(f"{key} only in {'this run' if k in ours else 'the checkpoint'}")
            else:
                out += _differences(theirs[k], ours[k], key)
        return out
    if theirs != ours:
        return [f"{prefix or 'fingerprint'}: checkpoint {json_short(theirs)}, this run {json_short(ours)}"]
    return []


def json_short(x: Any, limit: int = 60) -> str:
    text = json.dumps(x, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."
