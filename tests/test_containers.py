"""Containers: a real podman run of the task, the wrapper's environment forwarding, and the exact
singularity command (singularity cannot be installed here; its command line is checked instead)."""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from launcher.clusters.containers import python_command
from tests.clusterkit.image import MARKER, MARKER_TEXT, PODMAN_OPTIONS
from tests.launch import REPO, read_result, run_cli

PREFIX = os.path.realpath(sys.prefix)


def podman_overrides(image: str, *extra_options: str) -> list[str]:
    """Run this interpreter inside the image: its prefix is mounted read-only at the same path."""
    options = ",".join(f"'{o}'" for o in [*PODMAN_OPTIONS, *extra_options])
    return ["container=podman", f"container.image={image}", f"container.python={sys.executable}",
            f"container.binds=['{PREFIX}:{PREFIX}:ro']", f"container.options=[{options}]"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_task_runs_inside_podman_and_sees_its_rank(container_image, tmp_path):
    run = tmp_path / "run"
    # The in-container setup copies a file that exists only in the image's root file system
    # into the (mounted) run dir, named by the rank variable forwarded into the container.
    setup = f"cat {MARKER} > {run}/marker-$SUBMITIT_LOCAL_GLOBALID"
    run_cli("mode=check", *podman_overrides(container_image), f"container.setup=['{setup}']", "cluster.cpu_devices_per_task=2",
            "mode.allgather_mb=0.25", run_dir=run, timeout=300)
    r = read_result(run)
    assert r["num_processes"] == 2 and r["global_devices"] == 4 and r["psum_ok"] is True
    for rank in (0, 1):
        assert (run / f"marker-{rank}").read_text() == MARKER_TEXT
        status = json.loads((run / ".xlaunch" / "ranks" / f"rank{rank}.json").read_text())
        # The task process is PID 1: the first process of the container's own PID namespace.
        assert status["pid"] == 1 and status["state"] == "done"
        assert f"rank {rank}/2" in (run / "logs" / f"rank{rank}.log").read_text()
    assert not Path(MARKER).exists()  # the marker really is the image's, not this machine's


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_srun_starts_each_task_inside_podman(slurm, container_image, tmp_path):
    run = tmp_path / "run"
    setup = f"cat {MARKER} > {run}/marker-$SLURM_PROCID"
    # The pretend nodes' names resolve only through slurm.conf (scontrol, which the image lacks);
    # a real cluster's node names resolve in the container as on the host.
    hosts = ["--add-host=node1:127.0.0.1", "--add-host=node2:127.0.0.1"]
    run_cli("mode=check", "cluster=slurm", "cluster.nodes=2", "cluster.tasks_per_node=1", "cluster.cpu_devices_per_task=2",
            "mode.allgather_mb=0.25", *podman_overrides(container_image, *hosts), f"container.setup=['{setup}']",
            run_dir=run, env=slurm.env, timeout=300)
    r = read_result(run)
    assert r["cluster"] == "slurm" and r["num_processes"] == 2 and r["psum_ok"] is True
    for rank in (0, 1):
        assert (run / f"marker-{rank}").read_text() == MARKER_TEXT
        assert json.loads((run / ".xlaunch" / "ranks" / f"rank{rank}.json").read_text())["pid"] == 1
        assert f"rank {rank}/2 (local 0/1, node {rank}) " in (run / "logs" / f"rank{rank}.log").read_text()


@pytest.mark.timeout(300)
def test_an_image_that_cannot_start_is_named_on_the_first_line(tmp_path):
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = run_cli("mode=check", *podman_overrides("does-not-exist:latest"), run_dir=run, check=False, timeout=120)
    assert proc.returncode == 1
    first = next(line for line in proc.stderr.splitlines() if line.startswith("job failed:"))
    # The image, the runtime, and podman's own reason, read from the task's output.
    assert first.startswith("job failed: container image does-not-exist:latest could not be started by podman: "
                            "Error: "), proc.stderr
    assert "does-not-exist" in first.split("podman: ", 1)[1] and str(run / "submitit") in first
    assert time.monotonic() - t0 < 60  # at once, not after submitit's wait for a result


def _dry_run_wrapper(tmp_path, *overrides: str) -> Path:
    run = tmp_path / "run"
    run_cli("mode=check", *overrides, "launcher.dry_run=true", run_dir=run, timeout=60)
    wrapper = run / "container-python.sh"
    assert os.access(wrapper, os.X_OK)
    assert shlex.quote(str(wrapper)) in (run / "submission.txt").read_text()
    return wrapper


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_wrapper_forwards_the_rank_environment_by_name(container_image, tmp_path, runtime):
    # docker's wrapper is run with podman, which takes docker's command line: its options are
    # checked by a real container engine even where no docker daemon runs.
    overrides = [*podman_overrides(container_image), f"container={runtime}", "container.executable=podman"]
    wrapper = _dry_run_wrapper(tmp_path, *overrides, "+container.env.FIXED='a b; c'")
    assert ('--user="$(id -u):$(id -g)"' in wrapper.read_text()) == (runtime == "docker")
    code = ("import os; print([os.environ.get(k) for k in ('SLURM_PROCID', 'OMPI_COMM_WORLD_RANK', 'FIXED', "
            "'UNRELATED')], os.getuid())")
    env = {**os.environ, "SLURM_PROCID": "3", "OMPI_COMM_WORLD_RANK": "5", "UNRELATED": "x"}
    out = subprocess.run([str(wrapper), "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"['3', '5', 'a b; c', None] {os.getuid()}"


@pytest.mark.timeout(300)
def test_metacharacters_in_the_image_name_never_run(tmp_path):
    owned = tmp_path / "owned"
    wrapper = _dry_run_wrapper(tmp_path, "container=podman", f"container.image='x; touch {owned}'",
                               f"container.options=['--hostname=$(touch {owned})']")
    out = subprocess.run([str(wrapper), "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0  # podman refuses the odd image reference ...
    assert not owned.exists()  # ... and nothing in it ever reached a shell


def test_option_like_values_are_refused_with_the_key_named(tmp_path):
    proc = run_cli("mode=check", "container=podman", "container.image=--privileged", "launcher.dry_run=true",
                   run_dir=tmp_path / "run", check=False, timeout=60)
    assert proc.returncode == 2
    assert "container.image='--privileged'" in proc.stderr and "not an option" in proc.stderr


def _cfg(**container):
    base = {"runtime": "singularity", "image": "/images/jax.sif", "executable": None, "python": "python3",
            "binds": [], "setup": [], "venv": None, "env": {}, "options": []}
    return OmegaConf.create({"container": {**base, **container}, "cluster": {"env": {}}})


def test_singularity_command_is_spelt_out_and_quoted(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the working dir is the source tree: one bind covers both
    run = tmp_path / "run"
    cfg = _cfg(executable="apptainer", binds=["/scratch"], setup=["$WITH_CONDA"], venv="/p/my venv",
               env={"A": "1; touch /tmp/owned"}, options=["--rocm"])
    argv = shlex.split(python_command(cfg, run))
    inner = "$WITH_CONDA\nsource '/p/my venv/bin/activate'\nexec \"$@\""
    run = run.resolve()
    assert argv == ["env", "SINGULARITYENV_A=1; touch /tmp/owned", "apptainer", "exec", f"--bind={REPO}:{REPO}",
                    f"--bind={run}:{run}", "--bind=/scratch", "--rocm", "/images/jax.sif",
                    "bash", "-c", inner, "xlaunch-container", "python3"]
    # No setup: python is run directly, no shell in between.
    assert shlex.split(python_command(_cfg(), run))[-2:] == ["/images/jax.sif", "python3"]


def test_no_container_is_the_host_interpreter(tmp_path):
    assert python_command(_cfg(runtime="none"), tmp_path) == shlex.quote(sys.executable)
