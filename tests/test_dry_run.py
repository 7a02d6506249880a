"""launcher.dry_run=true: the exact text that would be submitted or run is printed and saved, and
nothing is submitted. Also: hostile values are quoted or refused, never run."""

import os
import shlex
import sys

import pytest

from tests.launch import REPO, run_cli

LUMI_IMAGE = "/appl/local/containers/sif-images/lumi-jax-rocm-6.2.4-python-3.12-jax-0.4.35.sif"
LUMI_BINDS = ["/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1", "/usr/lib64/libjansson.so.4", "/pfs",
              "/scratch", "/projappl", "/project", "/flash", "/appl"]


def dry_run(tmp_path, *overrides: str) -> tuple[str, object]:
    run = tmp_path / "2030-01-01" / "run"
    proc = run_cli("mode=check", *overrides, "launcher.dry_run=true", run_dir=run, timeout=60)
    assert "dry run: nothing submitted" in proc.stderr
    assert proc.stdout == (run / "submission.sh").read_text()  # printed == saved
    assert not (run / "job.json").exists() and not list((run / "submitit").glob("*.pkl"))
    return proc.stdout, run


def lumi_masks() -> str:
    # LUMI-G: GCD g is attached to CCD GCD_TO_CCD[g]; CCD c holds cores 8c..8c+7, of which core
    # 8c is kept for the system, so task g gets cores 8c+1..8c+7: mask 0xfe << 8c.
    gcd_to_ccd = [6, 7, 2, 3, 0, 1, 4, 5]
    return "mask_cpu:" + ",".join(f"{0xFE << (8 * ccd):x}" for ccd in gcd_to_ccd)


def test_lumi_dry_run_is_the_exact_sbatch_script(tmp_path):
    venv = "/project/project_465000001/venvs/xlaunch"
    text, run = dry_run(tmp_path, "cluster=lumi", "cluster.account=project_465000001", "cluster.nodes=2",
                        f"container.venv={venv}")
    sub = f"{run}/submitit"
    binds = " ".join([f"--bind={REPO}:{REPO}", f"--bind={run}:{run}", *[f"--bind={b}" for b in LUMI_BINDS]])
    assert text == f"""#!/bin/bash

# Parameters
#SBATCH --account=project_465000001
#SBATCH --cpus-per-task=7
#SBATCH --error={sub}/%j_0_log.err
#SBATCH --gpus-per-node=8
#SBATCH --job-name=xlaunch-check
#SBATCH --mem-per-gpu=60G
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --open-mode=append
#SBATCH --output={sub}/%j_0_log.out
#SBATCH --partition=standard-g
#SBATCH --signal=USR2@90
#SBATCH --time=60
#SBATCH --wckey=submitit

# setup
export PYTHONNOUSERSITE=1

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output {sub}/%j_%t_log.out --error {sub}/%j_%t_log.err --kill-on-bad-exit=1 \
--cpu-bind={lumi_masks()} singularity exec {binds} {LUMI_IMAGE} bash -c '$WITH_CONDA
source {venv}/bin/activate
exec "$@"' xlaunch-container python -u -m submitit.core._submit {sub}
"""
    assert lumi_masks() == "mask_cpu:fe000000000000,fe00000000000000,fe0000,fe000000,fe,fe00,fe00000000,fe0000000000"


def test_lumi_container_default_gives_way_to_the_command_line(tmp_path):
    text, _ = dry_run(tmp_path, "cluster=lumi", "container=none")
    assert "singularity" not in text
    assert f"--kill-on-bad-exit=1 --cpu-bind={lumi_masks()} {shlex.quote(sys.executable)} -u -m" in text


def test_tpu_dry_run_is_the_exact_gcloud_script(tmp_path):
    text, run = dry_run(tmp_path, "cluster=tpu", "cluster.tpu_name=my-v4-32", "cluster.zone=us-central2-b",
                        "cluster.project=my-proj", "cluster.nodes=4")
    flags = "--zone=us-central2-b --project=my-proj"
    remote = "xlaunch-runs/2030-01-01/run"
    # Quoted for the shell once: the command's own double quotes stay as they are.
    CLEAR = ('{ sudo -n rm -f /tmp/libtpu_lockfile || rm -f /tmp/libtpu_lockfile; for dev in /dev/accel* '
             '/dev/vfio/[0-9]*; do [ -e "$dev" ] && { sudo -n fuser -k -9 "$dev" || fuser -k -9 "$dev"; }; done; } '
             '>/dev/null 2>&1; true')
    assert text == f"""#!/bin/bash
# submitit job on TPU VM pod my-v4-32 (4 worker(s)): copy the pickled task
# to every worker, run it there (one process and one log per worker), copy each worker's
# run dir back. The job id is this script's process id, as for submitit's local jobs.
set -u
job=$$
local={run}
pickle="$local/submitit/${{job}}_submitted.pkl"
# submitit moves the pickled task into place just after starting this script.
for _ in $(seq 600); do [ -e "$pickle" ] && break; sleep 0.1; done

copy_back() {{
  for worker in $(seq 0 3); do
    mkdir -p "$local/.xlaunch/workers/$worker"
    gcloud compute tpus tpu-vm scp --recurse my-v4-32:{remote} "$local/.xlaunch/workers/$worker/" {flags} \
--worker="$worker" && cp -R "$local/.xlaunch/workers/$worker/"run/. "$local/"
  done
}}
stop_workers() {{
  kill "$ssh_pid" 2>/dev/null
  gcloud compute tpus tpu-vm ssh my-v4-32 --command='cd {remote} && kill -KILL $(cat submitit/'"$job"'_*.pid) \
2>/dev/null; true' {flags} --worker=all
}}

set -e
# What a killed job leaves on the workers (the TPU lock, processes holding the chips) goes first.
gcloud compute tpus tpu-vm ssh my-v4-32 --command='{CLEAR} && mkdir -p {remote}/submitit' {flags} --worker=all
gcloud compute tpus tpu-vm scp "$pickle" my-v4-32:{remote}/submitit/ {flags} --worker=all
set +e
gcloud compute tpus tpu-vm ssh my-v4-32 --command='set -e
cd {remote}
exec timeout --signal=KILL 3600 python3 -u -m launcher.clusters._tpu_worker submitit 4 '"$job" {flags} --worker=all &
ssh_pid=$!
trap 'stop_workers; copy_back; exit 143' INT TERM
wait "$ssh_pid"
rc=$?
copy_back
exit "$rc"
"""


