"""Fitted openers for the scaffolded reply: ranked by the metric, per valence, saved in the artifact."""

from __future__ import annotations

import json

import dspy
import pytest
from conftest import offline_workdir

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.compact.openers import TONED_OPENERS, emotion_valence
from trace_dspy.core.labels import check_openers
from trace_dspy.compact.opener_fit import fit_openers, rank_openers
from trace_dspy.optimize.optimizers import OptimizerConfig, compile_program
from trace_dspy.program.pipeline import stage_signature
from trace_dspy.program.writers import part_fitter
import trace_dspy
from trace_dspy.compact.reply_adapter import ChatReplyAdapter
from trace_dspy.compact.scaffold import ScaffoldedReply
from trace_dspy.store.artifacts import ArtifactError
from trace_dspy.testing.fakes import fake_lm

GOOD_NEWS = "Speaker: I won the lottery today, day {i}!"
BAD_NEWS = "Speaker: My cat ran away this morning, day {i}."

# How the fake writer goes on from each opener (a question for the question openers).
CONTINUATIONS = {"How are you feeling": " about it now?", "What happened": " next?", "How did": " it go?",
                 "How are you": " today?", "What did you": " do then?", "Do you": " want to talk?"}


def writer(prefills: list | None = None):
    def responder(outputs, inputs):
        if "prefill" in inputs:
            if prefills is not None:
                prefills.append(inputs["prefill"])
            opener = next((o for o in CONTINUATIONS if inputs["prefill"].endswith(o)), None)
            return {"response": CONTINUATIONS[opener] if opener else " something about your day."}
        if "emotion" in outputs and "dialogue" in inputs:
            return {"emotion": "joyful" if "lottery" in inputs["dialogue"] else "sad"}
        return {}
    return responder


def prefers(positive: str, negative: str):
    """A metric that likes ``positive`` to open a reply to good news and ``negative`` to bad news."""
    def metric(example, pred, trace=None):
        wanted = positive if "lottery" in example.dialogue else negative
        return 0.9 if pred.response.startswith(wanted) else 0.3 if "?" in pred.response else 0.1
    return metric


def examples(n_good=3, n_bad=3):
    return ([dspy.Example(dialogue=GOOD_NEWS.format(i=i), response="Wow!").with_inputs("dialogue")
             for i in range(n_good)]
            + [dspy.Example(dialogue=BAD_NEWS.format(i=i), response="Oh no.").with_inputs("dialogue")
               for i in range(n_bad)])


def scaffolded_program(**config):
    return TraceProgram(ProgramConfig(reply_format="scaffold", prior_k=0, best_of=1, **config))


def test_the_fit_finds_the_opener_the_metric_prefers_for_each_valence():
    lm, _ = fake_lm(writer(), strategy="ER", secondary_strategy="EX")
    program = scaffolded_program()
    with dspy.context(lm=lm):
        fit = fit_openers(program, examples(), prefers("Wow, that", "I'm so sorry"))
    assert fit is not None and fit.items == 6 and fit.failed == 0
    assert fit.openers["positive"]["ER"][0] == "Wow, that"
    assert fit.openers["negative"]["ER"][0] == "I'm so sorry"
    # A toned opener answers only its own valence; with the emotion unknown ("any"), neutral openers only.
    assert not {"I'm so sorry", "Oh no, that sounds"} & set(fit.openers["positive"]["ER"])
    assert not {"Wow, that", "I'm really glad"} & set(fit.openers["negative"]["ER"])
    assert len(fit.openers["any"]["ER"]) == 3 and not set(TONED_OPENERS) & set(fit.openers["any"]["ER"])
    # Every ER and EX opener of the pool that suits the dialogue was tried (the stock one is the first reply).
    assert fit.replies == 6 * (1 + 6 + 8)
    rows = [r for r in fit.record()["scores"] if r["valence"] == "negative" and r["mechanism"] == "ER"]
    assert {r["opener"] for r in rows} >= {"That sounds", "I'm so sorry"} and all(r["n"] == 3 for r in rows)
    assert program.reply_openers is None and program.config.best_of == 1  # the program given is not changed


