"""``xlaunch status|logs|cancel|runs|stacks|sweep``: follow and stop jobs submitted earlier.

A first word that names a command can never be a Hydra override (those are ``key=value``), so
``launcher.cli.main`` hands such a command line here before Hydra sees it. Each command takes a
run dir, or the latest run under ``./outputs`` and ``./multirun`` when none is named, and reads
what the run dir and the scheduler say (``launcher/cli/jobs.py``). Bad input (a directory that is
not a run dir, a job the scheduler no longer knows, cancelling a job that has ended) is one line
and exit status 2, as everywhere in xlaunch. ``xlaunch sweep`` prints a ``-m`` sweep's table
(``launcher/cli/sweep/``) from its sweep dir, also while it runs. Reference: docs/operate.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from launcher.cli import jobs, sweep
from launcher.cli.console import seconds
from launcher.errors import BAD_INPUT
from launcher.errors import BAD_INPUT as bad
from launcher.runtime import status, straggler, timing
from launcher.cli.sweep import points

COMMANDS = ("status", "logs", "cancel", "runs", "stacks", "sweep")

_RUN_HELP = "the run dir (default: the latest run under ./outputs and ./multirun)"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="xlaunch", description="Follow and stop jobs that xlaunch submitted (e.g. with launcher.wait=false). "
        "Start a job with `xlaunch key=value ...` (see `xlaunch --help`).",
        epilog="examples:\n  xlaunch status\n  xlaunch logs -f\n  xlaunch logs --rank 1 outputs/2026-01-31/12-00-00-train-slurm\n"
               "  xlaunch cancel\n  xlaunch runs -n 20\n  xlaunch sweep multirun/2026-01-31/12-00-00",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="{status,logs,cancel,runs,stacks,sweep}")

    s = sub.add_parser("status", help="the job's state and each rank's",
                       description="The job's state (queued, running, requeued, done, failed with the rank and "
                                   "why, cancelled), the scheduler's word on it and each rank's state.")
    s.add_argument("run", nargs="?", help=_RUN_HELP)
    s.add_argument("--json", action="store_true", help="print the state as one JSON object")
    s.add_argument("--ranks", action="store_true",
                   help=f"every rank on a line of its own (by default for jobs of up to {jobs.LISTED_RANKS} ranks; "
                        "a larger job's ranks are shown by state, from one file)")

    s = sub.add_parser("logs", help="the ranks' logs as one stream (or one rank's)",
                       description="The ranks' logs as one stream in time order, each line prefixed with its "
                                   "rank, or one rank's log as it is; with -f, follow them until the job ends.")
    s.add_argument("run", nargs="?", help=_RUN_HELP)
    s.add_argument("-r", "--rank", type=int, help="only this rank's log, without prefixes")
    s.add_argument("-f", "--follow", action="store_true", help="keep printing what the ranks write until the job ends")

    s = sub.add_parser("cancel", help="end the job on its backend",
                       description="End the job: the local processes, the SLURM job (scancel), mpirun, the TPU "
                                   "workers. The run dir keeps what the job wrote.")
    s.add_argument("run", nargs="?", help=_RUN_HELP)

    s = sub.add_parser("stacks", help="where each rank of a running job is: its threads' stacks",
                       description="Asks every rank of a running job for the Python stacks of all its threads "
                                   "(written into its log, also while the rank waits inside XLA) and prints where "
                                   "each rank is, ranks at the same place together.")
    s.add_argument("run", nargs="?", help=_RUN_HELP)
    s.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the ranks' answers (default 15)")

    s = sub.add_parser("runs", help="recent runs with their state and result",
                       description="The runs under ./outputs and ./multirun, newest first: when, mode, cluster, job "
                                   "id, state and the headline result.")
    s.add_argument("-n", "--last", type=int, default=10, help="how many runs (default 10; 0: all)")
    s.add_argument("--sweep", action="store_true", help="the latest -m sweep as one table (as xlaunch sweep)")

    s = sub.add_parser("sweep", help="a -m sweep as one table: its points, their figures and states",
                       description="A -m sweep's points as one table: the overrides that vary, each point's "
                                   "headline figures, its state (a failed point's error) and run dir, the best "
                                   "point; sweep.csv (every point) and sweep.png (the chart) are written again "
                                   "in the sweep dir. Also while the sweep runs.")
    s.add_argument("sweep_dir", nargs="?", help="the sweep dir (default: the latest sweep under ./multirun)")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        return {"status": _status, "logs": _logs, "cancel": _cancel, "runs": _runs,
                "stacks": _stacks, "sweep": _sweep}[args.command](args)
    except BAD_INPUT as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `xlaunch logs | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _status(args: argparse.Namespace) -> int:
    run = jobs.run_or_latest(args.run)
    st = jobs.job_state(run, every_rank=True if args.ranks else None)
    spent = timing.summary(run.path, ended=st.finished)
    if args.json:
        print(json.dumps({"run_dir": str(run.path), "job_id": run.job_id, "backend": run.backend,
                          "mode": run.mode, "cluster": run.cluster_name, **st.to_json(), "time": spent}))
        return 0
    rows = [("run dir", str(run.path)),
            ("job", f"{run.job_id} on {run.cluster_name} ({run.backend}), mode {run.mode}, submitted "
                    f"{_when(run.submitted)}"),
            ("state", f"{st.state}: {st.detail}" if st.detail else st.state)]
    if st.scheduler:
        rows.append(("scheduler", st.scheduler))
    if spent:
        rows.append(("time", timing.line(spent)))
        rows.append(("cost", _cost(spent, run)))
    rows += straggler.status_rows(st.stragglers)
    for r in st.ranks:
        if r.ranks:  # a large job: its ranks by state
            rows.append((f"ranks {r.ranks}" if r.ranks != str(r.rank) else f"rank {r.rank}", r.state))
            continue
        text = r.state + (f" on {r.host} pid {r.pid}" if r.host else "")
        if r.heartbeat_age_s is not None:
            text += f", heartbeat {r.heartbeat_age_s:g} s ago"
        if r.message and r.state != "done":
            text += f": {r.message}"
        rows.append((f"rank {r.rank}", text))
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
    return 0


def _logs(args: argparse.Namespace) -> int:
    run = jobs.run_or_latest(args.run)
    jobs.write_lines(jobs.log_lines(run, rank=args.rank, follow=args.follow))
    if args.follow:
        st = jobs.job_state(run)
        print(f"job {run.job_id} {st.state}" + (f": {st.detail}" if st.detail else ""), file=sys.stderr)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    run = jobs.run_or_latest(args.run)
    st = jobs.cancel(run)
    print(f"cancelled job {run.job_id} on {run.cluster_name} ({run.backend}); now {st.state}; what it wrote is in "
          f"{run.path}")
    return 0


def _stacks(args: argparse.Namespace) -> int:
    run = jobs.run_or_latest(args.run)
    stacks = jobs.stacks(run, args.timeout)
    print(f"job {run.job_id}: {status.where_ranks_are(stacks, run.ranks)}")
    for rank in sorted(stacks):
        print(f"rank {rank}: every thread's stack is in {status.rank_log(run.path, rank)}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    text, _ = sweep.report(points.find_sweep(getattr(args, "sweep_dir", None)))
    print(text)
    return 0


def _runs(args: argparse.Namespace) -> int:
    if args.sweep:
        return _sweep(args)
    if args.last < 0:
        print(f"error: --last {args.last}: give a number of runs (0: all)", file=sys.stderr)
        return 2
    runs = jobs.find_runs()
    runs = runs[:args.last] if args.last else runs
    if not runs:
        print(f"no submitted run under ./{' or ./'.join(jobs.RUN_ROOTS)} of {Path.cwd()}", file=sys.stderr)
        return 0
    rows = [("SUBMITTED", "RUN", "MODE", "CLUSTER", "JOB", "STATE", "NODE-H", "DEVICE-H", "RESULT")]
    for run in runs:
        try:
            st = jobs.job_state(run)
            state, detail, finished = st.state, st.detail, st.finished
        except bad as e:  # one run the scheduler forgot does not hide the others
            state, detail, finished = "unknown", str(e).split(": ", 1)[-1], True
        spent = timing.summary(run.path, ended=finished)
        c = timing.cost(spent, run.nodes, run.devices()) if spent else {}
        hours = [f"{c[k]:.3g}" if k in c else "-" for k in ("node_hours", "device_hours")]
        after = run.record.get("after") or {}
        job = run.job_id + (f" after {after['job_id']}" if after else "")   # a chain: launcher.after
        rows.append((time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.submitted)), _relative(run.path),
                     run.mode, run.cluster_name, job, state, *hours, _short(detail)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(f"{c:<{w}}" for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1])
    return 0


def _cost(spent: dict, run: jobs.Run) -> str:
    """A run's cost in words: node-hours (and device-hours) for the time its allocation was held."""
    c = timing.cost(spent, run.nodes, run.devices())
    devices = f", {c['device_hours']:.3g} device-hours" if "device_hours" in c else ""
    return (f"{c['node_hours']:.3g} node-hours{devices} ({run.nodes} node{'s' if run.nodes != 1 else ''} for the "
            f"{spent['held_s']:.1f} s the allocation was held)")


def _when(t: float) -> str:

    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))} ({seconds(max(time.time() - t, 0))} ago)"


def _relative(p: Path) -> str:
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _short(text: str, n: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n - 3] + "..."
