"""Fewer model passes for the same answers: forced text read in one batch, a reply call ended after its
sentence, saved prefix states, and the thread policy."""

from __future__ import annotations

import json

import dspy
import pytest

from trace_dspy.lm.constraint import OutputConstraint, OutputField
from trace_dspy.lm.forcing import COMPLETED, Forcing
from trace_dspy.lm.grammar import MAX_LIST_ITEMS, constraint_grammar
from trace_dspy.lm.threads import ThreadPolicy

CAUSE = OutputConstraint("sections", (
    OutputField("trigger_spans", "list"),
    OutputField("cause_summary", "text"),
    OutputField("cause_category", "label", ("Loss & Failure", "Loss of Face", "Threat")),
))
QUOTES = {"trigger_spans": ["My dog died.", "I miss him."]}


def forced(text: str, constraint=CAUSE, **kw) -> tuple[str, bool]:
    return Forcing(constraint, quotes=kw.pop("quotes", QUOTES), **kw).next_text(text)


def test_headers_and_separators_are_forced():
    assert forced("") == ('[[ ## trigger_spans ## ]]\n["', False)
    assert forced("[[ ## trig") == ('ger_spans ## ]]\n["', False)
    # A text value ends at its line break; the next header follows, with nothing for the model to choose.
    text = '[[ ## trigger_spans ## ]]\n["My dog died."]\n\n[[ ## cause_summary ## ]]\nHe was old.\n'
    assert forced(text) == ("\n[[ ## cause_category ## ]]\n", False)


def test_a_quote_is_forced_once_only_one_fits():
    head = "[[ ## trigger_spans ## ]]\n"
    assert forced(head + '["') == ("", False)  # two quotes fit
    assert forced(head + '["I') == (' miss him."', False)
    # After a quote: another item or the end, the model's choice; at the item limit only the end.
    assert forced(head + '["I miss him."') == ("", False)
    two = head + '["I miss him.", "My dog died."'
    assert MAX_LIST_ITEMS == 2
    assert forced(two)[0].startswith("]\n\n[[ ## cause_summary ## ]]\n")
    assert forced(head + '["I miss him.",') == (' "', False)


def test_labels_are_completed_only_when_one_fits_and_the_end_needs_no_model():
    head = ('[[ ## trigger_spans ## ]]\n["My dog died."]\n\n[[ ## cause_summary ## ]]\nHe was old.\n\n'
            "[[ ## cause_category ## ]]\n")
    assert forced(head) == ("", False)  # three labels, nothing shared
    assert forced(head + "Loss") == (" ", False)  # "Loss & Failure" and "Loss of Face" share the space
    assert forced(head + "Loss &") == (" Failure" + COMPLETED, True)
    assert forced(head + "Threat") == (COMPLETED, True)
    # The prior's candidates narrow a label field as in the grammar.
    narrowed = forced(head, choices={"cause_category": ["Threat"]})
    assert narrowed == ("Threat" + COMPLETED, True)


def test_a_reply_is_built_from_forced_pieces_and_the_models_few_choices():
    """Decoding as the engine does it: forced pieces in, the model's own text only where the grammar leaves a
    choice; the reply comes out whole and in layout."""
    text, complete, asked = "", False, []
    model_writes = iter(["I", "]", "He was old.", "\n", "Loss &"])
    while not complete:
        piece, complete = forced(text)
        text += piece
        if not complete and not piece:
            asked.append(next(model_writes))
            text += asked[-1]
    assert text == ('[[ ## trigger_spans ## ]]\n["I miss him."]\n\n[[ ## cause_summary ## ]]\nHe was old.\n\n'
                    "[[ ## cause_category ## ]]\nLoss & Failure" + COMPLETED)
    assert len(asked) == 5


def test_a_long_text_value_is_closed_at_its_limit_and_json_forces_nothing():
    head = '[[ ## trigger_spans ## ]]\n["My dog died."]\n\n[[ ## cause_summary ## ]]\n'
    assert forced(head + "x" * 9, limits={"cause_summary": 10}) == ("", False)
    assert forced(head + "x" * 10, limits={"cause_summary": 10})[0].startswith("\n\n[[ ## cause_category")
    as_json = OutputConstraint("json", CAUSE.fields)
    assert forced("", constraint=as_json) == ("", False)
    assert forced("", constraint=OutputConstraint.plain_text("response", max_sentences=1)) == ("", False)


