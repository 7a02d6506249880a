"""The callable that submitit pickles and runs once per process, on every cluster alike.

Order matters: rank from the environment, then the per-rank log, then device visibility, and
only then ``import jax``; ``jax.distributed.initialize`` gets every argument explicitly. So this
module, and what it imports at its top, imports no JAX: the mode's run, whose module does, is
loaded by the reference the launcher handed it (``Launch.run``) once JAX is initialised.

It is submitit-checkpointable: on the timeout or preemption signal submitit asks rank 0's task
for the job's next pickle (``checkpoint``) and requeues the job (``launcher.runtime.requeue``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from submitit.core.utils import UncompletedJobError
from submitit.helpers import Checkpointable, DelayedSubmission

from launcher import jaxcompat
from launcher.errors import BAD_INPUT
from launcher.plugins import function
from launcher.runtime import devices, preflight, ranks, requeue, status, straggler, timing
from launcher.runtime.context import Launch, TaskContext
from launcher.runtime.scalars import Scalars
from launcher.runtime.trackers import params_of
from launcher.runtime.status import ENDED
from launcher.runtime.watch import RankReporter


class Task(Checkpointable):
    def __init__(self, cfg: DictConfig, run_dir: Path, launch: Launch):
        # A plain container pickles without the schema classes' import paths mattering.
        self.cfg = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        self.run_dir = str(run_dir)
        self.launch = launch
        self.attempt = 0  # how many times the job was requeued or restarted before this run
        self.restart_reason = ""  # why the launcher restarted the job (launcher.max_restarts)
        self._running: dict[str, Any] = {}  # this run's config, log and attempt, for checkpoint()

    def __getstate__(self) -> dict[str, Any]:
        # What a run holds (its log, its decisions) is not the next run's.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._running = {}

    def checkpoint(self, *args: Any, **kwargs: Any) -> DelayedSubmission | None:
        """Called by submitit in rank 0, from its signal handler, when the job times out or is
        preempted: the task to run when the requeued job starts again (this one, one attempt on),
        or None where the job cannot be requeued (submitit then ends it; ``__call__`` reports why)."""
        r = self._running
        cfg, run_dir = r.get("cfg") or OmegaConf.create(self.cfg), Path(r.get("run_dir") or self.run_dir)
        log, attempt = r.get("log") or logging.getLogger("xlaunch.task"), r.get("attempt", self.attempt)
        why_not = requeue.why_not(cfg, run_dir, attempt, self.launch.requeues, self.launch.requeuers)
        if why_not:
            r["not_requeued"] = why_not
            log.error("not requeued: %s", why_not)
            return None
        nxt = Task.__new__(Task)
        nxt.__setstate__({**self.__getstate__(), "attempt": attempt + 1})
        reason = f"requeued after {requeue.signal_name()}"
        # Before SLURM stops the ranks: the waiting launcher and the peers then read their end as
        # the requeue it is, not as a failure.
        status.write_attempt(run_dir, attempt + 1, reason)
        r["requeued"] = True
        key, limit = requeue.limit_of(cfg)
        log.warning("%s: requeueing the job (restart %d of at most %s=%d); the next run resumes from what the "
                    "run dir holds", requeue.signal_name(), attempt + 1, key, limit)
        return DelayedSubmission(nxt, *args, **kwargs)

    def __call__(self) -> str:
        _hear_interrupts()
        cfg = OmegaConf.create(self.cfg)
        # Absolute: a mode may change the working directory (mode=run: the program's code dir),
        # and a TPU worker's run dir is its working directory (".").
        run_dir = Path(self.run_dir).absolute()
        rank = ranks.detect(self.launch.coordinator_port)
        attempt, reason = requeue.attempt_of(self.attempt)
        reason = getattr(self, "restart_reason", "") or reason
        status.write_attempt(run_dir, attempt, reason)
        watches = None if self.launch.shared_run_dir else [rank.process_id]
        reporter = RankReporter(run_dir, rank.process_id, rank.num_processes, attempt, watches=watches)
        reporter.step_clock = straggler.StepClock(cfg.launcher.straggler.steps)
        clock = timing.AttemptClock(run_dir, attempt, write=rank.process_id == 0)
        log = _open_rank_log(run_dir, rank, cfg.launcher.log_level,
                             requeue.restart_line(attempt, reason) if attempt else None)
        reporter.follow_log(sys.stderr.fileno())  # the log, now: a rank that writes to it is making progress
        # Rank 0's run of the tracker records the resolved config and the code's commit.
        params = params_of(OmegaConf.to_container(cfg, resolve=True), getattr(self.launch, "commit", "")) \
            if rank.process_id == 0 else None
        scalars = Scalars(run_dir, rank.process_id, attempt, warn=log.warning,
                          tracker=cfg.launcher.get("tracker", "tensorboard"), params=params)
        self._running = {"cfg": cfg, "log": log, "attempt": attempt, "run_dir": run_dir, "clock": clock,
                         "scalars": scalars}
        if rank.process_id == 0:  # the job's scores of its ranks' steps, as curves beside the run's
            reporter.on_scores = lambda step, entry: scalars.add(step, straggler.tensorboard(entry), prefix="straggler/")
        try:
            return self._run(cfg, run_dir, rank, reporter, log, attempt)
        except KeyboardInterrupt:  # the job was cancelled (submitit's local cancel is SIGINT)
            if reporter.status.state not in ENDED:  # a rank that said how it ended (hung, say) keeps its word
                reporter.set("stopped", "interrupted")
            clock.end("stopped", self._running.get("compile", {}).get("s"))
            raise
        except BaseException as e:  # noqa: BLE001 - every way out must be reported to the peers
            if requeue.ended_by_requeue(e, attempt, bool(self._running.get("requeued")), status.read_attempt(run_dir)):
                # This attempt ends, the job goes on: no result for submitit to write (a failed
                # one from every rank reads as the job's end).
                reporter.set("requeued", f"attempt {attempt} ended; the job was requeued")
                log.warning("this run ends here: the job was requeued%s",
                            "" if isinstance(e, SystemExit) else f" ({type(e).__name__}: {e})")
                if isinstance(e, SystemExit):
                    raise
                raise SystemExit(-1) from e
            bad_input = isinstance(e, BAD_INPUT)
            if isinstance(e, UncompletedJobError) and self._running.get("not_requeued"):
                message = self._running["not_requeued"]  # submitit's own says only "checkpoint returned None"
                log.error("rank %d ended: %s", rank.process_id, message)
            elif bad_input or isinstance(e, preflight.PreflightFailed):  # the message says it all
                message = str(e)
                log.error("rank %d failed: %s", rank.process_id, message)
            else:
                message = f"{type(e).__name__}: {e}"
                log.error("rank %d failed: %s\n%s", rank.process_id, message, traceback.format_exc())
            reporter.set("failed", message, bad_input=bad_input)
            _keep_scores(clock, reporter)
            clock.end("failed", self._running.get("compile", {}).get("s"))
            try:
                _write_time(scalars, run_dir)
            except Exception as again:  # noqa: BLE001 - the failure being reported is the one that matters
                log.warning("the failed attempt's time accounting was not written to TensorBoard: %s", again)
            raise
        finally:
            scalars.close()
            reporter.stop()
            logging.shutdown()

    def _run(self, cfg: DictConfig, run_dir: Path, rank: ranks.RankInfo, reporter: RankReporter,
             log: logging.Logger, attempt: int) -> str:
        """The task's steps in order; returns the path of result.json, which rank 0 wrote (the
        result travels once: the launcher reads that file)."""
        t0 = time.perf_counter()
        log.info("rank %d/%d (local %d/%d, node %d) on %s from %s; coordinator %s", rank.process_id,
                 rank.num_processes, rank.local_rank, rank.local_size, rank.node_rank, socket.gethostname(),
                 rank.source, rank.coordinator)
        _inject_fault(cfg, rank, log, before_start=True)
        self._prepare_xla(cfg, run_dir, rank, log)
        jax = self._start_distributed(cfg, rank, reporter, log)
        init_s = time.perf_counter() - t0
        _inject_fault(cfg, rank, log, before_start=False)
        if preflight.enabled(cfg.launcher, rank.num_nodes):
            self._running["preflight"] = _preflight(cfg, run_dir, rank, log)
        ctx = TaskContext(cfg=cfg, run_dir=run_dir, rank=rank, log=log, attempt=attempt, reporter=reporter,
                          launch=self.launch, clock=self._running["clock"], scalars=self._running["scalars"])
        result = self._run_mode(ctx, init_s)
        self._write_result(ctx, result)
        reporter.set("done")
        if rank.num_processes > 1:
            # Keeps rank 0's coordinator alive until every rank has finished its last collective.
            jax.distributed.shutdown()
        return str(run_dir / "result.json")

    def _prepare_xla(self, cfg: DictConfig, run_dir: Path, rank: ranks.RankInfo, log: logging.Logger) -> None:
        """Device visibility, then XLA's dump or the compilation cache: all before JAX starts."""
        visible = devices.set_visibility(cfg.cluster.accelerator, cfg.cluster, rank)
        log.info("device visibility: %s", visible or "unchanged")
        if cfg.launcher.xla_dump:
            dump = run_dir / "xla_dump" / f"rank{rank.process_id}"
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                       f" --xla_dump_to={dump} --xla_dump_hlo_as_text"
                                       # text dumps elide large constants; protos keep them for replay
                                       f" --xla_dump_hlo_as_proto").strip()
            # A step found in JAX's persistent compilation cache (JAX_COMPILATION_CACHE_DIR, common
            # on clusters) is not compiled, so XLA would dump nothing: compile everything here.
            os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"
        else:
            _compilation_cache(cfg, run_dir, log)

    def _start_distributed(self, cfg: DictConfig, rank: ranks.RankInfo, reporter: RankReporter,
                           log: logging.Logger) -> Any:
        """JAX imported, its CPU devices set, ``jax.distributed.initialize`` with explicit
        arguments, and the heartbeat started; returns the jax module."""
        cluster = cfg.cluster
        jaxcompat.check_version()  # the tasks' JAX (a container's, say) may not be the launcher's
        t0 = time.perf_counter()
        import jax  # noqa: PLC0415  JAX: only once this task's devices are set (_prepare_xla)
        import jaxlib  # noqa: PLC0415  JAX: only once this task's devices are set (_prepare_xla)

        log.info("jax %s, jaxlib %s", jax.__version__, jaxlib.__version__)
        cache_on = (os.environ.get("JAX_COMPILATION_CACHE_DIR")
                    and os.environ.get("JAX_ENABLE_COMPILATION_CACHE", "true").lower() not in ("false", "0"))
        self._running["cache"] = jaxcompat.count_compile_cache() if cache_on else None
        self._running["compile"] = jaxcompat.time_compiles()
        if cluster.accelerator == "cpu":
            jaxcompat.set_cpu_device_count(cluster.cpu_devices_per_task)
            if rank.num_processes > 1:  # before 0.5, gloo without jax.distributed fails to start
                jaxcompat.use_gloo_cpu_collectives()
                _open_files_for_gloo(cluster.cpu_devices_per_task, rank.num_processes, log)
        if rank.num_processes > 1:
            reporter.set("joining")
            log.info("jax.distributed.initialize(%s, num_processes=%d, process_id=%d, timeout=%d s)",
                     rank.coordinator, rank.num_processes, rank.process_id, cfg.launcher.init_timeout_s)
            jaxcompat.distributed_initialize(
                coordinator_address=rank.coordinator,
                num_processes=rank.num_processes,
                process_id=rank.process_id,
                local_device_ids=devices.jax_local_device_ids(cluster.accelerator, cluster),
                initialization_timeout=cfg.launcher.init_timeout_s,
                heartbeat_timeout_seconds=cfg.launcher.heartbeat_timeout_s,
            )
        reporter.set("joined")
        self._running["clock"].mark("joined")
        reporter.start(cfg.launcher.peer_timeout_s, cfg.launcher.init_timeout_s,
                       on_peer_failure=lambda why: _abort(log, reporter, why),
                       hang_timeout_s=cfg.launcher.hang_timeout_s, on_hang=lambda why: _abort(log, reporter, why, "hung"),
                       straggler_factor=cfg.launcher.straggler.factor)
        log.info("joined in %.2f s: %d global devices, %d local (%s)", time.perf_counter() - t0, jax.device_count(),
                 jax.local_device_count(), jax.devices()[0].platform)
        return jax

    def _run_mode(self, ctx: TaskContext, init_s: float) -> dict[str, Any]:
        """The mode's run, its result with what every result carries."""
        import jax  # noqa: PLC0415  JAX: started by _start_distributed

        cfg = ctx.cfg
        run = function(self.launch.run)  # the mode's module imports JAX: only now may it be imported
        t1 = time.perf_counter()
        result = run(ctx)
        return {
            "mode": cfg.mode.name,
            "mode_code": self.launch.mode_code,  # what ran: a preset's (cfp's) is search
            "cluster": cfg.cluster.name,
            "num_processes": ctx.rank.num_processes,
            "global_devices": jax.device_count(),
            "platform": jax.devices()[0].platform,
            "init_time_s": init_s,
            "mode_time_s": time.perf_counter() - t1,
            **({"preflight": self._running["preflight"]} if self._running.get("preflight") else {}),
            **result,
        }

    def _write_result(self, ctx: TaskContext, result: dict[str, Any]) -> None:
        """result.json (rank 0), with the compilation cache's counts and where the time went."""
        cache = self._running.get("cache")
        if cache is not None:  # rank 0's programs: loaded from the cache (hits) or compiled (misses)
            result["compile_cache"] = {"dir": os.environ["JAX_COMPILATION_CACHE_DIR"], **cache}
        # How the ranks' steps compared, as the job's watcher last scored them.
        scored = ctx.reporter.last_scores() if ctx.reporter is not None else {}
        if scored:
            lc = ctx.cfg.launcher.straggler
            result["stragglers"] = {**scored, "factor": lc.factor, "steps": lc.steps}
        # Where the time went, over this job's attempts so far (this one ends here).
        _keep_scores(ctx.clock, ctx.reporter)
        ctx.clock.end("done", self._running["compile"]["s"])
        result["time"] = timing.summary(ctx.run_dir, step_times=result.get("step_times_s"))
        _write_time(ctx.scalars, ctx.run_dir)
        if ctx.is_main:
            ctx.write_json("result.json", result)
            ctx.log.info("wrote %s", ctx.run_dir / "result.json")


