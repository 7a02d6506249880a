"""Installing xlaunch: a wheel works wherever it is installed, and installing never changes the
platform's JAX (where jax 0.4.35 is installed, LUMI's container, pip keeps it and picks the rest
of xlaunch's dependencies to suit it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv

import pytest

from launcher.jaxcompat import MINIMUM
from tests.launch import REPO
import tomllib
from launcher import jaxcompat
from launcher.errors import UserError

OLDEST = ".".join(map(str, MINIMUM))


@pytest.mark.heavy  # a virtual environment and a wheel installed into it
def test_installing_xlaunch_keeps_the_jax_that_is_there(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", f"jax=={OLDEST}", f"jaxlib=={OLDEST}"], check=True, timeout=600)

    report = tmp_path / "report.json"
    subprocess.run([*pip, "install", "--dry-run", "--report", str(report), str(REPO)], check=True, timeout=600)
    planned = {item["metadata"]["name"].lower(): item["metadata"]["version"]
               for item in json.loads(report.read_text())["install"]}
    assert "xlaunch" in planned and "optax" in planned  # the resolution really ran
    assert "jax" not in planned and "jaxlib" not in planned, f"pip would replace jax {OLDEST}: {planned}"

    found = subprocess.run([python, "-c", "import jax, jaxlib; print(jax.__version__, jaxlib.__version__)"],
                           capture_output=True, text=True, check=True).stdout.split()
    assert found == [OLDEST, OLDEST]


def test_the_declared_range_has_no_upper_bound_and_no_jaxlib_pin():

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    jax_deps = [d for d in deps if d.replace(" ", "").startswith(("jax>", "jax=", "jax<", "jaxlib"))]
    assert jax_deps == [f"jax>={OLDEST}"]


def test_an_older_jax_is_refused_with_the_version_and_the_range():

    jaxcompat.check_version(OLDEST)
    jaxcompat.check_version("0.11.1")
    with pytest.raises(UserError) as e:
        jaxcompat.check_version("0.4.30")
    assert "jax 0.4.30" in str(e.value) and f">={OLDEST}" in str(e.value)


def test_the_suites_compilation_cache_is_used_only_where_cpu_executables_survive_it():
    assert not jaxcompat.cpu_compilation_cache_works("0.4.35")   # read back, a step crashed it
    assert jaxcompat.cpu_compilation_cache_works("0.10.2")
    # tests/conftest.py set the session's cache where the JAX here allows it, and none elsewhere.
    assert bool(os.environ.get("XLAUNCH_TEST_COMPILATION_CACHE")) == jaxcompat.cpu_compilation_cache_works()


def test_the_suites_compile_flags_are_those_this_jaxlib_knows():
    # XLA ends a process on a flag it does not know: a made-up one is left out, a real one kept.
    assert jaxcompat.known_xla_flags(["--xla_backend_optimization_level=0", "--xla_no_such_flag=true"]) == \
        ["--xla_backend_optimization_level=0"]
    # tests/conftest.py gave the session, and every process it starts, those of FAST_COMPILE this
    # jaxlib knows: the fusion emitters' flag where it was tried and found (0.10.2), not on 0.4.35.
    session = os.environ["XLAUNCH_TEST_XLA_FLAGS"].split()
    assert "--xla_backend_optimization_level=0" in session and all(f in os.environ["XLA_FLAGS"] for f in session)
    emitters = {"0.4.35": False, "0.10.2": True}.get(jaxcompat.installed_version())
    assert emitters is None or ("--xla_cpu_use_fusion_emitters=false" in session) == emitters


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wheel_runs_from_anywhere_with_its_config_groups_and_the_users_own(tmp_path):
    # The wheel is built from a copy of what it is made of (a build in the checkout would leave
    # build/ there); the links launcher/models and launcher/conf travel as links.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("launcher", "models", "conf"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)],
                   check=True, timeout=300)
    (wheel,) = wheels.glob("xlaunch-*.whl")
    # jax, hydra, submitit... come from the system site; xlaunch from the wheel alone.
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    subprocess.run([python, "-m", "pip", "--disable-pip-version-check", "-q", "install", "--no-deps", str(wheel)],
                   check=True, timeout=300)

    empty = tmp_path / "empty"  # a user's directory: no conf/, no source tree
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(args, cwd=empty, env=env, capture_output=True, text=True, timeout=300)
        assert not check or proc.returncode == 0, proc.stderr
        return proc

    where = run(python, "-c", "import launcher; print(launcher.__file__)").stdout.strip()
    assert where.startswith(str(env_dir)), where  # the wheel's copy, not a checkout's
    assert "ModuleNotFoundError" in run(python, "-c", "import models", check=False).stderr  # no generic name
    # The quick health check for real, then a dry run of another mode, from the empty directory.
    check = run(python, "-m", "launcher", "mode=check", "cluster.cpu_devices_per_task=2", "mode.allgather_mb=0.25")
    assert check.stdout.startswith("check: 4 cpu devices in 2 processes") and "psum ok" in check.stdout
    (result,) = empty.glob("outputs/*/*-check-local/result.json")
    assert json.loads(result.read_text())["psum_ok"] is True
    run(python, "-m", "launcher", "mode=train", "model=llama2-tiny", "launcher.dry_run=true")
    assert list(empty.glob("outputs/*/*-train-local/submission.txt"))
    # The console script, its help and its commands.
    xlaunch = str(env_dir / "bin" / "xlaunch")
    assert run(xlaunch, "--help").stdout.startswith("xlaunch: ")
    assert "check  local" in run(xlaunch, "runs").stdout
    # A user's own config dir adds options to the groups: --config-dir and hydra.searchpath.
    mine = tmp_path / "myconf"
    (mine / "model").mkdir(parents=True)
    (mine / "model" / "mine.yaml").write_text("defaults:\n  - gpt-tiny\n  - _self_\nbatch_size: 24\n")
    for how in (["--config-dir", str(mine)], [f"hydra.searchpath=[file://{mine}]"]):
        cfg = run(python, "-m", "launcher", *how, "model=mine", "--cfg", "job").stdout
        assert "batch_size: 24" in cfg and "seq_len: 32" in cfg  # its own field over gpt-tiny's
        assert "mine" in run(python, "-m", "launcher", *how, "--help").stdout
