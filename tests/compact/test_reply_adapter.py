"""The chat-native reply layout (compact.reply_adapter): the conversation as chat turns, the reply as the plain
answer; the scaffolded reply (compact.scaffold) through it, and the program's choice of layout. The text helpers:
test_reply_text.py."""

from __future__ import annotations

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.config import ConfigError
from trace_dspy.compact.reply_adapter import ChatReplyAdapter
from trace_dspy.compact.reply_text import question_clause
from trace_dspy.compact.scaffold import ScaffoldedReply
from trace_dspy.program.pipeline import stage_signature
from trace_dspy.testing.fakes import fake_lm

DIALOGUE = "Speaker: I lost my wallet on the bus.\nListener: Oh no, did you report it?\nSpeaker: Yes, but nobody handed it in."


def reply_inputs(**extra):
    return {"dialogue": DIALOGUE, "emotion": "sad", "trigger_spans": ["I lost my wallet on the bus."],
            "cause_summary": "A lost wallet.", "cause_category": "Loss & Grief", "strategy": "EX",
            "secondary_strategy": "ER", "exemplars": ["Speaker: x\nListener (reply): COPY ME"], **extra}


def scaffolded(lm, inputs: dict, openers=None) -> dspy.Prediction:
    """The scaffolded reply to the reply stage's ``inputs``, written on ``lm`` with ``openers`` (None: stock)."""
    signature = stage_signature("generate_response", ProgramConfig(reply_format="scaffold"))
    module = ScaffoldedReply(dspy.Predict(signature), ChatReplyAdapter(scaffold=True), openers=openers)
    with dspy.context(lm=lm):
        return module(**{k: v for k, v in inputs.items() if k in signature.input_fields})


def test_the_conversation_becomes_chat_turns_and_the_plan_words():
    signature = stage_signature("generate_response", ProgramConfig(reply_format="chat"))
    demos = [dspy.Example(dialogue="Speaker: My cat is ill.", response="That must be worrying.")]
    messages = ChatReplyAdapter().format(signature, demos, reply_inputs())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert "ask one gentle question" in system and "say warmly" in system
    assert system.index("ask one gentle question") < system.index("say warmly")  # primary first
    assert messages[1:3] == [{"role": "user", "content": "My cat is ill."},
                             {"role": "assistant", "content": "That must be worrying."}]
    assert [m["content"] for m in messages[3:]] == ["I lost my wallet on the bus.", "Oh no, did you report it?",
                                                   "Yes, but nobody handed it in."]
    # Without reply_exemplars the writer never sees retrieved replies, nor the field markers.
    assert not any("COPY ME" in m["content"] or "[[ ##" in m["content"] for m in messages)


def test_compiled_instructions_replace_the_stock_lead():
    signature = stage_signature("generate_response", ProgramConfig(reply_format="chat"))
    compiled = signature.with_instructions("Be brief and kind to the person.")
    assert ChatReplyAdapter().format(compiled, [], reply_inputs())[0]["content"].startswith("Be brief and kind")
    stock = ChatReplyAdapter().format(signature, [], reply_inputs())[0]["content"]
    assert "[[" not in stock and "exemplars" not in stock


def test_other_stages_keep_the_field_layout():
    signature = stage_signature("plan_strategy", ProgramConfig())
    messages = ChatReplyAdapter().format(signature, [], {k: v for k, v in reply_inputs().items()
                                                         if k in signature.input_fields})
    assert "[[ ## dialogue ## ]]" in messages[-1]["content"]


def test_the_program_answers_through_the_chat_layout():
    lm, engine = fake_lm(response="Listener: That sounds stressful. Was there anything important in it?")
    program = TraceProgram(ProgramConfig(reply_format="chat", best_of=1))
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    assert pred.response == "That sounds stressful. Was there anything important in it?"
    assert engine.stage_order() == ["recognize_emotion", "analyze_cause", "plan_strategy", "generate_response"]
    last = lm.history[-1]
    assert [m["role"] for m in last["messages"]][-3:] == ["user", "assistant", "user"]
    assert last["kwargs"]["stop"] == ["\n"] and last["kwargs"]["max_tokens"] <= 80


@pytest.mark.parametrize("layout", ["chat", "briefed"])
def test_reply_second_question_keeps_the_reaction_and_drops_a_second_statement(layout):
    said = "Listener: That is great! I hope you passed as well!"
    replies = {}
    for second in ("any", "question"):
        lm, _ = fake_lm(response=said)
        program = TraceProgram(ProgramConfig(reply_format=layout, best_of=1, reply_second=second))
        with dspy.context(lm=lm):
            replies[second] = program(dialogue=DIALOGUE).response
    assert replies == {"any": "That is great! I hope you passed as well!", "question": "That is great!"}