def test_plain_constraints_travel_with_their_sentence_limit():
    plain = OutputConstraint.plain_text("response", max_sentences=1)
    assert OutputConstraint.from_json(json.loads(json.dumps(plain.to_json()))) == plain
    assert constraint_grammar(plain) is None  # free text: no grammar
    with pytest.raises(ValueError, match="max_sentences"):
        OutputConstraint("plain", plain.fields, max_sentences=-1)


def test_first_sentences_cut_as_the_reply_splitter_does():
    from trace_dspy.lm.decoding import first_sentences

    assert first_sentences("That is hard. Do you", 1) == "That is hard."
    assert first_sentences("Oh no!! How", 1) == "Oh no!!"
    assert first_sentences("No end yet", 1) == "No end yet"
    assert first_sentences("One. Two. Three", 2) == "One. Two."


def _busy(monkeypatch, machine: list[float], own: list[float]):
    from trace_dspy.lm import threads

    monkeypatch.setattr(threads, "_busy_seconds", lambda: machine[0])
    monkeypatch.setattr(threads, "_own_seconds", lambda: own[0])
    clock = [100.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(threads.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    return clock


def test_adaptive_threads_leave_the_cores_that_others_use(monkeypatch):
    machine, own = [0.0], [0.0]
    clock = _busy(monkeypatch, machine, own)
    policy = ThreadPolicy("adaptive", 2, cores=2)
    assert policy.threads() == 2  # quiet: the first window saw nothing
    # One second later: the machine was busy 2.5 core-seconds, of which this process used 1.0.
    clock[0] += 1.0
    machine[0] += 2.5
    own[0] += 1.0
    assert policy.others() == pytest.approx(1.5) and policy.threads() == 1
    clock[0] += 1.0
    machine[0] += 1.9  # only this process was busy
    own[0] += 1.9
    assert policy.threads() == 2
    assert ThreadPolicy("fixed", 2, cores=2).threads() == 2
    with pytest.raises(ValueError, match="thread policy"):
        ThreadPolicy("greedy", 2)


def test_the_thread_policy_is_a_checked_setting_recorded_with_the_lm():
    from trace_dspy.core.config import ConfigError
    from trace_dspy.lm.specs import LMConfig, LMSpec

    assert LMSpec().to_dict()["local"]["thread_policy"] == "adaptive"
    assert LMSpec(local={"thread_policy": "fixed"}).to_dict()["local"]["thread_policy"] == "fixed"
    assert "thread_policy" not in LMSpec(model="openai/x").to_dict()["local"]
    again = LMConfig.from_dict(LMConfig(default=LMSpec()).to_dict())
    assert again.default.local == {"thread_policy": "adaptive"}
    with pytest.raises(ConfigError, match="thread_policy"):
        LMSpec(local={"thread_policy": "fast"})


@pytest.mark.slow
@pytest.mark.embedded
def test_jump_forward_reads_fewer_passes_and_keeps_the_layout(local_model):
    """Forced text read in batches: the same fields parse, the quotes are the speaker's, and the model made
    fewer single-token passes than when it wrote every token itself."""
    from trace_dspy.lm.specs import local_lm
    from trace_dspy.program.pipeline import TraceProgram

    program = TraceProgram()
    dialogue = "Speaker: My dog died yesterday. I keep looking for him at the door."
    counts = {}
    results = {}
    for jump in (False, True):
        lm = local_lm(cache=False, thread_policy="fixed", jump_forward=jump)
        with dspy.context(lm=lm):
            results[jump] = program(dialogue=dialogue, exemplars=[])
        counts[jump] = lm.engine.guard_counts.get("forced_reads", 0), lm.engine.stats
    fast = results[True]
    assert counts[True][0] > 0 and counts[False][0] == 0
    assert set(fast.trigger_spans) <= {"My dog died yesterday.", "I keep looking for him at the door."}
    assert fast.cause_category and fast.strategy in ("ER", "IP", "EX") and fast.response


@pytest.mark.slow
@pytest.mark.embedded
def test_a_reply_call_ends_after_its_sentence_with_the_same_words(local_model):
    """Stopping after the first sentence gives the first sentence of the call that ran to its token cap:
    greedy and sampled alike (the same seed draws the same tokens)."""
    from trace_dspy.lm.constraint import CONSTRAINT_KWARG
    from trace_dspy.lm.specs import local_lm

    messages = [{"role": "system", "content": "You are a caring friend."},
                {"role": "user", "content": "My dog died yesterday."},
                {"role": "assistant", "content": "That sounds"}]
    plain = OutputConstraint.plain_text("response", max_sentences=1)
    for temperature in (0.0, 1.0):
        full_lm, cut_lm = local_lm(cache=False, thread_policy="fixed"), local_lm(cache=False, thread_policy="fixed")
        full = full_lm(messages=messages, max_tokens=40, temperature=temperature)[0]
        cut = cut_lm(messages=messages, max_tokens=40, temperature=temperature, **{CONSTRAINT_KWARG: plain})[0]
        from trace_dspy.lm.decoding import first_sentences

        assert cut == first_sentences(full, 1)
        assert cut_lm.engine.stats.completion_tokens < full_lm.engine.stats.completion_tokens


@pytest.mark.slow
@pytest.mark.embedded
def test_a_state_saved_on_disk_gives_the_tokens_of_a_fresh_read(local_model, tmp_path, monkeypatch):
    """The state after a stage's instructions, written by one process and read by the next, continues
    exactly as reading the instructions again does."""
    from trace_dspy.lm import state_files
    from trace_dspy.lm.models import load_model
    from trace_dspy.lm.specs import local_lm
    from trace_dspy.program.pipeline import TraceProgram

    monkeypatch.setenv("TRACE_DSPY_CACHE", str(tmp_path))
    loads = []
    real_load = state_files.StateFiles.load
    monkeypatch.setattr(state_files.StateFiles, "load",
                        lambda self, tokens: loads.append(real_load(self, tokens)) or loads[-1])
    program = TraceProgram()
    dialogue = "Speaker: I lost my wallet on the bus."

    def answer(**settings):
        lm = local_lm(cache=False, thread_policy="fixed", **settings)
        with dspy.context(lm=lm):
            pred = program(dialogue=dialogue, exemplars=[])
        engine = lm.engine
        load_model(str(engine.resolved_path()), engine.n_ctx, engine.n_threads, engine.seed, engine.flash_attn).states.clear()
        return pred.toDict()

    fresh = answer(state_files=False)
    written = answer()  # reads the instructions, writes their states
    assert list((tmp_path / "llama-states").glob("*.state")) and not any(loads)
    restored = answer()  # a "new process": nothing in memory, the states come from disk
    assert any(s is not None for s in loads)
    assert restored == written == fresh
    # A damaged file is ignored: the instructions are read again, with the same answer.
    for path in (tmp_path / "llama-states").glob("*.state"):
        path.write_bytes(path.read_bytes()[:100])
    assert answer() == fresh


def test_the_attention_kernel_is_a_recorded_setting_and_keeps_its_own_saved_states(local_model, tmp_path):
    """Flash attention lays the KV cache out differently: a state saved with it must never be restored into a
    context without it, and the setting travels with the engine's saved settings."""
    from trace_dspy.lm.engine import LlamaEngine
    from trace_dspy.lm.specs import _check_local
    from trace_dspy.lm.state_files import StateFiles

    tokens = [1, 2, 3, 4]
    with_fa = StateFiles(tmp_path, str(local_model), 512, flash_attn=True).path(tokens)
    without = StateFiles(tmp_path, str(local_model), 512, flash_attn=False).path(tokens)
    assert with_fa != without
    engine = LlamaEngine(local_model, flash_attn=True)
    assert LlamaEngine.load_state(engine.dump_state()).flash_attn is True
    assert LlamaEngine(local_model).flash_attn is False  # the default: faster generation on long contexts
    _check_local({"flash_attn": True})
    with pytest.raises(Exception, match="flash_attn"):
        _check_local({"flash_attn": "yes"})


@pytest.mark.slow
@pytest.mark.embedded
def test_a_continuation_from_the_shared_conversation_state_matches_a_fresh_read(local_model):
    """Calls that continue different prefills of one conversation restore the state after the conversation;
    each gives the tokens it gives when it is the first call of a fresh state table."""
    from trace_dspy.lm.models import load_model
    from trace_dspy.lm.specs import local_lm

    chat = [{"role": "system", "content": "You are a caring friend."},
            {"role": "user", "content": "My sister is getting married and I have to give a speech."}]
    prefills = ["That sounds", "I can imagine how", "What"]

    def call(lm, prefill):
        return lm(messages=[*chat, {"role": "assistant", "content": prefill}], max_tokens=16, temperature=0.0)[0]

    lm = local_lm(cache=False, thread_policy="fixed")
    engine = lm.engine
    model = load_model(str(engine.resolved_path()), engine.n_ctx, engine.n_threads, engine.seed, engine.flash_attn)
    together = [call(lm, p) for p in prefills]
    alone = []
    for prefill in prefills:
        model.states.clear()
        alone.append(call(lm, prefill))
    assert together == alone and all(together)
