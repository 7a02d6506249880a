"""What ``autoshard`` shows in a user's notebook or terminal: quiet by default.

A search says a hundred and more lines of what it analysed, profiled and measured. From Python,
by default, those go to a log file of their own beside the profile store
(``<store>/../autoshard_logs/<step>-<time>.log``), and the user's screen gets one line saying
where, a progress bar (``rich``: in a terminal or a Jupyter notebook, its description the line
the search last said), and the table of the race at the end. What XLA and the ILP's solver
print themselves while the search runs (XLA's C++ warnings as it compiles candidates, HiGHS's
banner) goes into the same log file (``runtime/native_output.py``). ``log=print`` (any callable)
takes every line instead, and nothing else is drawn or redirected. Only process 0 shows or
writes anything.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any, ContextManager, Iterator, Optional, TextIO

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from launcher.runtime import native_output


def log_path(store_root: Path, step: str) -> Path:
    """Where the details of a search of ``step`` whose profile store is ``store_root`` go."""
    return store_root.parent / "autoshard_logs" / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}.log"


class Console:
    """The quiet default: ``log`` into ``path``, ``progress`` as a bar, ``show`` on the screen.
    Used as a context manager around the search (the bar lives while it runs)."""

    def __init__(self, path: Path, is_main: bool) -> None:
        self.path, self.is_main = path, is_main
        self._file: Optional[TextIO] = None
        self._bar: Optional[Progress] = None
        self._task: Any = None
        self._native = contextlib.ExitStack()
        self._stream: TextIO = sys.stdout
        self._screen = RichConsole(stderr=False)
        self._draws = False

    def __enter__(self) -> "Console":
        if self.is_main:  # the search's own output (and XLA's, HiGHS's) into the log file from here on
            self._stream = self._native.enter_context(native_output.to_file(self.path))
            self._screen = RichConsole(file=self._stream, force_jupyter=self._screen.is_jupyter or None)
        # A bar where someone watches: a terminal or a notebook (a pipe or a CI log gets the lines only).
        self._draws = self.is_main and (self._screen.is_terminal or self._screen.is_jupyter)
        if self._draws:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=self._screen, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("autoshard", total=None)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        if self._file is not None:
            self._file.close()
            self._file = None
        self._native.close()
        self._stream = sys.stdout

    def log(self, line: str) -> None:
        """A detail: into the log file; the bar's description shows the latest."""
        if not self.is_main:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", buffering=1)
        self._file.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        if self._bar is not None:
            self._bar.update(self._task, description=_short(line))

    def show(self, text: str) -> None:
        """On the user's screen (above the bar while one is drawn), process 0 only."""
        if not self.is_main:
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self._stream, flush=True)

    def progress(self, total: int, what: str) -> ContextManager:
        """``Hooks.progress``: a bar of ``total`` units while the search does ``what``."""
        return self._progress(total, what)

    @contextlib.contextmanager
    def _progress(self, total: int, what: str) -> Iterator["_Advance"]:
        if self._bar is None:
            yield _Advance(None, None)
            return
        task = self._bar.add_task(what, total=max(total, 1))
        try:
            yield _Advance(self._bar, task)
        finally:
            self._bar.remove_task(task)


class _Advance:
    def __init__(self, bar: Optional[Progress], task: Any) -> None:
        self.bar, self.task = bar, task

    def advance(self, n: int = 1, description: Optional[str] = None, **_: Any) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=n, **({"description": description} if description else {}))

    def stepped(self) -> None:
        """A round of a race ended: in the user's own process, no other rank to compare with."""


def _short(line: str, width: int = 90) -> str:
    line = line.replace("[", "(").replace("]", ")")  # rich markup
    return line if len(line) <= width else line[:width - 3] + "..."