def test_reply_second_is_validated_recorded_and_absent_from_old_artifacts(tmp_path):
    import trace_dspy
    from trace_dspy.lm.specs import LMConfig
    from trace_dspy.store.artifacts import save_artifact

    assert ProgramConfig().reply_second == "any"
    config = ProgramConfig(reply_second="question")
    assert ProgramConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="reply_second must be one of any, question"):
        ProgramConfig(reply_second="never")
    old = {"config": {"program": {k: v for k, v in ProgramConfig().to_dict().items() if k != "reply_second"},
                      "lm": LMConfig().to_dict()}}
    folder = save_artifact(TraceProgram(ProgramConfig(prior_k=0)), old, root=tmp_path)
    assert trace_dspy.load(str(folder), attach_lms=False).config.reply_second == "any"


def test_an_empty_reply_is_a_parse_error_not_a_blank_answer():
    lm, _ = fake_lm(response="Listener:   ")
    program = TraceProgram(ProgramConfig(reply_format="chat"))
    with dspy.context(lm=lm), pytest.raises(dspy.utils.exceptions.AdapterParseError):
        program(dialogue=DIALOGUE)


def test_reply_format_is_validated_and_recorded():
    with pytest.raises(ConfigError, match="reply_format"):
        ProgramConfig(reply_format="prose")
    config = ProgramConfig(reply_format="chat")
    assert ProgramConfig.from_dict(config.to_dict()) == config
    assert ProgramConfig().reply_format == "auto"


def test_auto_picks_a_chat_layout_for_the_compact_writer_and_fields_otherwise():
    from trace_dspy.lm.specs import GrammarLM

    program = TraceProgram()
    lm, _ = fake_lm()
    assert program.reply_format(lm) == "fields"
    assert program.reply_format(None) == "fields"
    constrained = GrammarLM.__new__(GrammarLM)  # no connection needed to ask its kind
    assert program.reply_format(constrained) == "fields"  # a grammar alone does not make the writer compact
    assert TraceProgram(ProgramConfig(writer="compact")).reply_format(lm) == "scaffold"
    assert TraceProgram(ProgramConfig(writer="compact", reply_format="fields")).reply_format(lm) == "fields"


def test_artifacts_saved_before_the_option_keep_the_field_layout(tmp_path):
    import json
    import shutil
    from pathlib import Path

    import trace_dspy

    shipped = Path(__file__).resolve().parents[2] / "artifacts" / "trace-dspy" / "v0001"
    folder = tmp_path / "v0001"
    shutil.copytree(shipped, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "reply_format" not in manifest["config"]["program"]
    assert trace_dspy.load(str(folder), attach_lms=False).config.reply_format == "fields"


def test_the_audit_note_reaches_the_writer_on_a_redo():
    signature = stage_signature("generate_response", ProgramConfig(reply_format="chat", reflection=True))
    assert "revision_note" in signature.input_fields
    first = ChatReplyAdapter().format(signature, [], reply_inputs(revision_note=""))[0]["content"]
    redo = ChatReplyAdapter().format(signature, [], reply_inputs(revision_note="Do not give advice."))[0]["content"]
    assert "not right" not in first
    assert redo.startswith(first) and redo.endswith("Do not give advice.")


def test_with_reply_exemplars_the_writer_sees_the_retrieved_conversations_as_prose():
    signature = stage_signature("generate_response", ProgramConfig(reply_format="chat"))
    demos = [dspy.Example(dialogue="Speaker: My cat is ill.", response="That must be worrying.")]
    exemplars = ["Speaker: i lost my keys .\nListener: oh no !\nSpeaker: they were in my bag the whole time .\n"
                 "Listener (reply): ha , i 've done that too . were you relieved ?",
                 "not an exemplar"]
    messages = ChatReplyAdapter(exemplars=True).format(signature, demos, reply_inputs(exemplars=exemplars))
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user",
                                             "assistant", "user"]
    # Compiled demos first, then the exemplar's last speaker turn and its reply (tidied), then the conversation.
    assert messages[3:5] == [{"role": "user", "content": "They were in my bag the whole time."},
                             {"role": "assistant", "content": "Ha, I've done that too. Were you relieved?"}]
    assert messages[5]["content"] == "I lost my wallet on the bus."
    # The program routes its config to the matching adapter.
    from trace_dspy.compact.reply_adapter import chat_reply_adapter

    assert chat_reply_adapter(exemplars=True).exemplars and not chat_reply_adapter().exemplars


