"""Auto-sharding programs written as users write them, from Python, as a user would call it.

    python bench/bench_autoshard.py [--programs scanned_lm nnx_fsdp linen_lm equinox_mlp numpy_mlp own_mesh_adam]
                                    [--devices 8] [--iterations 10] [--repeats 14]

Each program of ``tests/user_programs.py`` (a scanned decoder LM with a hand-written FSDP x TP
layout; Flax's NNX FSDP toy, an optimizer holding its model's params; a Linen LM stepped as lm1b;
an Equinox MLP passed whole; an MLP with float64 NumPy parameters; plain JAX with its state on its
own mesh and a typed dropout key), in a process of its own with
``--devices`` virtual CPU devices and a fresh profile store:

1. ``autoshard(step, *args)`` with its defaults (every logical mesh, dp and fsdp raced, the
   user's own layout where it has one): the **cold** search's wall time, from an empty store;
2. the same call again: the **warm** search's (the store holds the answer);
3. ``autoshard(..., algorithm="ilp")``: the Alpa-style ILP's plan, and its search time;
4. a race of its own (``--repeats`` interleaved rounds of ``--iterations`` steps,
   ``search/race.py: race``): CFP's own plan (whatever the answer), the same plan compiled a
   second time (the A/A floor: any ratio is only as exact as this one's distance from 1), the
   ILP's plan, and the baselines dp, fsdp and the user's layout. Reported, paired (the median
   over rounds of the ratio within a round): CFP's own plan over the best baseline, the answer
   (what ``autoshard`` handed back) over it, the ILP's plan over it, the floor, and whether CFP's
   plan is behind the best baseline by more than 5% beyond the floor (issue #34's bound).
5. In the same race, google-parallax's AUTO strategy (``parallax.jit(step,
   strategy=ShardingStrategy.AUTO)`` under a (data 4, model 2) mesh of Auto axes, the
   one other auto-sharder that runs on stock JAX; the bench's own extra, ``pip install -e
   .[bench-parallax]``, never the package's dependency), where it compiles; where it does not,
   the row records why (its exception and the line of parallax that raised it).

Results go to bench/results/bench_autoshard.json (``--out``), every round kept: timings on a
shared 2-core machine are noisy.

    python bench/bench_autoshard.py --budget-sweep [--programs scanned_lm gpt-tiny] [--fractions 0.9 0.7 0.5]

A memory budget's sweep instead (issue 45): each program searched without a budget (dp's memory
measured), then under each fraction of dp's measured memory (``memory_budget_gb``; a built-in
model, ``gpt-tiny``, through ``pipeline.run_search`` as ``mode=search`` runs it): the answer, its
measured memory and whether it fits, the searched plan's predicted memory beside its measured,
every baseline's memory and time and which fit, the answer over the fastest baseline that fits
(paired), or the refusal. To bench/results/bench_autoshard_budget.json.

    python bench/bench_autoshard.py --cold-ab verify_slower_than=0 [--programs ...] [--runs 1]
    python bench/bench_autoshard.py --cold-ab --cold-env XLAUNCH_COMPILE_WORKERS=2 [--programs linen_lm] [--runs 2]

A search option's cost, side by side: each program's cold search (a fresh store, a process of its
own) with the option as given (``--cold-env``: with these environment variables), then with
autoshard's defaults, ``--runs`` times in turn: the whole search's wall time, where its profile
and its shortlist ended, how many shortlisted plans were measured, its XLA compiles (counted from
JAX's own compile event) and their seconds in each of those phases, and the answer. To
bench/results/bench_autoshard_cold.json. ``--cold-ab 'algorithm="ilp"'`` sets the ILP's cold search
beside CFP's (issue 45's point 6: CFP within 2x of it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "bench" / "results" / "bench_autoshard.json"
PROGRAMS = ("scanned_lm", "nnx_fsdp", "linen_lm", "equinox_mlp", "numpy_mlp", "own_mesh_adam")
BOUND = 1.05   # CFP's own plan over the best baseline, beyond the A/A floor


def worker(name: str, store: str, iterations: int, repeats: int) -> dict:
    import jax

    sys.path.insert(0, str(REPO))
    from launcher.sharding.apply import constrained_step
    from launcher.sharding.comparison import compare
    from launcher.sharding.user.api import autoshard
    from launcher.sharding.search.measure import StepRunner, baseline_runner
    from launcher.sharding.search.race import race
    from launcher.sharding.user.step import step_program
    from tests import user_programs

    log = lambda line: print(f"[{name}] {line}", file=sys.stderr, flush=True)
    quiet = lambda line: None
    make = getattr(user_programs, f"make_{name}")

    def search(**options):
        s = make()
        t = time.perf_counter()
        plan = autoshard(s.fn, *s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings, store_dir=store,
                         **options)
        return plan, time.perf_counter() - t

    answer, cold = search(log=log)
    _, warm = search(log=quiet)
    ilp, ilp_s = search(algorithm="ilp", log=quiet)
    own = answer.own or answer       # CFP's own plan, whichever plan is the answer
    log(f"cold {cold:.1f} s, warm {warm:.1f} s, ILP {ilp_s:.1f} s; the answer: {answer.why}")

    s = make()
    program = step_program(s.fn, s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings)

    def runner(plan, label):
        body, in_shardings, _ = constrained_step(program.step, program.args, plan.constraints, plan.mesh())
        return StepRunner(label, program, body, in_shardings)

    ilp_plan = ilp.own or ilp
    runners = [runner(own, "cfp"), runner(own, "cfp again"), runner(ilp_plan, "alpa_ilp")]
    parallax = parallax_runner(make(), program)
    if not isinstance(parallax, dict):
        runners.append(parallax)
    baselines = ["dp", "fsdp"] + (["user"] if program.in_shardings is not None else [])
    runners += [baseline_runner(program, b, jax.devices()) for b in baselines]
    runs = {r.name: r for r in race(runners, iterations=iterations, repeats=repeats)}
    cfp, again = runs["cfp"], runs["cfp again"]
    base = {b: runs[b] for b in baselines}
    ratios = {b: paired(cfp, r) for b, r in base.items()}
    # The fastest baseline as a search's answer names it, round by round (the comparison every output reads).
    best = compare({"cfp": cfp.repeat_times_s, **{b: r.repeat_times_s for b, r in base.items()}}, "cfp").best_baseline
    floor = abs(paired(again, cfp) - 1)
    answer_run = cfp if answer.row == "cfp" else runs.get(answer.row, runs.get("alpa_ilp"))
    return {
        "program": name, "devices": jax.device_count(), "platform": jax.devices()[0].platform,
        "cold_search_s": cold, "warm_search_s": warm, "ilp_search_s": ilp_s,
        "kept": {"source": own.source, "mesh_shape": own.mesh_shape}, "answer": answer.row, "answer_why": answer.why,
        "best_baseline": best,
        "cfp_over_best_paired": ratios[best], "answer_over_best_paired": paired(answer_run, base[best]),
        "ilp_over_best_paired": paired(runs["alpa_ilp"], base[best]), "aa_floor": floor,
        "cfp_behind_best_beyond_bound": ratios[best] > BOUND + floor,
        "cfp_over_each_paired": ratios,
        "predicted_step_time_s": own.predicted_step_time_s,
        "step_time_s": {n: r.step_time_s for n, r in runs.items()},
        "repeat_times_s": {n: r.repeat_times_s for n, r in runs.items()},
        "memory_gb": {n: r.memory_bytes / 2**30 for n, r in runs.items()},
        "parallax_auto": (parallax if isinstance(parallax, dict) else
                          {"over_best_paired": paired(runs["parallax_auto"], base[best]),
                           "cfp_over_parallax_paired": paired(cfp, runs["parallax_auto"])}),
        # The same training under every layout (float sums in another order differ a little).
        "losses_max_rel_diff": max(abs(a - b) / abs(a) for r in runs.values()
                                   for a, b in zip(cfp.losses, r.losses, strict=False)),
    }


BUILTIN = ("gpt-tiny", "bert-tiny", "llama2-tiny", "moe-tiny")


def parallax_runner(s, program):
    """google-parallax's AUTO plan of the user's step ``s`` as a race runner (``StepRunner``'s
    interface: the step's own arguments, the state it returns fed back), or where parallax
    cannot plan or compile it, ``{"error": ..., "where": ...}``."""
    import traceback

    import jax
    from jax.sharding import AxisType

    from launcher.models.train import CompiledStep
    from launcher.sharding.search.measure import PlanRun

    try:
        import parallax
    except ImportError as e:
        return {"error": f"not installed ({e}): pip install -e .[bench-parallax]", "where": ""}

    class ParallaxRunner(CompiledStep):
        def __init__(self):
            self.name, self.program, self.rounds, self.candidate, self.mesh_index = "parallax_auto", program, [], None, 0
            self.mesh = jax.make_mesh((jax.device_count() // 2, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
            reading = program.reading
            if reading.nnx:
                raise NotImplementedError("parallax.jit takes params as its first argument; this step takes Flax NNX "
                                          "objects (nnx.jit's style)")
            with jax.set_mesh(self.mesh):
                wrapped = parallax.jit(s.fn, strategy=parallax.ShardingStrategy.AUTO)
                args = tuple(jax.device_get(tuple(s.args)))
                jitted, self.shardings = wrapped._get_jitted_fn(*args)   # its plan: parallax's own jit
                self.args = jax.tree.map(jax.device_put, args, self.shardings)
                self._compile(lambda: jitted.lower(*self.args))

        def _one_step(self):
            with jax.set_mesh(self.mesh):
                t = time.perf_counter()
                # As parallax.jit's __call__ runs it: the arguments put where its plan takes them
                # (the state it returned may be laid out otherwise), then the step.
                args = jax.tree.map(jax.device_put, self.args, self.shardings)
                out = jax.block_until_ready(self.compiled(*args))
                seconds = time.perf_counter() - t
            reading = self.program.reading
            outs = list(out) if reading.returns_tuple else [out]
            args = list(self.args)
            for i, at in zip(reading.feeds_back, reading.returned_at, strict=True):
                args[i] = outs[at]
            self.args = tuple(args)
            return seconds

        def result(self):
            return PlanRun(self.name, self.rounds, self.losses, self.peak_memory_bytes, self.program.flops_per_step,
                           self.compile_time_s, self.compiled)

    try:
        return ParallaxRunner()
    except Exception as e:   # parallax's own failure on this program: recorded, as the issue asks
        frames = traceback.extract_tb(e.__traceback__)
        where = next((f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames)
                      if "parallax" in f.filename), "")
        return {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}", "where": where}


def budget_worker(name: str, store: str, fractions: list[float]) -> dict:
    """The budget sweep of one program (module doc)."""
    import jax

    sys.path.insert(0, str(REPO))
    from launcher.errors import UserError
    from launcher.sharding.user.api import autoshard
    from tests import user_programs

    log = lambda line: print(f"[{name} budget] {line}", file=sys.stderr, flush=True)
    if name in BUILTIN:
        search = _builtin_search(name, store)
    else:
        make = getattr(user_programs, f"make_{name}")

        def search(budget_gb: float) -> dict:
            s = make()
            plan = autoshard(s.fn, *s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings,
                             store_dir=store, memory_budget_gb=budget_gb, reuse=False, log=lambda line: None)
            own = plan.own or plan
            runs = {plan.row: plan.measured, **plan.baselines}
            return {"answer": plan.row, "why": plan.why,
                    "searched": {"predicted_memory_gb": own.predicted_memory_gb,
                                 "measured_memory_gb": own.measured["memory_gb"], "source": own.source},
                    "runs": {n: {"memory_gb": r["memory_gb"], "repeat_times_s": r["repeat_times_s"]}
                             for n, r in runs.items()}}

    t = time.perf_counter()
    free = search(0.0)
    dp = free["runs"]["dp"]["memory_gb"]
    rows = [{"fraction": None, "budget_gb": 0.0, "search_s": time.perf_counter() - t, **free}]
    log(f"no budget: the answer {free['answer']}; dp {dp * 1024:.2f} MiB")
    for f in fractions:
        t = time.perf_counter()
        try:
            out = search(f * dp)
        except UserError as e:
            rows.append({"fraction": f, "budget_gb": f * dp, "search_s": time.perf_counter() - t, "refused": str(e)})
            log(f"{f} x dp: refused: {e}")
            continue
        budget, runs = f * dp, out["runs"]
        fitting = {n: r for n, r in runs.items() if r["memory_gb"] <= budget and n != out["answer"]}
        mine = runs[out["answer"]]
        over = {n: _paired(mine["repeat_times_s"], r["repeat_times_s"]) for n, r in fitting.items()}
        s = out["searched"]
        rows.append({"fraction": f, "budget_gb": budget, "search_s": time.perf_counter() - t, **out,
                     "answer_fits": mine["memory_gb"] <= budget,
                     "fitting_baselines": sorted(fitting),
                     "answer_over_each_fitting_paired": over,
                     "answer_beats_every_fitting": all(v < 1 for v in over.values()),
                     "predicted_over_measured": (s["predicted_memory_gb"] / s["measured_memory_gb"]
                                                 if s["predicted_memory_gb"] else None)})
        log(f"{f} x dp ({budget * 1024:.2f} MiB): the answer {out['answer']} at {mine['memory_gb'] * 1024:.2f} MiB; "
            f"searched plan predicted {s['predicted_memory_gb'] and s['predicted_memory_gb'] * 1024:.2f} MiB, measured "
            f"{s['measured_memory_gb'] * 1024:.2f} MiB; over each fitting baseline {over}")
    return {"program": name, "devices": jax.device_count(), "dp_memory_gb": dp, "sweep": rows}


def cold_worker(name: str, store: str, options: dict) -> dict:
    """One cold search of ``name`` with ``options`` (``--cold-ab``): its times, read off its log."""
    sys.path.insert(0, str(REPO))
    import jax

    from launcher.sharding.user.api import autoshard
    from tests import user_programs

    s = getattr(user_programs, f"make_{name}")()
    lines: list[tuple[float, str]] = []
    compiles: list[tuple[float, float]] = []   # (when XLA's compile ended, since t0; its seconds)

    def heard(event, seconds, *args, **kwargs):   # JAX's own event, one per XLA compile
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append((time.perf_counter() - t0, seconds))

    jax.monitoring.register_event_duration_secs_listener(heard)
    t0 = time.perf_counter()
    plan = autoshard(s.fn, *s.args, data_argnums=s.data_argnums, in_shardings=s.in_shardings, store_dir=store,
                     log=lambda line: lines.append((time.perf_counter() - t0, line)), **options)
    cold = time.perf_counter() - t0
    last = lambda said: max((t for t, line in lines if said(line)), default=None)   # when the log last said it
    profile_end = last(lambda line: "segment combinations reused" in line)
    shortlist_end = last(lambda line: line.startswith("searched ParallelBlock"))
    # Each compile in the phase it ended in; a phase the algorithm has not (the ILP profiles
    # nothing) holds none.
    edges = (profile_end or 0.0, shortlist_end or profile_end or 0.0)
    phases = {phase: {"compiles": 0, "seconds": 0.0} for phase in ("profile", "shortlist", "race")}
    for t, sec in compiles:
        phase = phases["profile" if t <= edges[0] else "shortlist" if t <= edges[1] else "race"]
        phase["compiles"] += 1
        phase["seconds"] += sec
    return {"program": name, "options": options, "cold_search_s": cold,
            "profile_end_s": profile_end, "shortlist_end_s": shortlist_end,
            "compiles": len(compiles), "compile_s": sum(sec for _, sec in compiles), "compiles_by_phase": phases,
            "measured_plans": sum(line.startswith("candidate ") for _, line in lines),
            "not_measured": [line for _, line in lines if line.startswith("not measured")],
            "answer": plan.name or plan.algorithm, "why": plan.why}


def cold_ab(programs: list[str], given: dict, runs: int, env: dict, out: Path, given_env: dict | None = None) -> None:
    rows, given_env = [], given_env or {}
    for name in programs:
        for run in range(runs):
            for options, extra in ((given, given_env), ({}, {})):
                store = tempfile.mkdtemp(prefix=f"bench-autoshard-cold-{name}-")
                try:
                    proc = subprocess.run([sys.executable, __file__, "--worker", name, store, "--cold-ab",
                                           *[f"{k}={json.dumps(v)}" for k, v in options.items()]],
                                          env={**env, **extra, "XLAUNCH_CACHE_DIR": store},
                                          stdout=subprocess.PIPE, text=True, cwd=REPO)
                finally:
                    shutil.rmtree(store, ignore_errors=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{name}: the cold worker failed ({proc.returncode})")
                row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "env": extra, "run": run}
                rows.append(row)
                at = lambda s: "-" if s is None else f"{s:.0f} s"
                print(f"{name:>12} {dict(options, **extra) or 'defaults'}: cold {row['cold_search_s']:.0f} s (profile to "
                      f"{at(row['profile_end_s'])}, shortlist to {at(row['shortlist_end_s'])}, "
                      f"{row['measured_plans']} plans measured; {row['compiles']} XLA compiles, "
                      f"{row['compile_s']:.0f} s); answer {row['answer']}", flush=True)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({"command": " ".join(["python", "bench/bench_autoshard.py", *sys.argv[1:]]),
                                           "date": time.strftime("%Y-%m-%d"),
                                           "machine": platform.platform(), "cores": os.cpu_count(), "given": given,
                                           "given_env": given_env,
                                           "runs": runs, "programs": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def _builtin_search(name: str, store: str):
    """A built-in model searched as mode=search runs it, returning what ``budget_worker`` reads."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from launcher.sharding import pipeline
    from launcher.sharding.algorithms.base import Algorithm, Hooks
    from launcher.sharding.options import ProfileOptions, SearchOptions

    config = OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml")
    family = name.split("-")[0]
    schema = {"gpt": "launcher.models.gpt.GPT", "bert": "launcher.models.bert.BERT",
              "llama2": "launcher.models.llama2.LLaMA2", "moe": "launcher.models.moe.MoE"}[family]
    fields = {k: v for k, v in OmegaConf.to_container(config).items() if k not in ("defaults", "_target_")}

    def search(budget_gb: float) -> dict:
        model = instantiate({"_target_": schema, **fields}, _convert_="all")
        options = SearchOptions(profile=ProfileOptions(store_dir=store, memory_budget_gb=budget_gb))
        out = pipeline.run_search(model, Algorithm.named("cfp")(options, {}), mesh_shape="auto", hooks=Hooks())
        runs = {out.planned.row: out.searched, **out.baselines}
        return {"answer": out.answer.name, "why": out.answer.why(),
                "searched": {"predicted_memory_gb": out.planned.predicted_memory_bytes / 2**30,
                             "measured_memory_gb": out.searched.memory_bytes / 2**30, "source": out.planned.source},
                "runs": {n: {"memory_gb": r.memory_bytes / 2**30, "repeat_times_s": r.repeat_times_s}
                         for n, r in runs.items()}}

    return search


def _paired(times, other) -> float:
    from launcher.sharding.comparison import paired_over   # the one paired ratio

    return paired_over(times, other)


def paired(run, other) -> float:
    from launcher.sharding.comparison import paired_over   # the one paired ratio

    return paired_over(run.repeat_times_s, other.repeat_times_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", nargs="+", default=None, choices=PROGRAMS + BUILTIN)
    ap.add_argument("--budget-sweep", action="store_true", help="the memory budget sweep (module doc)")
    ap.add_argument("--fractions", nargs="+", type=float, default=[0.9, 0.7, 0.5], help="of dp's measured memory")
    ap.add_argument("--devices", type=int, default=8, help="virtual CPU devices (no effect on accelerators)")
    ap.add_argument("--iterations", type=int, default=10, help="steps per round of the bench's race")
    ap.add_argument("--repeats", type=int, default=14, help="interleaved rounds of the bench's race")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--cold-ab", nargs="*", metavar="OPTION=VALUE", help="cold searches with these options beside "
                    "autoshard's defaults (module doc)")
    ap.add_argument("--runs", type=int, default=1, help="--cold-ab: pairs of cold searches per program")
    ap.add_argument("--cold-env", nargs="+", default=[], metavar="NAME=VALUE",
                    help="--cold-ab: environment variables of the given side's searches")
    ap.add_argument("--worker", nargs=2, metavar=("PROGRAM", "STORE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    given = {}
    for k, _, v in (o.partition("=") for o in args.cold_ab or []):
        try:
            given[k] = json.loads(v)
        except json.JSONDecodeError:
            ap.error(f"--cold-ab {k}={v}: give OPTION=VALUE with the value as JSON, e.g. interleave=false, "
                     "profile_top_k=4 or 'mesh_shape=[[8],[4,2]]'")
    bad_env = [v for v in args.cold_env if "=" not in v or not v.split("=", 1)[0]]
    if bad_env:
        ap.error(f"--cold-env {' '.join(bad_env)}: give NAME=VALUE, e.g. XLAUNCH_COMPILE_WORKERS=2")
    if args.worker and args.cold_ab is not None:
        print(json.dumps(cold_worker(args.worker[0], args.worker[1], given)))
        return
    if args.worker:
        print(json.dumps(budget_worker(args.worker[0], args.worker[1], args.fractions) if args.budget_sweep
                         else worker(args.worker[0], args.worker[1], args.iterations, args.repeats)))
        return
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={args.devices}",
           "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    if args.budget_sweep:
        budget_sweep(args.programs or ["scanned_lm", "gpt-tiny"], args.fractions, env,
                     Path(args.out) if args.out != str(DEFAULT_OUT) else DEFAULT_OUT.with_name("bench_autoshard_budget.json"))
        return
    if args.cold_ab is not None:
        cold_ab(args.programs or list(PROGRAMS), given, args.runs, env,
                Path(args.out) if args.out != str(DEFAULT_OUT) else DEFAULT_OUT.with_name("bench_autoshard_cold.json"),
                dict(v.split("=", 1) for v in args.cold_env))
        return
    args.programs = args.programs or list(PROGRAMS)
    out, rows = Path(args.out), []
    for name in args.programs:
        store = tempfile.mkdtemp(prefix=f"bench-autoshard-{name}-")
        t = time.perf_counter()
        try:
            # Cold: the link model the race is priced on measured in the worker too, into its store.
            proc = subprocess.run([sys.executable, __file__, "--worker", name, store, "--iterations",
                                   str(args.iterations), "--repeats", str(args.repeats)],
                                  env={**env, "XLAUNCH_CACHE_DIR": store},
                                  stdout=subprocess.PIPE, text=True, cwd=REPO)
        finally:
            shutil.rmtree(store, ignore_errors=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: the worker failed ({proc.returncode})")
        row = {**json.loads(proc.stdout.strip().splitlines()[-1]), "wall_s": time.perf_counter() - t}
        rows.append(row)
        print(f"{name:>12}: cold {row['cold_search_s']:.0f} s, warm {row['warm_search_s']:.1f} s (ILP "
              f"{row['ilp_search_s']:.0f} s); CFP's plan {row['cfp_over_best_paired']:.3f}x {row['best_baseline']}, the "
              f"answer ({row['answer']}) {row['answer_over_best_paired']:.3f}x, ILP {row['ilp_over_best_paired']:.3f}x; "
              f"A/A floor {row['aa_floor']:.3f}" + ("  BEHIND beyond the bound" if row["cfp_behind_best_beyond_bound"]
                                                   else ""), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)   # after every program: a stopped bench keeps it
        out.write_text(json.dumps({"machine": platform.platform(), "cores": os.cpu_count(), "devices": args.devices,
                                   "iterations": args.iterations, "repeats": args.repeats, "bound": BOUND,
                                   "programs": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def budget_sweep(programs: list[str], fractions: list[float], env: dict, out: Path) -> None:
    rows = []
    for name in programs:
        store = tempfile.mkdtemp(prefix=f"bench-autoshard-budget-{name}-")
        try:
            proc = subprocess.run([sys.executable, __file__, "--budget-sweep", "--worker", name, store, "--fractions",
                                   *map(str, fractions)], env=env, stdout=subprocess.PIPE, text=True, cwd=REPO)
        finally:
            shutil.rmtree(store, ignore_errors=True)
        if proc.returncode != 0:
            raise SystemExit(f"{name}: the budget worker failed ({proc.returncode})")
        row = json.loads(proc.stdout.strip().splitlines()[-1])
        rows.append(row)
        for r in row["sweep"][1:]:
            what = (f"refused: {r['refused']}" if "refused" in r else
                    f"the answer {r['answer']} fits: {r['answer_fits']}, predicted/measured "
                    f"{r['predicted_over_measured'] and round(r['predicted_over_measured'], 3)}, beats every fitting "
                    f"baseline: {r['answer_beats_every_fitting']} ({r['answer_over_each_fitting_paired']})")
            print(f"{name:>12} {r['fraction']} x dp: {what}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"machine": platform.platform(), "cores": os.cpu_count(), "fractions": fractions,
                                   "programs": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
