"""Further reply plans: chosen by the metric on training dialogues, kept by the reply reward, saved in the artifact."""

from __future__ import annotations

import json

import dspy
import pytest

from conftest import offline_workdir
from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.labels import check_plans
from trace_dspy.optimize.optimizers import OptimizerConfig, compile_program
from trace_dspy.compact.plan_fit import choose_planless, choose_plans, fit_plans
from trace_dspy.program.writers import part_fitter
import trace_dspy
from trace_dspy.store.artifacts import ArtifactError
from trace_dspy.testing.fakes import fake_lm


def writer(calls: list | None = None, fail_for: str | None = None):
    """The fake writer says which plan it wrote for; the planner always plans IP+EX."""
    def responder(outputs, inputs):
        if "response" in outputs and "strategy" in inputs:
            plan = f"{inputs['strategy']}+{inputs.get('secondary_strategy', inputs['strategy'])}"
            if calls is not None:
                calls.append(plan)
            if plan == fail_for:
                raise RuntimeError(f"the writer fails for {plan}")
            return {"response": f"A reply for {plan}."}
        return {}
    return responder


def prefers(plan: str, score: float = 0.9):
    """A metric ``(example, pred)`` or reply reward ``(inputs, pred)`` that likes replies written for ``plan``."""
    def scored(example_or_inputs, pred, trace=None):
        return score if f"for {plan}." in pred.response else 0.4
    return scored


# The compact writer races the plans; the fields layout lets the fake LM answer by the plan's fields.
COMPACT = {"writer": "compact", "reply_format": "fields"}


def program(**config):
    return TraceProgram(ProgramConfig(**{"prior_k": 0, "best_of": 1, **COMPACT, **config}))


def examples(n=4):
    return [dspy.Example(dialogue=f"Speaker: my exam went badly, day {i}.", response="Oh no.").with_inputs("dialogue")
            for i in range(n)]


def test_the_program_keeps_the_reply_with_the_best_reward_and_reports_its_plan():
    calls: list = []
    lm, _ = fake_lm(writer(calls), strategy="IP", secondary_strategy="EX")
    prog = program()
    prog.reply_plans = ["EX+EX", ("ER", "IP")]
    prog.reward_fn = prefers("EX+EX")
    with dspy.context(lm=lm):
        out = prog(dialogue="Speaker: my exam went badly.")
    assert calls == ["IP+EX", "EX+EX", "ER+IP"]  # the LM's plan first, then the fitted ones in order
    assert out.response == "A reply for EX+EX."
    assert (out.strategy, out.secondary_strategy) == ("EX", "EX")
    assert out.reply_plans == [{"plan": "IP+EX", "reward": 0.4}, {"plan": "EX+EX", "reward": 0.9},
                               {"plan": "ER+IP", "reward": 0.4}]
    from trace_dspy.workflows.batch import format_stages

    assert f"{'reply_plans':<28} IP+EX 0.4 | EX+EX 0.9 | ER+IP 0.4" in format_stages(out).splitlines()
    # A tie keeps the LM's own plan; a fitted plan equal to the LM's is not written twice.
    calls.clear()
    prog.reward_fn = lambda inputs, pred: 0.5
    prog.reply_plans = ["IP+EX", "ER+ER"]
    with dspy.context(lm=lm):
        out = prog(dialogue="Speaker: my exam went badly.")
    assert calls == ["IP+EX", "ER+ER"] and out.strategy == "IP" and out.response == "A reply for IP+EX."
    # Without fitted plans the program writes one reply and has no reply_plans output.
    calls.clear()
    prog.reply_plans = None
    with dspy.context(lm=lm):
        out = prog(dialogue="Speaker: my exam went badly.")
    assert calls == ["IP+EX"] and "reply_plans" not in out


def test_a_failing_further_plan_is_skipped_but_the_lm_s_own_plan_must_not_fail():
    lm, _ = fake_lm(writer(fail_for="EX+EX"), strategy="IP", secondary_strategy="EX")
    prog = program()
    prog.reply_plans = ["EX+EX", "ER+IP"]
    prog.reward_fn = prefers("ER+IP")
    with dspy.context(lm=lm):
        out = prog(dialogue="Speaker: my exam went badly.")
    assert out.response == "A reply for ER+IP." and [t["plan"] for t in out.reply_plans] == ["IP+EX", "ER+IP"]
    lm, _ = fake_lm(writer(fail_for="IP+EX"), strategy="IP", secondary_strategy="EX")
    with dspy.context(lm=lm), pytest.raises(Exception, match=r"fails for IP\+EX"):  # noqa: B017, PT011
        prog(dialogue="Speaker: my exam went badly.")


