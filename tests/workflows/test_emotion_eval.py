"""python -m trace_dspy.evaluate --stage emotion and TraceProgram.recognize, with fake LMs and a fake prior."""

from __future__ import annotations

import json

import dspy
import pytest
from conftest import offline_workdir

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.cli.evaluate import main
from trace_dspy.lm.kinds import takes_grammar
from trace_dspy.lm.specs import GrammarLM
from trace_dspy.program import emotion_prior as ep
from trace_dspy.testing.fakes import ScriptedEngine, fake_lm
from trace_dspy.workflows import loading

# Four test items; the fake prior ranks labels by a word in the dialogue:
#   t1 afraid    (spider) -> afraid   right label
#   t2 terrified (dark)   -> afraid   wrong label, right group (fear); terrified is in the prior's top 3
#   t3 joyful    (party)  -> joyful   right label
#   t4 angry     (broke)  -> sad      wrong label and group; angry is not in the top 3
ITEMS = [("t1", "afraid", "There was a huge spider in my shoe this morning."),
         ("t2", "terrified", "The power went out and the house was pitch dark."),
         ("t3", "joyful", "We threw a surprise party for my sister and she loved it."),
         ("t4", "angry", "My roommate broke my guitar and did not even say sorry.")]
RANKING = {"spider": ["afraid", "terrified", "anxious"], "dark": ["afraid", "terrified", "anxious"],
           "party": ["joyful", "excited", "proud"], "broke": ["sad", "lonely", "disappointed"],
           "": ["content", "sad", "joyful"]}


def stub_encoder(texts):  # never called by the fake prior; it only has to be the encoder it is handed
    raise AssertionError("the fake prior encodes nothing")


class FakePrior:
    """Stands in for a fitted EmotionPrior: the three labels RANKING gives the dialogue's key word."""

    def candidates(self, dialogue, k, encoder):
        assert encoder is stub_encoder
        ranked = next(labels for word, labels in RANKING.items() if word in dialogue)
        return [(label, p) for label, p in zip(ranked, (0.6, 0.3, 0.1))][:k]


def constrained_lm():
    """A grammar-constrained LM (takes_grammar is true) over a scripted engine that records every call."""
    engine = ScriptedEngine()
    lm = GrammarLM("fake/scripted", engine=engine, cache=False)
    assert takes_grammar(lm)
    return lm, engine


def write_data(folder):
    """A data folder: the four test items, and a small pool for the default program's exemplar index."""
    def record(sid, emotion, text):
        return json.dumps({"id": sid, "emotion": emotion, "turns": [text], "reply": "That sounds like a lot."})

    folder.mkdir()
    (folder / "test.jsonl").write_text("".join(record(*item) + "\n" for item in ITEMS))
    pool = [(f"p{i}", emotion, f"Pool story {i} about feeling {emotion}.")
            for i, emotion in enumerate(["sad", "proud", "afraid", "angry", "joyful"] * 2)]
    (folder / "valid.jsonl").write_text("".join(record(*item) + "\n" for item in pool))
    return folder


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """tmp_path as the working folder, the fake prior for the default program, and its stub encoder."""
    monkeypatch.setattr(loading, "default_prior", lambda config, data=None, seed=0: FakePrior())
    monkeypatch.setattr(ep, "default_encoder", lambda: stub_encoder)
    write_data(tmp_path / "data")
    return tmp_path


def run_cli(tmp_path, monkeypatch, lm, *extra):
    offline_workdir(tmp_path, monkeypatch, lm)
    return main(["--stage", "emotion", "--data", "data", "--limit", "0", "--threads", "2", "--output-dir", "out",
                 *extra])


