"""What each TPU VM worker runs: ``python -m launcher.clusters._tpu_worker <folder> <workers> <job id>``.

It finds the worker's number (below), opens that worker's own log, then hands over to
submitit's own ``process_job``: from there on a TPU task runs exactly like a SLURM or local
one (submitit finds ``TpuJobEnvironment`` through xlaunch's entry point, as for every backend).

Which worker am I? GKE sets ``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES``. A TPU VM reached by
``gcloud ... ssh`` has neither in its environment; there the numbers come from the VM's
metadata server (``agent-worker-number``, ``worker-network-endpoints``), read the way JAX's own
Cloud TPU detection reads them, and are then set as those two variables for the task
(``launcher.runtime.ranks.TpuEnv`` reads them).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Mapping

from submitit.core import plugins
from submitit.core.submission import process_job
from submitit.core.utils import JobPaths

from launcher.runtime.ranks import TpuEnv


def metadata(key: str, env: Mapping[str, str] = os.environ, tries: int = 5) -> str:
    """One attribute of this VM from the GCE metadata server (GCE_METADATA_IP overrides its
    address, as in JAX and Google's client libraries)."""
    host = env.get("GCE_METADATA_IP", "metadata.google.internal")
    request = urllib.request.Request(f"http://{host}/computeMetadata/v1/instance/attributes/{key}",
                                     headers={"Metadata-Flavor": "Google"})
    error: Exception | None = None
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.read().decode().strip()
        except (urllib.error.URLError, OSError) as e:
            error = e
            time.sleep(0.5 * (attempt + 1))
    raise RuntimeError(f"cannot read TPU worker metadata {key!r} from {host}: {error}; outside a TPU VM set "
                       "TPU_WORKER_ID and TPU_WORKER_HOSTNAMES instead")


def worker_identity(env: Mapping[str, str] = os.environ) -> tuple[int, list[str]]:
    """(this worker's number, every worker's address in worker order)."""
    given = TpuEnv(env)  # the variables, read as the task reads them
    if given.present():
        return given.numbers().process_id, given.hosts()
    hosts = []
    # Two spellings are in use: plain hostnames, or "name:id:ip" triples.
    for endpoint in metadata("worker-network-endpoints", env).split(","):
        parts = endpoint.split(":")
        hosts.append(parts[2] if len(parts) == 3 else parts[0])
    return int(metadata("agent-worker-number", env)), hosts


def main(argv: list[str]) -> None:
    if len(argv) != 3:
        sys.exit("usage: python -m launcher.clusters._tpu_worker <submitit folder> <workers> <job id>")
    folder, expected, job_id = argv
    worker, hosts = worker_identity()
    if len(hosts) != int(expected):
        sys.exit(f"this TPU pod has {len(hosts)} workers but the job was submitted for {expected}: "
                 f"set cluster.nodes={len(hosts)}")
    os.environ.update(TPU_WORKER_ID=str(worker), TPU_WORKER_HOSTNAMES=",".join(hosts), SUBMITIT_EXECUTOR="tpu",
                      SUBMITIT_TPU_JOB_ID=job_id, SUBMITIT_TPU_NUM_WORKERS=str(len(hosts)))
    paths = JobPaths(folder, job_id=job_id, task_id=worker)
    paths.folder.mkdir(parents=True, exist_ok=True)
    # One log per worker, under submitit's usual names (copied back with the run dir).
    for fd, path in ((1, paths.stdout), (2, paths.stderr)):
        with open(path, "a") as f:
            os.dup2(f.fileno(), fd)
    # submitit's job environment, found now (its plugins import every backend): once the pid
    # file says the worker runs, the task is about to load.
    plugins.get_job_environment()
    # For cancelling: the job script kills what these files name.
    Path(paths.folder / f"{job_id}_{worker}.pid").write_text(f"{os.getpid()}\n")
    process_job(folder)


if __name__ == "__main__":
    main(sys.argv[1:])
