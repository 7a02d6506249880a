"""Session fixtures for real cluster software: a local SLURM and a container image.

Each starts once per test session, and only if a test asks for it. If the software is missing
or does not start, the fixture fails with the reason (a skipped infrastructure test would look
like a passing one). Implementations: tests/clusterkit/.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import jax
import pytest

from tests.clusterkit.image import ensure_image
from tests.clusterkit.slurm import LocalSlurm

# In-process JAX tests share one backend whose device count cannot change once it starts, so
# it is fixed here, before any test module touches it: 8 virtual CPU devices.
jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture(scope="session")
def slurm():
    """A running two-node SLURM (node1, node2; 4 CPUs each) with accounting; ``slurm.env``
    holds the SLURM_CONF that points clients at it."""
    # Not under pytest's tmp dir: munged wants every folder above its socket searchable by all.
    root = Path(tempfile.mkdtemp(prefix="xlaunch-slurm-", dir="/tmp"))
    root.chmod(0o755)
    cluster = LocalSlurm(root).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def container_image() -> str:
    """A podman image of minimal Debian, built once per machine (see clusterkit/image.py)."""
    return ensure_image()