def test_reply_exemplars_config_and_old_artifacts(tmp_path):
    from trace_dspy.lm.specs import LMConfig
    import trace_dspy
    from trace_dspy.store.artifacts import save_artifact

    assert ProgramConfig().reply_exemplars is True
    assert ProgramConfig.from_dict(ProgramConfig(reply_exemplars=False).to_dict()).reply_exemplars is False
    with pytest.raises(ConfigError, match="reply_exemplars must be true or false"):
        ProgramConfig(reply_exemplars="yes")
    # An artifact saved before the option loads as it was compiled: the writer without exemplars.
    old = {"config": {"program": {k: v for k, v in ProgramConfig().to_dict().items() if k != "reply_exemplars"},
                      "lm": LMConfig().to_dict()}}
    folder = save_artifact(TraceProgram(ProgramConfig(prior_k=0)), old, root=tmp_path)
    assert trace_dspy.load(str(folder), attach_lms=False).config.reply_exemplars is False


# ---------------------------------------------------------------- the scaffolded reply


def _continuing(prefills: list):
    """A writer that goes on from each opener, one sentence and then some words a reply must not keep."""
    goes_on = {"That sounds": " awful, losing it on the bus. Anyway the bus", "How are you feeling": " about it now? I",
               "Oh, that is": ".", "Oh, wow": "!", "How did": " you lose your wallet? Tell", "I'm so": " sorry.",
               "How are you": " not to blame.", "You must be feeling": " low about losing it on the bus.",
               "I can imagine how": " losing it on the bus hurts.", "That must be so": " low about losing it on the bus."}

    def responder(outputs, inputs):
        if "prefill" not in inputs:  # another stage: the default answers
            return {}
        prefills.append(inputs["prefill"])
        opener = next(o for o in goes_on if inputs["prefill"].endswith(o))
        return {"response": goes_on[opener]}
    return responder


def test_the_scaffolded_reply_is_one_continued_sentence_per_mechanism():
    prefills: list = []
    lm, engine = fake_lm(_continuing(prefills))
    pred = scaffolded(lm, reply_inputs())
    assert pred.response == "That sounds awful, losing it on the bus. How are you feeling about it now?"
    # The second sentence continues after the first: both are in its prefill.
    assert prefills == ["That sounds", "That sounds awful, losing it on the bus. How are you feeling"]
    last = lm.history[-1]["messages"]
    assert [m["role"] for m in last][-2:] == ["user", "assistant"]
    assert last[0]["content"] == "You are a caring friend. Answer the person in one or two short sentences of your own."
    assert lm.history[-1]["kwargs"]["max_tokens"] <= 32 and lm.history[-1]["kwargs"]["stop"] == ["\n"]


def test_a_question_ends_at_its_first_comma():
    assert question_clause("How did that happen, a coworker?", "How did") == "How did that happen?"
    assert question_clause("How did you get a tow truck to your doorstep, with your own car?", "How did") \
        == "How did you get a tow truck to your doorstep?"
    assert question_clause("How are you feeling about her?", "How are you feeling") == "How are you feeling about her?"
    # Cut to the bare opener, it would be left out as a question the model did not go on from: kept whole.
    assert question_clause("How are you, my friend?", "How are you") == "How are you, my friend?"
    assert question_clause("Well, how did it go?", "How did") == "Well, how did it go?"  # not begun with it
    # Through the adapter: the question's tail is cut, the acknowledgement's comma is not.
    goes_on = {"That sounds": " awful, losing it on the bus.", "How are you feeling": " about it now, my friend? I"}
    lm, _ = fake_lm(lambda outputs, inputs: {"response": next(
        v for k, v in goes_on.items() if inputs["prefill"].endswith(k))} if "prefill" in inputs else {})
    pred = scaffolded(lm, reply_inputs())
    assert pred.response == "That sounds awful, losing it on the bus. How are you feeling about it now?"


