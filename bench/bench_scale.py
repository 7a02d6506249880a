"""What watching a job costs as it grows: the launcher's own traffic on the run dir's file system,
its CPU, and how fast it names a killed rank, a failed rank and a hung job, at N ranks.

    python bench/bench_scale.py [--ranks 8,64,512,4096] [--window 20] [--strace 512] [--out FILE]
    python bench/bench_scale.py --real 8,16,32 [--slurm]      # real jobs: submission to every rank joined
    python bench/bench_scale.py --census 2,4,8                # what else grows: a traced mode=train job

Each rank is the launcher's real code (``launcher/runtime/watch.py``: its ``RankReporter``, the
watcher on rank 0, each host's ``node_watch.NodeWatch``), run without JAX: real processes of one rank each
up to 64 ranks, beyond that threads, ``--threads`` a process (the results say which). One more
rank, the victim, is always a process of its own: it is killed (SIGKILL), or fails (its status
says so), or stops progressing with the others (a hang, ``launcher.hang_timeout_s=10``), or turns
slow (``slow``: its host seconds per step 1.3x the others', each rank's given to its real
``straggler.StepClock``, published and scored by the real watcher). The
waiting launcher's side is the real ``JobWatch``, read as ``launcher/cli/submit.py`` reads it.

Counted, never estimated: every call naming a path in the run dir, from Python's audit hooks in
every process (open, os.utime, os.rename, os.listdir, os.scandir, os.mkdir, ...), and with
``--strace N`` also from the system calls (``strace -f --seccomp-bpf -e trace=%file``, which sees
stat calls too) up to N ranks, where the machine keeps up with tracing. Per N: calls per rank per second over a steady
``--window`` (the ranks joined and stepping, the launcher polling), the processes' CPU per rank,
and the seconds from the event to the launcher's reading naming it. Written to
``bench/results/bench_scale.json``.

``--real`` starts ``mode=run`` jobs of one CPU device a rank on ``cluster=local`` (and the tests'
SLURM with ``--slurm``): submission to every rank joined (from the ranks' status files), then a
rank killed and the time until the launcher names it. ``--census`` traces real ``mode=train`` jobs
(checkpoints, JAX's compilation cache in the run dir) and counts their run-dir calls by what they
were for: logs, checkpoints, the compilation cache, status and watch, submitit's files, result.json.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import platform
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.runtime import status, straggler  # noqa: E402  (the repository's, not an installed copy)
from launcher.runtime.watch import JobWatch, RankReporter, Watch, read_watch  # noqa: E402

RESULTS = REPO / "bench" / "results" / "bench_scale.json"
EVENTS = ("open", "os.utime", "os.rename", "os.replace", "os.listdir", "os.scandir", "os.mkdir", "os.remove",
          "os.unlink", "os.rmdir", "os.truncate", "os.chmod")
PEER_TIMEOUT_S, INIT_TIMEOUT_S, HANG_S = 15.0, 60.0, 10.0
# Each simulated rank's step: its host seconds (the victim's times SLOW_FACTOR once it turns slow),
# a few percent of noise, judged as launcher.straggler's defaults judge it.
STEP_HOST_S, STEP_NOISE, SLOW_FACTOR = 0.100, 0.03, 1.3
STRAGGLER_FACTOR, STRAGGLER_STEPS = 1.2, 10


# --- counting -----------------------------------------------------------------------------------

class Counter:
    """Audit-hook counts of calls naming a path under ``root``, between ``start`` and ``end``."""

    def __init__(self, root: str) -> None:
        self.root, self.start, self.end = root, float("inf"), float("inf")
        self.counts: dict[str, int] = {}
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if event not in EVENTS or not args:
            return
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)) and str(os.fsdecode(path)).startswith(self.root):
            now = time.time()
            if self.start <= now < self.end:
                self.counts[event] = self.counts.get(event, 0) + 1
                if event in ("os.rename", "os.replace") and f"/{status.STATUS_DIR}/ranks/" in os.fsdecode(args[1]):
                    # a status written: a heartbeat too (a rank's step figures go in place of a touch)
                    self.counts["status writes"] = self.counts.get("status writes", 0) + 1


# --- the simulated ranks ------------------------------------------------------------------------

def worker(spec: dict) -> None:
    """Runs ``spec["ranks"]`` of a job as threads of this process (one rank: the process itself),
    each the launcher's real reporter; writes what it saw to ``spec["out"]``."""
    threading.stack_size(512 * 1024)
    if len(spec["ranks"]) > 1:
        # A rank simulated by a thread is a process of one thread: its stack dump (a hang, `xlaunch
        # stacks`) is of its own thread, not of the process's every simulated rank (which makes
        # the dumps of T ranks T² threads' long, an artefact of the simulation).
        dump = faulthandler.dump_traceback
        faulthandler.dump_traceback = lambda file=sys.stderr, all_threads=True: dump(file, all_threads=False)
    counter = Counter(spec["run_dir"])
    counter.start, counter.end = spec["window"]
    ended: dict[int, list] = {}
    lock = threading.Lock()

    def on_end(rank: int, kind: str):
        def record(why: str) -> None:
            with lock:
                ended.setdefault(rank, [time.time(), kind, why[:300]])
        return record

    reporters = [RankReporter(spec["run_dir"], r, spec["num_ranks"], node_root=Path(spec["node_root"]))
                 for r in spec["ranks"]]
    for rep in reporters:  # its host time per step: given (a thread is no rank's main thread), published for real
        rep.step_clock = straggler.StepClock(STRAGGLER_STEPS)
    noise = random.Random(spec["ranks"][0])
    while time.time() < spec["join_at"]:
        time.sleep(0.05)
    for rep in reporters:
        rep.set("joined")
        rep.start(PEER_TIMEOUT_S, INIT_TIMEOUT_S, on_peer_failure=on_end(rep.rank, "failure"),
                  hang_timeout_s=spec["hang_timeout_s"], on_hang=on_end(rep.rank, "hang"),
                  straggler_factor=STRAGGLER_FACTOR)
    cpu: dict[str, float] = {}
    fail_at = spec.get("fail_at")
    while time.time() < spec["end_at"] and len(ended) < len(reporters):
        now = time.time()
        if now < spec["progress_until"]:
            slow = SLOW_FACTOR if now >= spec.get("slow_at", float("inf")) else 1.0
            for rep in reporters:  # a training step on every rank, once a second
                rep.step_clock.record(STEP_HOST_S * slow * (1 + noise.uniform(-STEP_NOISE, STEP_NOISE)), 1.0)
                rep.progressed()
        for key, at in (("start", spec["window"][0]), ("end", spec["window"][1])):
            if key not in cpu and now >= at:
                u = resource.getrusage(resource.RUSAGE_SELF)
                cpu[key] = u.ru_utime + u.ru_stime
        if fail_at is not None and now >= fail_at:
            reporters[0].set("failed", "RuntimeError: injected failure (bench_scale)")
            fail_at = None
        time.sleep(1.0)
    Path(spec["out"]).write_text(json.dumps({
        "ranks": spec["ranks"], "counts": counter.counts, "cpu_s": cpu.get("end", 0.0) - cpu.get("start", 0.0)
        if "end" in cpu else None, "ended": ended}))
    os._exit(0)  # the threads of ranks still following need no orderly end