def _preflight(cfg: DictConfig, run_dir: Path, rank: ranks.RankInfo, log: logging.Logger) -> dict:
    """launcher.preflight's checks on this rank, the job's verdict (runtime/preflight.py)."""
    t = time.perf_counter()
    kind, _, at = cfg.launcher.fault.partition(":")
    found = preflight.run(run_dir, status.node_name(), rank.process_id, cfg.launcher.preflight_min,
                          at if kind == "slow" else "")
    log.info("preflight passed in %.1f s: no node's matmul below launcher.preflight_min=%g of the other nodes' "
             "(median %.1f GFLOP/s); an all-reduce over every device took %.2f ms", time.perf_counter() - t,
             cfg.launcher.preflight_min, found["median_gflops"], 1e3 * found["allreduce_s"])
    return found


def _keep_scores(clock: timing.AttemptClock, reporter: RankReporter | None) -> None:
    """The attempt's slowest rank and those found slow, in its time accounting (result.json's
    ``time``: ``slowest``, ``slow``)."""
    scored = reporter.last_scores() if reporter is not None else {}
    if scored:
        clock.set(slowest=scored["slowest"][0], slow=[s["rank"] for s in scored["slow"]])


def _write_time(scalars: Scalars, run_dir: Path) -> None:
    """This attempt's time accounting as TensorBoard scalars (``time/<what>_s`` at step = the
    attempt, and the job's goodput so far), beside the curves the run wrote; a run that wrote none
    gets none. An earlier attempt's is written again where this attempt's purge step hid it (an
    attempt killed outright wrote none: result.json's ``time`` has every attempt)."""
    if not scalars.written:
        return
    purged = scalars.purged_from
    for a in timing.attempts(run_dir):
        n = a.get("attempt", 0)
        if n == scalars.attempt or (purged is not None and purged <= n < scalars.attempt):
            spent = timing.spent(a)
            spent.pop("in_mode_s")
            scalars.add(n, spent, prefix="time/", axis="attempt")
    total = timing.summary(run_dir)
    if total:
        scalars.add(scalars.attempt, {"goodput": total["goodput"]}, prefix="time/", axis="attempt")


