"""A real container image for tests, built without registry access.

``debootstrap`` makes a minimal Debian bookworm root file system from a Debian package mirror
(the one thing this machine reaches), a marker file is added, and ``podman import`` turns it
into ``localhost/xlaunch-test:<VERSION>``. The root file system tarball is cached under
/var/tmp and the image stays in podman's store, so only the first test session on a machine
pays for it (about a minute). Tests bind-mount the host's Python prefix into the container and
run that interpreter inside: same packages, but the image's libraries, namespaces and /etc.

Podman here needs ``--runtime runc`` and explicit ulimits (root without CAP_SYS_RESOURCE, crun
and hybrid cgroups do not mix): ``PODMAN_OPTIONS`` holds them for ``container.options``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

VERSION = "1"  # bump when the recipe below changes: a new tag and a new cache
IMAGE = f"localhost/xlaunch-test:{VERSION}"
MARKER = "/etc/xlaunch-test-image"
MARKER_TEXT = f"xlaunch-test-image {VERSION}\n"
CACHE = Path(os.environ.get("XLAUNCH_TEST_IMAGE_CACHE", "/var/tmp")) / f"xlaunch-test-rootfs-{VERSION}.tar"
MIRROR = os.environ.get("XLAUNCH_TEST_DEBIAN_MIRROR", "http://deb.debian.org/debian")
PODMAN_OPTIONS = ["--runtime=runc", "--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"]


class ImageBuildError(RuntimeError):
    pass


def podman(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, **kwargs)


def ensure_image() -> str:
    """The test image's name, building and importing it first if needed."""
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            raise ImageBuildError(f"{tool} not found: install podman and runc with .ci/install.sh (as root)")
    if podman("image", "exists", IMAGE).returncode == 0:
        return IMAGE
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    # Test workers (xdist) may all find the image missing: one builds it, the others wait.
    with open(CACHE.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if podman("image", "exists", IMAGE).returncode == 0:
            return IMAGE
        if not CACHE.exists():
            build_rootfs_tar(CACHE)
        out = podman("import", str(CACHE), IMAGE, timeout=600)
        if out.returncode:
            raise ImageBuildError(f"podman import {CACHE} failed:\n{out.stderr}")
    return IMAGE


def build_rootfs_tar(dest: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap not found: install it with .ci/install.sh (as root)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xlaunch-rootfs-", dir=dest.parent) as tmp:
        root = Path(tmp) / "rootfs"
        # python3 pulls in the shared libraries a host-built CPython and the jax wheels load.
        out = subprocess.run(["debootstrap", "--variant=minbase", "--include=python3", "bookworm", str(root), MIRROR],
                             capture_output=True, text=True, timeout=1200)
        if out.returncode:
            raise ImageBuildError(f"debootstrap from {MIRROR} failed (set XLAUNCH_TEST_DEBIAN_MIRROR to a "
                                  f"reachable mirror):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        (root / MARKER.lstrip("/")).write_text(MARKER_TEXT)
        partial = dest.parent / f".{dest.name}.{os.getpid()}.partial"
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.replace(dest)  # a cache file is whole or absent
