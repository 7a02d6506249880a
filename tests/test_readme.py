"""The README's two set-up commands are the ones that work: CI runs the README's test command."""

import re

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