def _spawn(specs: list[dict], strace: Path | None) -> list[subprocess.Popen]:
    procs = []
    for i, spec in enumerate(specs):
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
        if strace is not None:
            cmd = ["strace", "-f", "-qq", "-ttt", "--seccomp-bpf", "-e", "trace=%file", "-o", f"{strace}.{i}", *cmd]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs


def layout(n: int, threads: int) -> list[list[int]]:
    """Ranks 0..n-2 over processes (one each up to 64 ranks, else ``threads`` a process); rank
    n-1, the victim, alone."""
    body = list(range(n - 1))
    per = 1 if n <= 64 else threads
    return [body[i:i + per] for i in range(0, len(body), per)] + [[n - 1]]


def phase(n: int, kind: str, threads: int, window: float, strace: bool, workdir: Path) -> dict:
    """One job of ``n`` ranks: steady for ``window`` s, then its victim killed, failed, turning
    slow (its host work per step 1.3x the others'), or every rank stopping (a hang); the launcher's
    reading times the naming."""
    run_dir = workdir / f"{kind}-{n}" / "run"
    node_root = workdir / f"{kind}-{n}" / "node"
    run_dir.mkdir(parents=True)
    node_root.mkdir()
    groups = layout(n, threads)
    start_s = 3.0 + len(groups) * 0.15 + n / 1500  # interpreters and threads up before the join
    t0 = time.time()
    join_at = t0 + start_s
    win = (join_at + 6.0, join_at + 6.0 + window) if kind == "kill" else (float("inf"), float("inf"))
    # slow: once every rank has published a window of steps
    event_at = win[1] if kind == "kill" else join_at + (8.0 + STRAGGLER_STEPS + 2 * straggler.PUBLISH_EVERY_S
                                                        if kind == "slow" else 8.0)
    hang_timeout = HANG_S if kind == "hang" else 1800.0
    specs = []
    for i, ranks in enumerate(groups):
        victim = ranks == [n - 1]
        specs.append({"run_dir": str(run_dir), "num_ranks": n, "ranks": ranks, "node_root": str(node_root),
                      "join_at": join_at, "window": list(win), "hang_timeout_s": hang_timeout,
                      "progress_until": event_at if kind == "hang" else float("inf"),
                      "fail_at": event_at if (victim and kind == "fail") else None,
                      **({"slow_at": event_at} if victim and kind == "slow" else {}),
                      # (a slow rank is named after two windows of steps at one a second, and a publish)
                      "end_at": event_at + {"hang": HANG_S + 60, "slow": 60}.get(kind, 40),
                      "out": str(workdir / f"{kind}-{n}" / f"worker{i}.json")})
    trace = workdir / f"{kind}-{n}" / "strace" if strace else None
    procs = _spawn(specs, trace)
    counter = Counter(str(run_dir))  # the waiting launcher's own calls (this process)
    counter.start, counter.end = win
    seen = JobWatch(run_dir, n, PEER_TIMEOUT_S, INIT_TIMEOUT_S, STRAGGLER_FACTOR)
    named, verdict, killed = None, "", False
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    while time.time() < event_at + HANG_S + 45:
        now = time.time()
        if kind == "kill" and now >= event_at and not killed:
            killed = True  # the victim's own process (under --strace, strace's child), by the pid it reported
            try:
                os.kill(json.loads((status.status_dir(run_dir) / f"rank{n - 1}.json").read_text())["pid"],
                        signal.SIGKILL)
            except ProcessLookupError:  # it ended before (the job had failed already): the verdict says why
                verdict = f"the victim had ended before it was killed; the watch said: {seen.read(0).verdict}"
                break
        for p in procs:
            p.poll()  # reaped as a job's parent reaps its ranks: a zombie's pid still answers
        said, right, verdict = _said(kind, seen.read(0), n, now >= event_at)
        if said:
            named = now - event_at if right else None
            break
        time.sleep(0.25 if now >= event_at else 0.5)  # the launcher's poll
    for p in procs:
        try:
            p.wait(timeout=HANG_S + 60)
        except subprocess.TimeoutExpired:
            p.kill()
    reports = [json.loads(Path(s["out"]).read_text()) for s in specs if Path(s["out"]).exists()]
    out = {"kind": kind, "ranks": n, "processes": len(groups),
           "threads_per_process": max(len(g) for g in groups), "named_after_s": named, "verdict": verdict[:300],
           "ranks_ended_by_watch": sum(len(r["ended"]) for r in reports),
           # What the first rank to end was told, and when (from the event; negative: before it).
           "first_told": min(([e[0] - event_at, e[2]] for r in reports for e in r["ended"].values()), default=None),
           "launcher_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "launcher_rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024}
    if kind == "kill":
        calls: dict[str, int] = dict(counter.counts)
        for r in reports:
            for k, v in r["counts"].items():
                calls[k] = calls.get(k, 0) + v
        beats = calls.get("os.utime", 0) + calls.pop("status writes", 0)
        total = sum(calls.values())
        cpu = [r["cpu_s"] for r in reports if r["cpu_s"] is not None]
        out.update(window_s=window, calls=calls, calls_total=total,
                   calls_per_rank_per_s=total / n / window,
                   launcher_calls_per_s=sum(counter.counts.values()) / window,
                   heartbeats_per_rank_per_s=beats / n / window,
                   # Where the machine could not keep every simulated rank's beat (thousands of
                   # threads on two cores), the same calls per heartbeat at the beat's own rate.
                   calls_per_rank_per_s_at_full_beat=total / max(beats, 1) / status.HEARTBEAT_S,
                   cpu_ms_per_rank_per_s=1000 * sum(cpu) / n / window, cpu_reports=len(cpu))
        if trace is not None:
            out["strace"] = _strace_counts(trace, str(run_dir), win, n)
    shutil.rmtree(run_dir.parent, ignore_errors=True)
    return out


