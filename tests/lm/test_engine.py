"""The embedded llama.cpp engine: its settings (no model needed) and real-model checks.

The grammars it decodes under are tested in ``test_grammar.py``."""

from __future__ import annotations

import pickle
import sys
import threading

import dspy
import pytest

from trace_dspy import ProgramConfig, TraceProgram
from trace_dspy.core.labels import CAUSE_CATEGORIES, EMOTIONS, STRATEGIES
from trace_dspy.lm.engine import LlamaEngine
from trace_dspy.lm.model_files import LocalModelError, default_model_path
from trace_dspy.lm.models import loaded_model_count

DIALOGUE = ("Speaker: My dog Biscuit ran away yesterday. We searched the whole park.\n"
            "Listener: Oh no! Have you found him?\nSpeaker: Not yet. I keep checking the door.")


def test_the_guard_knows_which_field_is_being_written():
    from trace_dspy.lm.decoding import _guard_field

    chat = "[[ ## strategy ## ]]\nIP\n\n[[ ## response ## ]]\nI am"
    assert _guard_field(chat) == ("response", chat.index("I am"))
    as_json = '{"emotion": "sad", "response": "I am'
    assert _guard_field(as_json) == ("response", as_json.index('"I am'))
    assert _guard_field("no marker yet") is None


