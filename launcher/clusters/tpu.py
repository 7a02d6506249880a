"""cluster=tpu: the same command on every worker of a TPU VM pod, through ``gcloud``.

TPU VM workers share no file system with the machine that submits, so the job is a bash script
run on this machine (kept in the submitit folder, printed by a dry run) that

1. copies the pickled task to every worker, under ``~/<cluster.remote_dir>/<run>/submitit``,
   and for mode=run the user's code, unpacked in ``~/<cluster.remote_dir>/<run>-code``
   (``launcher/clusters/_code.py``: what git would keep, or ``mode.include``);
2. runs ``gcloud compute tpus tpu-vm ssh NAME --worker=all --command ...``: one process per
   worker, started by ``launcher.clusters._tpu_worker`` (which finds the worker's number, opens
   that worker's own log and hands over to submitit);
3. copies each worker's run dir back into the local run dir (results, rank logs, status files),
   also when the job failed or was cancelled.

The task runs with its run dir set to the worker's copy (its working directory), since the
submitting machine's path means nothing there. Each worker needs the same Python packages
(jax[tpu], submitit, xlaunch) under ``cluster.remote_python``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import time
import typing as tp
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from submitit.core import core, utils

from launcher.clusters import _code
from launcher.clusters._script import ScriptExecutor
from launcher.clusters._shell import one_line, operand
from launcher.clusters.base import Cluster, RankJobEnvironment
from launcher.clusters.config import Accelerator, ClusterConfig
from launcher.errors import UserError
from launcher.runtime import status
from launcher.runtime.user_program import CODE_DIR_ENV
from launcher.runtime.ranks import TpuEnv

# JAX's own default coordinator port on Cloud TPU (jax/_src/clusters/cloud_tpu_cluster.py).
DEFAULT_TPU_COORDINATOR_PORT = 8482
# Run on every worker before a job starts: a killed job leaves libtpu's lock file and, often,
# processes holding the chips, and the next start then fails to open the TPU (jax issue 10192).
_CLEAR_TPU = ("{ sudo -n rm -f /tmp/libtpu_lockfile || rm -f /tmp/libtpu_lockfile; "
              "for dev in /dev/accel* /dev/vfio/[0-9]*; do [ -e \"$dev\" ] && "
              "{ sudo -n fuser -k -9 \"$dev\" || fuser -k -9 \"$dev\"; }; done; } >/dev/null 2>&1; true")


@dataclass
class Config(ClusterConfig):
    """cluster.backend=tpu: which TPU VM pod, and how to reach its workers."""

    backend: str = "tpu"
    accelerator: Accelerator = Accelerator.tpu
    tasks_per_node: int = 1
    tpu_name: Optional[str] = None
    zone: Optional[str] = None
    project: Optional[str] = None
    gcloud: str = "gcloud"
    remote_dir: str = "xlaunch-runs"  # on each worker, relative to its home
    remote_python: str = "python3"  # the workers' interpreter (with jax[tpu], submitit and xlaunch)
    # How to make the pod again when a restart (launcher.max_restarts) finds it preempted or
    # lost: its type and runtime (gcloud's --accelerator-type, --version), whether it is a spot
    # pod, and the queued resource it was made through (none: made directly).
    accelerator_type: Optional[str] = None
    runtime_version: Optional[str] = None
    spot: bool = False
    queued_resource: Optional[str] = None

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cluster
        if not c.tpu_name:
            raise UserError("cluster=tpu needs the TPU VM's name: add cluster.tpu_name=<name> (and cluster.zone=<zone>)")
        if c.tasks_per_node != 1:
            raise UserError(f"cluster.tasks_per_node={c.tasks_per_node}: a TPU VM worker runs one process that "
                            "drives all its chips; use cluster.tasks_per_node=1 and cluster.nodes=<workers>")
        runtime = getattr(cfg.container.runtime, "value", cfg.container.runtime)
        if runtime != "none":
            raise UserError(f"container={runtime} is not supported on cluster=tpu: the workers run "
                            "cluster.remote_python directly; use container=none")


class TpuCluster(Cluster):
    backend = "tpu"
    submission_name = "submission.sh"
    config = Config
    display_name = "TPU"
    shares_filesystem = False  # TPU VM workers: the code and the run dir are copied
    runs_this_python = False  # cluster.remote_python, on the workers
    rank_env = TpuEnv

    @classmethod
    def choose_coordinator_port(cls, cfg) -> int:
        return DEFAULT_TPU_COORDINATOR_PORT

    def remote_run_dir(self) -> str:
        """The run dir on each worker, relative to its home: <remote_dir>/<date>/<run>."""
        parts = [self.cfg.cluster.remote_dir, *self.run_dir.resolve().parts[-2:]]
        return one_line("cluster.remote_dir", "/".join(p.strip("/") for p in parts if p.strip("/")))

    def remote_code_dir(self) -> str:
        """Where the user's code is unpacked on each worker (mode=run): beside the run dir, so
        that it is not copied back with it."""
        return self.remote_run_dir() + "-code"

    def executor(self) -> "TpuExecutor":
        c = self.cfg.cluster
        if self.code is not None:
            _code.pack(self.code.dir, list(self.code.include), self.run_dir)
        pod = TpuPod(c.tpu_name, self.remote_run_dir(), python=c.remote_python, gcloud=c.gcloud, zone=c.zone,
                     project=c.project, remote_code_dir=self.remote_code_dir() if self.code is not None else None)
        ex = TpuExecutor(self.folder, pod)
        ex.update_parameters(workers=c.nodes, timeout_min=c.timeout_min, setup=self.setup_lines(),
                             recreate=self.recreate())
        return ex

    def recreate(self) -> dict | None:
        """How a preempted or lost pod is made again (None: it cannot be; the restart says so)."""
        c = self.cfg.cluster
        if not (c.accelerator_type and c.runtime_version):
            return None
        return {"accelerator_type": operand("cluster.accelerator_type", c.accelerator_type),
                "runtime_version": operand("cluster.runtime_version", c.runtime_version), "spot": bool(c.spot),
                "queued_resource": operand("cluster.queued_resource", c.queued_resource) if c.queued_resource else None}

    def stacks(self, num_ranks: int, timeout_s: float) -> dict[int, dict]:
        """The workers keep their run dirs until the job ends: the request is written into each
        worker's copy (gcloud ssh), and the answers are copied back (gcloud scp) until all came."""
        c = self.cfg.cluster
        gcloud = [operand("cluster.gcloud", c.gcloud), "compute", "tpus", "tpu-vm"]
        flags = gcloud_flags(c.zone, c.project)
        remote, name = self.remote_run_dir(), operand("cluster.tpu_name", c.tpu_name)
        asked = time.time()
        ask = (f"mkdir -p {shlex.quote(remote)}/.xlaunch && echo " + shlex.quote(json.dumps({"time": asked})) +
               f" > {shlex.quote(remote)}/.xlaunch/{status.STACKS_REQUEST}")
        subprocess.run([*gcloud, "ssh", name, f"--command={ask}", *flags, "--worker=all"], check=True,
                       capture_output=True, timeout=120)
        back = self.run_dir / status.STATUS_DIR / "workers"
        deadline = time.monotonic() + timeout_s
        answers: dict[int, dict] = {}
        while len(answers) < num_ranks and time.monotonic() < deadline:
            time.sleep(1)
            for worker in range(c.nodes):
                into = back / str(worker)
                into.mkdir(parents=True, exist_ok=True)
                subprocess.run([*gcloud, "scp", "--recurse", f"{name}:{remote}/{status.STATUS_DIR}/{status.STACKS_DIR}",
                                str(into), *flags, f"--worker={worker}"], capture_output=True, timeout=120)
                answers.update(status.read_stacks(into, asked, here=True))
        return answers

    def cancel(self, job: tp.Any) -> None:
        """Ends the job and waits until its script has stopped the workers and copied their run
        dirs back (``cancel_id``): a restart's script may delete and make the pod again next, and
        must not meet the old script's ssh and scp on it."""
        self.cancel_id(str(job.job_id))

    def prepare_restart(self, executor: "TpuExecutor", exclude: tuple[str, ...] = ()) -> None:
        # A restart often follows a preemption: the script first asks gcloud for the pod's state
        # and makes a preempted or lost pod again.
        executor.update_parameters(check_pod=True)

    def submission_text(self, executor: "TpuExecutor") -> str:
        return executor._make_submission_file_text(executor._submitit_command_str, uid="")


