"""TraceProgram wiring, driven by a scripted fake LM through DSPy's real adapter."""

from __future__ import annotations

import json

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.core.dialogue import DialogueError
from trace_dspy.testing.fakes import fake_lm

STAGES = ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]
CAUSE_FIELDS = {"trigger_spans", "cause_summary", "cause_category"}


def test_predictor_names_are_the_artifact_schema():
    assert [n for n, _ in TraceProgram().named_predictors()] == STAGES
    # Reasoning on or off must not rename predictors (ChainOfThought would add ".predict").
    everything = ProgramConfig(reasoning=STAGES)
    nothing = ProgramConfig(reasoning=())
    for cfg in (everything, nothing):
        assert [n for n, _ in TraceProgram(cfg).named_predictors()] == STAGES


def test_stages_run_in_order_with_the_right_inputs(fake):
    pred = TraceProgram()(dialogue="I failed my driving test again.", exemplars=["Speaker: x\nListener: y"])
    assert fake.stage_order() == STAGES
    inputs = [set(c.inputs) for c in fake.calls]
    assert inputs[0] == {"dialogue"}
    assert inputs[1] == {"dialogue", "emotion"}
    assert inputs[2] == {"dialogue", "emotion", "exemplars"} | CAUSE_FIELDS
    assert inputs[3] == {"dialogue", "emotion", "exemplars", "strategy", "secondary_strategy"} | CAUSE_FIELDS
    # Upstream outputs really flow downstream (not just the field names).
    assert fake.calls[1].inputs["emotion"] == "sad"
    assert json.loads(fake.calls[3].inputs["trigger_spans"]) == ["I failed my driving test again."]
    assert fake.calls[3].inputs["strategy"] == "ER"
    assert "Listener: y" in fake.calls[2].inputs["exemplars"]
    assert pred.exemplars == ["Speaker: x\nListener: y"]


def test_every_stage_output_comes_back(fake):
    pred = TraceProgram(ProgramConfig(reasoning=["recognize_emotion", "plan_strategy"]))(
        dialogue="I failed my driving test again.")
    assert pred.emotion == "sad" and pred.emotion_group == "sadness"
    assert pred.trigger_spans == ["I failed my driving test again."]
    assert pred.cause_summary and pred.cause_category == "Loss & Failure"
    assert (pred.strategy, pred.secondary_strategy) == ("ER", "EX")
    assert pred.response.startswith("I'm sorry")
    assert pred.recognize_emotion_reasoning and pred.plan_strategy_reasoning
    assert pred.dialogue == "Speaker: I failed my driving test again."
    assert pred.exemplars == []


def test_per_call_answers_flow_through():
    lm, engine = fake_lm(emotion=lambda inputs: "proud" if "won" in inputs["dialogue"] else "sad")
    with dspy.context(lm=lm):
        program = TraceProgram()
        assert program(dialogue="We won the final!").emotion_group == "happiness"
        assert program(dialogue="My cat died.").emotion == "sad"


@pytest.mark.parametrize(("field", "bad"), [("emotion", "happyish"), ("strategy", "ADVICE"),
                                            ("cause_category", "Money")])
def test_out_of_set_label_is_an_error_the_caller_sees(field, bad):
    lm, _ = fake_lm(**{field: bad})
    with dspy.context(lm=lm), pytest.raises(Exception) as info:
        TraceProgram()(dialogue="I failed my driving test again.")
    # DSPy reports the parse failure; the program must not swallow it or default a label.
    assert "AdapterParseError" in type(info.value).__name__ or bad in str(info.value)


def test_dialogue_forms_are_normalized(fake):
    program = TraceProgram(ProgramConfig(reasoning=()))
    program(dialogue=["I lost my keys.", "Oh no, where?", "At the beach, in the sand."])
    program(dialogue="Speaker: I lost my keys.\nListener: Oh no, where?\nSpeaker: At the beach, in the sand.")
    first_inputs = [c.inputs["dialogue"] for c in fake.calls if c.outputs == ("emotion",)]
    assert first_inputs[0] == first_inputs[1] == (
        "Speaker: I lost my keys.\nListener: Oh no, where?\nSpeaker: At the beach, in the sand."
    )


def test_bad_dialogue_fails_before_any_lm_call(fake):
    with pytest.raises(DialogueError, match="last turn"):
        TraceProgram()(dialogue="Speaker: hi\nListener: hello")
    with pytest.raises(DialogueError, match="empty"):
        TraceProgram()(dialogue="   ")
    assert fake.calls == []


def test_reasoning_is_set_by_config(fake):
    program = TraceProgram(ProgramConfig(reasoning=["generate_response"]))
    assert "reasoning" not in program.recognize_emotion.signature.output_fields
    assert list(program.generate_response.signature.output_fields) == ["reasoning", "response"]
    pred = program(dialogue="I failed my driving test again.")
    assert fake.calls[0].outputs == ("emotion",)
    assert fake.calls[-1].outputs == ("reasoning", "response")
    assert pred.generate_response_reasoning and "recognize_emotion_reasoning" not in pred


