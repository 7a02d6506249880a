"""What a finished run prints: the answer to the question its mode asks, then where the rest is.

One entry per mode, keyed by the mode that runs (``mode_code``: a preset such as cfp runs
search's), each turning ``result.json`` into text: ``ANSWERS`` (the lines printed when the run
ends: the comparison table of cfp/search, loss, step time and TFLOPS of train, devices and
bandwidth of check, ...) and ``HEADLINES`` (one short line, the
``Result`` column of ``xlaunch runs``). A mode without an entry gets a generic answer from its
result's own fields. Every scalar stays in ``result.json``; the console gives the answer and the
path, in plain text that reads the same in a terminal, a pipe or a batch log.

    @answer("mymode")
    def _(result: dict) -> str: ...
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

from launcher.schema import mode_codes

Render = Callable[[dict], str]
ANSWERS: dict[str, Render] = {}
HEADLINES: dict[str, Render] = {}

# Fields every result has (launcher/runtime/task.py): the job, not the answer.
BOOKKEEPING = ("mode", "cluster", "num_processes", "global_devices", "platform", "init_time_s", "mode_time_s")


def answer(mode: str) -> Callable[[Render], Render]:
    def register(fn: Render) -> Render:
        ANSWERS[mode] = fn
        return fn
    return register


def headline(mode: str) -> Callable[[Render], Render]:
    def register(fn: Render) -> Render:
        HEADLINES[mode] = fn
        return fn
    return register


def _runs(result: dict) -> str:
    """The mode that ran: its code (a preset, cfp or one of yours, runs search's); for a result
    written before results carried it, the code conf/mode gives its name."""
    name = str(result.get("mode"))
    return str(result.get("mode_code") or mode_codes().get(name, name))


def answer_text(result: dict) -> str:
    """The mode's answer (several lines, no trailing newline)."""
    return ANSWERS.get(_runs(result), _generic_answer)(result).rstrip("\n")


def headline_text(result: dict) -> str:
    """One short line: the run's result at a glance."""
    render = HEADLINES.get(_runs(result))
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

@answer("check")
def _check(r: dict) -> str:
    hosts = r.get("hosts") or []
    psum = "ok" if r.get("psum_ok") else f"WRONG ({r.get('psum_value')}, expected {r.get('psum_expected')})"
    return "\n".join([
        f"check: {_devices(r)} on {len(hosts)} host(s) ({', '.join(hosts)}): psum {psum}",
        f"all-gather of {mib(r.get('allgather_bytes_per_device', 0))} per device: "
        f"{r.get('allgather_gbps', 0.0):.3g} GB/s bus bandwidth (median {seconds(r.get('allgather_time_s', 0.0))})",
    ])


@headline("check")
def _check_line(r: dict) -> str:
    psum = "psum ok" if r.get("psum_ok") else "psum WRONG"
    return f"{r.get('global_devices')} devices, {psum}, all-gather {r.get('allgather_gbps', 0.0):.3g} GB/s"


@answer("train")
def _train(r: dict) -> str:
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


@headline("train")
def _train_line(r: dict) -> str:
    losses = r.get("losses") or [math.nan]
    return (f"loss {losses[-1]:.4g}, {seconds(r.get('step_time_s', math.nan))}/step, "
            f"{r.get('tflops', math.nan):.3g} TFLOPS")


def _comparison(r: dict) -> str:
    """The comparison table rank 0 wrote (plain text; under it, which plan is the answer and
    why), the chart beside it, and the answer's plan file."""
    table = Path(str(r.get("comparison", "")))
    answer = r.get("answer") or {}
    if r.get("comparison") and table.is_file():
        lines = [table.read_text().rstrip("\n")]
    else:
        lines = [f"{r.get('mode')}: searched plan {seconds(r.get('step_time_s', math.nan))}/step"]
        if answer.get("why"):
            lines.append(answer["why"])
    if r.get("chart"):
        lines.append(f"chart: {r['chart']}")
    if answer.get("plan_file"):
        lines.append(f"plan: {answer['plan_file']} ({answer.get('name')}; mode=train mode.plan=<it> trains with it)")
    return "\n".join(lines)


def _comparison_line(r: dict) -> str:
    answer = r.get("answer") or {}
    if "vs_best_baseline" not in r:
        line = f"searched plan {seconds(r.get('step_time_s', math.nan))}/step"
    else:
        line = f"searched plan {r.get('vs_best_baseline_paired', r['vs_best_baseline']):.3f}x {r.get('best_baseline')}"
    return f"answer {answer['name']}; {line}" if answer.get("name") else line


# Keyed by what runs: every preset of search (cfp, or one of a user's) gets its comparison.
answer("search")(_comparison)
headline("search")(_comparison_line)


@answer("hlo_replay")
def _replay(r: dict) -> str:
    modules = r.get("modules") or [r]
    lines = [f"hlo_replay on {_devices(r)}:"]
    for m in modules:
        times = sorted(m.get("execution_times_s") or [])
        ran = (f"{seconds(times[len(times) // 2])} per execution (median of {len(times)})" if times
               else "not executed")
        lines.append(f"  {m.get('module')}: {ran}, compiled in {seconds(m.get('compile_time_s', 0.0))}")
    return "\n".join(lines)


@headline("hlo_replay")
def _replay_line(r: dict) -> str:
    modules = r.get("modules") or [r]
    medians = [sorted(t)[len(t) // 2] for t in (m.get("execution_times_s") or [] for m in modules) if t]
    return f"{len(modules)} module(s), " + (f"median {seconds(medians[0])}" if len(medians) == 1 else
                                           f"{len(medians)} timed")


@answer("analysis")
def _analysis(r: dict) -> str:
    return (f"analysis on mesh {r.get('mesh_shape')}: {r.get('num_contractions')} contractions in "
            f"{r.get('num_blocks')} parallel blocks, {len(r.get('segments') or [])} segments; plan space "
            f"{r.get('exhaustive_space')} exhaustive, {r.get('segment_space')} by segments")


@headline("analysis")
def _analysis_line(r: dict) -> str:
    return f"{r.get('num_blocks')} blocks, {len(r.get('segments') or [])} segments"


@answer("profile")
def _profile(r: dict) -> str:
    return (f"profile: {r.get('profiled_configs')} segment combinations ({r.get('measured_configs')} measured now, "
            f"{r.get('reused_configs')} reused from the store; {r.get('over_budget_configs', 0)} over the memory "
            f"budget, {r.get('stopped_early_configs', 0)} stopped early) in {seconds(r.get('profile_time_s', 0.0))}")


@headline("profile")
def _profile_line(r: dict) -> str:
    return f"{r.get('profiled_configs')} combinations, {r.get('measured_configs')} measured"


@answer("run")
def _run(r: dict) -> str:
    """The user's program: what it was, and what its function returned (JSON, short)."""
    lines = [f"run {r.get('program')} on {_devices(r)}: done in {seconds(r.get('mode_time_s', 0.0))}"
             + (f" (restart {r['restart']})" if r.get("restart") else "")]
    if "returned" in r:
        text = json.dumps(r["returned"], default=str)
        lines.append("returned: " + (text if len(text) <= 400 else text[:400] + " ..."))
    return "\n".join(lines)


@headline("run")
def _run_line(r: dict) -> str:
    text = json.dumps(r.get("returned"), default=str) if "returned" in r else "done"
    return text if len(text) <= 60 else text[:57] + "..."
