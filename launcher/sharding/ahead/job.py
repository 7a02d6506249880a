"""``mode=search mode.predict=true``: the plans for N nodes you do not have, ranked by predicted
step time, computed here (a login node, a laptop: no accelerator, nothing submitted).

For every logical mesh of the N nodes' devices (``search/meshes.py``'s, the first axis across
nodes), the step is analysed as the search analyses it, and its candidates are:

- each baseline's plan (``mode.baselines``: dp, tp, fsdp, dp_tp, ep), on the mesh shaped like
  its own, as the race lays it out (``nearest.nearest_on_meshes``);
- the search's plan on each mesh: the ILP over every strategy of every contraction (those that
  leave devices repeating work included), priced by the link model (``links.py``) with each
  strategy's computation (``ilp.formulate(compute=True)``).

Each candidate is then compiled for the N devices as virtual CPU devices (XLA's SPMD partitioner
is the same on every backend) and predicted with the one model of a step the race checks against
measurement (``price.py``): its dots' FLOPs per device at the link model's matmul rate and the
bytes its instructions move at the device's memory bandwidth (``work.py``), plus every collective
of the partitioned program priced on the link it crosses (``collectives.py``); its memory per
device is XLA's own analysis of that program.
The best plan that fits the device's memory is written as ``plan.json`` (``mode=train
mode.plan=<run dir>/plan.json`` on the real nodes).
"""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import jax
from hydra.utils import instantiate
from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from launcher import jaxcompat
from launcher.errors import BAD_INPUT, UserError
from launcher.runtime.native_output import to_file
from launcher.sharding import pipeline
from launcher.sharding.algorithms.base import builtin_baselines
from launcher.sharding.apply import make_mesh, plan_json, whole_step
from launcher.sharding.ilp.formulate import formulate
from launcher.sharding.ilp.operators import operator_graph
from launcher.sharding.ilp.plan import to_blocks
from launcher.sharding.ilp.solve import solve
from launcher.sharding.predict import links as links_mod
from launcher.sharding.predict.price import price
from launcher.sharding.ahead.command import ERROR_FILE, links_name
from launcher.sharding.search.fit import state_inputs
from launcher.sharding.search.meshes import for_each_mesh, mesh_shapes
from launcher.sharding.search.nearest import nearest_on_meshes
from launcher.sharding.user.api import load_step

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from launcher.sharding.program import TrainingProgram
    from launcher.sharding.analysis.core import Analysis

Log = Callable[[str], None]


def device_count(cfg: DictConfig, per_node_default: int) -> tuple[int, int]:
    """(nodes, devices per node) the job would have: ``cluster.nodes`` times its GPUs (or tasks)
    per node, or the link model's devices per node (a TPU worker's chips)."""
    c = cfg.cluster
    nodes = int(c.get("nodes", 1) or 1)
    per = int(c.get("gpus_per_node") or 0)
    if not per and c.get("accelerator") == "cpu" and c.get("cpu_devices_per_task"):
        per = int(c.tasks_per_node) * int(c.cpu_devices_per_task)
    return nodes, per or per_node_default


@dataclass
class Candidate:
    name: str                      # the row: a baseline's name, or "search" (the ILP's plan on a mesh)
    mesh: list[int]
    choice: dict[int, Any]         # contraction op id -> strategy
    analysis: Analysis             # the analysis its layouts are in (a block plan's, or the ILP's operators')
    assignment: list[int]          # per block of ``analysis``
    source: str
    model_s: float = math.nan      # the ILP's own cost model's figure (the link model's lines)
    stored: frozenset = frozenset()  # inputs stored split over every device between steps (fsdp's state)


def main(run_dir: str) -> None:
    """The child's side of ``command.run_prediction``: its bad input as one line in ``ERROR_FILE``."""
    d = Path(run_dir)
    try:
        predict_job(OmegaConf.load(d / "predict_config.yaml"), d)
    except BAD_INPUT as e:
        (d / ERROR_FILE).write_text(str(e) + "\n")
        raise SystemExit(2) from None