def test_missing_extra_is_named(monkeypatch):
    import trace_dspy.lm.model_files as mod

    monkeypatch.setattr(mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(LocalModelError, match=r'pip install -e "\.\[local\]"'):
        default_model_path()


def test_engine_pickles_and_saves_settings_only():
    engine = LlamaEngine(n_ctx=2048, seed=3, quote_fields={}, text_limits={"reasoning": 99})
    clone = pickle.loads(pickle.dumps(engine))
    assert clone.settings() == engine.settings()
    assert LlamaEngine.load_state(engine.dump_state()).settings() == engine.settings()


def test_models_load_without_extra_weight_buffers(local_model, monkeypatch):
    """The engine loads with use_extra_bufts off (AMX/repack buffers crash where AMX is advertised but not
    granted) and puts llama-cpp-python's defaults back afterwards, also when loading fails."""
    import llama_cpp

    import trace_dspy.lm.models as mod

    low = sys.modules["llama_cpp.llama_cpp"]
    original = low.llama_model_default_params
    assert original().use_extra_bufts  # llama.cpp's own default, which the wrapper turns off
    seen = []

    class Recording:
        def __init__(self, **kwargs):
            seen.append(low.llama_model_default_params().use_extra_bufts)
            raise RuntimeError("stop before loading")

    monkeypatch.setattr(llama_cpp, "Llama", Recording)
    monkeypatch.setattr(mod, "_MODELS", {})
    with pytest.raises(RuntimeError, match="stop before loading"):
        mod.load_model(str(local_model), 512, 1, 0)
    assert seen == [False]
    assert low.llama_model_default_params is original


# ---------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def smol(local_model):
    from trace_dspy.lm.specs import local_lm

    return local_lm(cache=False, thread_policy="fixed")


@pytest.mark.slow
@pytest.mark.embedded
def test_program_runs_on_the_embedded_model(smol):
    engine = smol.engine
    before = engine.stats.calls
    with dspy.context(lm=smol, track_usage=True):
        pred = TraceProgram(ProgramConfig(best_of=1))(dialogue=DIALOGUE)
    # One call per analysis stage; the scaffolded reply (auto on this model) is one call per sentence, and one
    # more for a sentence whose opener the model did not go on from (the next opener, tried once).
    assert 3 + 2 <= engine.stats.calls - before <= 3 + 4
    assert pred.emotion in EMOTIONS and pred.cause_category in CAUSE_CATEGORIES
    assert pred.strategy in STRATEGIES and pred.secondary_strategy in STRATEGIES
    assert pred.response.strip()
    speaker = DIALOGUE.replace("Speaker: ", "")
    assert 1 <= len(pred.trigger_spans) <= 2 and all(s in speaker for s in pred.trigger_spans)
    usage = pred.get_lm_usage()[smol.model]
    assert usage["prompt_tokens"] > 100 and usage["completion_tokens"] > 5


@pytest.mark.slow
@pytest.mark.embedded
def test_deterministic_thread_safe_and_loaded_once(smol):
    from trace_dspy.lm.specs import local_lm

    # Greedy only: sampled Best-of-N candidates differ on purpose when a prompt repeats.
    program = TraceProgram(ProgramConfig(reasoning=(), best_of=1))
    dialogues = [DIALOGUE, "My best friend moved to Peru."]
    with dspy.context(lm=smol):
        sequential = [program(dialogue=d).toDict() for d in dialogues]
    # A second engine with the same settings shares the loaded model.
    other = local_lm(cache=False, thread_policy="fixed")
    results: dict[int, dict] = {}

    def run(i):  # each dialogue once on each engine, all four at once
        with dspy.context(lm=other if i % 2 else smol):
            results[i] = program(dialogue=dialogues[i // 2]).toDict()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(4)] == [sequential[0], sequential[0], sequential[1], sequential[1]]
    assert loaded_model_count() == 1
    # A pickled LM (as MLflow stores it) gives the same answers.
    clone = pickle.loads(pickle.dumps(smol))
    with dspy.context(lm=clone):
        assert program(dialogue=dialogues[0]).toDict() == sequential[0]


@pytest.mark.slow
@pytest.mark.embedded
@pytest.mark.parametrize("prefix_cache", [True, False])
def test_answers_do_not_depend_on_call_order(local_model, prefix_cache):
    from trace_dspy.lm.specs import local_lm

    lm = local_lm(cache=False, thread_policy="fixed", prefix_cache=prefix_cache)
    program = TraceProgram(ProgramConfig(reasoning=(), best_of=1))  # greedy, as above
    dialogues = ["I lost my wallet on the bus.", "My niece was born this morning!"]
    with dspy.context(lm=lm):
        forward = [program(dialogue=d).response for d in dialogues]
        backward = [program(dialogue=d).response for d in reversed(dialogues)][::-1]
    assert forward == backward


@pytest.mark.slow
@pytest.mark.embedded
def test_dspy_cache_serves_repeats_without_the_engine(local_model, tmp_path):
    from trace_dspy.lm.specs import local_lm

    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=True)
    try:
        lm = local_lm(cache=True)
        predict = dspy.Predict("question -> answer")
        with dspy.context(lm=lm):
            first = predict(question="Name a colour.").answer
            calls = lm.engine.stats.calls
            second = predict(question="Name a colour.").answer
        assert first == second and lm.engine.stats.calls == calls == 1
    finally:
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


@pytest.mark.slow
@pytest.mark.embedded
def test_fast_greedy_gives_the_answers_of_llama_cpps_own_sampler(local_model):
    """The top-token grammar check must pick exactly what full-vocabulary masking picks."""
    from trace_dspy.lm.specs import local_lm

    # The guard and jump-forward reading change answers on purpose (tested on their own).
    fast = local_lm(cache=False, thread_policy="fixed", fast_greedy=True, loop_guard=False, jump_forward=False)
    slow = local_lm(cache=False, thread_policy="fixed", fast_greedy=False)
    program = TraceProgram(ProgramConfig(best_of=1))  # greedy calls only: the fast path is for greedy decoding
    dialogues = [DIALOGUE, "I lost my wallet on the bus."]
    with dspy.context(lm=slow):
        expected = [program(dialogue=d).toDict() for d in dialogues]
    with dspy.context(lm=fast):
        got = [program(dialogue=d).toDict() for d in dialogues]
    assert got == expected
    assert fast.engine.stats.completion_tokens == slow.engine.stats.completion_tokens
    # Every stage ran (the scaffolded reply in two calls, and at most two second tries), the analysis stages
    # under a grammar.
    assert fast.engine.stats.calls == slow.engine.stats.calls
    assert 2 * (3 + 2) <= fast.engine.stats.calls <= 2 * (3 + 4)


@pytest.mark.slow
@pytest.mark.embedded
def test_the_loop_guard_cuts_a_looping_field_back_to_its_first_statement(local_model):
    """Greedy SmolLM2 repeats "This is a very bad thing." until the length cap; the guard stops it."""
    from trace_dspy.core.text import loop_start
    from trace_dspy.lm.specs import local_lm

    dialogue = "Speaker: My roommate keeps eating my food."
    program = TraceProgram(ProgramConfig(best_of=1))
    # Jump-forward reading off on both: it changes what the model goes on from (tested on its own); no cap on
    # the summary's length, which would end the loop before it shows.
    from trace_dspy.lm.grammar import DEFAULT_TEXT_LIMITS

    uncapped = {k: v for k, v in DEFAULT_TEXT_LIMITS.items() if k != "cause_summary"}
    plain = local_lm(cache=False, thread_policy="fixed", loop_guard=False, jump_forward=False, text_limits=uncapped)
    guarded = local_lm(cache=False, thread_policy="fixed", jump_forward=False, text_limits=uncapped)
    with dspy.context(lm=plain):
        looping = program(dialogue=dialogue)
    with dspy.context(lm=guarded):
        cut = program(dialogue=dialogue)
    assert loop_start(looping.cause_summary) is not None  # the model really loops here
    assert loop_start(cut.cause_summary) is None
    kept = cut.cause_summary.rstrip('"')
    assert len(kept) > 20 and looping.cause_summary.startswith(kept)
    assert guarded.engine.guard_counts["loops_cut"] >= 1
    assert guarded.engine.stats.completion_tokens < plain.engine.stats.completion_tokens
    assert plain.model != guarded.model  # answers differ, so DSPy's cache must not mix them


@pytest.mark.slow
@pytest.mark.embedded
def test_repeated_sampled_calls_give_distinct_candidates_reproducibly(local_model):
    """Best-of-N sends the same request N times; a fixed seed would return one candidate N times."""
    from trace_dspy.lm.specs import local_lm

    def candidates():
        lm = local_lm(cache=False, thread_policy="fixed")
        return [lm(messages=[{"role": "user", "content": "Say something kind to a friend who lost a game."}],
                   temperature=1.0, max_tokens=24)[0] for _ in range(4)]

    first = candidates()
    assert len(set(first)) >= 3
    assert candidates() == first  # a fresh engine draws the same sequence
    greedy = local_lm(cache=False, thread_policy="fixed")
    ask = [{"role": "user", "content": "Name a colour."}]
    assert greedy(messages=ask, temperature=0.0, max_tokens=8) == greedy(messages=ask, temperature=0.0, max_tokens=8)


def test_sampled_calls_keep_only_likely_tokens_and_the_setting_names_the_lm():
    from trace_dspy.lm.engine import SAMPLE_MIN_P
    from trace_dspy.lm.specs import local_lm

    assert LlamaEngine().sample_min_p == SAMPLE_MIN_P
    with pytest.raises(ValueError, match="sample_min_p"):
        LlamaEngine(sample_min_p=1.0)
    # The setting changes sampled answers, so it is part of the LM's name (DSPy's cache key).
    assert local_lm(cache=False, thread_policy="fixed").model == local_lm(cache=False, thread_policy="fixed", sample_min_p=SAMPLE_MIN_P).model
    assert local_lm(cache=False, thread_policy="fixed", sample_min_p=0.05).model.endswith("+minp0.05")


@pytest.mark.slow
@pytest.mark.embedded
def test_min_p_reaches_llama_cpp(local_model):
    """With min-p near 1 only the top token survives, so a temperature-1.0 sample is the greedy answer."""
    from trace_dspy.lm.specs import local_lm

    ask = [{"role": "user", "content": "Say something kind to a friend who lost a game."}]
    greedy = local_lm(cache=False, thread_policy="fixed")(messages=ask, temperature=0.0, max_tokens=16)
    narrow = local_lm(cache=False, thread_policy="fixed", sample_min_p=0.999)
    assert [narrow(messages=ask, temperature=1.0, max_tokens=16) for _ in range(2)] == [greedy, greedy]
    wide = local_lm(cache=False, thread_policy="fixed", sample_min_p=0.0)
    assert len({wide(messages=ask, temperature=1.0, max_tokens=16)[0] for _ in range(3)}) >= 2


@pytest.mark.slow
@pytest.mark.embedded
def test_a_repeated_sampled_prompt_is_read_once(local_model, monkeypatch):
    """Best-of-N candidates share their whole prompt: the second one must not reset or restore the context."""
    from trace_dspy.lm import engine as engine_module
    from trace_dspy.lm.specs import local_lm

    lm = local_lm(cache=False, thread_policy="fixed")
    ask = [{"role": "system", "content": "You are kind."},
           {"role": "user", "content": "Say something kind to a friend who lost a game."}]
    lm(messages=ask, temperature=1.0, max_tokens=3)
    llama = lm.engine._model().llama
    events = []
    monkeypatch.setattr(engine_module, "restore_context", lambda *a: events.append("restore"))
    monkeypatch.setattr(llama, "reset", lambda: events.append("reset"))
    lm(messages=ask, temperature=1.0, max_tokens=3)
    assert events == []
    # Greedy calls still start from the fixed point, so their answers never depend on call order.
    lm(messages=ask, temperature=0.0, max_tokens=3)
    assert events in (["restore"], ["reset"])


@pytest.mark.slow
@pytest.mark.embedded
def test_constrained_decoding_keeps_to_the_priors_candidates(smol):
    """Even candidates that contradict the message bind the embedded model: the grammar allows nothing else."""
    from trace_dspy.core.config import ProgramConfig
    from trace_dspy.program.emotion_prior import shipped_prior

    program = TraceProgram(ProgramConfig(prior_k=2), emotion_prior=shipped_prior())  # the field exists with a prior
    seen = set()
    with dspy.context(lm=smol):
        for candidates in ("proud (60%), grateful (30%)", "jealous (51%), nostalgic (12%)"):
            for message in ("Speaker: My dog died yesterday.", "Speaker: I got the job!!"):
                state = {"dialogue": message, "emotion_candidates": candidates}
                label = program._call("recognize_emotion", state).emotion
                assert label in candidates
                seen.add(label)
    assert len(seen) >= 2


@pytest.mark.slow
@pytest.mark.embedded
def test_a_last_assistant_message_is_continued_as_a_prefill(local_model):
    """The scaffolded reply begins the answer itself; the engine must go on from that text, as llama.cpp's
    server does, and return only what the model added."""
    from trace_dspy.lm.specs import local_lm

    lm = local_lm(cache=False, thread_policy="fixed")
    chat = [{"role": "system", "content": "You are a caring friend."},
            {"role": "user", "content": "I failed my driving test again."}]
    continued = lm(messages=[*chat, {"role": "assistant", "content": "You must be feeling"}],
                   temperature=0.0, max_tokens=12)[0]
    model = lm.engine._model()
    with model.lock:
        prompt = model.formatter(messages=chat).prompt + "You must be feeling"
        model.llama.reset()
        raw = model.llama.create_completion(prompt=prompt, temperature=0.0, max_tokens=12,
                                            stop=list(model.formatter(messages=chat).stop))
    assert continued == raw["choices"][0]["text"]
    assert continued.strip() and not continued.lstrip().startswith("You must")