def test_recognize_runs_only_the_emotion_stage_and_the_prior_decides_on_a_constrained_lm(monkeypatch):
    monkeypatch.setattr(ep, "default_encoder", lambda: stub_encoder)
    compact = TraceProgram(ProgramConfig(writer="compact"), emotion_prior=FakePrior())
    lm, engine = constrained_lm()
    with dspy.context(lm=lm):
        pred = compact.recognize("Speaker: The power went out and the house was pitch dark.")
    assert engine.calls == []
    assert pred.emotion == "afraid" and pred.emotion_group == "fear"
    assert pred.emotion_path.startswith("prior (top 1") and pred.emotion_candidates.count("%") == 1
    program = TraceProgram(ProgramConfig(), emotion_prior=FakePrior())
    assert [label for label, _ in program.prior_candidates("Speaker: pitch dark", 3)] == RANKING["dark"]
    # A capable LM (the standard writer) is asked, once, with the prior's five candidates as a hint; no later
    # stage runs.
    lm, engine = fake_lm(emotion="terrified")
    with dspy.context(lm=lm):
        pred = program.recognize("Speaker: The power went out and the house was pitch dark.")
    assert engine.stage_order() == ["recognize_emotion"]
    assert pred.emotion == "terrified" and pred.emotion_path == "prior+lm (top 5)"
    # forward shares the code: the same emotion, then the later stages.
    with dspy.context(lm=lm):
        full = program(dialogue="Speaker: The power went out and the house was pitch dark.")
    assert full.emotion == "terrified" and full.emotion_candidates == pred.emotion_candidates
    assert engine.stage_order()[1:] == ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]
    # Without a prior there are no candidates, and the LM decides.
    assert TraceProgram(ProgramConfig()).prior_candidates("Speaker: pitch dark", 3) is None


def test_emotion_stage_makes_no_lm_call_on_a_constrained_engine(workdir, monkeypatch, capsys):
    lm, engine = constrained_lm()
    assert run_cli(workdir, monkeypatch, lm, "--no-mlflow", "--writer", "compact") == 0
    assert engine.calls == []
    rows = [json.loads(line) for line in (workdir / "out/examples.jsonl").read_text().splitlines()]
    assert {r["id"]: r["predicted"] for r in rows} == {"t1": "afraid", "t2": "afraid", "t3": "joyful", "t4": "sad"}
    assert all(r["emotion_path"].startswith("prior (top 1") for r in rows)
    out = capsys.readouterr().out
    assert "| emotion_acc | 0.5000 |" in out and "confusion.png" in out


def test_emotion_stage_asks_a_capable_lm_once_per_item(workdir, monkeypatch):
    lm, engine = fake_lm(emotion="sad")
    assert run_cli(workdir, monkeypatch, lm, "--no-mlflow") == 0
    assert engine.stage_order() == ["recognize_emotion"] * 4
    assert all("%" in call.inputs["emotion_candidates"] for call in engine.calls)
    summary = json.loads((workdir / "out/summary.json").read_text())["summary"]
    assert summary["emotion_acc"] == 0.0 and summary["emotion_path"] == "prior+lm (top 5)"


