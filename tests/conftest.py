"""Session fixtures for real cluster software: a local SLURM and a container image.

Each starts once per test session, and only if a test asks for it. If the software is missing
or does not start, the fixture fails with the reason (a skipped infrastructure test would look
like a passing one). Implementations: tests/clusterkit/.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from launcher import jaxcompat

# One JAX persistent compilation cache for the session, in a fresh folder removed at its end: the
# suite compiles the same steps in many tests and in their jobs' processes (a tiny model under a
# built-in plan, a profiled segment), and each is compiled once and read back after (the
# train-mode and profile-shortcut tests: 126 s without, 106 s with it, here). Set before JAX is
# imported (jaxcompat imports none); the xdist workers and the jobs the tests start inherit it.
# The first pytest process (xdist's controller, or the only one) makes it. Not where JAX's CPU
# executables do not survive the cache (jaxcompat.cpu_compilation_cache_works).
_OWN_CACHE = "XLAUNCH_TEST_COMPILATION_CACHE" not in os.environ and jaxcompat.cpu_compilation_cache_works()
if _OWN_CACHE:
    os.environ["XLAUNCH_TEST_COMPILATION_CACHE"] = tempfile.mkdtemp(prefix="xlaunch-test-jax-cache-")
if os.environ.get("XLAUNCH_TEST_COMPILATION_CACHE"):
    os.environ.update(JAX_COMPILATION_CACHE_DIR=os.environ["XLAUNCH_TEST_COMPILATION_CACHE"],
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

# One cache of measured link models for the session (launcher/sharding/predict/price.py: every
# search's race is priced on its devices' link model, measured once per kind of devices), in a
# fresh folder removed at its end: the suite's searches measure each of their few device
# arrangements once, not once per test, and never write to the user's ~/.cache.
_OWN_LINKS = "XLAUNCH_CACHE_DIR" not in os.environ
if _OWN_LINKS:
    os.environ["XLAUNCH_CACHE_DIR"] = tempfile.mkdtemp(prefix="xlaunch-test-cache-")

# Compiling is most of the suite's time on CPU devices, and two of XLA's settings change a
# program's speed, not its results: its backend's (LLVM's) optimisations, and, where this jaxlib
# has the flag (0.10.2; not 0.4.35, whose XLA would end the process on it:
# jaxcompat.known_xla_flags), XLA:CPU's newer MLIR fusion emitters, which compile the same fusions
# slower than the LLVM IR emitters before them. Both off for the session's processes and the jobs
# they start (which inherit the environment), as tests/test_plans.py's workers had them: a moe-tiny
# train job compiled in 5.7 s with the optimisations, 3.8 s without; every plan's losses on LLaMA
# took 49 s on 0.10.2 with the new emitters, 30 s with the old, to the same losses (docs/testing.md).
# Tests that time plans against each other compare them under the same flags; benchmarks
# (bench/) keep XLA's defaults. The first pytest process decides; the workers inherit it.
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
if "XLAUNCH_TEST_XLA_FLAGS" not in os.environ:
    _given = os.environ.get("XLA_FLAGS", "")
    os.environ["XLAUNCH_TEST_XLA_FLAGS"] = " ".join(
        jaxcompat.known_xla_flags([f for f in FAST_COMPILE if f.split("=")[0] not in _given]))
    os.environ["XLA_FLAGS"] = f"{_given} {os.environ['XLAUNCH_TEST_XLA_FLAGS']}".strip()

from tests.clusterkit.image import ensure_image
from tests.clusterkit.slurm import LocalSlurm

# In-process JAX tests share one backend whose device count cannot change once it starts, so
# it is fixed here, before any test module touches it: 8 virtual CPU devices.
jaxcompat.set_cpu_device_count(8)


# The outside HLO conformance suite (the XLA authors' modules) lives beside the checkout, not in
# it: tests/test_hlo_replay_fixtures.py runs where it exists (this machine, CI); elsewhere that
# file is not collected (not skipped: nothing there was tried) and the run says so in one line.
XLA_HLO_SUITE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "xla_hlo"
XLA_HLO_TESTS = "test_hlo_replay_fixtures.py"


class _Absent(pytest.File):
    def collect(self):
        return []


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name == XLA_HLO_TESTS and not XLA_HLO_SUITE.is_dir():
        return _Absent.from_parent(parent, path=module_path)
    return None


def pytest_unconfigure(config):
    if _OWN_CACHE:
        shutil.rmtree(os.environ["XLAUNCH_TEST_COMPILATION_CACHE"], ignore_errors=True)
    if _OWN_LINKS:
        shutil.rmtree(os.environ["XLAUNCH_CACHE_DIR"], ignore_errors=True)


def _paths_asked(config) -> list[Path]:
    return [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]


def _asked_for_the_suite_alone(config) -> bool:
    return all(path.name == XLA_HLO_TESTS for path in _paths_asked(config))


def pytest_terminal_summary(terminalreporter, config):
    # Under xdist the workers collect, not this process: the paths asked for tell instead.
    suite_tests = Path(__file__).parent / XLA_HLO_TESTS
    if not XLA_HLO_SUITE.is_dir() and any(suite_tests.is_relative_to(p) for p in _paths_asked(config)):
        terminalreporter.write_line(f"HLO conformance suite not found (looked in {XLA_HLO_SUITE}): "
                                    f"tests/{XLA_HLO_TESTS} not collected")


def pytest_sessionfinish(session, exitstatus):
    # Asked for the conformance suite alone where it is absent: nothing ran, nothing failed.
    if (exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and not XLA_HLO_SUITE.is_dir()
            and _asked_for_the_suite_alone(session.config)):
        session.exitstatus = pytest.ExitCode.OK


# Under xdist (pyproject.toml: two workers) every worker makes its own module fixtures and
# runs its own copy of what tests share through a module: tests that share something costly
# therefore go to one worker, as one unit. The scheduler sees only test ids, so the units are
# named by file: each module with module-scoped fixtures (compiled layouts, searches, worker
# processes), and the modules that reuse the uninterrupted training run tests/train_reference.py
# makes once per process (tests/test_lint.py checks both lists against the files). Every other
# test is a unit of its own. SLURM needs no unit: each worker's cluster has its own ports and folder.
MODULE_FIXTURES = {"test_autoshard.py", "test_autoshard_budget.py", "test_autoshard_state.py", "test_cfp_layouts.py",
                   "test_cfp_search.py", "test_cfp_workloads.py", "test_hlo_replay.py", "test_hlo_replay_fixtures.py",
                   "test_plans.py", "test_ray.py", "test_sweep.py"}
TRAIN_REFERENCE = {"test_checkpoint.py", "test_requeue.py", "test_restart.py", "test_trace.py"}


class SharedWork(LoadScopeScheduling):
    def _split_scope(self, nodeid: str) -> str:
        module = Path(nodeid.split("::", 1)[0]).name
        if module in TRAIN_REFERENCE:
            return "train_reference"
        return module if module in MODULE_FIXTURES else nodeid


def pytest_xdist_make_scheduler(config, log):
    return SharedWork(config, log)


# Longest first. xdist hands out the units with the most tests first, then the others in the order
# collected: left alone, the heavy stage's units (each of one test) started in file order, and its
# Optuna search, in test_sweep.py, began last and ran about 3 minutes alone after the other worker
# had finished (docs/testing.md). So the tests measured at 80 s or more in the heavy stage are
# collected first, longest first (test_lint.py checks that each names a test).
START_FIRST = (
    "tests/test_cfp_search.py::test_two_processes_agree_and_the_saved_plan_trains",   # [every-mesh]: 190 s
    "tests/test_sweep.py::test_a_2_trial_optuna_search_of_the_default_job",            # 161 s
    "tests/test_bench_accelerator.py::test_the_cpu_sequence_takes_every_figure_the_gpu_run_takes",   # 132 s
    "tests/test_scale.py::test_a_traced_job_costs_the_run_dir_the_same_per_rank_at_4_and_12_ranks",  # 119 s
    "tests/test_cfp_ilp.py::test_mode_search_with_the_ilp_writes_a_plan_measured_against_baselines",  # 81 s
)


def pytest_collection_modifyitems(config, items):
    first = {name: k for k, name in enumerate(START_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid.split("[", 1)[0], len(first)))   # stable: the rest keep their order


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

