"""The user's code (mode=run) for workers that share no file system with this machine (TPU pods).

What is copied of the code directory (``mode.code_dir``, default the directory the launcher was
started from): the files ``mode.include``'s globs match, when given; else every file git would
keep, tracked or not, less what ``.gitignore`` (and git's other exclude files) ignore, asked of
git itself (through a throwaway repository where the directory is none), so the rules are
exactly git's. The run dir, should it lie inside, is left out. One ``code.tar.gz`` in the run
dir carries the files; the job script copies it to every worker and unpacks it there before
the task starts (``launcher/clusters/tpu.py``), and the task runs from that copy.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import UserError

ARCHIVE = "code.tar.gz"
MAX_BYTES = 1 << 30  # more than this is data, not code: say so rather than copy it to every worker


@dataclass(frozen=True)
class UserCode:
    """The user's code a job's tasks run, as its mode says (``launcher.modes.Mode.code``: mode=run):
    where it is on this machine, and the globs of what workers that share no file system need
    (none: every file git would keep)."""

    dir: Path
    include: tuple[str, ...] = ()


def files(root: Path, include: list[str], leave_out: Path | None = None) -> list[str]:
    """The files to copy, relative to ``root``, sorted."""
    root = Path(root).resolve()
    if include:
        found = set()
        for pattern in include:
            # A directory stands for everything in it ('src', or 'src/**', which matches folders).
            matched = [f for p in root.glob(pattern) for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file()]
            if not matched:
                raise UserError(f"mode.include: {pattern!r} matches no file in {root}; give globs relative to "
                                "mode.code_dir (e.g. '*.py', 'src/**')")
            found.update(p.relative_to(root).as_posix() for p in matched)
        names = sorted(found)
    else:
        names = sorted(_git_files(root))
    if leave_out is not None:
        leave_out = Path(leave_out).resolve()
        names = [n for n in names if not (root / n).resolve().is_relative_to(leave_out)]
    return [n for n in names if (root / n).is_file() or (root / n).is_symlink()]


def _git_files(root: Path) -> list[str]:
    if shutil.which("git") is None:
        raise UserError(f"git is needed to choose what of {root} to copy to the workers (honouring .gitignore): "
                        "install git, or list the files with mode.include=[...]")
    inside = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True,
                            text=True).stdout.strip() == "true"
    list_files = ["ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    if inside:
        out = subprocess.run(["git", "-C", str(root), *list_files], capture_output=True, check=True)
    else:
        with tempfile.TemporaryDirectory(prefix="xlaunch-git-") as tmp:
            subprocess.run(["git", "init", "-q", tmp], check=True, capture_output=True)
            out = subprocess.run(["git", f"--git-dir={tmp}/.git", f"--work-tree={root}", *list_files], cwd=root,
                                 capture_output=True, check=True)
    return [n for n in out.stdout.decode().split("\0") if n]


def pack(root: Path, include: list[str], run_dir: Path) -> tuple[Path, int, int]:
    """Writes ``<run dir>/code.tar.gz``: (its path, the number of files, their bytes)."""
    root = Path(root).resolve()
    names = files(root, include, leave_out=run_dir)
    if not names:
        raise UserError(f"mode.code_dir={root}: nothing to copy to the workers (every file is ignored by git); "
                        "list what the program needs with mode.include=[...]")
    size = sum((root / n).lstat().st_size for n in names)
    if size > MAX_BYTES:
        raise UserError(f"mode.code_dir={root}: {len(names)} files, {size / 2**30:.1f} GiB to copy to every worker; "
                        "ignore data and outputs in .gitignore, or list what the program needs with mode.include=[...]")
    path = Path(run_dir) / ARCHIVE
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name in names:
            tar.add(root / name, arcname=name, recursive=False)
    return path, len(names), size