def _open_files_for_gloo(local: int, processes: int, log: logging.Logger) -> None:
    """The open-files limit raised to its hard limit, and a warning where even that holds few
    groups of gloo's sockets. XLA:CPU's cross-process collectives (gloo) hold a socket per pair
    of devices of a group, for as long as the process lives: a group of all N devices costs each
    process local x (N - 1) of them (2,016 at 32 x 2 devices), and every distinct group another
    (each mesh, each order of its devices a search measures). Counted here: the tenth group of all
    64 devices over two processes hung at the limit of 20,000, and a 64-device search, which
    measures plans on ten meshes, died in its shortlist. Linux's usual soft limit, 1,024, would not
    hold a second group of 32 devices; the hard limit is as far as a process may raise it."""
    import resource  # noqa: PLC0415  POSIX only, and only here

    every = local * processes
    per_group = local * (every - 1)   # this process's sockets for one group of every device
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("open files: soft limit raised from %d to its hard limit %d (gloo's sockets: %d for a group "
                     "of all %d devices)", soft, hard, per_group, every)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit != resource.RLIM_INFINITY and per_group and limit // per_group < GLOO_GROUPS_WANTED:
        log.warning("open files: the limit, %d, holds %d groups of all %d devices' gloo sockets (%d each); a job "
                    "that runs collectives over many groups (a search over several meshes) can fail when it runs "
                    "out: raise the hard limit (ulimit -Hn as root, or the scheduler's), or use fewer CPU devices "
                    "per task", limit, limit // per_group, every, per_group)


# How many groups of every device a job's open files should hold before the warning above: a
# search over 64 devices measured plans over ten meshes, some in two orders of their devices.
GLOO_GROUPS_WANTED = 16


def _inject_fault(cfg: DictConfig, rank: ranks.RankInfo, log: logging.Logger, *, before_start: bool) -> None:
    """``launcher.fault`` (the tests' failures): ``hang:N`` never joins; ``crash:N`` raises and
    ``abort:N`` aborts once joined."""
    kind, _, at = cfg.launcher.fault.partition(":")
    if kind not in ("hang", "crash", "abort") or int(at) != rank.process_id:
        return   # (slow:<node> is the preflight's)
    if before_start and kind == "hang":
        log.warning("launcher.fault=%s: this rank will never join", cfg.launcher.fault)
        while True:
            time.sleep(3600)
    if not before_start and kind in ("crash", "abort"):
        log.warning("launcher.fault=%s: injecting a %s", cfg.launcher.fault, kind)
        if kind == "abort":
            os.abort()  # dies like a segfaulting or XLA-aborted process: no Python cleanup
        raise RuntimeError(f"launcher.fault={cfg.launcher.fault}: injected crash")


def _compilation_cache(cfg: DictConfig, run_dir: Path, log: logging.Logger) -> None:
    """Turns JAX's persistent compilation cache on for this task (``launcher.compile_cache_dir``),
    before JAX is imported."""
    where = cfg.launcher.get("compile_cache_dir")
    if where == "off":
        os.environ["JAX_ENABLE_COMPILATION_CACHE"] = "false"   # an inherited JAX_COMPILATION_CACHE_DIR too
        log.info("JAX's persistent compilation cache: off (launcher.compile_cache_dir=off)")
        return
    where = where or os.environ.get("JAX_COMPILATION_CACHE_DIR") or str(run_dir / "jax_cache")
    env = jaxcompat.compilation_cache_env(cfg.cluster.accelerator, where)
    if not env:
        log.info("JAX's persistent compilation cache: off (the JAX in use cannot read CPU executables back "
                 "safely: launcher/jaxcompat.py)")
        return
    os.environ.update(env)
    log.info("JAX's persistent compilation cache: %s", where)


def _open_rank_log(run_dir: Path, rank: ranks.RankInfo, level: str, restart: str | None = None) -> logging.Logger:
    """Sends this process's stdout, stderr (XLA's C++ output included) and logging to its own
    file. A requeued job's ranks append to the same files, each restart marked by ``restart``."""
    path = status.rank_log(run_dir, rank.process_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", buffering=1)
    if restart:
        f.write(restart + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(f.fileno(), 1)
    os.dup2(f.fileno(), 2)
    faulthandler.enable(file=f, all_threads=True)  # a SIGABRT from XLA still leaves a traceback
    log = logging.getLogger("xlaunch.task")
    log.handlers.clear()
    handler = logging.StreamHandler(f)
    handler.setFormatter(logging.Formatter(f"%(asctime)s rank{rank.process_id} %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    return log


def _hear_interrupts() -> None:
    """SIGINT raises KeyboardInterrupt in this rank, as in any Python program started in a
    terminal: cluster=local cancels a job so (as submitit does), and the rank then says it was
    stopped. A launcher started by a non-interactive shell in the background (`nohup python -m
    launcher ... &`, a CI script) hands its ranks SIGINT ignored, which Python keeps: they were
    killed a few seconds later and read as died without a word."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _abort(log: logging.Logger, reporter: RankReporter, why: str, state: str = "stopped") -> None:
    # Called from the heartbeat thread: the main thread may be stuck inside a collective that
    # will never complete, so leave at once rather than raise.
    log.error("ending this rank because %s", why)
    reporter.set(state, why)
    for h in log.handlers:
        h.flush()
    os._exit(17)