def test_mpi_dry_run_is_the_exact_mpirun_script(tmp_path):
    text, run = dry_run(tmp_path, "cluster=mpi-local", "cluster.tasks_per_node=4", "+cluster.env.OMP_NUM_THREADS=1")
    root = " --allow-run-as-root" if os.geteuid() == 0 else ""
    over = " --oversubscribe" if 4 > os.cpu_count() else ""
    assert text == f"""#!/bin/bash
# submitit job: mpirun starts 4 rank(s) (1 node(s) x 4), each running the pickled task.
# The job id is this script's process id, as for submitit's local jobs.
export SUBMITIT_EXECUTOR=mpi
export SUBMITIT_MPI_JOB_ID=$$
export SUBMITIT_MPI_NUM_NODES=1
export OMP_NUM_THREADS=1
exec mpirun -np 4{root}{over} --timeout 3600 -x SUBMITIT_EXECUTOR -x SUBMITIT_MPI_JOB_ID -x SUBMITIT_MPI_NUM_NODES \
-x OMP_NUM_THREADS --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo {shlex.quote(sys.executable)} -u -m \
submitit.core._submit {run}/submitit
"""


def test_slurm_values_with_shell_metacharacters_are_quoted(tmp_path):
    evil = "$(touch /tmp/owned); `touch /tmp/owned`"
    text, _ = dry_run(tmp_path, "cluster=slurm", "cluster.partition='gpu; touch /tmp/owned'",
                      f"cluster.account='{evil}'", f"+cluster.env.EVIL='{evil}'",
                      "cluster.srun_args=['--label','--comment=$(reboot)']", "+cluster.sbatch_args.mail-type='END;x'")
    lines = text.splitlines()
    assert "#SBATCH --partition='gpu; touch /tmp/owned'" in lines
    assert f"#SBATCH --account={shlex.quote(evil)}" in lines
    assert "#SBATCH --mail-type='END;x'" in lines
    assert f"export EVIL={shlex.quote(evil)}" in lines
    assert " --kill-on-bad-exit=1 --label '--comment=$(reboot)' " in text


@pytest.mark.parametrize("override, message", [
    ("cluster.partition='gpu\ntouch /tmp/owned'", "cluster.partition='gpu\\ntouch /tmp/owned': line breaks"),
    ("+cluster.env.BAD-NAME=1", "'BAD-NAME' is not a valid environment variable name"),
    ("+cluster.sbatch_args={9mail: x}", "'9mail' is not an sbatch option name"),
])
def test_bad_slurm_values_are_refused_with_the_key_named(tmp_path, override, message):
    proc = run_cli("mode=check", "cluster=slurm", override, "launcher.dry_run=true", run_dir=tmp_path / "run", check=False,
                   timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
    assert proc.stderr.count("error:") == 1 and "Traceback" not in proc.stderr


def test_tpu_needs_one_task_per_worker(tmp_path):
    proc = run_cli("mode=check", "cluster=tpu", "cluster.tpu_name=p", "cluster.tasks_per_node=4", "launcher.dry_run=true",
                   run_dir=tmp_path / "run", check=False, timeout=60)
    assert proc.returncode == 2 and "cluster.tasks_per_node=4" in proc.stderr and "tasks_per_node=1" in proc.stderr


def test_a_tpu_name_that_is_not_one_is_refused(tmp_path):
    proc = run_cli("mode=check", "cluster=tpu", "cluster.tpu_name='pod;reboot'", "launcher.dry_run=true", run_dir=tmp_path / "run",
                   check=False, timeout=60)
    assert proc.returncode == 2 and "cluster.tpu_name='pod;reboot'" in proc.stderr
