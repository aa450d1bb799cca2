"""MLflow helpers that need no MLflow store (store.tracking)."""

from __future__ import annotations

import pytest

from trace_dspy.store.tracking import logged_or_warned


def test_a_failed_log_warns_with_the_results_path_and_does_not_raise(tmp_path, capsys):
    done = []
    with logged_or_warned(tmp_path / "out"):
        done.append("started")
        raise ConnectionError("store unreachable")
    assert done == ["started"]
    err = capsys.readouterr().err
    assert "could not log to MLflow (ConnectionError: store unreachable)" in err
    assert f"results are in {tmp_path / 'out'}" in err


def test_a_successful_log_prints_nothing(tmp_path, capsys):
    with logged_or_warned(tmp_path):
        pass
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_still_ends_the_command(tmp_path, capsys, interrupt):
    with pytest.raises(interrupt), logged_or_warned(tmp_path):
        raise interrupt()
    assert capsys.readouterr().err == ""
