"""A path a command will write is checked before its work: one ``error:`` line, exit 2, nothing fitted.

A refit takes minutes; found after it, a missing folder for ``--output`` or ``--json`` lost them in a
traceback. Each command's first piece of work is replaced by a stub that fails the test when it is reached.
"""

from __future__ import annotations

import importlib

import pytest

class WorkStarted(Exception):
    """The command began its work before checking where its results go."""


def _started(*args, **kwargs):
    raise WorkStarted


# command -> (its main, flags besides the output, the function its work starts with)
FITS = {
    "fit_tone": ("trace_dspy.cli.fit_tone", ["--data", "ed"], "trace_dspy.workflows.fits._ed_pool"),
    "fit_relevance": ("trace_dspy.cli.fit_relevance", ["--data", "ed"], "trace_dspy.workflows.fits._ed_pool"),
    "fit_empathy": ("trace_dspy.cli.fit_empathy", ["--epitome", "ep"], "trace_dspy.data.epitome.load_epitome"),
    "fit_prior": ("trace_dspy.cli.fit_prior", ["--data", "ed"], "trace_dspy.data.sources.resolve_source"),
    "metric_validity": ("trace_dspy.cli.metric_validity", ["--data", "ed"],
                        "trace_dspy.cli.metric_validity.run_validity"),
}


def run_fit(name: str, argv: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    module, flags, work = FITS[name]
    monkeypatch.setattr(work, _started)
    code = importlib.import_module(module).main([*flags, *argv])
    return code, capsys.readouterr().err.strip().splitlines()


def assert_one_error(code: int, err: list[str], *words: str) -> None:
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert all(w in err[0] for w in words), err


@pytest.mark.parametrize("name", list(FITS))
def test_an_output_in_a_missing_folder_is_refused_before_the_fit(tmp_path, monkeypatch, capsys, name):
    target = tmp_path / "no-such-folder" / "weights.npz"
    code, err = run_fit(name, ["--output", str(target)], monkeypatch, capsys)
    assert_one_error(code, err, "--output", str(target.parent), "does not exist")
    assert not target.parent.exists()


@pytest.mark.parametrize("name", ["fit_tone", "fit_relevance", "fit_empathy", "fit_prior"])
def test_an_output_that_is_a_folder_is_refused_before_the_fit(tmp_path, monkeypatch, capsys, name):
    code, err = run_fit(name, ["--output", str(tmp_path)], monkeypatch, capsys)
    assert_one_error(code, err, "--output", "is a folder")


@pytest.mark.parametrize("name", ["fit_tone", "fit_relevance", "fit_empathy"])
def test_a_json_record_in_a_missing_folder_is_refused_before_the_fit(tmp_path, monkeypatch, capsys, name):
    target = tmp_path / "missing" / "table.json"
    code, err = run_fit(name, ["--output", str(tmp_path / "w.npz"), "--json", str(target)], monkeypatch, capsys)
    assert_one_error(code, err, "--json", "does not exist")


def test_a_check_against_missing_weights_is_refused_before_the_fit(tmp_path, monkeypatch, capsys):
    code, err = run_fit("fit_tone", ["--check", "--output", str(tmp_path / "none.npz")], monkeypatch, capsys)
    assert_one_error(code, err, "--check", "none.npz")


@pytest.fixture
def workdir(fake_workdir):
    return fake_workdir


def test_a_compile_into_an_artifact_root_that_is_a_file_is_refused_before_it_compiles(workdir, capsys):
    from trace_dspy.cli.compile import main

    _, engine = workdir
    code = main(["--optimizer", "labeled", "--train", "4", "--dev", "3", "--threads", "1", "--config", "fast.toml",
                 "--no-mlflow", "--artifacts-dir", "a-file"])
    assert_one_error(code, capsys.readouterr().err.strip().splitlines(), "--artifacts-dir", "a-file", "is a file")
    assert engine.calls == []


def test_replies_into_a_folder_under_a_file_are_refused_before_the_program_loads(workdir, capsys):
    from trace_dspy.cli.respond import main

    tmp_path, engine = workdir
    (tmp_path / "in.jsonl").write_text('{"id": "a", "dialogue": "I lost my keys."}\n')
    code = main(["--program", "default", "--config", "fast.toml", "--input", "in.jsonl",
                 "--output", "a-file/replies.jsonl"])
    assert_one_error(code, capsys.readouterr().err.strip().splitlines(), "--output", "a-file")
    assert engine.calls == []


def test_the_embedded_bench_output_in_a_missing_folder_is_refused_before_the_model_loads(tmp_path, monkeypatch,
                                                                                        capsys):
    monkeypatch.setattr("trace_dspy.bench.embedded.run_embedded", _started)
    from trace_dspy.cli.bench_local import main

    code = main(["--output", str(tmp_path / "missing" / "bench.json")])
    assert_one_error(code, capsys.readouterr().err.strip().splitlines(), "--output", "does not exist")
