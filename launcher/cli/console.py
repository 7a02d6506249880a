"""What a finished run prints: the answer to the question its mode asks, then where the rest is.

Each mode's entry in the table ``launcher.modes.MODES`` holds its renderers (``answer``: the
lines printed when the run ends, the comparison table of cfp/search, loss, step time and TFLOPS
of train, devices and bandwidth of check...; ``headline``: one short line, the ``Result`` column
of ``xlaunch runs``), functions of ``result.json`` in the mode's own module
(``launcher/modes/<name>.py``: ``answer`` and ``line``), beside its schema and figures. The entry
is the one that ran (``mode_code``: a preset such as cfp runs search's, and gets its table). A mode without
renderers gets a generic answer from its result's own fields. Every scalar stays in
``result.json``; the console gives the answer and the path, in plain text that reads the same in
a terminal, a pipe or a batch log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from launcher.figures import devices, seconds
from launcher.modes import MODES
from launcher.runtime.watch import remaining_s
from launcher.cli.schema import mode_codes

Render = Callable[[dict], str]

# Fields every result has (launcher/runtime/task.py): the job, not the answer.
BOOKKEEPING = ("mode", "cluster", "num_processes", "global_devices", "platform", "init_time_s", "mode_time_s")


def _renderer(result: dict, which: str) -> Optional[Render]:
    """The ``answer`` or ``headline`` renderer of the mode that ran, if it names one."""
    mode = MODES.get(_runs(result))
    return mode.renderer(which) if mode is not None else None


def _runs(result: dict) -> str:
    """The mode that ran: its code (a preset, cfp or one of yours, runs search's); for a result
    written before results carried it, the code conf/mode gives its name."""
    name = str(result.get("mode"))
    return str(result.get("mode_code") or mode_codes().get(name, name))


def answer_text(result: dict) -> str:
    """The mode's answer (several lines, no trailing newline)."""
    return (_renderer(result, "answer") or _generic_answer)(result).rstrip("\n")


def headline_text(result: dict) -> str:
    """One short line: the run's result at a glance."""
    render = _renderer(result, "headline")
    if render is None:
        first = answer_text(result).splitlines()
        return first[0] if first else ""
    return render(result)


def closing_line(run_dir: Path) -> str:
    return f"run dir: {run_dir} (every field in result.json, each rank's log in logs/)"


def summarize(result: dict, run_dir: Path) -> str:
    """What the console shows when a run ends: its answer, then one line with the run dir."""
    return answer_text(result) + "\n" + closing_line(run_dir)


# --- a mode without an answer of its own ------------------------------------------------------

def _scalar(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _generic_answer(r: dict) -> str:
    """For a mode with no answer of its own: its result's top-level scalar fields, up to 8."""
    fields = [(k, v) for k, v in r.items() if k not in BOOKKEEPING and isinstance(v, (int, float, str, bool))]
    lines = [f"{r.get('mode')} on {r.get('cluster')}: {devices(r)}, {seconds(r.get('mode_time_s', 0.0))}"]
    lines += [f"  {k}: {_scalar(v)}" for k, v in fields[:8]]
    if len(fields) > 8:
        lines.append(f"  ... {len(fields) - 8} more fields")
    return "\n".join(lines)


def progress_line(progress: dict | None, phase: str, since: float, now: float) -> str:
    """``what: done/total (pct), elapsed ..., eta ...`` from rank 0's progress (the job's watch),
    else the phase."""
    if not progress:
        return f"{phase}, {seconds(now - since)} since submission"
    done, total = progress["completed"], max(progress["total"], 1)
    elapsed = now - (progress.get("started") or since)
    left = remaining_s(done, total, progress.get("first"), now)
    eta = "unknown" if left is None else seconds(left)
    return (f"{progress['description']}: {done:g}/{total:g} ({100 * done / total:.0f}%), "
            f"elapsed {seconds(elapsed)}, eta {eta}")