class TpuJobEnvironment(RankJobEnvironment):
    """Inside a worker process started by TpuExecutor (SUBMITIT_EXECUTOR=tpu): one task per
    worker, numbered by TPU_WORKER_ID among TPU_WORKER_HOSTNAMES (set by ``_tpu_worker`` from
    GKE's variables or the TPU VM's metadata server), read by ``launcher.runtime.ranks.TpuEnv``
    as the Task reads them."""

    reader = TpuEnv
    _env = {"job_id": "SUBMITIT_TPU_JOB_ID"}

    @property
    def hostnames(self) -> tp.Sequence[str]:
        env = TpuEnv(os.environ)
        return (env.hosts() if env.present() else []) or [self.hostname]


def gcloud_flags(zone: tp.Optional[str], project: tp.Optional[str]) -> list[str]:
    """The flags naming the pod's zone and project in every gcloud call (none: gcloud's defaults)."""
    flags = [f"--zone={operand('cluster.zone', zone)}"] if zone else []
    return flags + ([f"--project={operand('cluster.project', project)}"] if project else [])


@dataclass(frozen=True)
class TpuPod:
    """Where a TPU job runs: the pod (its name, zone and project, and the gcloud that reaches
    it) and, on its workers, the run dir (relative to the home directory), the python that runs
    the task and the dir the user's code is unpacked in (None: no code is copied)."""
    name: str
    remote_run_dir: str
    python: str = "python3"
    gcloud: str = "gcloud"
    zone: tp.Optional[str] = None
    project: tp.Optional[str] = None
    remote_code_dir: tp.Optional[str] = None


