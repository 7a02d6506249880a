"""What a finished run prints: the answer to the question its mode asks, then where the rest is.

Each mode's entry in the table ``launcher.modes.MODES`` names its renderers (``answer``: the
lines printed when the run ends, the comparison table of cfp/search, loss, step time and TFLOPS
of train, devices and bandwidth of check...; ``headline``: one short line, the ``Result`` column
of ``xlaunch runs``), functions of ``result.json`` defined here. The entry is the one that ran
(``mode_code``: a preset such as cfp runs search's, and gets its table). A mode without
renderers gets a generic answer from its result's own fields. Every scalar stays in
``result.json``; the console gives the answer and the path, in plain text that reads the same in
a terminal, a pipe or a batch log.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable, Optional

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


# --- formatting ----------------------------------------------------------------------------

def seconds(s: float) -> str:
    if s == 0 or math.isnan(s):
        return f"{s:g} s"
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    return f"{int(s // 60)} min {s % 60:.0f} s"


def mib(n: float) -> str:
    return f"{n / 2**20:.3g} MiB"


def _devices(r: dict) -> str:
    return f"{r.get('global_devices', '?')} {r.get('platform', '')} devices in {r.get('num_processes', '?')} processes"


def _scalar(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _generic_answer(r: dict) -> str:
    """For a mode with no answer of its own: its result's top-level scalar fields, up to 8."""
    fields = [(k, v) for k, v in r.items() if k not in BOOKKEEPING and isinstance(v, (int, float, str, bool))]
    lines = [f"{r.get('mode')} on {r.get('cluster')}: {_devices(r)}, {seconds(r.get('mode_time_s', 0.0))}"]
    lines += [f"  {k}: {_scalar(v)}" for k, v in fields[:8]]
    if len(fields) > 8:
        lines.append(f"  ... {len(fields) - 8} more fields")
    return "\n".join(lines)


# --- the modes ------------------------------------------------------------------------------

def check_answer(r: dict) -> str:
    hosts = r.get("hosts") or []
    psum = "ok" if r.get("psum_ok") else f"WRONG ({r.get('psum_value')}, expected {r.get('psum_expected')})"
    return "\n".join([
        f"check: {_devices(r)} on {len(hosts)} host(s) ({', '.join(hosts)}): psum {psum}",
        f"all-gather of {mib(r.get('allgather_bytes_per_device', 0))} per device: "
        f"{r.get('allgather_gbps', 0.0):.3g} GB/s bus bandwidth (median {seconds(r.get('allgather_time_s', 0.0))})",
    ])


def check_line(r: dict) -> str:
    psum = "psum ok" if r.get("psum_ok") else "psum WRONG"
    return f"{r.get('global_devices')} devices, {psum}, all-gather {r.get('allgather_gbps', 0.0):.3g} GB/s"


def train_answer(r: dict) -> str:
    losses = r.get("losses") or [math.nan]
    plan = (r.get("plan") or {})
    mesh = plan.get("mesh_shape") or {}
    lines = [
        f"train {r.get('model')} under plan {plan.get('name')} {mesh} on {_devices(r)}: "
        f"{r.get('steps')} steps, loss {losses[0]:.4g} -> {losses[-1]:.4g}",
        f"step time {seconds(r.get('step_time_s', math.nan))} (median), {r.get('tflops', math.nan):.3g} TFLOPS "
        f"({r.get('tflops_per_device', math.nan):.3g} per device), peak memory "
        f"{mib(r.get('peak_memory_bytes', 0))} per device, compile {seconds(r.get('compile_time_s', 0.0))}",
    ]
    if r.get("resumed_from_step"):
        lines.append(f"resumed from the checkpoint of step {r['resumed_from_step']}")
    return "\n".join(lines)


def train_line(r: dict) -> str:
    losses = r.get("losses") or [math.nan]
    return (f"loss {losses[-1]:.4g}, {seconds(r.get('step_time_s', math.nan))}/step, "
            f"{r.get('tflops', math.nan):.3g} TFLOPS")


