"""Installing xlaunch never changes the platform's JAX: where jax 0.4.35 is installed (LUMI's
container), pip keeps it and picks the rest of xlaunch's dependencies to suit it."""

from __future__ import annotations

import json
import subprocess
import venv

import pytest

from launcher.jaxcompat import MINIMUM
from tests.launch import REPO

OLDEST = ".".join(map(str, MINIMUM))


@pytest.mark.slow
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
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    jax_deps = [d for d in deps if d.replace(" ", "").startswith(("jax>", "jax=", "jax<", "jaxlib"))]
    assert jax_deps == [f"jax>={OLDEST}"]


def test_an_older_jax_is_refused_with_the_version_and_the_range():
    from launcher import jaxcompat
    from launcher.errors import UserError

    jaxcompat.check_version(OLDEST)
    jaxcompat.check_version("0.11.1")
    with pytest.raises(UserError) as e:
        jaxcompat.check_version("0.4.30")
    assert "jax 0.4.30" in str(e.value) and f">={OLDEST}" in str(e.value)
