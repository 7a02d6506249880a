"""cluster=tpu end to end, with a STAND-IN for gcloud (tests/clusterkit/bin/gcloud): it runs each
worker's command on this machine, one process per worker in its own home folder, as the real
gcloud does on each TPU VM. The worker side (our _tpu_worker module, submitit, the task) is real.
"""

import http.server
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.clusters._tpu_worker import main, worker_identity
from launcher.clusters.base import free_port
from launcher.clusters.tpu import TpuExecutor, TpuPod
from tests.launch import REPO, read_result, run_cli
from tests.test_hang import OTHERS, RANK1

STANDIN_BIN = REPO / "tests" / "clusterkit" / "bin"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_check_runs_on_every_worker_of_a_stand_in_pod(tmp_path):
    run, pod = tmp_path / "2030-01-01" / "run", tmp_path / "pod"
    env = {"PATH": f"{STANDIN_BIN}:{os.environ['PATH']}", "XLAUNCH_STANDIN_TPU_ROOT": str(pod),
           "XLAUNCH_STANDIN_TPU_WORKERS": "2"}
    # No TPU here: the stand-in pod's workers use 2 CPU devices each.
    run_cli("mode=check", "cluster=tpu", "cluster.tpu_name=pod-a", "cluster.zone=us-central2-b", "cluster.nodes=2",
            "cluster.accelerator=cpu", "cluster.cpu_devices_per_task=2", f"cluster.remote_python={sys.executable}",
            f"launcher.coordinator_port={free_port()}", "mode.allgather_mb=0.25", run_dir=run, env=env, timeout=240)
    r = read_result(run)  # written by worker 0, copied back
    assert r["cluster"] == "tpu" and r["num_processes"] == 2 and r["global_devices"] == 4 and r["psum_ok"] is True
    job_id = json.loads((run / "job.json").read_text())["job_id"]
    for w in (0, 1):
        remote = pod / f"worker{w}" / "xlaunch-runs" / "2030-01-01" / "run"
        # Each worker ran in its own copy of the run dir, with its own log, and it came back.
        assert f"rank {w}/2" in (remote / "logs" / f"rank{w}.log").read_text()
        assert "from tpu" in (run / "logs" / f"rank{w}.log").read_text()
        worker_log = (run / "submitit" / f"{job_id}_{w}_log.out").read_text()
        assert f"node={w}(2), global_rank={w}(2)" in worker_log
    # Worker 1 wrote no result.json of its own: only rank 0 writes.
    assert not (pod / "worker1" / "xlaunch-runs" / "2030-01-01" / "run" / "result.json").exists()
    # The gcloud calls made are exactly those of the saved script (the dry run's text) when bash
    # runs it with this job's id.
    calls = [json.loads(line) for line in (pod / "calls.log").read_text().splitlines()]
    script = (run / "submission.sh").read_text()
    assert replay_gcloud_calls(script, job_id, tmp_path / "replayed") == calls
    assert [c[3] for c in calls] == ["ssh", "scp", "ssh", "scp", "scp"]  # mkdir, task, run, 2 x copy back
    assert calls[0][:5] == ["compute", "tpus", "tpu-vm", "ssh", "pod-a"]
    assert calls[0][6:] == ["--zone=us-central2-b", "--worker=all"]
    # A killed job's TPU lock and the processes holding the chips are cleared before anything else.
    assert calls[0][5].startswith("--command={ sudo -n rm -f /tmp/libtpu_lockfile || rm -f /tmp/libtpu_lockfile;")
    assert calls[0][5].endswith("; true && mkdir -p xlaunch-runs/2030-01-01/run/submitit")
    assert calls[2][5].endswith(f"launcher.clusters._tpu_worker submitit 2 {job_id}")


def replay_gcloud_calls(script: str, job_id: str, record) -> list[list[str]]:
    """Runs the job script with a shell function in place of gcloud that records its arguments."""
    path = shlex.quote(str(record))
    fake = f"gcloud() {{ printf '%s\\0' \"$@\" >> {path}; printf '\\n' >> {path}; }}\n"
    text = script.replace("job=$$\n", f"job={job_id}\n", 1)
    subprocess.run(["bash", "-c", fake + text], capture_output=True, text=True, timeout=60)
    return [rec.split("\0") for rec in record.read_text().split("\0\n") if rec]


