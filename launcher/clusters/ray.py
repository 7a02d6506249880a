"""cluster=ray (backend ray): the tasks as Ray actors, one group per node, on a Ray cluster.

The job is a small bash script on this machine (kept in the submitit folder, printed by a dry
run) that runs this module as a Ray *driver*: it connects to the cluster (``cluster.address``:
``auto``, a head's ``host:port``, or ``ray://host:10001`` through Ray Client), reserves one
placement-group bundle per node (``STRICT_SPREAD``: a node's tasks together, nodes apart), and
starts one actor per task in its node's bundle. Each actor runs the task as every backend does,
``<python> -u -m submitit.core._submit <folder>``, in a process of its own, so device visibility
is set before JAX is imported and a rank that dies takes no Ray worker with it; the rank numbers
reach it as ``XLAUNCH_*`` variables (``launcher.runtime.ranks.ExplicitEnv``), the coordinator
being rank 0's node. The script's process id is the job id, as for mpirun's and submitit's local
jobs, so ``xlaunch status|logs|cancel|runs`` work as they do there: cancelling signals the
driver, which stops every task and frees the placement group; a driver that dies takes its
actors with it (Ray ends the actors of a dead owner) and they take their task processes.

The run dir must be on a file system every Ray node sees, as on SLURM (on KubeRay: a shared
volume mounted at the same path). Ray's own logs stay Ray's; each rank's output goes to its
submitit log and its rank log in the run dir. Ray itself is imported only by the driver and
the pre-submission probe (``python -m launcher.clusters.ray probe``): the CLI imports nothing of
Ray, and the submitting python needs Ray only when ``cluster=ray`` is chosen.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.clusters._script import ScriptExecutor
from launcher.clusters._shell import one_line
from launcher.clusters.base import Cluster, RankJobEnvironment
from launcher.clusters.config import ClusterConfig
from launcher.errors import UserError
from launcher.runtime import status
from launcher.runtime.ranks import ExplicitEnv

INSTALL_HINT = "pip install 'xlaunch[ray]' (or pip install 'ray[client]')"
PLACEMENT_FILE = "ray_placement.json"  # in the submitit folder: which rank ran on which Ray node


@dataclass
class Config(ClusterConfig):
    """cluster.backend=ray: which Ray cluster, and what each task asks of it."""

    backend: str = "ray"
    address: str = "auto"  # auto | host:port (the head's GCS) | ray://host:10001 (Ray Client)
    cpus_per_task: float = 1.0  # Ray CPUs each task reserves
    # Custom resources each task asks for, e.g. {TPU: 4} or a slice's "TPU-v4-16-head": 1.
    resources: Dict[str, float] = field(default_factory=dict)
    # Ray's runtime environment for the tasks (working_dir, py_modules, pip, env_vars, ...);
    # cluster.env is added to its env_vars.
    runtime_env: Dict[str, Any] = field(default_factory=dict)
    python: Optional[str] = None  # the tasks' interpreter on the nodes; null: the Ray worker's own

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cluster
        runtime = getattr(cfg.container.runtime, "value", cfg.container.runtime)
        if runtime != "none":
            raise UserError(f"container={runtime} is not supported on cluster=ray: Ray starts the tasks in its "
                            "own workers; give Ray's image through cluster.runtime_env (image_uri) and use "
                            "container=none")
        if c.cpus_per_task <= 0:
            raise UserError(f"cluster.cpus_per_task={c.cpus_per_task}: must be more than 0")
        for name, amount in c.resources.items():
            if amount <= 0:
                raise UserError(f"cluster.resources.{name}={amount}: must be more than 0")
        address(c.address)  # refuses a malformed one now


class RayCluster(Cluster):
    backend = "ray"
    config = Config
    display_name = "Ray"
    submission_name = "submission.sh"
    runs_this_python = False  # the Ray workers' python, on the nodes
    rank_env = ExplicitEnv

    def other_hosts(self) -> None:
        """Not known before the driver has connected: Ray places the ranks."""
        return None

    def executor(self) -> "RayExecutor":
        c, lc = self.cfg.cluster, self.cfg.launcher
        ex = RayExecutor(self.folder, python=sys.executable, max_num_timeout=self.max_requeues())
        ex.update_parameters(
            address=one_line("cluster.address", c.address), nodes=c.nodes, tasks_per_node=c.tasks_per_node,
            task_resources=task_resources(c), node_gpus=c.gpus_per_node, runtime_env=runtime_env(c),
            task_python=c.python, coordinator_port=self.coordinator_port, init_timeout_s=lc.init_timeout_s,
            cwd=os.getcwd(), setup=self.setup_lines())
        return ex

    def submission_text(self, executor: "RayExecutor") -> str:
        return executor._make_submission_file_text(executor._submitit_command_str, uid="")

    def cancel(self, job) -> None:
        """Signals the driver, which stops every task and frees the placement group, and waits
        for it, so that nothing of the job runs once the launcher has said it ended."""
        job.cancel(check=False)
        process = getattr(job, "_process", None)
        if process is None:
            return
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)


class RayJobEnvironment(RankJobEnvironment):
    """Inside a task started by the Ray driver (SUBMITIT_EXECUTOR=ray): the numbers are the
    ``XLAUNCH_*`` variables it set, read by ``ExplicitEnv`` as the Task reads them."""

    reader = ExplicitEnv
    _env = {"job_id": "SUBMITIT_RAY_JOB_ID"}


def task_resources(c) -> dict[str, float]:
    """What one task reserves: Ray CPUs and the custom resources (GPUs are reserved per node)."""
    return {"CPU": float(c.cpus_per_task), **{str(k): float(v) for k, v in c.resources.items()}}


def bundle(params: dict) -> dict[str, float]:
    """One node's reservation: its tasks' resources, and the node's GPUs as a whole (each task's
    visibility is then set by xlaunch per local rank, as on every backend)."""
    out = {k: v * params["tasks_per_node"] for k, v in params["task_resources"].items()}
    if params["node_gpus"]:
        out["GPU"] = float(params["node_gpus"])
    return out


def runtime_env(c) -> dict:
    env = dict(c.runtime_env or {})
    if c.env:
        env["env_vars"] = {**(env.get("env_vars") or {}), **{str(k): str(v) for k, v in c.env.items()}}
    return env


def address(value: str) -> tuple[str, str, int | None]:
    """(kind, host, port) of ``cluster.address``: ``auto``, ``host:port`` or ``ray://host:port``."""
    if value == "auto":
        return "auto", "", None
    kind, rest = ("client", value[len("ray://"):]) if value.startswith("ray://") else ("gcs", value)
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"cluster.address={value!r}: expected auto, host:port (the Ray head's GCS address, "
                        "e.g. 10.0.0.1:6379) or ray://host:10001 (Ray Client)")
    return kind, host, int(port)


