from __future__ import annotations

import pytest

from trace_dspy.core.dialogue import (
    MAX_DIALOGUE_CHARS,
    DialogueError,
    normalize_dialogue,
    parse_dialogue,
    speaker_text,
)


def test_plain_string_is_one_speaker_turn():
    assert normalize_dialogue("  I failed   my test. ") == "Speaker: I failed my test."


def test_prefixed_lines_with_continuations_and_aliases():
    text = "seeker: I moved.\nIt was far.\nRESPONDER: Where to?\nSpeaker: Oslo."
    assert normalize_dialogue(text) == "Speaker: I moved. It was far.\nListener: Where to?\nSpeaker: Oslo."


def test_list_of_strings_alternates_backwards_from_the_speaker():
    turns = parse_dialogue(["a", "b", "c", "d"])
    assert [t.role for t in turns] == ["Listener", "Speaker", "Listener", "Speaker"]


def test_list_of_role_mappings():
    turns = parse_dialogue([{"role": "user", "text": "hi"}, {"role": "assistant", "text": "hey"},
                            {"role": "speaker", "text": "sad day"}])
    assert [t.role for t in turns] == ["Speaker", "Listener", "Speaker"]


@pytest.mark.parametrize(("value", "message"), [
    ("", "empty"),
    (" \n\t ", "empty"),
    ([], "empty"),
    ("Speaker: hi\nListener: hello", "last turn"),
    (["hi", ""], "empty"),
    ("bad\x00bytes", "NUL"),
    (b"bytes", "string or a list"),
    ([{"role": "robot", "text": "x"}], "unknown role"),
    ("x" * (MAX_DIALOGUE_CHARS + 1), "limit"),
])
def test_bad_dialogues_are_refused_with_a_reason(value, message):
    with pytest.raises(DialogueError, match=message):
        parse_dialogue(value)


def test_speaker_text_ignores_listener():
    assert speaker_text("Speaker: one\nListener: two\nSpeaker: three") == "one three"
