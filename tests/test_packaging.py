"""signatures/ and optimize/ import as trace_dspy.signatures / trace_dspy.optimize,
from a built wheel and from the editable install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_wheel_maps_both_folders_under_trace_dspy(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in ("trace_dspy", "signatures", "optimize"):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = dist.glob("trace_dspy-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "trace_dspy/signatures/stages.py" in names
    assert "trace_dspy/optimize/scorers.py" in names
    assert "trace_dspy/data/seed/seed_dialogues.jsonl" in names
    assert "trace_dspy/optimize/empathy_head.npz" in names  # the learned scorer's weights ship
    assert "trace_dspy/optimize/relevance_head.npz" in names  # and the relevance head's
    assert "trace_dspy/program/emotion_prior.npz" in names  # and the shipped emotion prior
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
