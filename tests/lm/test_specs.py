"""LM configuration: TOML, flags, per-stage routing, and no secrets anywhere."""

from __future__ import annotations

import json

import dspy
import pytest

from trace_dspy.cli.common import add_model_args, settings_from_args
from trace_dspy.core.config import ConfigError
from trace_dspy.lm.specs import (
    GrammarLM,
    LMConfig,
    LMSet,
    LMSpec,
    build_lm,
    redact_url,
    use_lm,
)

TOML = """
[program]
reasoning = []

[lm]
model = "openai/base-model"
api_base = "http://user:hunter2@127.0.0.1:9/v1"
api_key_env = "TRACE_TEST_KEY"

[lm.stages.response]
model = "openai/response-model"

[lm.stages.analyze_cause]
model = "openai/cause-model"

[lm.judge]
model = "openai/judge-model"
"""


def _settings(tmp_path, *flags, text=TOML):
    import argparse

    path = tmp_path / "c.toml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    return settings_from_args(parser.parse_args(["--config", str(path), *flags]))


def test_toml_routes_each_stage(tmp_path):
    cfg = _settings(tmp_path).lm
    assert cfg.for_stage("recognize_emotion").model == "openai/base-model"
    assert cfg.for_stage("analyze_cause").model == "openai/cause-model"  # stage beats group
    assert cfg.for_stage("plan_strategy").model == "openai/base-model"
    assert cfg.for_stage("generate_response").model == "openai/response-model"
    assert cfg.for_role("judge").model == "openai/judge-model"
    assert cfg.for_role("prompt").model == "openai/base-model"  # falls back to the default


def test_flags_override_the_file(tmp_path):
    settings = _settings(tmp_path, "--lm", "local", "--analysis-lm", "openai/a", "--prompt-lm", "openai/p")
    cfg = settings.lm
    assert cfg.default.model == "local"
    assert cfg.for_stage("recognize_emotion").model == "openai/a"
    assert cfg.for_stage("analyze_cause").model == "openai/cause-model"  # the file's stage entry stays
    assert cfg.for_role("prompt").model == "openai/p"
    assert settings.program.reasoning == ()


def test_recorded_config_holds_no_secret(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TEST_KEY", "sk-very-secret-value")
    record = json.dumps(_settings(tmp_path).to_dict())
    assert "sk-very-secret-value" not in record and "hunter2" not in record
    assert "TRACE_TEST_KEY" in record  # the variable's name is fine to record
    lm = build_lm(LMConfig.from_dict(_settings(tmp_path).lm.to_dict()).default)
    assert lm.kwargs.get("api_key") == "sk-very-secret-value" or "sk-very-secret-value" in repr(vars(lm))


@pytest.mark.parametrize(("text", "message"), [
    ('[lm]\nmodel = "openai/x"\napi_key = "sk-123"\n', "must not hold secrets"),
    ('[lm]\nmodel = "openai/x"\napi_key_env = "sk-123abc"\n', "NAME of an environment variable"),
    ('[lm]\nmodel = "openai/x"\ntemprature = 0.5\n', "unknown keys: temprature"),
    ('[lm.stages.writer]\nmodel = "x"\n', "unknown stage"),
    ('[lmm]\nmodel = "x"\n', "unknown table"),
    ('[program]\nadapter = "xml"\n', "adapter must be one of"),
    ('[data]\nsrc = "x"\n', "unknown keys: src"),
    ('[retrieval]\nk = 3\n', "unknown table"),
])
def test_bad_configs_are_refused_clearly(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        _settings(tmp_path, text=text)


def test_missing_key_variable_is_named(monkeypatch):
    monkeypatch.delenv("NOPE_KEY", raising=False)
    with pytest.raises(ConfigError, match="NOPE_KEY"):
        build_lm(LMSpec(model="openai/x", api_key_env="NOPE_KEY"))


def test_round_trip_and_redaction():
    cfg = LMConfig(default=LMSpec(model="local", local={"n_ctx": 2048}),
                   stages={"response": LMSpec(model="openai/r", server_grammar=True)})
    assert LMConfig.from_dict(cfg.to_dict()) == cfg
    assert redact_url("https://me:pw@host:8443/v1") == "https://***@host:8443/v1"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"


def test_lmset_shares_identical_specs_and_builds_grammar_lms():
    cfg = LMConfig(default=LMSpec(model="openai/a", api_base="http://127.0.0.1:9/v1"),
                   stages={"response": LMSpec(model="openai/b", api_base="http://127.0.0.1:9/v1",
                                              server_grammar=True)})
    lms = LMSet(cfg)
    stage = lms.stage_lms()
    assert stage["recognize_emotion"] is stage["plan_strategy"] is lms.default
    assert isinstance(stage["generate_response"], GrammarLM)
    assert not isinstance(lms.default, GrammarLM) and isinstance(lms.default, dspy.LM)


def test_grammar_lm_adds_the_grammar_to_the_request():
    lm = GrammarLM("openai/x", api_base="http://127.0.0.1:9/v1")
    from trace_dspy import TraceProgram

    messages = dspy.ChatAdapter().format(TraceProgram().recognize_emotion.signature, [], {"dialogue": "Speaker: hi"})
    kwargs = lm._with_grammar(messages, {"temperature": 0})
    assert kwargs["extra_body"]["grammar"].startswith("root ::= ")
    assert lm._with_grammar([{"role": "user", "content": "hi"}], {}) == {}


def test_use_lm_sets_the_lm_only_when_given():
    outer, inner = dspy.LM("openai/outer"), dspy.LM("openai/inner")
    with dspy.context(lm=outer):
        with use_lm(None):
            assert dspy.settings.lm is outer
        with use_lm(inner):
            assert dspy.settings.lm is inner
        assert dspy.settings.lm is outer
