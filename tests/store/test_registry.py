"""The MLflow registry's champion rule (store.registry)."""

from __future__ import annotations

from trace_dspy.store.registry import champion, promote_if_better, register_version


def test_champion_moves_only_on_a_strictly_better_score(tmp_path):
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    import mlflow

    mlflow.set_tracking_uri(uri)
    with mlflow.start_run(experiment_id=mlflow.create_experiment("champion")) as run:
        versions_ = [register_version(run.info.run_id, run.info.artifact_uri, s, tracking_uri=uri)
                     for s in (0.5, 0.4, 0.5, 0.50001)]
    assert versions_ == [1, 2, 3, 4]
    assert promote_if_better(1, 0.5, tracking_uri=uri) is True
    assert promote_if_better(2, 0.4, tracking_uri=uri) is False
    assert promote_if_better(3, 0.5, tracking_uri=uri) is False  # a tie does not move it
    assert champion(tracking_uri=uri) == (1, 0.5)
    assert promote_if_better(4, 0.50001, tracking_uri=uri) is True
    assert champion(tracking_uri=uri) == (4, 0.50001)