def test_too_few_dialogues_keep_the_stock_openers():
    lm, _ = fake_lm(writer(), strategy="ER", secondary_strategy="EX")
    with dspy.context(lm=lm):
        assert fit_openers(scaffolded_program(), examples(1, 2), prefers("Wow, that", "I'm so")) is None


def test_ranking_shrinks_a_valence_with_few_dialogues_towards_the_overall_mean():
    # "A" is best overall; one unpleasant dialogue liked "B" a little better: not enough to reorder.
    scored = {("ER", "A"): [("positive", 0.8)] * 6 + [("negative", 0.5)],
              ("ER", "B"): [("positive", 0.2)] * 6 + [("negative", 0.6)]}
    openers, rows = rank_openers(scored, {"ER": ("B", "A"), "EX": ("How did",)}, keep=2, shrink=4.0)
    assert openers["negative"]["ER"] == ("A", "B") and openers["any"]["ER"] == ("A", "B")
    # ... but many such dialogues do.
    scored = {k: v + [("negative", 0.5 if k[1] == "A" else 0.6)] * 20 for k, v in scored.items()}
    openers, _ = rank_openers(scored, {"ER": ("B", "A")}, keep=2)
    assert openers["negative"]["ER"] == ("B", "A") and openers["positive"]["ER"] == ("A", "B")
    # A mechanism nobody planned keeps the stock openers: it is left out of the table.
    assert "EX" not in openers["any"] and {r["mechanism"] for r in rows} == {"ER"}
    # A mechanism planned for too few dialogues keeps the stock openers too.
    assert rank_openers({("ER", "A"): [("positive", 0.9)] * 2}, {"ER": ("A",)}, min_trials=3)[0] == {}
    # A toned opener is ranked only for its valence, however well it scored elsewhere.
    scored = {("ER", "Oh no, that sounds"): [("positive", 0.9), ("negative", 0.9)] * 2, ("ER", "That sounds"): [
        ("positive", 0.5), ("negative", 0.5)] * 2}
    openers, _ = rank_openers(scored, {"ER": ("That sounds", "Oh no, that sounds")}, keep=2)
    assert openers["negative"]["ER"] == ("Oh no, that sounds", "That sounds")
    assert openers["positive"]["ER"][0] == "That sounds" and "Oh no, that sounds" not in openers["any"]["ER"]


def test_the_writer_takes_the_openers_of_the_emotion_s_valence():
    fitted = {"positive": {"ER": ("Wow, that", "That's so")}, "negative": {"ER": ("I'm so sorry",)},
              "any": {"ER": ("Oh, that is",)}}
    signature = stage_signature("generate_response", ProgramConfig(reply_format="scaffold"))
    for emotion, opener in (("joyful", "Wow, that"), ("devastated", "I'm so sorry"), ("hangry", "Oh, that is")):
        prefills: list = []
        lm, _ = fake_lm(writer(prefills))
        inputs = {"dialogue": "Speaker: news", "emotion": emotion, "strategy": "ER", "secondary_strategy": "EX",
                  "exemplars": []}
        with dspy.context(lm=lm):
            ScaffoldedReply(dspy.Predict(signature), ChatReplyAdapter(scaffold=True), openers=fitted)(
                **{k: inputs.get(k, "") for k in signature.input_fields})
        assert prefills[0] == opener
        assert prefills[1].endswith("How are you feeling")  # EX was not fitted: the stock opener
    assert (emotion_valence("surprised"), emotion_valence("anxious"), emotion_valence(None)) == (
        "positive", "negative", "any")


@pytest.mark.parametrize(("openers", "message"), [
    ([], "table of valences"),
    ({"happy": {"ER": ["Wow"]}}, "unknown valence"),
    ({"any": {"XX": ["Wow"]}}, "unknown mechanism"),
    ({"any": {"ER": "Wow"}}, "list of 1 to 8"),
    ({"any": {"ER": []}}, "list of 1 to 8"),
    ({"any": {"ER": ["  "]}}, "non-empty"),
    ({"any": {"ER": ["x" * 41]}}, "at most 40"),
])
def test_bad_opener_tables_are_refused(openers, message):
    with pytest.raises(ValueError, match=message):
        check_openers(openers)


