"""What each layer may do: core/ records no MLflow itself, one split rule, one warn-once."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_core_makes_no_mlflow_calls():
    for path in sorted((ROOT / "trace_dspy" / "core").glob("*.py")):
        assert not _imports(path) & {"mlflow", "opentelemetry"}, path.name
        assert "mlflow." not in path.read_text(), path.name


def test_the_prior_and_the_compile_split_the_pool_alike():
    from trace_dspy.data.sources import load_splits, resolve_source, select_view, split_pool

    source = resolve_source(None, announce_seed=False)
    for seed in (0, 3):
        train, dev = split_pool(source, seed=seed)
        splits = load_splits(source, seed=seed)
        assert [s.dialogue for s in select_view(dev, "longest")] == [e.dialogue for e in splits.dev]
        assert [s.dialogue for s in select_view(train, "longest")] == [e.dialogue for e in splits.train]
        assert not {s.split_key for s in train} & {s.split_key for s in dev}


def test_warn_once_logs_each_key_once(monkeypatch, caplog):
    from trace_dspy.core import console

    monkeypatch.setattr(console, "_WARNED", set())
    log = logging.getLogger("trace_dspy.test_layers")
    with caplog.at_level(logging.WARNING):
        assert console.warn_once(log, ("k", 1), "%s happened", "this")
        assert not console.warn_once(log, ("k", 1), "%s happened", "again")
        assert console.warn_once(log, "other", "other")
    assert [r.getMessage() for r in caplog.records] == ["this happened", "other"]