def test_the_fit_chooses_the_plan_that_raises_the_metric_where_the_reward_would_keep_it():
    lm, _ = fake_lm(writer(), strategy="IP", secondary_strategy="EX")
    prog = program()
    prog.reward_fn = prefers("EX+EX")
    with dspy.context(lm=lm):
        fit = fit_plans(prog, examples(), prefers("EX+EX"))
    assert fit is not None and fit.plans == (("EX", "EX"),)
    assert (round(fit.baseline, 3), round(fit.score, 3)) == (0.4, 0.9)
    assert fit.items == 4 and fit.replies == 4 * 6 and fit.failed == 0  # IP+EX is the LM's: written once
    record = fit.record()
    assert record["plans"] == ["EX+EX"] and record["steps"][0] == {"plan": "EX+EX", "score": 0.9, "gain": 0.5,
                                                                   "kept": True}
    assert record["steps"][1]["kept"] is False  # nothing else adds
    assert prog.reply_plans == ()  # the program given is not changed
    # The metric likes ER+IP, but the reward would never keep it: choosing it would gain nothing.
    with dspy.context(lm=lm):
        fit = fit_plans(prog, examples(), prefers("ER+IP"))
    assert fit.plans == () and fit.score == fit.baseline
    # Too few dialogues: no fit.
    with dspy.context(lm=lm):
        assert fit_plans(prog, examples(3), prefers("EX+EX")) is None


def test_choose_plans_is_greedy_with_a_minimum_gain():
    # Two dialogues: ER+EX wins the first by reward and metric, EX+EX the second.
    table = [{"lm": (0.5, 0.5), ("ER", "EX"): (0.8, 0.9), ("EX", "EX"): (0.2, 0.1)},
             {"lm": (0.5, 0.5), ("ER", "EX"): (0.4, 0.9), ("EX", "EX"): (0.6, 0.7)}]
    options = [("ER", "EX"), ("EX", "EX")]
    plans, baseline, score, steps, rows = choose_plans(table, options, max_plans=2, min_gain=0.01)
    assert plans == (("ER", "EX"), ("EX", "EX")) and baseline == 0.5 and score == pytest.approx(0.8)
    assert [s["plan"] for s in steps] == ["ER+EX", "EX+EX"]
    assert rows[0] == {"plan": "ER+EX", "n": 2, "alone": 0.9, "with_lm": 0.7}
    assert choose_plans(table, options, max_plans=1, min_gain=0.01)[0] == (("ER", "EX"),)
    assert choose_plans(table, options, max_plans=2, min_gain=0.25)[0] == ()


@pytest.mark.parametrize(("plans", "message"), [
    ("ER+EX", "list of"), (["ER"], "not a pair"), ([("ER", "XX")], "not a pair"), (["ER+EX+IP"], "not a pair"),
])
def test_bad_plans_are_refused(plans, message):
    with pytest.raises(ValueError, match=message):
        check_plans(plans)
    assert check_plans(["ER+EX", ("ER", "EX"), "EX+EX"]) == (("ER", "EX"), ("EX", "EX"))


def test_compile_program_chooses_plans_only_when_asked():
    lm, _ = fake_lm(writer(), strategy="IP", secondary_strategy="EX")
    prog = program()
    prog.reward_fn = prefers("EX+EX")
    metric = prefers("EX+EX")
    said: list = []
    fits, unfitted = OptimizerConfig(name="labeled", plan_items=4), OptimizerConfig(name="labeled", plan_items=0)
    with dspy.context(lm=lm):
        result = compile_program(fits, prog, metric, examples(), [], log=said.append,
                                 fit_parts=part_fitter(fits, metric))
        off = compile_program(unfitted, prog, metric, examples(), [], fit_parts=part_fitter(unfitted, metric))
        compiled = result.program
        assert compiled(dialogue="Speaker: my exam went badly.").response == "A reply for EX+EX."
    assert compiled.reply_plans == (("EX", "EX"),) and result.fits.reply_plans["items"] == 4
    assert off.program.reply_plans == () and off.fits.reply_plans is None
    assert said[0] == "plans: writing replies for 6 plans on 4 training dialogues"
    assert OptimizerConfig(name="labeled", plan_items=4).settings()["plan_items"] == 4
    assert OptimizerConfig().plan_items == 16 and OptimizerConfig().settings()["plan_items"] == 16  # on by default
    assert "plan_items" not in OptimizerConfig(name="labeled", plan_items=0).settings()