def _said(kind: str, w: Watch, n: int, after: bool) -> tuple[bool, bool, str]:
    """Whether the watch ``w`` has said what the phase waits for (the victim, rank n-1, killed,
    failed or slow; the job hung), whether rightly (not an even rank named slow, nor the victim
    before it turned slow), and what it said."""
    if kind == "slow":
        slow = [s["rank"] for s in w.stragglers.get("slow", [])]
        if not slow:
            return False, False, ""
        if not after or slow != [n - 1]:
            return True, False, f"ranks named slow wrongly: {slow} ({'before' if not after else 'after'} the victim turned)"
        return True, True, straggler.warning(w.stragglers["slow"][0], w.stragglers["median_host_s"], STRAGGLER_FACTOR,
                                             STRAGGLER_STEPS)
    want = "the job hung" if kind == "hang" else f"rank {n - 1} "
    said = bool(after and w.verdict and want in w.verdict)
    return said, said, w.verdict


def _strace_counts(trace: Path, run_dir: str, window: tuple, n: int) -> dict:
    """Calls naming the run dir in the window, from every traced process's system calls."""
    by_call: dict[str, int] = {}
    for f in trace.parent.glob(trace.name + ".*"):
        for line in f.read_text(errors="replace").splitlines():
            parts = line.split(None, 2)
            if len(parts) < 3 or run_dir not in parts[2]:
                continue
            try:
                t = float(parts[1])
            except ValueError:
                continue
            if window[0] <= t < window[1]:
                call = parts[2].split("(", 1)[0]
                by_call[call] = by_call.get(call, 0) + 1
    total = sum(by_call.values())
    return {"calls": by_call, "calls_total_ranks_only": total,
            "calls_per_rank_per_s_ranks_only": total / n / (window[1] - window[0])}