def test_compile_program_fits_openers_only_for_a_scaffolded_reply():
    lm, _ = fake_lm(writer(), strategy="ER", secondary_strategy="EX")
    metric = prefers("Wow, that", "I'm so sorry")
    fits = OptimizerConfig(name="labeled", opener_items=4, plan_items=0)
    with dspy.context(lm=lm):
        result = compile_program(fits, scaffolded_program(opener_variety=1), metric, examples(2, 2), [],
                                 fit_parts=part_fitter(fits, metric))
        compiled = result.program
        assert compiled.reply_openers["negative"]["ER"][0] == "I'm so sorry"
        assert result.fits.reply_openers["items"] == 4
        unfitted = OptimizerConfig(name="labeled", plan_items=0)  # off
        off = compile_program(unfitted, scaffolded_program(), metric, examples(2, 2), [],
                              fit_parts=part_fitter(unfitted, metric))
        said: list = []
        fields = compile_program(fits, TraceProgram(ProgramConfig(reply_format="chat")),
                                 metric, examples(2, 2), [], log=said.append, fit_parts=part_fitter(fits, metric))
    assert off.program.reply_openers is None and fields.program.reply_openers is None
    assert off.fits.reply_openers is None and fields.fits.reply_openers is None
    assert said == ["openers: not fitted: the reply stage is not scaffolded for this LM (reply_format scaffold, "
                    "or auto with the embedded model)"]
    # The compiled program writes with them: a reply to bad news opens with the fitted opener.
    with dspy.context(lm=lm):
        assert compiled(dialogue=BAD_NEWS.format(i=9)).response.startswith("I'm so sorry")


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    lm, engine = fake_lm(writer(), strategy="ER", secondary_strategy="EX")
    offline_workdir(tmp_path, monkeypatch, lm)
    (tmp_path / "scaffold.toml").write_text('[program]\nreply_format = "scaffold"\nbest_of = 1\n')
    return engine


def test_the_compile_saves_the_fitted_openers_and_loading_restores_them(fake_models, tmp_path, capsys):
    from trace_dspy.cli.compile import main
    from trace_dspy.cli.inspect_artifact import main as inspect

    argv = ["--config", "scaffold.toml", "--optimizer", "labeled", "--train", "4", "--dev", "2", "--no-mlflow"]
    assert main([*argv, "--opener-items", "4"]) == 0
    manifest = json.loads((tmp_path / "artifacts/trace-dspy/v0001/manifest.json").read_text())
    saved = manifest["reply_openers"]
    assert saved["items"] == 4 and set(saved["openers"]) == {"positive", "negative", "any"}
    assert manifest["optimizer"]["opener_items"] == 4
    loaded = trace_dspy.load("trace-dspy@v1")
    assert loaded.reply_openers == check_openers(saved["openers"])
    # Without the fit, the manifest says so and the program keeps the stock openers.
    assert main(argv) == 0  # off by default
    assert json.loads((tmp_path / "artifacts/trace-dspy/v0002/manifest.json").read_text())["reply_openers"] == {
        "openers": None}
    assert trace_dspy.load("trace-dspy@v2").reply_openers is None
    capsys.readouterr()
    assert inspect(["trace-dspy@v1"]) == 0 and inspect(["trace-dspy@v2"]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  openers")]
    assert shown[0].startswith("  openers     fitted on 4 training dialogues; first positive: ER")
    assert shown[1] == "  openers     stock (not fitted)"
    # A damaged table is refused by name.
    path = tmp_path / "artifacts/trace-dspy/v0001/manifest.json"
    manifest["reply_openers"]["openers"]["any"] = {"XX": ["Wow"]}
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="reply_openers"):
        trace_dspy.load("trace-dspy@v1")