def test_an_opener_continued_with_a_comma_is_not_gone_on_from_unless_it_is_an_interjection():
    from trace_dspy.compact.openers import comma_may_follow

    assert comma_may_follow("Oh, wow") and not comma_may_follow("That must be so")
    assert not comma_may_follow("I can imagine how") and not comma_may_follow("How are you feeling")
    # IP+EX: "You must be feeling" goes on with a comma (left out), its spare "I can imagine how" with words.
    goes_on = {"You must be feeling": ", your daughter's first word, that's", "I can imagine how": " proud you are.",
               "How are you feeling": " about it?"}
    prefills: list = []

    def answer(outputs, inputs):
        if "prefill" not in inputs:
            return {}
        prefills.append(inputs["prefill"])
        return {"response": next(v for k, v in goes_on.items() if inputs["prefill"].endswith(k))}

    lm, _ = fake_lm(answer)
    pred = scaffolded(lm, reply_inputs(strategy="IP", secondary_strategy="EX"))
    assert prefills[:2] == ["You must be feeling", "I can imagine how"]
    assert pred.response == "I can imagine how proud you are. How are you feeling about it?"
    # After an interjection the comma is the sentence's own.
    goes_on = {"Oh, wow": ", that's wonderful.", "How are you feeling": " about it?"}
    pred = scaffolded(lm, reply_inputs(strategy="ER", secondary_strategy="EX"),
                      openers={"any": {"ER": ["Oh, wow"]}})
    assert pred.response.startswith("Oh, wow, that's wonderful.")


def test_an_opener_the_model_does_not_go_on_from_is_left_out_and_candidates_vary():
    from trace_dspy.compact.reply_text import scaffold_openers

    prefills: list = []
    lm, _ = fake_lm(_continuing(prefills))
    inputs = reply_inputs(strategy="EX", secondary_strategy="EX")
    assert scaffold_openers(inputs, 1) == ["Oh, that is", "How did"]
    pred = scaffolded(lm.copy(rollout_id=0), inputs)  # BestOfN's first sample
    assert pred.response == "How did you lose your wallet?"
    # The model went on from neither the lead nor the next candidate's lead in its place.
    assert prefills == ["Oh, that is", "Oh, wow", "How did"]
    # A question opener made a statement is not kept: the next candidate's question is asked in its place, as
    # the next lead is where the model does not go on from this one.
    pred = scaffolded(lm.copy(rollout_id=1), inputs)
    assert prefills[3:] == ["Oh, wow", "That sounds", "That sounds awful, losing it on the bus. How are you",
                            "That sounds awful, losing it on the bus. How are you feeling"]
    assert pred.response == "That sounds awful, losing it on the bus. How are you feeling about it now?"
    # A second sentence that only says the first one's words again is cut to its opener, and left out (as is the
    # next candidate's in its place, which says them too).
    pred = scaffolded(lm, reply_inputs(strategy="IP", secondary_strategy="IP"))
    assert pred.response == "You must be feeling low about losing it on the bus."


def test_the_program_writes_scaffolded_candidates_and_keeps_the_best():
    prefills: list = []
    lm, engine = fake_lm(_continuing(prefills), strategy="EX", secondary_strategy="ER")
    program = TraceProgram(ProgramConfig(reply_format="scaffold", best_of=2, best_of_threshold=1.0, opener_variety=1))
    program.reward_fn = lambda inputs, pred: 0.9 if pred.response.startswith("How did") else 0.5
    with dspy.context(lm=lm):
        pred = program(dialogue=DIALOGUE)
    assert pred.response == "How did you lose your wallet?"  # the sampled candidate scored higher
    assert pred.reply_rewards == [0.5, 0.9]
    assert prefills[0] == "That sounds" and "Oh, that is" in prefills


def test_auto_picks_the_scaffold_for_the_compact_writer():
    from trace_dspy.lm.specs import GrammarLM

    constrained = GrammarLM.__new__(GrammarLM)
    assert TraceProgram(ProgramConfig(writer="compact")).reply_format(constrained) == "scaffold"
    assert TraceProgram(ProgramConfig(reply_format="chat")).reply_format(constrained) == "chat"


def test_when_the_model_goes_on_from_no_opener_the_reply_is_asked_for_whole():
    def responder(outputs, inputs):
        if "prefill" not in inputs:
            return {}
        return {"response": "." if inputs["prefill"] else "Oh no. Did anyone hand it in?"}

    lm, _ = fake_lm(responder)
    pred = scaffolded(lm, reply_inputs())
    assert pred.response == "Oh no. Did anyone hand it in?"
    # Each opener and the next candidate's in its place were tried before the whole reply was asked for.
    assert [m[-1]["role"] for m in (h["messages"] for h in lm.history)] == ["assistant"] * 4 + ["user"]
