"""bench/trace's readers on small JSONL files written here: Mooncake (and aiperf's mooncake_trace
extensions), Bailian, aiperf single_turn and multi_turn, the format detection and the refusals."""

from __future__ import annotations

import json

import pytest

from bench.trace.formats import detect, read_trace
from bench.trace.request import TraceError


def write(path, records) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def test_mooncake_fields_times_and_inferred_sessions(tmp_path):
    # 0 is followed by 1, 4, 6, 10: a fork (a system prompt); the rest are conversations below it
    path = write(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 2000, "output_length": 50, "hash_ids": [0, 1, 2, 3]},
        {"timestamp": 1500, "input_length": 1100, "output_length": 5, "hash_ids": [0, 4, 5]},
        "",
        {"timestamp": 1500, "input_length": 1200, "output_length": 7, "hash_ids": [0, 6, 7]},
        {"timestamp": 9000, "input_length": 2300, "output_length": 9, "hash_ids": [0, 1, 2, 8, 9]},
        {"timestamp": 9500, "input_length": 600, "output_length": 1, "hash_ids": [0, 10]},
        {"timestamp": 9600, "input_length": 100, "output_length": 1, "hash_ids": [0]}])
    fmt, reqs = read_trace(path)
    assert fmt == "mooncake" and len(reqs) == 6
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 1.5, 9.0, 9.5, 9.6]
    assert reqs[0].blocks == (0, 1, 2, 3) and reqs[0].input_length == 2000 and reqs[0].output_tokens == 50
    # turn 2 of the first conversation (its partial block 3 became 8) joins its session
    assert [r.session for r in reqs] == ["block-1", "block-4", "block-6", "block-1", "block-10", "request-5"]
    assert not any(r.follows_previous or r.carries_history for r in reqs)


def test_mooncake_aiperf_extensions(tmp_path):
    path = write(tmp_path / "m.jsonl", [
        {"session_id": "a", "timestamp": 100, "input_length": 300, "output_length": 4, "hash_ids": [1]},
        {"session_id": "a", "delay": 2000, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]},
        {"session_id": 7, "text_input": "hello there", "output_length": 3}])
    _, reqs = read_trace(path)
    assert [r.session for r in reqs] == ["a", "a", "7"]
    assert reqs[1].arrival_s is None and reqs[1].delay_s == 2.0 and reqs[1].follows_previous
    assert reqs[2].text == "hello there" and reqs[2].blocks == () and reqs[2].input_length is None


@pytest.mark.parametrize(("record", "message"), [
    ({"timestamp": 0, "output_length": 1, "hash_ids": [1]}, "field 'input_length' is missing"),
    ({"timestamp": 0, "input_length": 5, "hash_ids": [1, "x"]}, "'hash_ids' must be a list of integers"),
    ({"timestamp": -1, "input_length": 5}, "'timestamp' must be a number >= 0"),
    ({"messages": [{"role": "user", "content": "hi"}], "input_length": 3}, "field 'messages' is not supported"),
    ({"timestamp": 0, "delay": 5, "input_length": 5}, "'timestamp' and 'delay' cannot be set together"),
])
def test_mooncake_refusals_name_the_line_and_field(tmp_path, record, message):
    path = write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 5, "hash_ids": [0]}, record])
    with pytest.raises(TraceError, match=message) as e:
        read_trace(path, "mooncake")
    assert "m.jsonl:2" in str(e.value)


def test_not_json_names_the_line(tmp_path):
    path = write(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 5}, "{oops"])
    with pytest.raises(TraceError, match=r"m.jsonl:2: not a JSON object"):
        read_trace(path)


