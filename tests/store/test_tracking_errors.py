"""A tracking store that fails is one line without SQL, and evaluate does not exit 0 when its run was not logged.

An unusable sqlite store (a file that is not a database, a folder) is refused before the evaluation, as compile
refuses a locked one; a store that fails while the run is logged keeps the rows and the summary, says where
they are in one line, and the command exits 1.
"""

from __future__ import annotations

import sqlite3

import pytest
from conftest import FAST_CONFIG, echo_reply, offline_workdir
from sqlalchemy.exc import OperationalError

from trace_dspy.testing.fakes import fake_lm

EVALUATE = ["--program", "default", "--limit", "2", "--threads", "1", "--config", "fast.toml"]
SQL_WORDS = ("[SQL:", "SELECT", "INSERT", "sqlalche.me", "[parameters:")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    lm, engine = fake_lm(echo_reply)
    offline_workdir(tmp_path, monkeypatch, lm)
    (tmp_path / "fast.toml").write_text(FAST_CONFIG)
    return tmp_path, engine


def sql_error(*args, **kwargs):
    raise OperationalError("INSERT INTO assessments (trace_id, name) VALUES (?, ?)", ("tr-1", "empathy"),
                           sqlite3.OperationalError("disk I/O error"))


def evaluate(argv: list[str], capsys) -> tuple[int, list[str]]:
    from trace_dspy.cli.evaluate import main

    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("store", ["not-a-database.db", "a-folder"])
def test_an_unusable_sqlite_store_is_one_line_before_the_evaluation(workdir, capsys, store):
    tmp_path, engine = workdir
    (tmp_path / "not-a-database.db").write_text("these are not the tables you are looking for\n")
    (tmp_path / "a-folder").mkdir()
    code, err = evaluate([*EVALUATE, "--tracking-uri", f"sqlite:///{tmp_path / store}"], capsys)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: the MLflow store") and store in err[0], err
    assert not any(word in err[0] for word in SQL_WORDS), err
    assert engine.calls == [] and not (tmp_path / "runs").exists()


def test_a_store_that_fails_while_logging_is_one_line_and_not_a_success(workdir, monkeypatch, capsys):
    tmp_path, engine = workdir
    monkeypatch.setattr("trace_dspy.store.evaluations.log_evaluation", sql_error)
    code, err = evaluate(EVALUATE, capsys)
    assert code == 1, err
    said = [line for line in err if "MLflow" in line]
    assert len(said) == 1 and said[0].startswith("warning: could not log to MLflow"), err
    assert "disk I/O error" in said[0] and "runs/evaluate" in said[0]
    assert not any(word in line for line in err for word in SQL_WORDS), err
    # the results are kept where the line says
    folder = tmp_path / said[0].rsplit("results are in ", 1)[1].strip()
    assert (folder / "examples.jsonl").is_file() and (folder / "summary.json").is_file()
    assert engine.calls


def test_tracing_that_cannot_start_says_why_in_one_line_without_sql(workdir, monkeypatch, capsys):
    monkeypatch.setattr("trace_dspy.store.tracking.prepare_tracing", sql_error)
    code, err = evaluate(EVALUATE, capsys)
    assert code == 0, err  # the evaluation runs untraced, and its run is logged
    said = [line for line in err if "tracing is off" in line]
    assert said == ["warning: tracing is off (OperationalError: disk I/O error)"], err
    assert not any(word in line for line in err for word in SQL_WORDS), err
