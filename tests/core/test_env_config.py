"""The environment variables are named in one module, and the config tables are typed with one set of defaults."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from trace_dspy.core import env
from trace_dspy.core.config import ConfigError, DataConfig, TracingConfig, check_tables
from trace_dspy.workflows.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
CODE = [p for d in ("trace_dspy", "signatures", "optimize") for p in (ROOT / d).rglob("*.py")
        if d != "trace_dspy" or p.relative_to(ROOT / d).parts[0] not in ("signatures", "optimize")]
NAME = re.compile(r"TRACE_DSPY_[A-Z_]+")


def test_every_variable_is_listed_with_a_description():
    named = {m for p in CODE for m in NAME.findall(p.read_text())}
    named |= {m for p in (ROOT / "tests").rglob("*.py") for m in NAME.findall(p.read_text())}
    assert named - set(env.VARIABLES) == set()
    assert all(len(description) > 10 for description in env.VARIABLES.values())


def test_no_module_but_env_spells_a_variable_name_as_a_string():
    spelled = []
    for path in CODE:
        if path == ROOT / "trace_dspy" / "core" / "env.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in env.VARIABLES:
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert spelled == []


def test_readers(tmp_path, monkeypatch):
    environ = {env.THREADS: " 3 ", env.TIMEOUT: "soon", env.DATA: "", env.TRUST_ARTIFACT_LM: "Yes"}
    assert env.value(env.THREADS, environ) == " 3 " and env.text(env.THREADS, environ) == "3"
    assert env.value(env.DATA, environ) is None and env.value(env.LM, environ) is None
    assert env.number(env.THREADS, environ) == 3.0 and env.number(env.LM, environ) is None
    assert env.number(env.TIMEOUT, environ) != env.number(env.TIMEOUT, environ)  # NaN: not a number
    assert env.flag(env.TRUST_ARTIFACT_LM, environ) and not env.flag(env.LM_CACHE, environ)
    monkeypatch.setenv(env.CACHE, str(tmp_path))
    assert env.cache_dir("index") == tmp_path / "index"
    monkeypatch.delenv(env.CACHE)
    assert env.cache_dir("index") == Path.home() / ".cache" / "trace-dspy" / "index"


def test_data_and_tracing_tables():
    assert DataConfig() == DataConfig(None, 16, 16, 8)
    assert DataConfig.from_dict({"source": "x", "dev": 4}) == DataConfig("x", 16, 4, 8)
    with pytest.raises(ConfigError, match=r"\[data\] unknown keys: src; use source, train, dev, val"):
        DataConfig.from_dict({"src": "x"})
    assert TracingConfig.from_dict({"enabled": True}).enabled and not TracingConfig.from_dict(None).enabled
    for bad in ({"enabled": "yes"}, {"on": True}):
        with pytest.raises(ConfigError, match=r"\[tracing\] takes one key"):
            TracingConfig.from_dict(bad)
    with pytest.raises(ConfigError, match=r"cfg.toml: unknown table\(s\) extra"):
        check_tables({"extra": {}}, "cfg.toml")


def test_settings_types_the_tables_and_flags_win():
    settings = Settings(raw={"data": {"source": "table", "train": 3}, "tracing": {"enabled": True},
                             "metric": {"judge": 0.1}, "optimizer": {"name": "labeled", "max_labeled_demos": 5}})
    assert settings.data == DataConfig("table", 3, 16, 8) and settings.tracing.enabled
    assert settings.data_source(None) == "table" and settings.data_source("flag") == "flag"
    assert settings.metric().judge == 0.1
    optimizer = settings.optimizer(max_labeled_demos=None, name="bootstrap")
    assert (optimizer.name, optimizer.max_labeled_demos) == ("bootstrap", 5)
    assert Settings().data == DataConfig() and Settings().metric().judge == 0.0
    with pytest.raises(ConfigError, match="metric"):
        Settings(raw={"metric": {"judge": -1}}).metric()


def test_compile_sizes_come_from_flags_then_the_data_table_then_the_defaults(tmp_path):
    from trace_dspy.cli.compile import config_from_args

    config = tmp_path / "c.toml"
    config.write_text('[data]\ntrain = 5\n[optimizer]\nseed = 7\nmax_labeled_demos = 3\n')
    cfg = config_from_args(["--config", str(config), "--dev", "2", "--max-labeled", "4"])
    assert (cfg.data.train, cfg.data.dev, cfg.data.val) == (5, 2, DataConfig.val)
    assert (cfg.optimizer.seed, cfg.optimizer.max_labeled_demos) == (7, 4)
    assert config_from_args([]).optimizer.seed == 0