def test_summary_numbers_table_and_confusion_matrix_on_a_hand_checked_case(workdir, monkeypatch):
    lm, _ = constrained_lm()
    assert run_cli(workdir, monkeypatch, lm, "--no-mlflow", "--writer", "compact") == 0
    record = json.loads((workdir / "out/summary.json").read_text())
    summary = record["summary"]
    assert summary["n"] == 4 and summary["failed"] == 0
    assert summary["emotion_acc"] == pytest.approx(0.5)  # t1, t3
    assert summary["group_acc"] == pytest.approx(0.75)  # t1, t2 (fear), t3
    assert summary["top3"] == pytest.approx(0.75)  # all but t4
    # F1 over the gold labels: afraid 2/3 (one right, one false alarm), terrified 0, joyful 1, angry 0.
    assert summary["macro_f1"] == pytest.approx((2 / 3 + 0 + 1 + 0) / 4)
    table = summary["per_label"]
    assert len(table) == 32 and list(table)[:3] == ["afraid", "angry", "annoyed"]
    assert table["afraid"] == {"group": "fear", "precision": 0.5, "recall": 1.0, "f1": pytest.approx(2 / 3),
                               "support": 1, "predicted": 2}
    assert table["sad"]["support"] == 0 and table["sad"]["predicted"] == 1 and table["sad"]["precision"] == 0.0
    assert summary["program"] == "default" and summary["split"] == "test" and summary["view"] == "trace"
    assert summary["lm"] == "local" and summary["seconds"] >= 0 and "mlflow" not in record
    rows = [json.loads(line) for line in (workdir / "out/examples.jsonl").read_text().splitlines()]
    assert {r["id"]: (r["gold"], r["correct"]) for r in rows} == {
        "t1": ("afraid", True), "t2": ("terrified", False), "t3": ("joyful", True), "t4": ("angry", False)}
    t2 = next(r for r in rows if r["id"] == "t2")
    assert [c[0] for c in t2["candidates"]] == RANKING["dark"]
    png = (workdir / "out/confusion.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000


def test_the_mlflow_run_holds_the_numbers_the_summary_and_the_png(workdir, monkeypatch):
    import mlflow

    lm, _ = constrained_lm()
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    assert run_cli(workdir, monkeypatch, lm, "--tracking-uri", uri, "--writer", "compact") == 0
    record = json.loads((workdir / "out/summary.json").read_text())
    mlflow.set_tracking_uri(uri)
    (run,) = mlflow.search_runs(experiment_names=["trace-dspy"], output_format="list")
    assert run.info.run_id == record["mlflow"]["run_id"]
    assert run.data.tags["trace_dspy.kind"] == "evaluate-emotion" and run.data.params["stage"] == "emotion"
    assert run.data.metrics["test/emotion_acc"] == pytest.approx(0.5)
    assert run.data.metrics["test/top3"] == pytest.approx(0.75)
    files = {a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/confusion.png", "evaluation/summary.json", "evaluation/examples.jsonl"} <= files


def test_user_errors_are_one_line_and_exit_2(workdir, monkeypatch, capsys):
    lm, _ = constrained_lm()
    offline_workdir(workdir, monkeypatch, lm)
    assert main(["--stage", "emotion", "--program", str(workdir / "missing"), "--data", "data", "--no-mlflow"]) == 2
    assert "cannot resolve program" in capsys.readouterr().err
    (workdir / "empty").mkdir()
    # The trace view leaves out 'prepared', the only label here: nothing to evaluate.
    (workdir / "empty/test.jsonl").write_text(json.dumps({"id": "x", "emotion": "prepared", "turns": ["Ready."],
                                                          "reply": "Good luck."}) + "\n")
    (workdir / "empty/valid.jsonl").write_text((workdir / "data/valid.jsonl").read_text())
    assert main(["--stage", "emotion", "--data", "empty", "--no-mlflow"]) == 2
    assert "no test items" in capsys.readouterr().err
    assert main(["--stage", "emotion", "--limit", "-1", "--no-mlflow"]) == 2
    # --limit 0 stays an error for the full evaluation.
    assert main(["--limit", "0", "--no-mlflow"]) == 2


def test_an_interrupted_run_keeps_its_rows_and_the_rerun_resumes(workdir, monkeypatch, capsys):
    def interrupt_at_the_party(outputs, inputs):
        if "party" in inputs.get("dialogue", ""):
            raise KeyboardInterrupt
        return {"emotion": "sad"}

    lm, _ = fake_lm(interrupt_at_the_party)
    assert run_cli(workdir, monkeypatch, lm, "--no-mlflow", "--threads", "1") == 130
    assert "interrupted; finished rows are in out/examples.jsonl" in capsys.readouterr().err
    kept = [json.loads(line)["id"] for line in (workdir / "out/examples.jsonl").read_text().splitlines()]
    assert kept == ["t1", "t2"] and not (workdir / "out/summary.json").exists()
    lm, engine = fake_lm(emotion="sad")
    assert run_cli(workdir, monkeypatch, lm, "--no-mlflow") == 0
    assert len(engine.calls) == 2  # t3 and t4 only
    assert json.loads((workdir / "out/summary.json").read_text())["summary"]["n"] == 4