def running_head(value: str) -> tuple[str, int]:
    """The head's (host, port) to try before anything is submitted; for ``auto``, the cluster
    Ray recorded on this machine (``RAY_ADDRESS``, else the one ``ray start --head`` wrote)."""
    kind, host, port = address(value)
    if kind != "auto":
        return host, tp.cast(int, port)
    recorded = os.environ.get("RAY_ADDRESS", "")
    if not recorded:
        with contextlib.suppress(OSError):
            recorded = Path(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "ray_current_cluster").read_text().strip()
    if not recorded or recorded == "auto":
        raise UserError("cluster.address=auto: no Ray cluster is running on this machine; start one "
                        "(ray start --head) or give the head's address: cluster.address=<host>:6379 "
                        "(or ray://<host>:10001 through Ray Client)")
    _, host, port = address(recorded)
    return host, tp.cast(int, port)


class RayExecutor(ScriptExecutor):
    """Runs a submitit job on a Ray cluster through a driver script on this machine.

    Parameters (``update_parameters``): address, nodes, tasks_per_node, task_resources (what
    each task reserves), node_gpus, runtime_env, task_python, coordinator_port,
    init_timeout_s (how long the placement group may wait for its resources), cwd (where the
    tasks start: the launcher's working directory), setup.
    """

    defaults = {"address": "auto", "nodes": 1, "tasks_per_node": 1, "task_resources": {"CPU": 1.0},
                "node_gpus": 0, "runtime_env": {}, "task_python": None, "coordinator_port": 0,
                "init_timeout_s": 60, "cwd": "", "setup": []}

    def __init__(self, folder: tp.Union[str, Path], python: str = sys.executable, **kwargs: tp.Any) -> None:
        super().__init__(folder, **kwargs)
        self.python = python

    @property
    def _submitit_command_str(self) -> str:
        return " ".join(["-u -m submitit.core._submit", shlex.quote(str(self.folder))])

    def _num_tasks(self) -> int:
        return self.parameters["nodes"] * self.parameters["tasks_per_node"]

    def spec(self) -> dict:
        p = self.parameters
        return {k: p[k] for k in self.defaults if k != "setup"} | {"bundle": bundle(p)}

    def _check_available(self) -> None:
        """Before anything is submitted: Ray importable here, the head answering, and the
        cluster holding what the job asks for (its alive nodes' total resources)."""
        p = self.parameters
        try:
            import ray  # noqa: F401, PLC0415  only cluster=ray needs it, and only here
        except ImportError:
            raise UserError(f"cluster=ray needs Ray in this python ({sys.executable}): {INSTALL_HINT}") from None
        host, port = running_head(p["address"])
        try:
            socket.create_connection((host, port), timeout=5).close()
        except OSError as e:
            raise UserError(f"cluster.address={p['address']}: no Ray head answers at {host}:{port} ({e}); start one "
                            f"(ray start --head --port={port}) or give the address of a running head") from None
        out = subprocess.run([self.python, "-m", "launcher.clusters.ray", "probe", p["address"]],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"cluster.address={p['address']}: cannot connect to the Ray cluster: {last}")
        nodes = json.loads(out.stdout.strip().splitlines()[-1])
        why = unplaceable(bundle(p), p["nodes"], nodes)
        if why:
            raise UserError(why)

    def _script_logs(self, job) -> tp.Tuple[Path, Path]:
        """The driver's own output, beside the tasks' (``<job id>_driver_log.out|err``): where
        a placement that never came, or a rank's end, is told."""
        folder = job.paths.folder
        return folder / f"{job.job_id}_driver_log.out", folder / f"{job.job_id}_driver_log.err"

    def _make_submission_file_text(self, command: str, uid: str) -> str:  # noqa: ARG002 - submitit's signature
        p = self.parameters
        spec = json.dumps(self.spec(), sort_keys=True)
        return "\n".join([
            "#!/bin/bash",
            f"# submitit job: a Ray driver places {self._num_tasks()} task(s) ({p['nodes']} node(s) x "
            f"{p['tasks_per_node']}) on the Ray cluster at {p['address']}:",
            f"# one placement-group bundle per node, STRICT_SPREAD, each {json.dumps(bundle(p), sort_keys=True)};",
            f"# each task an actor reserving {json.dumps(p['task_resources'], sort_keys=True)} and running: "
            f"<python> {command}",
            "# The job id is this script's process id, as for submitit's local jobs.",
            "export SUBMITIT_RAY_JOB_ID=$$",
            *p["setup"],
            "exec " + shlex.join([self.python, "-u", "-m", "launcher.clusters.ray", "run", str(self.folder), spec]),
            "",
        ])