def test_disabled_cause_stage_drops_its_inputs_downstream(fake):
    program = TraceProgram(ProgramConfig(disabled=["analyze_cause"]))
    assert [n for n, _ in program.named_predictors()] == ["recognize_emotion", "plan_strategy", "generate_response"]
    pred = program(dialogue="I failed my driving test again.")
    assert fake.stage_order() == ["recognize_emotion", "plan_strategy", "generate_response"]
    assert not CAUSE_FIELDS & set(fake.calls[1].inputs)
    assert not CAUSE_FIELDS & set(fake.calls[2].inputs)
    assert "cause_summary" not in pred and pred.response


def test_disabled_strategy_stage(fake):
    program = TraceProgram(ProgramConfig(disabled=["plan_strategy"]))
    program(dialogue="I failed my driving test again.")
    assert fake.stage_order() == ["recognize_emotion", "analyze_cause", "generate_response"]
    assert "strategy" not in fake.calls[-1].inputs


def test_config_rejects_unknown_or_required_stages():
    with pytest.raises(ConfigError, match="generate_response"):
        ProgramConfig(disabled=["generate_response"])
    with pytest.raises(ConfigError, match="plan"):
        ProgramConfig(reasoning=["plan"])
    with pytest.raises(ConfigError, match="unknown"):
        ProgramConfig.from_dict({"reasoning": [], "cot": True})
    cfg = ProgramConfig(reasoning=["plan_strategy", "recognize_emotion", "plan_strategy"])
    assert cfg == ProgramConfig.from_dict(cfg.to_dict())
    assert cfg.reasoning == ("recognize_emotion", "plan_strategy")


def test_config_from_toml(tmp_path):
    from trace_dspy.core.config import program_config_from_toml

    path = tmp_path / "c.toml"
    path.write_text('[program]\nreasoning = []\ndisabled = ["plan_strategy"]\n')
    cfg = program_config_from_toml(path)
    assert cfg.reasoning == () and cfg.disabled == ("plan_strategy",)
    path.write_text("[program\n")
    with pytest.raises(ConfigError, match="c.toml"):
        program_config_from_toml(path)


def test_state_round_trip_keeps_instructions_and_demos(tmp_path, fake):
    program = TraceProgram()
    program.generate_response.signature = program.generate_response.signature.with_instructions("Be kind.")
    program.recognize_emotion.demos = [dspy.Example(dialogue="Speaker: yay", emotion="joyful")]
    path = tmp_path / "program.json"
    program.save(str(path))
    loaded = TraceProgram()
    loaded.load(str(path))
    assert loaded.generate_response.signature.instructions == "Be kind."
    assert loaded.recognize_emotion.demos[0]["emotion"] == "joyful"
    assert loaded(dialogue="I failed my driving test again.").response


def test_stage_lms_route_calls_and_survive_compile():
    analysis_lm, analysis = fake_lm()
    response_lm, response = fake_lm(response="From the response model.")
    program = TraceProgram(stage_lms={"generate_response": response_lm})
    with dspy.context(lm=analysis_lm):
        pred = program(dialogue="I failed my driving test again.")
    assert analysis.stage_order() == STAGES[:3] and response.stage_order() == ["generate_response"]
    assert pred.response == "From the response model."

    trainset = [dspy.Example(dialogue="Speaker: I failed my driving test again.", emotion="sad",
                             response="Oh no.").with_inputs("dialogue")]
    optimizer = dspy.BootstrapFewShot(metric=lambda e, p, trace=None: True, max_bootstrapped_demos=1,
                                      max_labeled_demos=0)
    with dspy.context(lm=analysis_lm):
        compiled = optimizer.compile(program, trainset=trainset)
        response.calls.clear()
        assert compiled(dialogue="Another bad day.").response == "From the response model."
    assert response.stage_order() == ["generate_response"]
    assert compiled.generate_response.demos  # it really compiled
    with pytest.raises(ValueError, match="unknown stage"):
        program.set_stage_lms({"respond": response_lm})


def test_default_stage_lms_give_way_to_a_configured_lm():
    recorded_lm, recorded = fake_lm(response="From the recorded model.")
    configured_lm, configured = fake_lm(response="From the configured model.")
    lms = {stage: recorded_lm for stage in STAGES}
    program = TraceProgram(stage_lms=lms, stage_lms_default=True)
    assert program(dialogue="I failed my driving test again.").response == "From the recorded model."
    with dspy.context(lm=configured_lm):
        assert program(dialogue="I failed my driving test again.").response == "From the configured model."
    assert configured.stage_order() == STAGES and recorded.stage_order() == STAGES
    # Stage LMs a caller chose are not a default: they keep their stages under a configured LM.
    chosen = TraceProgram(stage_lms=lms)
    with dspy.context(lm=configured_lm):
        assert chosen(dialogue="I failed my driving test again.").response == "From the recorded model."


def test_a_loaded_program_runs_on_the_lm_dspy_holds():
    import trace_dspy

    configured_lm, configured = fake_lm(response="From the configured model.")
    program = trace_dspy.load("trace-dspy@v6")  # recorded on the embedded model, which must not be called
    with dspy.context(lm=configured_lm):
        pred = program(dialogue="I failed my driving test again.")
    assert pred.response == "From the configured model."
    assert configured.stage_order()[-1] == "generate_response"