@pytest.fixture
def fake_models(monkeypatch, tmp_path):
    lm, engine = fake_lm(writer(), strategy="IP", secondary_strategy="EX")
    offline_workdir(tmp_path, monkeypatch, lm)
    # The compile's reward: replies written for EX+EX are the good ones.
    monkeypatch.setattr(TraceProgram, "reply_reward", lambda self, inputs, pred: prefers("EX+EX")(inputs, pred))
    (tmp_path / "one.toml").write_text('[program]\nbest_of = 1\nprior_k = 0\nwriter = "compact"\n'
                                       'reply_format = "fields"\n')
    return engine


def test_the_compile_saves_the_plans_and_loading_restores_them(fake_models, tmp_path, capsys):
    from trace_dspy.cli.compile import main
    from trace_dspy.cli.inspect_artifact import main as inspect

    argv = ["--config", "one.toml", "--optimizer", "labeled", "--train", "4", "--dev", "2", "--no-mlflow"]
    assert main([*argv, "--plan-items", "4"]) == 0
    path = tmp_path / "artifacts/trace-dspy/v0001/manifest.json"
    manifest = json.loads(path.read_text())
    saved = manifest["reply_plans"]
    assert saved["items"] == 4 and isinstance(saved["plans"], list) and len(saved["options"]) == 6
    assert manifest["optimizer"]["plan_items"] == 4
    assert trace_dspy.load("trace-dspy@v1").reply_plans == check_plans(saved["plans"])
    assert main([*argv, "--plan-items", "0"]) == 0
    assert json.loads((tmp_path / "artifacts/trace-dspy/v0002/manifest.json").read_text())["reply_plans"] == {
        "plans": []}
    assert trace_dspy.load("trace-dspy@v2").reply_plans == ()
    capsys.readouterr()
    assert inspect(["trace-dspy@v1"]) == 0 and inspect(["trace-dspy@v2"]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  plans")]
    assert shown[0].startswith("  plans       the LM's plan + ") and "on 4 dialogues" in shown[0]
    assert shown[1] == "  plans       the LM's plan only (not fitted)"
    # A damaged table is refused by name.
    manifest["reply_plans"]["plans"] = ["EX+XX"]
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="reply_plans"):
        trace_dspy.load("trace-dspy@v1")


def constrained(monkeypatch):
    """Make every LM count as grammar-constrained (the embedded model's kind) for the plan fit, which weighs
    dropping the planner call only on such an LM."""
    import trace_dspy.lm.kinds as kinds

    monkeypatch.setattr(kinds, "takes_grammar", lambda lm: True)


def planner_counter(calls: list):
    """The fake planner plans IP+EX and counts its calls; the writer says which plan it wrote for."""
    write = writer()

    def responder(outputs, inputs):
        if "strategy" in outputs:
            calls.append("planner")
            return {"strategy": "IP", "secondary_strategy": "EX"}
        return write(outputs, inputs)
    return responder


def test_a_fitted_first_plan_replaces_the_planner_only_for_the_compact_writer():
    calls: list = []
    lm, _ = fake_lm(planner_counter(calls))
    standard = program(writer="standard")
    standard.first_plan = "EX+ER"
    standard.reward_fn = lambda inputs, pred: 0.5
    with dspy.context(lm=lm):
        out = standard(dialogue="Speaker: my exam went badly.")
    # The standard writer: the planner asked, one reply for its plan (no race).
    assert calls == ["planner"] and out.plan_path == "lm" and out.strategy == "IP" and "reply_plans" not in out
    prog = program()
    prog.first_plan = "EX+ER"
    prog.reward_fn = lambda inputs, pred: 0.5
    calls.clear()
    with dspy.context(lm=lm):
        out = prog(dialogue="Speaker: my exam went badly.")
    assert calls == [] and out.plan_path == "fitted"
    assert (out.strategy, out.secondary_strategy, out.response) == ("EX", "ER", "A reply for EX+ER.")
    # planner = "lm" asks the LM even where a first plan is fitted, and the fitted first plan races its plan;
    # none fitted: asked.
    asked = TraceProgram(ProgramConfig(prior_k=0, best_of=1, planner="lm", **COMPACT), parts=prog.parts)
    asked.reward_fn = prog.reward_fn
    for other in (asked, prog.with_parts(first_plan=None)):
        calls.clear()
        with dspy.context(lm=lm):
            out = other(dialogue="Speaker: my exam went badly.")
        assert calls == ["planner"] and out.plan_path == "lm" and out.strategy == "IP"
        if other is asked:
            assert [t["plan"] for t in out.reply_plans] == ["IP+EX", "EX+ER"]
    # The further plans race it.
    prog.reply_plans = ["ER+ER"]
    prog.reward_fn = prefers("ER+ER")
    with dspy.context(lm=lm):
        out = prog(dialogue="Speaker: my exam went badly.")
    assert [t["plan"] for t in out.reply_plans] == ["EX+ER", "ER+ER"] and out.strategy == "ER"
    with pytest.raises(ValueError, match="not a pair"):
        prog.first_plan = "EX"