class _Metadata(http.server.BaseHTTPRequestHandler):
    values = {"agent-worker-number": "1", "worker-network-endpoints": "w-0:id0:10.0.0.2,w-1:id1:10.0.0.3"}

    def do_GET(self):  # noqa: N802 - http.server's name
        key = self.path.rsplit("/", 1)[-1]
        ok = self.headers.get("Metadata-Flavor") == "Google" and key in self.values
        self.send_response(200 if ok else 404)
        self.end_headers()
        if ok:
            self.wfile.write(self.values[key].encode())

    def log_message(self, *args):
        pass


def test_worker_identity_comes_from_the_metadata_server_on_a_tpu_vm():
    # A TPU VM sets no TPU_WORKER_* variables; a local HTTP server answers as its metadata server.
    server = http.server.HTTPServer(("127.0.0.1", 0), _Metadata)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"GCE_METADATA_IP": f"127.0.0.1:{server.server_port}"}
        assert worker_identity(env) == (1, ["10.0.0.2", "10.0.0.3"])
    finally:
        server.shutdown()
    # Where GKE sets the variables, they win.
    assert worker_identity({"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "a,b"}) == (0, ["a", "b"])


def test_a_worker_refuses_a_pod_of_another_size(monkeypatch):
    monkeypatch.setenv("TPU_WORKER_ID", "0")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5")
    with pytest.raises(SystemExit, match="has 4 workers but the job was submitted for 2: set cluster.nodes=4"):
        main(["submitit", "2", "123"])


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_cancel_kills_the_workers_and_brings_back_their_logs(tmp_path, monkeypatch, request, sigint):
    if sigint == "ignored":
        # As in a launcher started by `nohup ... &` from a script: its children inherit SIGINT
        # ignored, and bash cannot trap a signal ignored on entry.
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        request.addfinalizer(lambda: signal.signal(signal.SIGINT, previous))
    pod, run = tmp_path / "pod", tmp_path / "run"
    monkeypatch.setenv("PATH", f"{STANDIN_BIN}:{os.environ['PATH']}")
    monkeypatch.setenv("XLAUNCH_STANDIN_TPU_ROOT", str(pod))
    monkeypatch.setenv("XLAUNCH_STANDIN_TPU_WORKERS", "2")
    ex = TpuExecutor(run / "submitit", TpuPod("pod-b", "runs/b", python=sys.executable))
    ex.update_parameters(workers=2, timeout_min=5)
    job = ex.submit(time.sleep, 3600)
    pid_files = [pod / f"worker{w}" / "runs" / "b" / "submitit" / f"{job.job_id}_{w}.pid" for w in (0, 1)]
    deadline = time.monotonic() + 60
    while not all(f.exists() and f.read_text().strip() for f in pid_files) and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = [int(f.read_text()) for f in pid_files]
    assert all(map(_running, pids))
    job.cancel()
    while not job.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job.done() and not any(map(_running, pids))
    for w in (0, 1):  # each worker's log was copied back on the way out
        assert "Loading pickle" in (run / "submitit" / f"{job.job_id}_{w}_log.out").read_text()


def _pod_running(program: str, tmp_path: Path) -> tuple[Path, Path, dict]:
    """A stand-in pod of 2 workers, and a code dir holding one of tests/programs: (pod, run dir, env)."""
    code, pod, run = tmp_path / "code", tmp_path / "pod", tmp_path / "2030-01-01" / "run"
    code.mkdir()
    (code / program).write_text((REPO / "tests" / "programs" / program).read_text())
    env = {"PATH": f"{STANDIN_BIN}:{os.environ['PATH']}", "XLAUNCH_STANDIN_TPU_ROOT": str(pod),
           "XLAUNCH_STANDIN_TPU_WORKERS": "2", "PYTHONPATH": str(REPO)}
    return pod, run, env


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_restart_makes_a_preempted_pod_again_and_clears_its_locks_first(tmp_path):
    pod, run, env = _pod_running("preempted.py", tmp_path)
    code, env = tmp_path / "code", {**os.environ, **env}
    args = [sys.executable, "-m", "launcher", "mode=run", f"mode.code_dir={code}", "mode.script=preempted.py",
            "cluster=tpu", "cluster.tpu_name=pod-a", "cluster.nodes=2", "cluster.accelerator=cpu",
            "cluster.cpu_devices_per_task=1", f"cluster.remote_python={sys.executable}",
            "cluster.accelerator_type=v4-16", "cluster.runtime_version=tpu-ubuntu2204-base", "cluster.spot=true",
            f"launcher.coordinator_port={free_port()}", "launcher.max_restarts=1", f"hydra.run.dir={run}"]
    launcher = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    remote = [pod / f"worker{w}" / "xlaunch-runs" / "2030-01-01" / "run" for w in (0, 1)]
    lock = Path("/tmp/libtpu_lockfile")  # no TPU here: nothing else uses it
    try:
        deadline = time.monotonic() + 120
        while not all((r / "logs" / f"rank{w}.log").exists() and "restart 0" in (r / "logs" / f"rank{w}.log").read_text()
                      for w, r in enumerate(remote)):
            assert time.monotonic() < deadline and launcher.poll() is None, "the first run never started"
            time.sleep(0.5)
        # Preempted: the pod goes, its workers' processes with it, and a TPU lock is left behind.
        (pod / "state.json").write_text(json.dumps({"pod": "PREEMPTED"}))
        lock.touch()
        for w, r in enumerate(remote):
            for pid_file in (r / "submitit").glob(f"*_{w}.pid"):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
        _, err = launcher.communicate(timeout=300)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err
    assert "restarted as job" in err and read_result(run)["restart"] == 1
    calls = [json.loads(line) for line in (pod / "calls.log").read_text().splitlines()]
    verbs = [c[2] + " " + c[3] for c in calls]
    # The restart asked for the pod's state, made it again, then cleared the locks before the task.
    again = verbs.index("tpu-vm describe")
    assert verbs[again:again + 4] == ["tpu-vm describe", "tpu-vm delete", "tpu-vm create", "tpu-vm ssh"]
    assert calls[again + 2][4:7] == ["pod-a", "--accelerator-type=v4-16", "--spot"]
    assert calls[again + 2][7] == "--version=tpu-ubuntu2204-base"
    assert calls[again + 3][5].startswith("--command={ sudo -n rm -f /tmp/libtpu_lockfile")
    assert not lock.exists() and json.loads((pod / "state.json").read_text())["pod"] == "READY"
    assert "=== restart 1 (restarted after:" in (run / "logs" / "rank1.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_xlaunch_stacks_reaches_the_workers_of_a_running_pod(tmp_path):
    pod, run, env = _pod_running("hang.py", tmp_path)
    code = tmp_path / "code"
    run_cli("mode=run", f"mode.code_dir={code}", "mode.script=hang.py", "cluster=tpu", "cluster.tpu_name=pod-a",
            "cluster.nodes=2", "cluster.accelerator=cpu", "cluster.cpu_devices_per_task=1",
            f"cluster.remote_python={sys.executable}", f"launcher.coordinator_port={free_port()}",
            "launcher.wait=false", run_dir=run, env=env)
    log0 = pod / "worker0" / "xlaunch-runs" / "2030-01-01" / "run" / "logs" / "rank0.log"
    try:
        deadline = time.monotonic() + 120
        while not (log0.exists() and "step 2 " in log0.read_text()):
            assert time.monotonic() < deadline, "the three steps never came"
            time.sleep(0.5)
        time.sleep(1)  # rank 1 reaches its sleep
        out = run_cli("stacks", str(run), env=env).stdout
        assert RANK1.search(out) and OTHERS.search(out), out
    finally:
        run_cli("cancel", str(run), env=env, check=False)
