"""Where a sampled sequence ends (every generator shares it) and the incremental text it reads
stop strings from: framework-free, no model."""

from __future__ import annotations

import pytest

from swarmling.backends.completion import check_sampling, generation_result
from swarmling.backends.base import Completion, SamplingParams
from swarmling.backends.incremental_text import IncrementalText
from swarmling.backends.sequence_end import SequenceEnd

EOS = 0
# A toy byte-level vocabulary: token i is a few bytes; "é" (2 bytes) is split over tokens 5 and 6.
PIECES = {0: b"", 1: b"<ans", 2: b"wer>", 3: b"4", 4: b"</answer>", 5: "é".encode()[:1], 6: "é".encode()[1:], 7: b" x"}


def decode(ids: list[int]) -> str:
    return b"".join(PIECES[i] for i in ids).decode("utf-8", "replace")


def ends(stops, max_new=10, text=bytes):
    if text is bytes:
        return SequenceEnd(max_new, [s.encode() for s in stops], lambda t: t == EOS, PIECES.__getitem__)
    return SequenceEnd(max_new, stops, lambda t: t == EOS, IncrementalText(decode).add)


@pytest.mark.parametrize("text", [bytes, str], ids=["byte pieces", "incremental text"])
def test_a_stop_string_over_several_tokens_ends_at_the_token_completing_it(text):
    end = ends(["answer>"], text=text)
    assert [end.add(t) for t in (7, 1)] == [False, False]
    assert end.add(2) and end.finish_reason == "stop" and end.tokens == 3
    assert end.add(3) and end.tokens == 3  # tokens after the end are not counted


def test_eos_is_kept_and_wins_over_length_and_stops():
    end = ends(["</answer>"], max_new=2)
    assert not end.add(3)
    assert end.add(EOS) and end.finish_reason == "eos" and end.tokens == 2


def test_the_length_limit_and_abandoning():
    end = ends([], max_new=2)
    assert not end.add(3) and end.add(7) and end.finish_reason == "length"
    running = ends([], max_new=5)
    running.add(3)
    running.abandon()
    assert running.finish_reason == "abandoned" and running.tokens == 1
    end.abandon()  # a sequence that had ended keeps its reason
    assert end.finish_reason == "length"


def test_the_stop_check_reads_each_token_once():
    asked = []
    end = SequenceEnd(100, ["zz"], lambda t: False, lambda t: asked.append(t) or "a")
    for t in range(50):
        end.add(t)
    assert asked == list(range(50)) and end.reason is None


def test_incremental_text_adds_up_to_the_whole_decode_and_waits_for_whole_characters():
    text = IncrementalText(decode)
    ids = [7, 1, 5, 6, 2, 3, 4]
    parts = [text.add(t) for t in ids]
    assert parts[2] == ""  # half of "é": nothing until its second byte arrives
    assert parts[3] == "é"
    assert "".join(parts) == decode(ids)


def test_results_are_grouped_per_prompt_and_counted():
    c = [Completion(str(i), [i] * (i + 1), [0.0] * (i + 1), "length") for i in range(4)]
    result = generation_result([[1, 2], [3]], 2, c, started=0.0)
    assert [[x.text for x in row] for row in result.completions] == [["0", "1"], ["2", "3"]]
    assert result.prefill_tokens == 3 and result.generated_tokens == 10 and result.prompt_ids == [[1, 2], [3]]
    with pytest.raises(ValueError, match="temperature"):
        check_sampling(SamplingParams(temperature=0.0))
