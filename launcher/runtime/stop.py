"""Stop requests for users' programs (mode=run): SLURM asks the job to stop, the program saves
and returns on every rank, then the job is requeued.

SLURM signals a job before its time limit (``--signal=USR2@90``, from submitit), and a
preempting scheduler sends the same signal. submitit's own handler runs in rank 0 only: it asks
the task for the job's next pickle (``Task.checkpoint``), runs ``scontrol requeue`` and exits at
once. That suits the built-in modes, which keep on disk whatever they resume from as they
compute it (``launcher/runtime/requeue.py``). A user's program saves when it is told to, on
every rank, so while it runs the signal is handled here instead:

1. A rank that gets the signal records the request in the run dir (``.xlaunch/stop.json``);
   the job's watcher passes it on in the job's watch, which every rank reads once a beat
   (``launcher/runtime/watch.py``), so each learns of the request within a few seconds, also
   where the scheduler signalled only some of them.
2. ``launcher.context().should_stop()`` tells the program. The processes agree on the answer
   (one small host exchange, ``launcher/runtime/hosts.py``), so every process stops after the
   same step, and none is left waiting in a collective for a peer that has stopped.
3. Once ``should_stop()`` has said True and the program has returned on every rank (a barrier,
   so every process has saved), rank 0 calls submitit's handler, kept from before: the
   requeue happens exactly as for the built-in modes (restart count one higher, same run dir;
   ``cluster.max_requeues``; on local, mpi-local and TPU the job ends with the line that says it
   cannot be requeued and names the command that resumes it).
4. A program that ignores the request is not waited on: ``mode.stop_grace_s`` after it, rank 0
   hands over to submitit's handler from a thread all the same and the rank ends (SLURM then
   stops the others); the next run resumes from whatever the program saved on its own.

A request that the program never asked about does not change a program that runs to its end
within the grace period: it finished, and its result is the job's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from submitit.core.job_environment import JobEnvironment
from submitit.core.utils import UncompletedJobError

from launcher.runtime import hosts, status
from launcher.runtime.watch import Watch

POLL_S = 0.5


class StopRequests:
    """The stop requests of one run of a program, on one rank (see the module's docstring).

    ``forced_end(requeued)`` is called in rank 0's timer thread when the grace period ran out and
    submitit's handler has requeued the job (True) or refused to (False); it must end the process.
    """

    def __init__(self, run_dir: Path, rank: int, num_processes: int, attempt: int, grace_s: float,
                 log: logging.Logger, forced_end: Callable[[bool], None]) -> None:
        self.run_dir, self.rank, self.num_processes, self.attempt = Path(run_dir), rank, num_processes, attempt
        self.grace_s, self.log, self.forced_end = grace_s, log, forced_end
        self.requested = threading.Event()  # this rank knows of a request
        self.acknowledged = False  # should_stop() said True: the program is stopping
        self._closed = threading.Event()  # the program returned without being told to stop
        self._handed_over = False
        self._lock = threading.RLock()  # RLock: the signal handler may interrupt its own thread
        self._submitit: Any = None
        self._signum = 0
        self._timer: threading.Timer | None = None

    # -- set-up ---------------------------------------------------------------------------------
    def install(self, listen: Callable[[Callable[[Watch], None]], None]) -> None:
        """Takes over submitit's signal (main thread only) and hears of a peer's request through
        ``listen`` (the rank reporter's: every watch of the job it reads)."""
        self._signum = JobEnvironment._usr_sig()
        previous = signal.getsignal(self._signum)
        self._submitit = previous if callable(previous) else None
        signal.signal(self._signum, self._on_signal)
        listen(self._heard)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._note(f"{signal.Signals(signum).name} on rank {self.rank}", publish=True)

    def _heard(self, watch: Watch) -> None:
        # A request an earlier run left means nothing now.
        if watch.stop.get("attempt") == self.attempt and not self.requested.is_set():
            self._note(watch.stop.get("why", "asked"), publish=False)

    def _note(self, why: str, publish: bool) -> None:
        with self._lock:
            if self.requested.is_set() or self._closed.is_set():
                return
            self.requested.set()
        if publish:
            path = status.stop_file(self.run_dir)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"attempt": self.attempt, "why": why, "time": time.time()}))
            tmp.replace(path)
        self.log.warning("the job is asked to stop (%s: time limit near, or preempted); the program learns it "
                         "from launcher.context().should_stop()%s", why,
                         f"; handed over for requeue in at most mode.stop_grace_s={self.grace_s:g} s"
                         if self.rank == 0 else "")
        if self.rank == 0:
            self._timer = threading.Timer(self.grace_s, self._grace_over)
            self._timer.daemon = True
            self._timer.start()

    # -- what the program calls -----------------------------------------------------------------
    def should_stop(self) -> bool:
        mine = self.requested.is_set()
        agreed = mine
        if self.num_processes > 1:
            agreed = bool(np.asarray(hosts.gather(np.array(int(mine), np.int32))).any())
        if agreed and not self.acknowledged:
            self.acknowledged = True
            self.log.warning("should_stop() is True: the program saves and returns, then the job is requeued")
        return agreed

    # -- after the program ----------------------------------------------------------------------
    def after_program(self) -> bool:
        """Called when the program has returned: False if it ran to its end (nothing to do),
        else hands the job over for requeue (rank 0; raises what submitit's handler raises) or
        waits to be stopped with it (the other ranks)."""
        if not self.acknowledged:
            self.close()
            return False

        self.log.info("the program stopped as asked; waiting for every rank to have stopped")
        hosts.barrier("xlaunch-stop")
        if self.rank == 0:
            self._hand_over()
            return True
        deadline = time.monotonic() + self.grace_s + 60
        while time.monotonic() < deadline:  # rank 0 requeues the job, and SLURM ends this rank
            time.sleep(POLL_S)
        raise RuntimeError(f"the program stopped as asked, but rank 0 did not hand the job over within "
                           f"{self.grace_s + 60:g} s (see its log)")

    def close(self) -> None:
        with self._lock:
            self._closed.set()
            if self._timer is not None:
                self._timer.cancel()

    def _claim(self) -> bool:
        with self._lock:
            if self._handed_over or self._closed.is_set():
                return False
            self._handed_over = True
            if self._timer is not None:
                self._timer.cancel()
            return True

    def _hand_over(self) -> None:
        if not self._claim():
            return
        if self._submitit is None:
            raise RuntimeError("no submitit signal handler to hand the job over to (not started by submitit?)")
        self._submitit(self._signum, None)  # Task.checkpoint, scontrol requeue, sys.exit; or raises

    def _grace_over(self) -> None:
        if not self._claim():
            return
        self.log.warning("the program has not stopped %g s after the request (mode.stop_grace_s): the job is handed "
                         "over without it; the next run resumes from what it saved by itself", self.grace_s)

        try:
            if self._submitit is not None:
                self._submitit(self._signum, None)
            requeued = False
        except SystemExit:
            requeued = True
        except UncompletedJobError:
            requeued = False
        except BaseException:  # noqa: BLE001 - this thread must end the process whatever happened
            self.log.exception("handing the job over failed")
            requeued = False
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        self.forced_end(requeued)
