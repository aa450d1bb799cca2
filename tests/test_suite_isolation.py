"""The suite's own stores: a test that names no tracking store or artifacts folder writes outside the checkout."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_default_stores_are_outside_the_checkout():
    import mlflow

    from trace_dspy.store.artifacts import artifacts_root
    from trace_dspy.store.tracking import resolve_tracking_uri

    for uri in (resolve_tracking_uri(None), mlflow.get_tracking_uri()):
        assert uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_relative_to(REPO)
    assert not artifacts_root().resolve().is_relative_to(REPO)


def test_a_test_that_sets_the_tracking_store_gets_it_back_after(monkeypatch, tmp_path):
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'own.db'}")
    assert mlflow.get_tracking_uri().endswith("own.db")  # the conftest fixture puts the suite's store back after
