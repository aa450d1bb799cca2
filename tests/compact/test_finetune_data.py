"""The fine-tuned writer's training examples: human replies in the briefed layout, planned by the EPITOME
scorer, and left out where the metric's own readers find them off-topic or uncaring (``ReplyFloors``)."""

from __future__ import annotations

import pytest

from trace_dspy.compact.finetune import FinetuneConfig, ReplyFloors, human_examples, tuned_config
from trace_dspy.core.config import ConfigError, ProgramConfig
from trace_dspy.data.listener_replies import ListenerReply
from trace_dspy.program.pipeline import stage_signature

def _reply(number: int, speaker: str, reply: str, emotion: str) -> ListenerReply:
    return ListenerReply(f"valid:{number}", speaker, reply, emotion, None, speaker.lower(), reply.lower())


REPLIES = [
    _reply(1, "I found a spider in my bathtub", "They do love to surprise ya, do not they?", "afraid"),
    _reply(2, "I am nervous about my son starting school.", "That will be no fun.", "anxious"),
    _reply(3, "My dog died last night.", "I am so sorry. How old was he?", "sad"),
]


class _Scorer:
    """EPITOME levels by reply: the uncaring one is all zeros, the others lead with EX then ER."""

    def score_batch(self, seekers, replies):
        return [{"ER": 0.0, "IP": 0.0, "EX": 0.0} if "no fun" in r else {"ER": 1.0, "IP": 0.2, "EX": 1.5}
                for r in replies]


class _Relevance:
    """P(fits) by reply: the spider reply fits nobody."""

    def __init__(self):
        self.calls = []

    def score_batch(self, speakers, lasts, replies):
        self.calls.append((list(speakers), list(lasts)))
        return [0.05 if "surprise ya" in r else 0.97 for r in replies]


def _signature():
    return stage_signature("generate_response", tuned_config(ProgramConfig()))


def test_the_floors_leave_out_the_off_topic_and_the_uncaring_reply_and_count_them():
    relevance = _Relevance()
    human = human_examples(REPLIES, _Scorer(), _signature(), relevance=relevance, floors=ReplyFloors())
    assert human.below_floors == 2 and len(human.examples) == 1
    messages = human.examples[0]["messages"]
    assert messages[-1] == {"role": "assistant", "content": "I am so sorry. How old was he?"}
    assert messages[-2] == {"role": "user", "content": "My dog died last night."}
    assert "They feel sad" in messages[0]["content"]  # ED's label, in the briefed system line
    assert relevance.calls == [([r.speaker for r in REPLIES], [r.speaker for r in REPLIES])]


def test_without_floors_every_reply_is_learned_from_and_planned_by_its_strongest_mechanisms():
    human = human_examples(REPLIES, _Scorer(), _signature())
    assert human.below_floors == 0 and len(human.examples) == 3
    system = human.examples[2]["messages"][0]["content"]
    assert "question" in system  # EX first (1.5), then ER (1.0): the plan asks a question


def test_the_default_config_reads_with_floors_and_refuses_floors_out_of_range():
    assert FinetuneConfig().floors == ReplyFloors(0.6, 0.35)
    with pytest.raises(ConfigError, match="relevance 1.5"):
        ReplyFloors(relevance=1.5)
    with pytest.raises(ConfigError, match="empathy -0.1"):
        ReplyFloors(empathy=-0.1)


def test_the_program_mix_answers_each_conversations_first_turn_as_the_human_mix_reads_it():
    from trace_dspy.compact.finetune_fit import first_turns
    from trace_dspy.data.samples import Sample

    def sample(conv: str, turns: tuple[str, ...], reply: str) -> Sample:
        return Sample(f"{conv}:{len(turns)}", conv, turns, "sad", reply)

    # ED's text, lower-cased with spaced punctuation; its pool holds every prefix of a conversation (the
    # longest first here), each with the reply that follows it; a JSONL pool may hold a conversation whole
    dog = ("my dog died last night .", "so sorry . how old was he ?", "twelve . he was my best friend .")
    pool = [sample("c1", dog, "i am so sorry ."), sample("c1", dog[:1], dog[1]),
            sample("c2", ("I passed my driving test!", "Congrats! First try?", "Yes!"), "Well done!")]
    turns = first_turns(pool, None, 0)
    assert [e.dialogue for e in turns] == ["Speaker: My dog died last night.", "Speaker: I passed my driving test!"]
    assert [e.response for e in turns] == ["So sorry. How old was he?", "Congrats! First try?"]
    assert set(turns[0].inputs().keys()) == {"dialogue"} and turns[1].conversation_id == "c2"
    drawn = first_turns(pool, 1, 0)
    assert len(drawn) == 1 and drawn == first_turns(pool, 1, 0)  # the draw is seeded