def unplaceable(need: dict[str, float], count: int, nodes: list[dict]) -> str:
    """Why ``count`` bundles of ``need``, one per node, cannot be placed on ``nodes`` (each
    ``{"id", "address", "resources"}``, alive ones) ("" if they can, going by totals)."""
    fit = [n for n in nodes if all(n["resources"].get(k, 0.0) >= v for k, v in need.items())]
    if len(fit) >= count:
        return ""
    if len(nodes) < count:
        return (f"cluster.nodes={count}: the Ray cluster has {len(nodes)} alive node(s); lower cluster.nodes or "
                "add nodes")
    short = sorted({k for n in nodes for k, v in need.items() if n["resources"].get(k, 0.0) < v})
    have = "; ".join(f"{n['address']} {n['id'][:8]}: " + ", ".join(f"{k}={n['resources'].get(k, 0.0):g}" for k in short)
                     for n in nodes)
    return (f"the Ray cluster cannot give {count} node(s) {json.dumps(need, sort_keys=True)} each (only {len(fit)} "
            f"node(s) can; short of {', '.join(short)}: {have}); lower cluster.tasks_per_node, "
            "cluster.cpus_per_task, cluster.gpus_per_node or cluster.resources")


# --- the driver: run by the job script on this machine --------------------------------------------