class TpuExecutor(ScriptExecutor):
    """Runs a submitit job once per worker of a TPU VM pod. Parameters: workers, timeout_min,
    setup (shell lines run on each worker before the task), check_pod (first ask gcloud for the
    pod's state and make a preempted or lost one again, as ``recreate`` says: a restart's
    script), recreate. Every start clears what a killed job leaves on the workers (the TPU lock
    file, processes holding the chips). With ``remote_code_dir``, the run
    dir's code.tar.gz (the user's code, ``launcher/clusters/_code.py``) is unpacked there on every
    worker before the task starts, and the task is told where (``XLAUNCH_CODE_DIR``)."""

    defaults = {"workers": 1, "timeout_min": 60, "setup": [], "check_pod": False, "recreate": None}

    def __init__(self, folder: tp.Union[str, Path], pod: TpuPod, **kwargs: tp.Any) -> None:
        super().__init__(folder, **kwargs)
        self.remote_code_dir = operand("mode.code_dir", pod.remote_code_dir) if pod.remote_code_dir else None
        self.tpu_name = operand("cluster.tpu_name", pod.name)
        if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", self.tpu_name):
            raise UserError(f"cluster.tpu_name={pod.name!r}: a TPU VM name is lowercase letters, digits and "
                            "hyphens, starting with a letter (as `gcloud compute tpus tpu-vm list` shows it)")
        self.remote_run_dir = operand("cluster.remote_dir", pod.remote_run_dir)
        self.python = operand("cluster.remote_python", pod.python)
        self.gcloud = operand("cluster.gcloud", pod.gcloud)
        self.flags = gcloud_flags(pod.zone, pod.project)
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.folder.name):
            raise ValueError(f"TpuExecutor: folder name {self.folder.name!r} must be a plain name (letters, digits, ._-)")

    @classmethod
    def affinity(cls) -> int:
        return 0 if shutil.which("gcloud") else -1

    def _internal_process_submissions(self, delayed_submissions: tp.List[utils.DelayedSubmission]) -> tp.List[core.Job[tp.Any]]:
        # A task that keeps a run dir (xlaunch's Task) gets the worker's copy: its working dir.
        for d in delayed_submissions:
            if hasattr(d.function, "run_dir"):
                d.function = copy.copy(d.function)
                d.function.run_dir = "."
        return super()._internal_process_submissions(delayed_submissions)

    @property
    def _submitit_command_str(self) -> str:
        return (f"{shlex.quote(self.python)} -u -m launcher.clusters._tpu_worker {shlex.quote(self.folder.name)} "
                f"{int(self.parameters['workers'])}")

    def _num_tasks(self) -> int:
        return self.parameters["workers"]

    def _gcloud(self, verb: str, *args: str, worker: str = "all") -> str:
        return " ".join([shlex.quote(self.gcloud), "compute", "tpus", "tpu-vm", verb, *args,
                         *map(shlex.quote, self.flags), f"--worker={worker}"])

    def _remote(self, path: str = "") -> str:
        return shlex.quote(f"{self.tpu_name}:{self.remote_run_dir}{path}")

    def _remote_code(self) -> str:
        return shlex.quote(f"{self.tpu_name}:{self.remote_code_dir}/")

    def _make_submission_file_text(self, command: str, uid: str) -> str:
        p = self.parameters
        rdir = shlex.quote(self.remote_run_dir)
        sub = shlex.quote(self.folder.name)
        local = shlex.quote(str(self.folder.parent))
        code = shlex.quote(self.remote_code_dir) if self.remote_code_dir else None
        unpack = [f"tar -xzf {code}/{_code.ARCHIVE} -C {code}", f'export {CODE_DIR_ENV}="$HOME"/{code}'] if code else []
        run_lines = ["set -e", *unpack, f"cd {rdir}", *p["setup"],
                     f"exec timeout --signal=KILL {int(60 * p['timeout_min'])} {command}"]
        # The job id is spliced in unquoted ("$job", digits only); everything else is quoted for
        # the worker's shell, then the whole command once more for this one.
        run = "--command=" + shlex.quote("\n".join(run_lines) + " ") + '"$job"'
        stop = "--command=" + shlex.quote(f"cd {rdir} && kill -KILL $(cat {sub}/") + '"$job"' + \
            shlex.quote("_*.pid) 2>/dev/null; true")
        name = shlex.quote(self.tpu_name)
        leaf = shlex.quote(Path(self.remote_run_dir).name)
        prepare = f"{_CLEAR_TPU} && " + (f"rm -rf {code} && mkdir -p {rdir}/{sub} {code}" if code
                                            else f"mkdir -p {rdir}/{sub}")
        return "\n".join([
            "#!/bin/bash",
            f"# submitit job on TPU VM pod {self.tpu_name} ({p['workers']} worker(s)): copy the pickled task",
            "# to every worker, run it there (one process and one log per worker), copy each worker's",
            "# run dir back. The job id is this script's process id, as for submitit's local jobs.",
            "set -u",
            "job=$$",
            f"local={local}",
            f'pickle="$local/{sub}/${{job}}_submitted.pkl"',
            "# submitit moves the pickled task into place just after starting this script.",
            'for _ in $(seq 600); do [ -e "$pickle" ] && break; sleep 0.1; done',
            "",
            "copy_back() {",
            f"  for worker in $(seq 0 {p['workers'] - 1}); do",
            '    mkdir -p "$local/.xlaunch/workers/$worker"',
            "    " + self._gcloud("scp", "--recurse", self._remote(), '"$local/.xlaunch/workers/$worker/"',
                                  worker='"$worker"') +
            f' && cp -R "$local/.xlaunch/workers/$worker/"{leaf}/. "$local/"',
            "  done",
            "}",
            "stop_workers() {",
            '  kill "$ssh_pid" 2>/dev/null',
            "  " + self._gcloud("ssh", name, stop),
            "}",
            "",
            *(self._pod_check() if p["check_pod"] else []),
            "set -e",
            "# What a killed job leaves on the workers (the TPU lock, processes holding the chips) goes first.",
            self._gcloud("ssh", name, "--command=" + shlex.quote(prepare)),
            self._gcloud("scp", '"$pickle"', self._remote(f"/{self.folder.name}/")),
            *([self._gcloud("scp", f'"$local/{_code.ARCHIVE}"', self._remote_code())] if code else []),
            "set +e",
            self._gcloud("ssh", name, run) + " &",
            "ssh_pid=$!",
            "trap 'stop_workers; copy_back; exit 143' INT TERM",
            'wait "$ssh_pid"',
            "rc=$?",
            "copy_back",
            'exit "$rc"',
            "",
        ])

    def _tpus(self, *args: str) -> str:
        return " ".join([shlex.quote(self.gcloud), "compute", "tpus", *args, *map(shlex.quote, self.flags)])

    def _pod_check(self) -> list[str]:
        """Lines that make a preempted or lost pod again before the job starts on it."""
        name, r = shlex.quote(self.tpu_name), self.parameters["recreate"]
        if r is None:
            remake = [f'  echo "error: TPU VM pod {self.tpu_name} is $state and cannot be made again: set '
                      'cluster.accelerator_type and cluster.runtime_version (and cluster.queued_resource, '
                      'cluster.spot as it was made)" >&2', "  exit 1"]
        else:
            spot = ["--spot"] if r["spot"] else []
            made = [f"--accelerator-type={shlex.quote(r['accelerator_type'])}", *spot]
            if r["queued_resource"]:
                qr = shlex.quote(r["queued_resource"])
                remake = [
                    "  " + self._tpus("queued-resources", "delete", qr, "--force", "--quiet"),
                    "  " + self._tpus("queued-resources", "create", qr, f"--node-id={name}", *made,
                                      f"--runtime-version={shlex.quote(r['runtime_version'])}"),
                    "  for _ in $(seq 360); do",
                    "    qstate=$(" + self._tpus("queued-resources", "describe", qr, "--format='value(state.state)'") + ")",
                    '    [ "$qstate" = ACTIVE ] && break',
                    '    case "$qstate" in FAILED|SUSPENDED) echo "error: queued resource ' + r["queued_resource"] +
                    ' is $qstate" >&2; exit 1;; esac',
                    "    sleep 10",
                    "  done",
                ]
            else:
                remake = [
                    "  " + self._tpus("tpu-vm", "delete", name, "--quiet"),
                    "  " + self._tpus("tpu-vm", "create", name, *made,
                                      f"--version={shlex.quote(r['runtime_version'])}"),
                ]
        return [
            "# A restart: the pod as gcloud sees it now; a preempted or lost one is made again first.",
            "state=$(" + self._tpus("tpu-vm", "describe", name, "--format='value(state)'") + ") || state=MISSING",
            'if [ "$state" != READY ]; then',
            f'  echo "TPU VM pod {self.tpu_name} is $state: making it again" >&2',
            *remake,
            "fi",
        ]

    def _check_available(self) -> None:
        if shutil.which(self.gcloud) is None:
            raise UserError(f"cluster.gcloud={self.gcloud}: not found on PATH; install the Google Cloud CLI "
                            "(or preview the gcloud commands with launcher.dry_run=true)")

    def _script_logs(self, job) -> tp.Tuple[Path, Path]:
        # Task logs come back from the workers under submitit's names; gcloud's output stays apart.
        return job.paths.folder / f"{job.job_id}_gcloud.out", job.paths.folder / f"{job.job_id}_gcloud.err"
