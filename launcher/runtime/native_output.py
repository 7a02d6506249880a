"""What libraries below Python print, sent to a file for a while: XLA's C++ warnings and HiGHS's
banner, which write to the process's file descriptors 1 and 2 themselves, past ``sys.stdout``.

A search compiles dozens of candidate programs, and XLA says of some of them, in about 600
characters each, that it rematerializes a tensor ("[SPMD] Involuntary full rematerialization");
the ILP's solver prints its banner. Those lines are the search's details, not the user's answer:
``to_file`` points descriptors 1 and 2 at the search's log file while it runs, and hands the
caller a stream on the screen as it was, for what the user is meant to see.

Python-level streams that are no descriptor (a Jupyter kernel's, pytest's ``capsys``) are left
as they are: nothing below Python writes to them, and the screen stream is then that stream.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import sys
from pathlib import Path
from typing import Iterator, TextIO

_FDS = (1, 2)


def _flush_c_stdio() -> None:
    """C's own stdout buffer (HiGHS prints through it), so nothing of the search reaches the
    screen once the descriptors are back."""
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to ask (not Linux or macOS): nothing buffered there
        pass


def _descriptor(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        return None


@contextlib.contextmanager
def to_file(path: Path) -> Iterator[TextIO]:
    """Descriptors 1 and 2 appended to ``path`` inside the block; yields a stream on the screen:
    ``sys.stdout`` itself where it writes to no descriptor of those two (a notebook's, pytest's
    ``capsys``), else a copy of its descriptor as it was. Restored on the way out, whatever
    happened inside."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    _flush_c_stdio()
    saved = {fd: os.dup(fd) for fd in _FDS}
    screen_fd = _descriptor(sys.stdout)
    screen = sys.stdout if screen_fd not in _FDS else os.fdopen(
        os.dup(saved[screen_fd]), "w", buffering=1, encoding=getattr(sys.stdout, "encoding", None) or "utf-8",
        errors="replace")
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        for fd in _FDS:
            os.dup2(target, fd)
        yield screen
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        _flush_c_stdio()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        os.close(target)
        if screen is not sys.stdout:
            screen.close()