# Run before the task's own command, in its process: asks Linux to SIGKILL it when its Ray worker
# dies (PR_SET_PDEATHSIG, kept across exec), then becomes the command. Not a preexec_fn: the
# actor runs its methods on threads, where preexec_fn is unsafe.
_DIE_WITH_PARENT = ("import ctypes, os, sys\n"
                    "try:\n    ctypes.CDLL('libc.so.6').prctl(1, 9)\nexcept Exception:\n    pass\n"
                    "os.execvp(sys.argv[1], sys.argv[1:])")


class _Task:
    """One rank, as a Ray actor: starts the task process and signals it on request."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None

    def where(self) -> dict:
        import ray  # noqa: PLC0415  inside the actor

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "ip": ray.util.get_node_ip_address()}

    def run(self, python: str | None, args: list[str], env: dict[str, str], cwd: str | None, stdout: str,
            stderr: str) -> int:
        """Runs ``<python> <args>`` (python: this Ray worker's own when None) to its end, in
        ``cwd`` (None: the worker's own, Ray's copy of a runtime_env working_dir)."""
        task = (shlex.split(python) if python else [sys.executable]) + args
        argv = [sys.executable, "-c", _DIE_WITH_PARENT, *task]
        full = {k: v for k, v in os.environ.items() if k not in _VISIBILITY}
        full.update(env)
        if cwd is None:  # the task's code is Ray's copy (mode=run reads it from there)
            full["XLAUNCH_CODE_DIR"] = os.getcwd()
        with open(stdout, "a") as out, open(stderr, "a") as err:
            self.process = subprocess.Popen(argv, env=full, cwd=cwd, stdout=out, stderr=err)
            return self.process.wait()

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)


# Set by Ray for its own workers; the task sets the rank's own (launcher/runtime/devices.py).
_VISIBILITY = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def connect(addr: str, **kwargs: Any) -> None:
    """``ray.init``; through Ray Client, tried three times: the head starts a server per client
    connection, which a loaded head can be too slow to start within Ray's own wait."""
    import ray  # noqa: PLC0415

    for attempt in range(3 if addr.startswith("ray://") else 1):
        try:
            ray.init(address=addr, logging_level="ERROR", log_to_driver=False, **kwargs)
            return
        except (ConnectionError, RuntimeError):
            if attempt == 2 or not addr.startswith("ray://"):
                raise
            time.sleep(5)


def probe(addr: str) -> list[dict]:
    import ray  # noqa: PLC0415

    connect(addr)
    try:
        return [{"id": n["NodeID"], "address": n["NodeManagerAddress"], "resources": n["Resources"]}
                for n in ray.nodes() if n["Alive"]]
    finally:
        ray.shutdown()


def drive(folder: Path, spec: dict) -> int:
    """Places the tasks, runs them, and ends them all as soon as one fails or the job is cancelled."""
    import ray  # noqa: PLC0415
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group  # noqa: PLC0415
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415

    stop = {"signal": 0}

    def on_signal(signum, _frame):
        stop["signal"] = signum

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    job_id = os.environ["SUBMITIT_RAY_JOB_ID"]
    run_dir = folder.parent
    nodes, per_node = spec["nodes"], spec["tasks_per_node"]
    n = nodes * per_node
    connect(spec["address"], runtime_env=spec["runtime_env"] or None)
    pg = placement_group([spec["bundle"]] * nodes, strategy="STRICT_SPREAD", name=f"xlaunch-{job_id}")
    waited = time.monotonic()
    while not pg.wait(timeout_seconds=1):
        if stop["signal"]:
            remove_placement_group(pg)
            return 128 + stop["signal"]
        if time.monotonic() - waited > spec["init_timeout_s"]:
            remove_placement_group(pg)
            free, total = ray.available_resources(), ray.cluster_resources()
            have = ", ".join(f"{k}={free.get(k, 0.0):g} of {total.get(k, 0.0):g}" for k in sorted(spec["bundle"]))
            print(f"error: the Ray cluster could not place {nodes} bundle(s) of {json.dumps(spec['bundle'], sort_keys=True)} "
                  f"(one per node) within launcher.init_timeout_s={spec['init_timeout_s']} s; free in the whole "
                  f"cluster now: {have} (other jobs hold the rest)", file=sys.stderr, flush=True)
            return 3
    node_of_bundle = placement_group_table(pg)["bundles_to_node_id"]
    ips = {x["NodeID"]: x["NodeManagerAddress"] for x in ray.nodes()}
    coordinator = f"{ips[node_of_bundle[0]]}:{spec['coordinator_port']}"
    task_resources = dict(spec["task_resources"])
    cpus = task_resources.pop("CPU", 0.0)
    actors = []
    for rank in range(n):
        node = rank // per_node
        actors.append(ray.remote(_Task).options(
            num_cpus=cpus, num_gpus=0, resources=task_resources or None, max_concurrency=2,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=node)).remote())
    placed = ray.get([a.where.remote() for a in actors])
    (folder / PLACEMENT_FILE).write_text(json.dumps(
        {"coordinator": coordinator, "ranks": [{"rank": r, **w} for r, w in enumerate(placed)]}, indent=1) + "\n")
    runs = {}
    for rank, actor in enumerate(actors):
        env = {"SUBMITIT_EXECUTOR": "ray", "SUBMITIT_RAY_JOB_ID": job_id, "XLAUNCH_PROCESS_ID": str(rank),
               "XLAUNCH_NUM_PROCESSES": str(n), "XLAUNCH_LOCAL_RANK": str(rank % per_node),
               "XLAUNCH_LOCAL_SIZE": str(per_node), "XLAUNCH_NODE_RANK": str(rank // per_node),
               "XLAUNCH_COORDINATOR": coordinator}
        out, err = (folder / f"{job_id}_{rank}_log.out", folder / f"{job_id}_{rank}_log.err")
        args = ["-u", "-m", "submitit.core._submit", str(folder)]
        # Where the task starts: the launcher's working directory (the run dir and the code are
        # on a file system every node sees), or Ray's copy of a runtime_env working_dir.
        cwd = None if (spec["runtime_env"] or {}).get("working_dir") else spec["cwd"]
        runs[actor.run.remote(spec["task_python"], args, env, cwd, str(out), str(err))] = rank
    rc = 0
    pending = list(runs)
    while pending and not stop["signal"]:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            rank = runs[ref]
            try:
                code = ray.get(ref)
                why = f"exited with status {code}" if code > 0 else f"was killed by signal {-code}"
            except ray.exceptions.RayError as e:  # its actor or node was lost
                code, why = 1, f"was lost with its Ray actor ({type(e).__name__}: {str(e).splitlines()[0]})"
            if code != 0 and not rc:
                rc = 1
                host = placed[rank]["host"]
                status.mark_failed(run_dir, rank, f"the task process {why} on Ray node {placed[rank]['node_id'][:8]}",
                                   host)
                print(f"error: rank {rank} {why} on {host}; stopping the other ranks", file=sys.stderr, flush=True)
                stop["signal"] = signal.SIGTERM
    if stop["signal"]:
        _stop(actors, pending)
        rc = rc or 128 + stop["signal"]
    remove_placement_group(pg)
    ray.shutdown()
    return rc


def _stop(actors: list, pending: list) -> None:
    """SIGTERM to every task (a rank records that it was stopped), SIGKILL to those left after 10 s."""
    import ray  # noqa: PLC0415

    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(Exception):
            ray.get([a.signal.remote(signum) for a in actors], timeout=10)
        with contextlib.suppress(Exception):
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=10)
        if not pending:
            return
    for a in actors:
        with contextlib.suppress(Exception):
            ray.kill(a)


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"] and len(argv) == 2:
        print(json.dumps(probe(argv[1])))
        return 0
    if argv[:1] == ["run"] and len(argv) == 3:
        return drive(Path(argv[1]), json.loads(argv[2]))
    print("usage: python -m launcher.clusters.ray probe <address> | run <submitit folder> <spec json>",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