def test_bailian_sessions_follow_parent_chat_ids(tmp_path):
    path = write(tmp_path / "b.jsonl", [
        {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 10,
         "type": "text", "turn": 1, "hash_ids": [11, 12, 13]},
        {"chat_id": 2, "parent_chat_id": -1, "timestamp": 1.25, "input_length": 20, "output_length": 3,
         "type": "search", "turn": 1, "hash_ids": [21, 22]},
        {"chat_id": 5, "parent_chat_id": 1, "timestamp": 61.114, "input_length": 70, "output_length": 0,
         "type": "text", "turn": 2, "hash_ids": [11, 12, 14, 15, 16]},
        {"chat_id": 9, "parent_chat_id": 5, "timestamp": 90.0, "input_length": 90, "output_length": 4,
         "type": "text", "turn": 3, "hash_ids": [11, 12, 14, 15, 17, 18]},
        {"chat_id": 7, "parent_chat_id": 100, "timestamp": 95.0, "input_length": 16, "output_length": 2,
         "type": "file", "turn": 4, "hash_ids": [31]},
        {"chat_id": 8, "parent_chat_id": 7, "timestamp": 96.0, "input_length": 32, "output_length": 2,
         "type": "file", "turn": 5, "hash_ids": [31, 32]}])
    assert detect(path) == "bailian"
    _, reqs = read_trace(path)
    # seconds as recorded; chat 9 -> 5 -> 1 (root); chat 7's parent 100 is not in the file: 7 is its root
    assert [r.arrival_s for r in reqs] == [0.5, 1.25, 61.114, 90.0, 95.0, 96.0]
    assert [r.session for r in reqs] == ["chat-1", "chat-2", "chat-1", "chat-1", "chat-7", "chat-7"]
    assert reqs[3].blocks == (11, 12, 14, 15, 17, 18) and reqs[3].input_length == 90 and reqs[2].output_tokens == 0


def test_bailian_needs_its_ids(tmp_path):
    path = write(tmp_path / "b.jsonl", [{"chat_id": "x", "parent_chat_id": -1, "timestamp": 0, "input_length": 3,
                                         "output_length": 1, "hash_ids": [1]}])
    with pytest.raises(TraceError, match="field 'chat_id' must be an integer"):
        read_trace(path)


def test_aiperf_single_turn(tmp_path):
    path = write(tmp_path / "s.jsonl", [
        {"text": "What is a page?", "timestamp": 1500, "output_length": 5},
        {"text": "first", "session_id": "s", "delay": 200},
        {"texts": ["second"], "session_id": "s", "role": "user"}])
    assert detect(path) == "aiperf-single"
    _, reqs = read_trace(path)
    assert [r.text for r in reqs] == ["What is a page?", "first", "second"]
    assert [r.session for r in reqs] == ["line-0", "s", "s"]
    assert [r.arrival_s for r in reqs] == [1.5, None, None] and reqs[1].delay_s == 0.2
    # lines of one session go one after another, each self-contained
    assert [r.follows_previous for r in reqs] == [False, True, True]
    assert not any(r.carries_history for r in reqs) and reqs[0].output_tokens == 5 and reqs[1].output_tokens is None


@pytest.mark.parametrize(("record", "message"), [
    ({"text": "x", "image": "http://a/b.png"}, "field 'image' is not supported"),
    ({"texts": ["a", "b"]}, "'texts' must hold exactly one string"),
    ({"text": "x", "timestamp": 1, "delay": 1}, "cannot be set together"),
])
def test_aiperf_single_turn_refusals(tmp_path, record, message):
    with pytest.raises(TraceError, match=message):
        read_trace(write(tmp_path / "s.jsonl", [record]), "aiperf-single")


def test_aiperf_multi_turn_carries_history_and_hoists_system(tmp_path):
    path = write(tmp_path / "mt.jsonl", [
        {"session_id": "s1", "turns": [{"role": "system", "text": "You are terse."},
                                       {"text": "q1", "timestamp": 0},
                                       {"text": "q2", "delay": 1000, "output_length": 3}]},
        {"turns": [{"text": "alone", "timestamp": 500}]}])
    assert detect(path) == "aiperf-multi"
    _, reqs = read_trace(path)
    assert [(r.session, r.text) for r in reqs] == [("s1", "You are terse.\nq1"), ("s1", "q2"), ("line-1", "alone")]
    assert [(r.follows_previous, r.carries_history) for r in reqs] == [(False, False), (True, True), (False, False)]
    assert reqs[1].delay_s == 1.0 and reqs[1].output_tokens == 3 and reqs[2].arrival_s == 0.5


def test_detect_refuses_an_unknown_shape(tmp_path):
    with pytest.raises(TraceError, match="cannot tell the trace format"):
        detect(write(tmp_path / "x.jsonl", [{"prompt": "hi"}]))
