"""Where a job's time went, over all its attempts (its first run, requeues and restarts).

Rank 0 of each attempt writes ``.xlaunch/time/attempt<N>.json`` as it goes: when the attempt was
submitted (``job.json``, or the attempt record a requeue or restart wrote), when its task started,
when it had joined ``jax.distributed``, when it ended and how; the seconds spent compiling (JAX's
own compile events: tracing, lowering, XLA, and loading from the persistent cache), in steps and
in checkpoints (what the mode reports), and how far its steps got. ``summary`` adds the attempts
up: queued, start-up, compiling, steps, checkpoints, the rest of the mode's time, and work lost
(the steps an attempt did past the checkpoint the next one resumed from, at the job's median step
time); goodput is the time in steps that were kept over the job's wall time, from its first
submission to its last end. ``result.json`` carries it as ``time``; ``xlaunch status`` shows it.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

from launcher.runtime.status import STATUS_DIR, _write_json, read_attempt

TIME_DIR = "time"


class AttemptClock:
    """This attempt's times, written by rank 0 whenever one is added (a failed attempt keeps
    what it had). Modes add theirs through ``add`` and ``set``."""

    def __init__(self, run_dir: Path, attempt: int, write: bool) -> None:
        self.path = Path(run_dir) / STATUS_DIR / TIME_DIR / f"attempt{attempt}.json"
        self.write_enabled, self._written = write, 0.0
        self.data: dict[str, Any] = {"attempt": attempt, "submitted": _submitted(run_dir, attempt),
                                     "started": time.time(), "compile_s": 0.0, "steps_s": 0.0, "checkpoint_s": 0.0}
        self._write()

    def mark(self, name: str) -> None:
        self.data[name] = time.time()
        self._write()

    def add(self, key: str, seconds: float) -> None:
        self.data[key] = self.data.get(key, 0.0) + float(seconds)
        self._write()

    def set(self, **values: Any) -> None:
        self.data.update(values)
        self._write()

    def progressed(self, step: int) -> None:
        """How far this attempt's steps got (what a restart may do again): written at most once a
        second, and at the end."""
        self.data["last_step"] = step
        if time.time() - self._written >= 1.0:
            self._write()

    def end(self, outcome: str, compile_s: float | None = None) -> None:
        if compile_s is not None:
            self.data["compile_s"] = compile_s
        self.data.update(ended=time.time(), outcome=outcome)
        self._write()

    def _write(self) -> None:
        self._written = time.time()
        if self.write_enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _write_json(self.path, self.data)


def _submitted(run_dir: Path, attempt: int) -> float | None:
    """When this attempt was submitted: the job's submission for the first, else when the requeue
    or restart was decided."""
    if attempt:
        return read_attempt(run_dir).get("time")
    try:
        return float(json.loads((Path(run_dir) / "job.json").read_text())["submitted"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def attempts(run_dir: Path) -> list[dict]:
    out = []
    for p in sorted((Path(run_dir) / STATUS_DIR / TIME_DIR).glob("attempt*.json"),
                    key=lambda p: int(p.stem.removeprefix("attempt") or 0)):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def summary(run_dir: Path, step_times: list[float] | None = None, ended: bool = False) -> dict | None:
    """The job's time over all its attempts so far (None before rank 0 has started). An attempt
    that has not said it ended counts to now, or, once the job has ended (``ended``: a rank 0
    killed says nothing), to the last end any attempt recorded."""
    runs = attempts(run_dir)
    if not runs:
        return None
    now = _now(runs, ended)
    each = [spent(a, now) for a in runs]
    first = runs[0].get("submitted") or runs[0]["started"]
    last = max(a.get("ended") or now for a in runs)
    # Work lost: steps an attempt did past the checkpoint the next one resumed from.
    lost_steps = sum(max(a.get("last_step", 0) - b.get("resumed_from_step", a.get("last_step", 0)), 0)
                     for a, b in zip(runs, runs[1:], strict=False))
    median = statistics.median(step_times) if step_times else _median_step(runs)
    lost_s = lost_steps * median if median else 0.0
    wall = max(last - first, 1e-9)
    total = {k: sum(e[k] for e in each) for k in _SPENT}
    total["other_s"] = max(sum(e["in_mode_s"] for e in each) - total["compile_s"] - total["steps_s"]
                           - total["checkpoint_s"], 0.0)
    # What the allocation was held for (each attempt from its start to its end, one that never
    # joined too; not its time in the queue), and what the restarts cost of it: every later
    # attempt's start-up and compiling, and the work done again.
    held = sum(max((a.get("ended") or now) - a["started"], 0.0) for a in runs)
    restart_s = sum(e["startup_s"] + e["compile_s"] for e in each[1:]) + lost_s
    # The latest attempt's scoring of its ranks' steps (runtime/straggler.py), as its rank 0 last saw it.
    scored = [a for a in runs if a.get("slowest")]
    ranks = {"slowest": scored[-1]["slowest"], "slow": scored[-1].get("slow", [])} if scored else {}
    return {
        "attempts": len(runs), "wall_s": wall, **total,
        "lost_steps": lost_steps, "lost_s": lost_s,
        "goodput": max(total["steps_s"] - lost_s, 0.0) / wall,
        "held_s": held, "restart_s": restart_s, "restart_share": restart_s / held if held > 0 else 0.0,
        **ranks,
    }


def cost(t: dict, nodes: int, devices: int | None = None) -> dict:
    """What a run cost (``summary``'s ``t``): node-hours, and device-hours where the device count
    is known, for the time its allocation was held."""
    hours = t.get("held_s", 0.0) / 3600
    return {"node_hours": nodes * hours, **({"device_hours": devices * hours} if devices else {})}


# Where an attempt's time went, in the order the summary's line gives it.
_SPENT = ("queued_s", "startup_s", "compile_s", "steps_s", "checkpoint_s", "other_s")


def spent(a: dict, now: float | None = None) -> dict:
    """One attempt's time (``attempts``' entry): queued, start-up, compiling, steps,
    checkpoints and the rest of the mode's time (``in_mode_s``: all of it, from joining to the
    end); an attempt that has not ended counts to ``now``."""
    now = time.time() if now is None else now

    def span(start: str, stop: str) -> float:
        t0, t1 = a.get(start), a.get(stop) or (now if stop == "ended" else None)
        return max(t1 - t0, 0.0) if t0 is not None and t1 is not None else 0.0

    compile_s, steps_s, checkpoint_s = (a.get(k, 0.0) for k in ("compile_s", "steps_s", "checkpoint_s"))
    return {"queued_s": span("submitted", "started"), "startup_s": span("started", "joined"),
            "compile_s": compile_s, "steps_s": steps_s, "checkpoint_s": checkpoint_s,
            "other_s": max(span("joined", "ended") - compile_s - steps_s - checkpoint_s, 0.0),
            "in_mode_s": span("joined", "ended")}


def _now(runs: list[dict], ended: bool) -> float:
    now = (max(a.get("ended") or 0.0 for a in runs) or None) if ended else None
    return time.time() if now is None else now


def _median_step(runs: list[dict]) -> float:
    per = [a["steps_s"] / a["steps_done"] for a in runs if a.get("steps_done")]
    return statistics.median(per) if per else 0.0


def line(t: dict) -> str:
    """The summary in one line, as ``xlaunch status`` and the launcher's last lines show it."""
    parts = [f"queued {t['queued_s']:.1f} s", f"start-up {t['startup_s']:.1f} s", f"compiling {t['compile_s']:.1f} s",
             f"steps {t['steps_s']:.1f} s", f"checkpoints {t['checkpoint_s']:.1f} s", f"other {t['other_s']:.1f} s"]
    if t["lost_steps"]:
        parts.append(f"lost {t['lost_s']:.1f} s ({t['lost_steps']} steps done again)")
    restarts = ""
    if t["attempts"] > 1:
        restarts = f", {t['attempts']} attempts"
        if "restart_s" in t:   # a summary written before restarts were costed has no share
            restarts += (f" (restarts cost {t['restart_s']:.1f} s, {100 * t['restart_share']:.0f}% of the "
                         f"{t['held_s']:.1f} s the allocation was held)")
    return f"{', '.join(parts)}; goodput {100 * t['goodput']:.0f}% of {t['wall_s']:.1f} s{restarts}"