def test_the_fit_drops_the_planner_only_for_a_constrained_lm_when_its_plan_does_not_pay(monkeypatch):
    # The LM plans IP+EX; the metric and the reward like EX+EX replies.
    lm, _ = fake_lm(writer(), strategy="IP", secondary_strategy="EX")
    prog = program()
    prog.reward_fn = prefers("EX+EX")
    with dspy.context(lm=lm):
        fit = fit_plans(prog, examples(), prefers("EX+EX"))
    assert fit.lm_plans == {"IP+EX": 4} and fit.first_plan is None and fit.plans == (("EX", "EX"),)
    assert fit.planless[0] == ("EX", "EX") and fit.planless_score == pytest.approx(0.9)  # it would not lose
    constrained(monkeypatch)
    with dspy.context(lm=lm):
        fit = fit_plans(prog, examples(), prefers("EX+EX"))
    assert fit.first_plan == ("EX", "EX") and fit.plans == fit.planless[1:]
    record = fit.first_plan_record()
    assert record["plan"] == "EX+EX" and record["lm_plans"] == {"IP+EX": 4} and record["constrained"] is True
    assert record["score_without"] == record["score_with_planner"] == 0.9
    # Where the LM's own plan is the good one and no option is it, the planner stays.
    lm, _ = fake_lm(writer(), strategy="EX", secondary_strategy="IP")
    prog.reward_fn = prefers("EX+IP")
    with dspy.context(lm=lm):
        fit = fit_plans(prog, examples(), prefers("EX+IP"))
    assert fit.first_plan is None and fit.score == pytest.approx(0.9) and fit.planless_score == pytest.approx(0.4)


def test_choose_planless_races_the_options_alone():
    # The LM's plan wins both dialogues by metric; without it, ER+EX then EX+EX are the best race.
    table = [{"lm": (0.9, 1.0), ("ER", "EX"): (0.8, 0.9), ("EX", "EX"): (0.2, 0.1)},
             {"lm": (0.9, 1.0), ("ER", "EX"): (0.4, 0.3), ("EX", "EX"): (0.6, 0.7)}]
    plans, score = choose_planless(table, [("ER", "EX"), ("EX", "EX")], max_plans=1, min_gain=0.01)
    assert plans == (("ER", "EX"), ("EX", "EX")) and score == pytest.approx(0.8)
    assert choose_plans(table, [("ER", "EX"), ("EX", "EX")], max_plans=1, min_gain=0.01)[2] == pytest.approx(1.0)


def test_the_compile_saves_the_first_plan_and_loading_restores_it(fake_models, tmp_path, capsys, monkeypatch):
    from trace_dspy.cli.compile import main
    from trace_dspy.cli.inspect_artifact import main as inspect

    constrained(monkeypatch)
    # (one.toml, from the fixture: the compact writer in the fields layout)
    argv = ["--config", "one.toml", "--optimizer", "labeled", "--train", "4", "--dev", "2", "--no-mlflow"]
    assert main([*argv, "--plan-items", "4"]) == 0
    path = tmp_path / "artifacts/trace-dspy/v0001/manifest.json"
    manifest = json.loads(path.read_text())
    first = manifest["first_plan"]
    assert first["plan"] == first["planless"][0] and first["lm_plans"] == {"IP+EX": 4} and first["constrained"]
    assert manifest["reply_plans"]["first_plan"] == first["plan"]
    assert manifest["reply_plans"]["plans"] == first["planless"][1:]  # the race's rest, not the LM-first choice
    loaded = trace_dspy.load("trace-dspy@v1")
    assert loaded.first_plan == check_plans([first["plan"]])[0]
    assert loaded.reply_plans == check_plans(first["planless"][1:])
    capsys.readouterr()
    assert inspect(["trace-dspy@v1"]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  planner")]
    assert shown == [f"  planner     not asked by the compact writer, the race starts from {first['plan']} (training "
                     f"score {first['score_without']:.3f} without its plan, {first['score_with_planner']:.3f} with "
                     "it, on 4 dialogues); asked by the standard writer"]
    manifest["first_plan"]["plan"] = "IP+XX"
    path.write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="first_plan"):
        trace_dspy.load("trace-dspy@v1")