def comparison_answer(r: dict) -> str:
    """The comparison table, from the result's fields as comparison.txt has it (plain text;
    under it, which plan is the answer and why), the chart beside it, and the answer's plan file."""
    answer = r.get("answer") or {}
    if r.get("baselines") is not None and r.get("repeat_times_s") and answer.get("searched"):
        from launcher.sharding.report import comparison_text  # noqa: PLC0415  rich: at the run's end only

        lines = [comparison_text(r).rstrip("\n")]
    else:
        lines = [f"{r.get('mode')}: searched plan {seconds(r.get('step_time_s', math.nan))}/step"]
        if answer.get("why"):
            lines.append(answer["why"])
    if r.get("chart"):
        lines.append(f"chart: {r['chart']}")
    if answer.get("plan_file"):
        lines.append(f"plan: {answer['plan_file']} ({answer.get('name')}; mode=train mode.plan=<it> trains with it)")
    return "\n".join(lines)


def comparison_line(r: dict) -> str:
    answer = r.get("answer") or {}
    if "vs_best_baseline" not in r:
        line = f"searched plan {seconds(r.get('step_time_s', math.nan))}/step"
    else:
        line = f"searched plan {r.get('vs_best_baseline_paired', r['vs_best_baseline']):.3f}x {r.get('best_baseline')}"
    return f"answer {answer['name']}; {line}" if answer.get("name") else line


def replay_answer(r: dict) -> str:
    modules = r.get("modules") or [r]
    lines = [f"hlo_replay on {_devices(r)}:"]
    for m in modules:
        times = sorted(m.get("execution_times_s") or [])
        ran = (f"{seconds(times[len(times) // 2])} per execution (median of {len(times)})" if times
               else "not executed")
        lines.append(f"  {m.get('module')}: {ran}, compiled in {seconds(m.get('compile_time_s', 0.0))}")
    return "\n".join(lines)


def replay_line(r: dict) -> str:
    modules = r.get("modules") or [r]
    medians = [sorted(t)[len(t) // 2] for t in (m.get("execution_times_s") or [] for m in modules) if t]
    return f"{len(modules)} module(s), " + (f"median {seconds(medians[0])}" if len(medians) == 1 else
                                           f"{len(medians)} timed")


def analysis_answer(r: dict) -> str:
    return (f"analysis on mesh {r.get('mesh_shape')}: {r.get('num_contractions')} contractions in "
            f"{r.get('num_blocks')} parallel blocks, {len(r.get('segments') or [])} segments; plan space "
            f"{r.get('exhaustive_space')} exhaustive, {r.get('segment_space')} by segments")


def analysis_line(r: dict) -> str:
    return f"{r.get('num_blocks')} blocks, {len(r.get('segments') or [])} segments"


def profile_answer(r: dict) -> str:
    return (f"profile: {r.get('profiled_configs')} segment combinations ({r.get('measured_configs')} measured now, "
            f"{r.get('reused_configs')} reused from the store; {r.get('over_budget_configs', 0)} over the memory "
            f"budget, {r.get('stopped_early_configs', 0)} stopped early) in {seconds(r.get('profile_time_s', 0.0))}")


def profile_line(r: dict) -> str:
    return f"{r.get('profiled_configs')} combinations, {r.get('measured_configs')} measured"


def run_answer(r: dict) -> str:
    """The user's program: what it was, and what its function returned (JSON, short)."""
    lines = [f"run {r.get('program')} on {_devices(r)}: done in {seconds(r.get('mode_time_s', 0.0))}"
             + (f" (restart {r['restart']})" if r.get("restart") else "")]
    if "returned" in r:
        text = json.dumps(r["returned"], default=str)
        lines.append("returned: " + (text if len(text) <= 400 else text[:400] + " ..."))
    return "\n".join(lines)


def run_line(r: dict) -> str:
    text = json.dumps(r.get("returned"), default=str) if "returned" in r else "done"
    return text if len(text) <= 60 else text[:57] + "..."


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
