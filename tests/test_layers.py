"""The package's import graph points one way: read every module's imports, lazy ones included.

Layers, bottom to top (a module may import its own layer, without cycles, and any layer below):

    core < signatures < lm < data < optimize < compact < program < store < workflows < testing < bench < cli
    < launchers
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = {"trace_dspy": REPO / "trace_dspy", "trace_dspy.signatures": REPO / "signatures",
         "trace_dspy.optimize": REPO / "optimize"}
LAYERS = ["core", "signatures", "lm", "data", "optimize", "compact", "program", "store", "workflows", "testing", "bench",
          "cli"]
# The one module outside the compact writer's package that may import it: the writer switch.
COMPACT_GATE = "trace_dspy.program.writers"
TOP = len(LAYERS)  # the package root, its launchers and trace_dspy.inspect


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for package, folder in ROOTS.items():
        for path in sorted(folder.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join([package, *parts])] = path
    return mods


MODULES = _modules()


def imports_of(name: str, path: Path) -> set[str]:
    """The trace_dspy modules ``name`` imports anywhere in its body (top level, functions, branches)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names if f"{module}.{alias.name}" in MODULES)
    resolved = set()
    for module in found:
        if not (module == "trace_dspy" or module.startswith("trace_dspy.")):
            continue
        while module not in MODULES and "." in module:
            module = module.rsplit(".", 1)[0]
        if module != name:
            resolved.add(module)
    return resolved


GRAPH = {name: imports_of(name, path) for name, path in MODULES.items()}


def layer(name: str) -> int:
    parts = name.split(".")
    if parts[-1] == "__main__":  # a package's launcher, as trace_dspy.inspect and trace_dspy.bench have
        return TOP
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return TOP


def test_the_graph_is_read_from_every_module():
    # a walker that silently skipped folders or lazy imports would pass everything below
    assert {"trace_dspy.core.config", "trace_dspy.signatures.stages", "trace_dspy.optimize.metric",
            "trace_dspy.cli.compile", "trace_dspy.inspect.__main__", "trace_dspy.bench.__main__"} <= set(MODULES)
    assert "trace_dspy.cli.compile" in GRAPH["trace_dspy.compile"]
    assert "trace_dspy.store.registry" in GRAPH["trace_dspy.store.artifacts"]  # a lazy import inside a function
    assert all(layer(name) < TOP for name in MODULES if name.startswith("trace_dspy.optimize"))


def test_no_module_imports_a_higher_layer():
    upward = sorted(f"{a} -> {b}" for a, targets in GRAPH.items() for b in targets if layer(b) > layer(a))
    assert upward == []


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(GRAPH[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_only_the_writer_switch_imports_the_compact_writer():
    inside = {name for name in MODULES if name.startswith("trace_dspy.compact")}
    assert {"trace_dspy.compact.writer", "trace_dspy.compact.scaffold", "trace_dspy.compact.openers"} <= inside
    importers = sorted(name for name, targets in GRAPH.items() if name not in inside and targets & inside)
    assert importers == [COMPACT_GATE]


def test_commands_never_import_commands():
    for name, targets in GRAPH.items():
        if name.startswith("trace_dspy.cli.") and name != "trace_dspy.cli.common":
            others = {t for t in targets if t.startswith("trace_dspy.cli.") and t != "trace_dspy.cli.common"}
            assert not others, f"{name} imports {sorted(others)}"


LAUNCHERS = sorted(n for n in MODULES if layer(n) == TOP and n.count(".") >= 1)
COMMANDS = sorted(n.removesuffix(".__main__").split(".", 1)[1] for n in LAUNCHERS)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_launchers_are_one_import_of_their_command(name):
    assert GRAPH[name] and all(t.startswith("trace_dspy.cli.") and t != "trace_dspy.cli.common" for t in GRAPH[name])
    assert len(GRAPH[name]) == 1


def test_the_checker_catches_an_upward_and_a_cyclic_import(tmp_path):
    # the rules themselves, on a made-up module that imports a command and the package that imports it back
    fake = tmp_path / "fake.py"
    fake.write_text("def f():\n    from trace_dspy.cli.compile import main\n    from .jsonl import atomic_write_json\n")
    found = imports_of("trace_dspy.core.fake", fake)
    assert found == {"trace_dspy.cli.compile", "trace_dspy.core.jsonl"}
    assert layer("trace_dspy.cli.compile") > layer("trace_dspy.core.fake")


def test_every_command_starts_under_python_m():
    """``python -m trace_dspy.<command> --help`` for every launcher; a module shadowed by a package would fail."""
    import subprocess
    import sys

    assert {"compile", "evaluate", "respond", "chat", "inspect", "bench", "bench_local"} <= set(COMMANDS)
    script = (
        "import runpy, sys\n"
        "for command in sys.argv[1:]:\n"
        "    sys.argv = ['x', '--help']\n"
        "    try:\n"
        "        runpy.run_module('trace_dspy.' + command, run_name='__main__', alter_sys=True)\n"
        "    except SystemExit as exc:\n"
        "        assert exc.code in (0, None), (command, exc.code)\n"
        "    else:\n"
        "        raise AssertionError(command + ' did not exit')\n"
        "    print('ok', command, file=sys.stderr)\n"
    )
    run = subprocess.run([sys.executable, "-c", script, *COMMANDS], capture_output=True, text=True, timeout=300,
                         cwd=REPO.parent)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("ok ") == len(COMMANDS)