def predict_job(cfg: DictConfig, run_dir: Path) -> None:
    """The whole command: predicted plans printed, written to the run dir (module doc)."""
    t0 = time.perf_counter()
    links = links_mod.load(links_name(cfg))
    nodes, per_node = device_count(cfg, links.devices_per_node)
    n = nodes * per_node
    jax.config.update("jax_platforms", "cpu")   # a login node's or a laptop's: no accelerator is looked for
    jaxcompat.set_cpu_device_count(n)
    if jax.device_count() != n:
        raise UserError(f"mode.predict=true needs {n} virtual CPU devices in this process, JAX gave "
                        f"{jax.device_count()}: run it in a fresh process (python -m launcher ...)")
    log_path = run_dir / "predict.log"
    mode = cfg.mode
    with log_path.open("a") as log_file, to_file(log_path) as screen:
        def log(line: str) -> None:
            log_file.write(line + "\n")
            log_file.flush()

        def say(line: str) -> None:
            log(line)
            print(line, file=screen, flush=True)

        if mode.get("step"):
            subject = load_step(mode.step, log=log)
        else:
            subject = instantiate(cfg.model, _convert_="all")
        say(f"predicting plans for {nodes} node(s) x {per_node} devices = {n} devices; link model "
            f"{links.describe()}")
        result = predict(subject, links, nodes=nodes, per_node=per_node, mesh_shape=mode.mesh_shape,
                         baselines=list(mode.baselines), learning_rate=float(mode.learning_rate),
                         time_limit_s=float(mode.get("ilp_time_limit_s", 300.0)), log=log, say=say)
    files = write(result, run_dir)
    result.update(files=files, mode_wall_s=time.perf_counter() - t0, log=str(log_path))
    (run_dir / "result.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(Path(files["text"]).read_text(), end="", flush=True)
    if "plan" in files:
        use = "" if mode.get("step") else f" (on the nodes: mode=train mode.plan={files['plan']})"
        print(f"plan written: {files['plan']}{use}; details: {log_path}", flush=True)


def predict(subject: Any, links: links_mod.LinkModel, *, nodes: int, per_node: int, mesh_shape: Any = "auto",
            baselines: Sequence[str] = ("dp", "tp", "fsdp", "dp_tp", "ep"), learning_rate: float = 1e-3,
            time_limit_s: float = 300.0, log: Log = lambda line: None, say: Log = lambda line: None) -> dict:
    """Every candidate's predicted step time and memory per device on ``nodes`` x ``per_node``
    devices (this process's virtual CPU devices, as many), ranked (module doc)."""


    n = nodes * per_node
    shapes = mesh_shapes(mesh_shape, n, nodes)
    say(f"analysing the step on {len(shapes)} logical mesh(es): {shapes}")

    def analyse(i: int) -> pipeline.Analyzed:
        out = pipeline.analyze(subject, mesh_shape=shapes[i], learning_rate=learning_rate, log=log)
        say(f"  [{i + 1}/{len(shapes)}] mesh {shapes[i]}: {len(out.analysis.contractions)} contractions, "
            f"{len(out.analysis.blocks)} blocks ({out.seconds:.1f} s)")
        return out

    analyzed, _ = for_each_mesh(shapes, analyse, refuse=UserError, log=log,
                                none_fit=lambda why: UserError(f"the step divides none of the meshes of {n} devices: "
                                                               f"{why}"))
    kept = [(s, a) for s, a in zip(shapes, analyzed, strict=True) if a is not None]
    program = kept[0][1].program
    analyses = [a.analysis for _, a in kept]
    cands: list[Candidate] = []
    names = builtin_baselines(baselines)   # a user's step maps those it has a layout for (dp, fsdp)
    state = state_inputs(program)
    for name, near in nearest_on_meshes(analyses, program, names, jax.devices(), log=log).items():
        a = analyses[near.mesh]
        choice = {op: a.blocks[a.owner[op]].strategies[op][near.assignment[a.owner[op]]] for op in a.contractions}
        # fsdp is dp with the state stored split (ZeRO-3): the nearest block plan and that storage.
        stored = state if name == "fsdp" else frozenset()
        cands.append(Candidate(name, list(a.mesh_shape), choice, a, list(near.assignment),
                               ("its own layout" if near.exact else f"nearest {name}")
                               + (", state stored split" if stored else ""), stored=stored))
    say("solving the search's plan on each mesh (the ILP over every strategy, priced by the link model)")
    for k, a in enumerate(analyses, 1):
        t0 = time.perf_counter()
        cands.append(search_plan(a, links, time_limit_s, log))
        say(f"  [{k}/{len(analyses)}] mesh {list(a.mesh_shape)} ({time.perf_counter() - t0:.1f} s)")
    say(f"compiling {len(cands)} candidate plans for {n} virtual devices (memory: XLA's analysis)")
    rows = []
    for k, c in enumerate(cands, 1):
        row = _measure_free(c, program, links, n, log)
        say(f"  [{k}/{len(cands)}] {c.name} on {c.mesh}: " + (row["skipped"][:100] if "skipped" in row else
                                                           f"{row['predicted_step_time_s'] * 1e3:.3f} ms, "
                                                           f"{row['memory_per_device_gb']:.3f} GB per device"))
        row["_candidate"] = c
        rows.append(row)
        if c.name == "search" and not row.get("fits", True) and state and "skipped" not in row:
            # Too big with the state whole on every device that holds it: the same plan with the
            # state stored split, as the search's fit pass offers it (search/fit.py).
            twin = Candidate(c.name, c.mesh, c.choice, c.analysis, c.assignment, c.source + ", state stored split",
                             c.model_s, stored=state)
            row = _measure_free(twin, program, links, n, log)
            row["_candidate"] = twin
            rows.append(row)
    rows.sort(key=lambda r: (not r.get("fits", False), r.get("predicted_step_time_s", math.inf)))
    for rank, r in enumerate(rows, 1):
        r["rank"] = rank
    best = next((r for r in rows if r.get("fits")), None)
    return {"mode": "search", "predict": True, "nodes": nodes, "devices_per_node": per_node, "devices": n,
            "links": links.name, "links_file": links.path, "links_described": links.describe(),
            "meshes": [list(s) for s, _ in kept], "ranked": rows, "best": best}


def search_plan(a: Analysis, links: links_mod.LinkModel, time_limit_s: float = 300.0, log: Log = lambda line: None) -> Candidate:
    """The search's plan on ``a``'s mesh when nothing can be measured: the ILP over every
    strategy, each paying its computation and its collectives at ``links``' figures."""
    og = operator_graph(a, every_strategy=True)
    dtype = _dtype(a)
    problem = formulate(og, links.comm_model(a.mesh_shape, dtype), compute=True)
    t0 = time.perf_counter()
    solution = solve(problem, None, time_limit_s)
    log("ILP on mesh %s: %d nodes, %d variables, %s in %.2f s, its model's step %.6f s"
        % (list(a.mesh_shape), len(problem.sizes), solution.num_variables, solution.status,
           time.perf_counter() - t0, problem.time_s(solution.choice)))
    choice = og.choice(solution.choice)
    blocks = to_blocks(a, choice)
    if blocks is not None:
        return Candidate("search", list(a.mesh_shape), choice, a, blocks, "the ILP's plan (a CFP block plan)",
                         problem.time_s(solution.choice))
    return Candidate("search", list(a.mesh_shape), choice, og.analysis, list(solution.choice),
                     "the ILP's plan (per contraction)", problem.time_s(solution.choice))


def _dtype(a: Analysis) -> str:
    dtypes = [a.graph.vars[c.out].dtype for c in a.contractions.values()]
    return max(set(dtypes), key=dtypes.count) if dtypes else "float32"


def _measure_free(c: Candidate, program: TrainingProgram, links: links_mod.LinkModel, n: int, log: Log) -> dict:
    """A candidate compiled for the virtual devices and predicted by the one model of a step
    (``price.py``, the race's): its row."""
    row: dict = {"plan": c.name, "mesh_shape": c.mesh, "source": c.source, "state_stored_split": bool(c.stored),
                 "crossing_axes": links.crossing(c.mesh), "ilp_model_step_time_s": c.model_s}
    t0 = time.perf_counter()
    try:
        mesh = make_mesh(c.mesh)
        step, ins, outs = whole_step(c.analysis, dict(enumerate(c.assignment)), mesh, c.stored)
        compiled = jax.jit(step, in_shardings=ins, out_shardings=outs).lower(*program.args).compile()
    except Exception as e:  # noqa: BLE001 - a plan XLA cannot compile is reported, the others ranked
        row.update(fits=False, skipped=f"XLA could not compile it: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        log(f"{c.name} on {c.mesh}: {row['skipped']}")
        return row
    p = price(compiled, links)   # the virtual devices are numbered node by node, as the link model counts them
    row.update(predicted_step_time_s=p.step_s, predicted_compute_s=p.compute_s, predicted_comm_s=p.comm_s,
               memory_per_device_gb=p.memory_bytes / 1e9, fits=p.memory_bytes <= links.memory_bytes,
               collectives=p.collectives, work=p.work.to_json(), compile_s=time.perf_counter() - t0)
    log(f"{c.name} on {c.mesh} ({c.source}): compute {p.compute_s:.6f} s + communication {p.comm_s:.6f} s, "
        f"{p.memory_bytes / 1e9:.3f} GB per device (compiled in {row['compile_s']:.1f} s)")
    return row


def _crossing_words(row: Mapping[str, Any]) -> str:
    axes = row.get("crossing_axes") or []
    return ", ".join(f"axis {a} ({row['mesh_shape'][a]})" for a in axes) or "none"


def table(result: Mapping[str, Any]) -> str:
    """The ranked plans as the terminal shows them (and ``predict.txt``)."""
    t = Table(title=f"Predicted for {result['nodes']} node(s) x {result['devices_per_node']} devices "
                    f"({result['links']} link model)", title_justify="left")
    for col in ("rank", "plan", "mesh", "axis across nodes", "step (ms)", "compute (ms)", "comm (ms)",
                "memory/device (GB)", "fits"):
        t.add_column(col, justify="left" if col in ("plan", "mesh", "axis across nodes", "fits") else "right")
    for r in result["ranked"]:
        if "skipped" in r:
            t.add_row(str(r["rank"]), r["plan"], str(r["mesh_shape"]), _crossing_words(r), "-", "-", "-", "-",
                      "no: " + r["skipped"][:60])
            continue
        t.add_row(str(r["rank"]), r["plan"], str(r["mesh_shape"]), _crossing_words(r),
                  f"{r['predicted_step_time_s'] * 1e3:.3f}", f"{r['predicted_compute_s'] * 1e3:.3f}",
                  f"{r['predicted_comm_s'] * 1e3:.3f}", f"{r['memory_per_device_gb']:.3f}",
                  "yes" if r["fits"] else "no")
    console = Console(width=150, record=True, file=io.StringIO())
    console.print(t)
    lines = [console.export_text().rstrip(), f"link model: {result['links_described']}"]
    best = result["best"]
    if best is None:
        lines.append("no plan fits the device's memory: more nodes, a smaller batch, or a model with less state")
    else:
        lines.append(f"best: {best['plan']} on mesh {best['mesh_shape']} ({best['source']}), "
                     f"{best['predicted_step_time_s'] * 1e3:.3f} ms a step predicted; across nodes: "
                     f"{_crossing_words(best)}")
    return "\n".join(lines) + "\n"


def write(result: dict, run_dir: Path) -> dict:
    """``predict.txt`` (the table), ``plan.json`` (the best plan that fits, for ``mode=train
    mode.plan=``), ``<plan>_<mesh>_plan.json`` for every other candidate; the rows lose their
    candidate objects (``result.json`` holds the rest)."""
    files: dict = {}
    for r in result["ranked"]:
        c = r.pop("_candidate")
        if "skipped" in r:
            continue
        name = f"{c.name}_{'x'.join(map(str, c.mesh))}{'_stored' if c.stored else ''}_plan.json"
        text = plan_json(c.analysis, c.assignment, c.name, c.stored).to_json()
        (run_dir / name).write_text(text)
        r["plan_file"] = str(run_dir / name)
        if r is result["best"]:
            (run_dir / "plan.json").write_text(text)
            files["plan"] = str(run_dir / "plan.json")
    text = table(result)
    (run_dir / "predict.txt").write_text(text)
    files["text"] = str(run_dir / "predict.txt")
    return files


if __name__ == "__main__":
    import sys

    main(sys.argv[1])
