"""The README's two set-up commands are the ones that work: CI runs the README's test command; and
the package's public imports are the ones the README and docs/ show."""

import json
import re
import subprocess
import sys

from tests.launch import REPO


def _commands(text: str) -> list[str]:
    return re.findall(r"```bash\n([^\n]+)\n```", text)


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    first_two = _commands(readme)[:2]
    assert first_two[0] == "pip install -e . && python -m launcher"
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert first_two[1] in ci, f"{first_two[1]!r} is not a line of .ci/run"


def test_the_readme_shows_the_resume_example_as_it_is():
    readme = (REPO / "README.md").read_text()
    shown = re.search(r"`examples/resume.py`, whole:\n\n```python\n(.*?)```", readme, re.S).group(1)
    source = (REPO / "examples" / "resume.py").read_text()
    assert shown.startswith("import ") and source.endswith(shown)  # all of it but the module's docstring


# ---------------------------------------------------------------------------------------------
# The public API: every import the README and docs/ show works as written; the imports earlier
# releases documented still work, with a DeprecationWarning; `import launcher` starts no JAX.

# The imports earlier releases documented, and the name each must give.
OLD_IMPORTS = {
    "from launcher.cfp.autoshard import autoshard, AutoPlan": ("autoshard", "AutoPlan"),
    "from launcher.sharding.autoshard import autoshard, AutoPlan": ("autoshard", "AutoPlan"),
    "import launcher.cfp.autoshard; launcher.cfp.autoshard.Step": ("Step",),
    "import launcher.sharding.autoshard; launcher.sharding.autoshard.Step": ("Step",),
}

_CHECK = r"""
import json, sys, warnings
statements, old = json.loads(sys.argv[1]), json.loads(sys.argv[2])
import launcher
out = {"jax_on_import": "jax" in sys.modules, "failed": {}, "warned": {}, "old": {}}
for statement in statements:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            exec(statement, {})
        except Exception as e:
            out["failed"][statement] = repr(e)
    out["warned"][statement] = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
for statement, names in old.items():
    scope = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(statement.split(";")[0], scope)
        values = [eval(statement.split("; ")[1], scope)] if ";" in statement else [scope[n] for n in names]
    out["old"][statement] = {"same": all(v is getattr(launcher, n) for v, n in zip(values, names)),
                             "warned": [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]}
print(json.dumps(out))
"""


def _documented() -> tuple[list[str], list[str]]:
    """The package's imports in the Python code blocks of README.md and docs/, as written, and
    the ``launcher.<name>(`` calls their text shows."""
    imports, calls = [], set()
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        for block in re.findall(r"```python\n(.*?)```", text, re.S):
            imports += [m.strip() for m in re.findall(r"^\s*((?:from launcher[\w.]* import [\w, ]+)|(?:import launcher[\w.]*))",
                                                      block, re.M)]
        calls |= set(re.findall(r"\blauncher\.([A-Za-z_]\w*)\(", text))
    return imports, sorted(calls)


def test_every_import_the_readme_and_docs_show_works_and_the_old_ones_warn():
    imports, calls = _documented()
    assert "from launcher import autoshard" in imports and "import launcher" in imports
    statements = [*imports, *(f"import launcher; launcher.{name}" for name in calls)]
    proc = subprocess.run([sys.executable, "-c", _CHECK, json.dumps(statements), json.dumps(OLD_IMPORTS)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert not out["jax_on_import"]   # the CLI and the tasks import the package before devices are set
    assert out["failed"] == {}
    assert not any(out["warned"].values()), out["warned"]
    for statement, got in out["old"].items():
        assert got["same"], statement
        assert got["warned"] and all("is deprecated; write `from launcher import " in w for w in got["warned"]), got
