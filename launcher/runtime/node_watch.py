"""Each host's ranks, their processes checked by one of them: a rank gone without a word is found
by its pid, on its own host, and recorded in the run dir as failed (``died``), where the job's
watcher (``launcher/runtime/watch.py``) reads it. Nothing of this touches the shared file system
while every rank lives: the register and the lock are in node-local memory.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path

from launcher.runtime import status
from launcher.runtime.status import rank_log


def _node_root() -> Path:
    """Memory of this node alone: /dev/shm (a container's own where it has one), else the
    temporary directory."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class NodeWatch:
    """The ranks of one host, their pids checked by one of them.

    Each rank registers its pid in a folder of node-local memory named for the job's run dir,
    attempt and host; the rank that holds the folder's lock (the first to try; when it ends,
    the kernel frees the lock and the next rank to try takes it) checks every registered pid each
    beat and records a rank whose process is gone, without a word of its own, as failed in the
    run dir. Costs nothing on the shared file system while every rank lives."""

    def __init__(self, run_dir: Path, rank: int, attempt: int, root: Path | None = None) -> None:
        self.run_dir, self.rank = Path(run_dir), rank
        self.host, self.pidns = socket.gethostname(), status._pid_namespace()
        key = hashlib.sha1(f"{Path(run_dir).resolve()}\0{attempt}\0{self.host}".encode()).hexdigest()[:16]
        self.dir = (root or _node_root()) / f"xlaunch-{os.getuid()}" / key
        self.dir.mkdir(parents=True, exist_ok=True)
        self.entry = self.dir / f"rank{rank}"
        status._write_json(self.entry, {"rank": rank, "pid": os.getpid(), "pidns": self.pidns, "host": self.host})
        self._lock_fd: int | None = None
        self.leading = False
        self._known: dict[str, tuple[int, int, str]] = {}
        self._reported: set[int] = set()

    def beat(self) -> list[int]:
        """Takes the lead if it is free, and when leading checks the registered ranks; returns
        those found dead this beat."""
        if not self.leading:
            self.leading = self._try_lead()
            if not self.leading:
                return []
        dead = []
        with contextlib.suppress(OSError), os.scandir(self.dir) as it:
            names = [e.name for e in it if e.name.startswith("rank")]
        for name in names:
            if name not in self._known:
                with contextlib.suppress(OSError, ValueError, KeyError):
                    d = json.loads((self.dir / name).read_text())
                    self._known[name] = (int(d["rank"]), int(d["pid"]), d.get("pidns", ""))
        for name, (rank, pid, pidns) in list(self._known.items()):
            if rank in self._reported or pidns != self.pidns or status.pid_alive(pid):
                continue
            if not (self.dir / name).exists():  # it ended cleanly and left
                del self._known[name]
                continue
            self._reported.add(rank)
            dead.append(rank)
            log = rank_log(self.run_dir, rank)
            status.mark_failed(self.run_dir, rank, f"rank {rank} (pid {pid}) died on {self.host} {status._DIED} "
                               f"(killed or crashed: see its log {log})", self.host, died=True)
            with contextlib.suppress(OSError):  # it cannot leave the register itself
                (self.dir / name).unlink()
            del self._known[name]
        return dead

    def _try_lead(self) -> bool:
        try:
            if self._lock_fd is None:
                self._lock_fd = os.open(self.dir / "leader.lock", os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def close(self) -> None:
        """This rank ends cleanly: it leaves the register (the last one out removes it)."""
        with contextlib.suppress(OSError):
            self.entry.unlink()
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)
            self._lock_fd, self.leading = None, False
        with contextlib.suppress(OSError):
            if not any(n.startswith("rank") for n in os.listdir(self.dir)):
                (self.dir / "leader.lock").unlink()
                self.dir.rmdir()
