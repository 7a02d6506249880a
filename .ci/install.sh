#!/usr/bin/env bash
# Installs everything the test suite needs on a bare Debian 12 machine, as root:
#   the cluster software the tests start for real (SLURM with accounting, Open MPI, podman),
#   the Python packages (this project, editable, with its test extras), and the container
#   image the container tests run in (built once, cached under /var/tmp).
# Safe to run again: apt and pip skip what is there, the image is reused.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

if [ "$(id -u)" != 0 ]; then
  echo "install.sh: run as root (apt-get, and the tests start SLURM daemons as root)" >&2
  exit 1
fi

apt-get update
packages=(
  # SLURM on one machine: controller, two node daemons, accounting (slurmdbd + MariaDB), munge
  slurm-wlm slurmctld slurmd slurm-client slurmdbd munge mariadb-server
  # mpirun for cluster=mpi-local (mpi4py's wheel links against it)
  openmpi-bin libopenmpi-dev
  # real containers: podman with the runc runtime; debootstrap builds the test image offline
  podman runc debootstrap
  # strace: the heavy stage counts a real job's calls on its run dir (tests/test_scale.py)
  strace
  ca-certificates tar
)
command -v python3 >/dev/null || packages+=(python3)
python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
apt-get install -y --no-install-recommends "${packages[@]}"

# Debian's own python3 is "externally managed" (PEP 668): this machine is the CI's to change.
pip_flags=()
stdlib=$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')
[ -e "$stdlib/EXTERNALLY-MANAGED" ] && pip_flags+=(--break-system-packages)
# [checkpoint]: orbax-checkpoint for mode=train's checkpoints; [ray]: Ray for cluster=ray's tests (a real
# two-node Ray cluster on this machine); [frameworks]: Flax and Equinox for
# the examples and the auto-sharding of users' models; [sweep]: Hydra's Optuna sweeper;
# [tensorboard]: tensorboardX and TensorBoard for the curves; [wandb], [mlflow]: the other trackers
# (W&B offline, MLflow's file store in the tests); [bench-parallax]: the peer
# bench/bench_autoshard.py races (extras: see pyproject.toml).
python3 -m pip install "${pip_flags[@]}" -e ".[test,checkpoint,ray,frameworks,sweep,tensorboard,wandb,mlflow,bench-parallax]"

# The other end of the supported JAX range (launcher/jaxcompat.py: MINIMUM, LUMI's container's
# JAX) in a virtual environment of its own: .ci/run runs the core suite there too. xlaunch is
# installed into it the way a LUMI user installs it over the container's JAX, which must stay
# (tests/test_install.py checks that it does).
oldest=$(python3 -c 'import sys; sys.path.insert(0, "."); from launcher.jaxcompat import MINIMUM; print(".".join(map(str, MINIMUM)))')
venv=.venv-jax-oldest
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q "jax==$oldest" "jaxlib==$oldest"
# orbax-checkpoint as a LUMI user adds it: the spec that suits (and keeps) this JAX, which
# launcher/jaxcompat.py knows (no orbax release serves jax 0.4.x and the newest alike).
# [tensorboard] asks nothing of JAX: the core suite reads mode=train's curves there too.
"$venv/bin/python" -m pip install -q -e ".[test,checkpoint,tensorboard]" "$("$venv/bin/python" -m launcher.jaxcompat orbax)"
found=$("$venv/bin/python" -c 'import jax; print(jax.__version__)')
[ "$found" = "$oldest" ] || { echo "install.sh: installing xlaunch replaced jax $oldest with $found" >&2; exit 1; }

# The container tests' image: minimal Debian from the package mirror (a minute or three the
# first time on a machine; tests/clusterkit/image.py).
python3 -c 'import sys; sys.path.insert(0, "."); from tests.clusterkit.image import ensure_image; print(ensure_image())'