# --- real jobs ----------------------------------------------------------------------------------

def real_job(n: int, cluster: list[str], env: dict, workdir: Path) -> dict:
    """A mode=run job of ``n`` one-device ranks: submission to every rank joined, then one rank
    killed and named, then the job cancelled."""
    run = workdir / f"real-{cluster[0].split('=')[1]}-{n}"  # no '=' in a path Hydra reads
    program = workdir / "sleeper.py"
    program.write_text("import time\nfor _ in range(600):\n    time.sleep(1)\n")
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "mode=run", f"mode.script={program}",
                             "cluster.cpu_devices_per_task=1", "launcher.init_timeout_s=600", *cluster,
                             f"hydra.run.dir={run}"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    joined_s = killed_named_s = None
    try:
        deadline = t0 + 900
        while time.time() < deadline and proc.poll() is None:
            statuses = status.read_statuses(run)
            if len(statuses) == n and all(st.state == "joined" for st, _ in statuses.values()):
                joined_s = max(st.time for st, _ in statuses.values()) - t0
                break
            time.sleep(1)
        if joined_s is not None:
            st, _ = status.read_statuses(run)[n // 2]
            killed = time.time()
            os.kill(st.pid, signal.SIGKILL)
            _, err = proc.communicate(timeout=120)
            line = next((x for x in err.splitlines() if f"rank {n // 2} (pid" in x), "")
            killed_named_s = time.time() - killed if line else None
    finally:
        if proc.poll() is None:
            subprocess.run([sys.executable, "-m", "launcher", "cancel", str(run)], cwd=REPO, env=env,
                           capture_output=True, timeout=120)
            proc.kill()
    w = read_watch(run)
    return {"ranks": n, "cluster": " ".join(cluster), "submission_to_all_joined_s": joined_s,
            "killed_rank_named_s": killed_named_s, "returncode": proc.returncode,
            "watch_states": w.states if w else None}


# --- what else grows with the ranks -------------------------------------------------------------

CENSUS = ["mode=train", "model=gpt-tiny", "mode.steps=16", "mode.checkpoint_every=8", "cluster.cpu_devices_per_task=1",
          "mode.plan=dp"]


def census(n: int, workdir: Path) -> dict:
    """A real mode=train job of ``n`` one-device ranks (checkpoints, JAX's compilation cache in
    the run dir), traced with strace: its calls on the run dir by what they were for, per rank."""
    run = workdir / f"census-{n}"
    trace = workdir / f"census-{n}.strace"
    t0 = time.time()
    subprocess.run(["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=%file,getdents64", "-o", str(trace),
                    sys.executable, "-m", "launcher", *CENSUS, f"cluster.tasks_per_node={n}", f"hydra.run.dir={run}"],
                   cwd=REPO, check=True, capture_output=True, timeout=1800)
    wall = time.time() - t0
    what = {"logs": "/logs/", "checkpoints": "/checkpoints/", "compile cache": "/jax_cache",
            "status and watch": "/.xlaunch/", "submitit (pickles, results)": "/submitit", "result.json": "/result.json"}
    counts = dict.fromkeys(what, 0)
    other = 0
    for line in trace.read_text(errors="replace").splitlines():
        if str(run) not in line:
            continue
        rest = line.split(str(run), 1)[1]
        key = next((k for k, frag in what.items() if rest.startswith(frag)), None)
        if key is None:
            other += 1
        else:
            counts[key] += 1
    shutil.rmtree(run, ignore_errors=True)
    trace.unlink()
    return {"ranks": n, "wall_s": wall, "calls": {**counts, "other": other},
            "calls_per_rank": {k: v / n for k, v in {**counts, "other": other}.items()}}


# --- main ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", default=None, help="simulated jobs of these sizes (default 8,64,512,4096 unless "
                                                  "--real or --census is given)")
    ap.add_argument("--threads", type=int, default=64, help="simulated ranks per process beyond 64 ranks")
    ap.add_argument("--window", type=float, default=20.0, help="seconds of steady state counted")
    ap.add_argument("--strace", type=int, default=0, metavar="N",
                    help="also count from the system calls (strace) up to N ranks (traced threads slow down too "
                         "much beyond a few hundred: their beats fall behind)")
    ap.add_argument("--phases", default="kill,fail,hang,slow")
    ap.add_argument("--real", default="", help="real mode=run jobs of these rank counts (e.g. 8,16,32)")
    ap.add_argument("--slurm", action="store_true", help="with --real: on the tests' SLURM too")
    ap.add_argument("--census", default="", help="real mode=train jobs of these rank counts traced with strace: "
                                                   "their run-dir calls by what they were for (e.g. 2,4,8)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    if args.ranks is None:
        args.ranks = "" if args.real or args.census else "8,64,512,4096"
    if args.strace and not shutil.which("strace"):
        sys.exit("--strace: strace is not installed (apt-get install strace)")
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "host": platform.node(),
                          "heartbeat_s": status.HEARTBEAT_S}
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    try:
        if args.ranks:
            rows = []
            for n in (int(x) for x in args.ranks.split(",")):
                for kind in args.phases.split(","):
                    row = phase(n, kind, args.threads, args.window, n <= args.strace and kind == "kill", workdir)
                    row["when"] = time.strftime("%Y-%m-%d %H:%M")
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            # This run's rows replace those of the same size and kind; the others stay.
            done = {(r["ranks"], r["kind"]) for r in rows}
            kept = [r for r in results.get("simulated", []) if (r["ranks"], r["kind"]) not in done]
            results["simulated"] = sorted(kept + rows, key=lambda r: (r["ranks"], r["kind"]))
        if args.census:
            results["census"] = [census(int(n), workdir) for n in args.census.split(",")]
            for row in results["census"]:
                print(json.dumps(row), flush=True)
        if args.real:
            results["real"] = [real_job(n, ["cluster=local", f"cluster.tasks_per_node={n}"], dict(os.environ), workdir)
                               for n in (int(x) for x in args.real.split(","))]
            if args.slurm:
                results["real"] += _slurm_jobs([int(x) for x in args.real.split(",")], workdir)
            for row in results["real"]:
                print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    summary = [(r["ranks"], r["kind"], r.get("calls_per_rank_per_s"), r.get("cpu_ms_per_rank_per_s"),
                r["named_after_s"]) for r in results.get("simulated", [])]
    for row in summary:
        print(*row)
    print(f"wrote {args.out}")


def _slurm_jobs(counts: list[int], workdir: Path) -> list[dict]:
    """The same real jobs on the tests' SLURM (two pretend nodes, each declared with enough CPUs)."""
    from tests.clusterkit.slurm import LocalSlurm

    out = []
    root = Path(tempfile.mkdtemp(prefix="xlaunch-slurm-", dir="/tmp"))  # munged: every folder above searchable
    root.chmod(0o755)
    slurm = LocalSlurm(root, cpus_per_node=max(counts) // 2).start()
    try:
        for n in counts:
            out.append(real_job(n, ["cluster=slurm", "cluster.nodes=2", f"cluster.tasks_per_node={n // 2}"],
                                {**os.environ, **slurm.env}, workdir))
    finally:
        slurm.stop()
        shutil.rmtree(root, ignore_errors=True)
    return out


if __name__ == "__main__":
    main()
