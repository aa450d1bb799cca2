"""The package as a user installs it: signatures/ and optimize/ import as trace_dspy.signatures /
trace_dspy.optimize from a built wheel and from the editable install; the wheel carries the default program
and runs it from any directory; the ``trace-dspy`` console script dispatches to the commands."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import committed_artifacts

from trace_dspy.store.shipped import SHIPPED_DEFAULT

REPO = Path(__file__).resolve().parents[1]
PROBE = (
    "import trace_dspy.signatures as s, trace_dspy.optimize as o, trace_dspy, importlib.util;"
    "print(s.__file__); print(o.__file__); print(trace_dspy.__file__);"
    "print(importlib.util.find_spec('signatures') is None, importlib.util.find_spec('optimize') is None)"
)


def _outside_paths() -> str:
    """sys.path without the checkout (pytest and ``python -m`` put it there)."""
    return ":".join(p for p in sys.path if p and not Path(p).resolve().is_relative_to(REPO))


def _probe(cwd: Path, extra_path: str | None = None) -> list[str]:
    env = {"PATH": "/usr/bin:/bin"}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _default_program_dir() -> str:
    """The checkout folder pyproject.toml maps to trace_dspy.default_program."""
    return _pyproject()["tool"]["setuptools"]["package-dir"]["trace_dspy.default_program"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of a copy of the checkout's package sources, built offline (no build isolation)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    # the package's folders, without the symlinked helper folders a worktree may hold inside trace_dspy/
    for folder in ("trace_dspy", "signatures", "optimize", _default_program_dir()):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"),
                        ignore_dangling_symlinks=True, symlinks=True)
    for link in (src / "trace_dspy").iterdir():
        if link.is_symlink():
            link.unlink()
    dist = tmp / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(dist), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (built,) = dist.glob("trace_dspy-*.whl")
    return built


@pytest.mark.slow
def test_wheel_maps_both_folders_under_trace_dspy(wheel, tmp_path):
    names = zipfile.ZipFile(wheel).namelist()
    assert "trace_dspy/signatures/stages.py" in names
    assert "trace_dspy/optimize/scorers.py" in names
    assert "trace_dspy/data/seed/seed_dialogues.jsonl" in names
    assert "trace_dspy/optimize/empathy_head.npz" in names  # the learned scorer's weights ship
    assert "trace_dspy/optimize/relevance_head.npz" in names  # and the relevance head's
    assert "trace_dspy/program/emotion_prior.npz" in names  # and the shipped emotion prior
    # and the default program, every file of its artifact folder
    shipped = {n.removeprefix("trace_dspy/default_program/") for n in names if n.startswith("trace_dspy/default_program/")}
    folder = REPO / _default_program_dir()
    assert shipped == {f.relative_to(folder).as_posix() for f in folder.rglob("*") if f.is_file()}
    assert "manifest.json" in shipped and "program.json" in shipped
    assert not any(n.startswith(("signatures/", "optimize/", "tests/")) for n in names)
    # every module of the checkout ships: a subpackage missing from pyproject's list would be left out silently
    for folder, prefix in (("trace_dspy", "trace_dspy/"), ("signatures", "trace_dspy/signatures/"),
                           ("optimize", "trace_dspy/optimize/")):
        for module in (REPO / folder).rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert prefix + module.relative_to(REPO / folder).as_posix() in names, module

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    sig, opt, pkg, no_top_level = _probe(tmp_path, extra_path=f"{site}:{_outside_paths()}")[:4]
    assert sig == str(site / "trace_dspy/signatures/__init__.py")
    assert opt == str(site / "trace_dspy/optimize/__init__.py")
    assert pkg == str(site / "trace_dspy/__init__.py")
    assert no_top_level == "True True"


def test_installed_package_resolves_the_mapped_folders(tmp_path):
    """Run from outside the checkout so only the installed finder can resolve the names."""
    sig, opt, pkg, no_top_level = _probe(tmp_path, extra_path=_outside_paths())[:4]
    if Path(pkg).parent == REPO / "trace_dspy":  # editable install of this checkout
        assert sig == str(REPO / "signatures/__init__.py")
        assert opt == str(REPO / "optimize/__init__.py")
    else:  # a regular install: the mapped folders sit inside the package
        assert Path(sig).parent == Path(pkg).parent / "signatures"
        assert Path(opt).parent == Path(pkg).parent / "optimize"
    assert no_top_level == "True True"


def test_the_packaged_program_is_the_checkouts_default(tmp_path, monkeypatch):
    """The wheel carries the program respond runs by default among the versions the repository ships (a new
    default compile must move pyproject.toml's mapping with it). A version the user compiled into the checkout
    does not count: it is not part of the repository."""
    from trace_dspy.store import artifacts
    from trace_dspy.workflows.loading import default_reference

    committed = committed_artifacts(tmp_path)
    if committed is None:
        pytest.skip("not a git checkout: which versions the repository ships is unknown")
    monkeypatch.setattr(artifacts, "CHECKOUT_ROOT", tmp_path / "no-checkout-artifacts")
    monkeypatch.setenv("TRACE_DSPY_ARTIFACTS", str(committed))
    default = default_reference()
    assert default.startswith("trace-dspy@v")
    number = int(default.removeprefix("trace-dspy@v"))
    assert f"artifacts/trace-dspy/v{number:04d}" == _default_program_dir()
    assert default == SHIPPED_DEFAULT  # what the notice of a newer local default names as the packaged one
    assert _pyproject()["project"]["scripts"] == {"trace-dspy": "trace_dspy.cli.main:main"}


# What an installed user runs, with every model replaced by a fake: the default program and the install hint.
LOAD_PROBE = """
import json, trace_dspy
from trace_dspy.core.extras import install_hint
from trace_dspy.lm import specs
from trace_dspy.testing.fakes import fake_lm

lm, engine = fake_lm(lambda outputs, inputs: {"response": "That is great news!"} if "response" in outputs else {})
specs.build_lm = lambda spec: lm
program = trace_dspy.load()
reply = program(dialogue="Speaker: I got the job!!").response
print(json.dumps({"package": trace_dspy.__file__, "reply": reply, "stages": engine.stage_order(),
                  "hint": install_hint("embed")}))
"""


def _borrow_site_packages(python: Path) -> None:
    """Let the new venv at ``python`` import pip and the dependencies (every extra) from the interpreter running
    the tests, whether that is a system Python or the user's own venv (``--system-site-packages`` would reach only
    the base interpreter, which a venv user's packages are not in).

    A ``.pth`` file of plain folder lines appends them to ``sys.path`` after the venv's own site-packages, so the
    wheel's files come first; the ``.pth`` files inside those folders are not run, so an editable install of this
    checkout stays out of the way.
    """
    import site

    outer = [p for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()]
    own = subprocess.run([python, "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    Path(own).mkdir(parents=True, exist_ok=True)
    (Path(own) / "zz_borrowed_dependencies.pth").write_text("".join(f"{p}\n" for p in outer))


@pytest.mark.slow
def test_the_installed_wheel_runs_the_packaged_default_from_any_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python, script = venv / "bin/python", venv / "bin/trace-dspy"
    _borrow_site_packages(python)
    install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(REPO / "tests/fake_cli.py", work / "fake_cli.py")
    # no PYTHONPATH and a working directory outside the checkout: only the installed package can be imported
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRACE_DSPY_CACHE": str(tmp_path / "cache")}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=work, env=env, capture_output=True, text=True, timeout=300)

    probe = run(python, "-c", LOAD_PROBE)
    assert probe.returncode == 0, probe.stderr
    loaded = json.loads(probe.stdout.splitlines()[-1])
    site = Path(loaded["package"]).parent
    assert site.is_relative_to(venv) and not site.is_relative_to(REPO)
    assert loaded["reply"] == "That is great news!"
    assert loaded["stages"][:3] == ["recognize_emotion", "analyze_cause", "plan_strategy"]
    assert "running the compiled program shipped in the package (trace-dspy@v6)" in probe.stderr
    assert loaded["hint"] == f'pip install "{wheel}[embed]"'  # not the checkout's pip install -e ".[embed]"

    helped = run(script, "--help")
    assert helped.returncode == 0
    assert all(f"  {name} " in helped.stdout for name in ("respond", "inspect", "fit_tone", "bench", "bench_local"))
    tone = run(script, "fit_tone", "--help")
    assert tone.returncode == 0 and tone.stdout.startswith("usage: trace-dspy fit_tone "), tone.stderr
    shown = run(script, "inspect", site / "default_program")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("trace-dspy@v6")

    answered = run(python, "fake_cli.py", "trace_dspy.cli.main", "respond", "I failed my driving test again.")
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip() == "heard: I failed my driving test again."
    assert "running the compiled program shipped in the package (trace-dspy@v6)" in answered.stderr

    # a package without its program data falls back to the uncompiled program, and says so
    shutil.rmtree(site / "default_program")
    fallback = run(python, "fake_cli.py", "trace_dspy.respond", "I failed my driving test again.")
    assert fallback.returncode == 0, fallback.stderr
    assert fallback.stdout.strip() == "heard: I failed my driving test again."
    assert "no compiled program found" in fallback.stderr and "running the uncompiled program" in fallback.stderr
    assert sorted(p.name for p in work.iterdir()) == ["fake_cli.py"]  # nothing written where it ran


def test_console_script_lists_the_commands_and_runs_them(monkeypatch, capsys):
    import trace_dspy.lm.specs as lms_module
    from trace_dspy.cli.main import COMMANDS, main
    from trace_dspy.testing.fakes import fake_lm

    assert set(COMMANDS) == {"respond", "chat", "compile", "evaluate", "inspect", "fit_prior", "fit_empathy",
                             "fit_relevance", "fit_tone", "metric_validity", "bench", "bench_local"}
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trace-dspy COMMAND") and all(f"  {name} " in out for name in COMMANDS)
    assert main([]) == 2 and "usage: trace-dspy" in capsys.readouterr().err
    assert main(["nope"]) == 2 and "unknown command 'nope'" in capsys.readouterr().err
    # a subcommand is its python -m command: same options, output and exit code
    assert main(["inspect", "--help"]) == 0 and "--artifacts-dir" in capsys.readouterr().out
    lm, _ = fake_lm(lambda outputs, inputs: {"response": "heard you"} if "response" in outputs else {})
    monkeypatch.setattr(lms_module, "build_lm", lambda spec: lm)
    assert main(["respond", "I lost my keys."]) == 0
    assert capsys.readouterr().out.strip() == "heard you"
    assert main(["respond", "--threads", "0", "hi"]) == 2
    assert "at least 1" in capsys.readouterr().err


def test_install_hint_names_the_checkouts_command(monkeypatch):
    import trace_dspy.core.extras as extras

    extras.install_hint.cache_clear()
    assert extras.install_hint("embed") == 'pip install -e ".[embed]"'  # this checkout
    monkeypatch.setattr(extras, "from_checkout", lambda: False)
    monkeypatch.setattr(extras, "_installed_from_file", lambda: None)
    extras.install_hint.cache_clear()
    try:
        assert extras.install_hint("embed") == 'pip install "trace-dspy[embed]"'  # from an index
    finally:
        extras.install_hint.cache_clear()


def test_every_package_folder_is_listed_for_the_wheel():
    # a new subpackage missing from [tool.setuptools] packages is left out of the wheel (and an installed
    # program that imports it fails), while the editable install still finds it
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    root = REPO / "trace_dspy"
    folders = {".".join(("trace_dspy", *p.parent.relative_to(root).parts)) for p in root.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert folders - listed == set()
    # each with modules to import is a regular package (a folder without __init__.py imports as a namespace
    # package); a launcher folder holds only its __main__.py
    modules = {".".join(("trace_dspy", *p.parent.relative_to(root).parts)) for p in root.rglob("*.py")
               if "__pycache__" not in p.parts and p.name != "__main__.py"}
    assert all((root.joinpath(*f.split(".")[1:]) / "__init__.py").is_file() for f in modules)
