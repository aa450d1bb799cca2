"""README and CI agree: .ci/run runs exactly the README's test command."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci/run").read_text()
    setup = [line for line in readme.splitlines() if line.startswith("pip install -e") and "pytest" in line]
    assert len(setup) == 1, "README needs exactly one install-and-test command"
    test_command = setup[0].split("&&", 1)[1].strip()
    assert test_command.startswith("python -m pytest")
    ci_commands = [line.strip() for line in ci.splitlines() if "pytest" in line and not line.lstrip().startswith("#")]
    assert ci_commands == [test_command]


def test_ci_installs_every_extra():
    import tomllib

    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    ci = (REPO / ".ci/run").read_text()
    installed = ci.split('pip install -q -e ".[', 1)[1].split("]", 1)[0].split(",")
    assert set(installed) == extras
