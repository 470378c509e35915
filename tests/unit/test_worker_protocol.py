"""The worker protocol: the framing as the daemon reads it (bounded by the header, typed, and what
came before a bad frame kept), the messages as tagged structs that cost no byte over lists, and JSON
with half a character (a lone surrogate escape) read with U+FFFD in its place."""

from __future__ import annotations

import struct

import msgspec
import pytest

from atomictoolsd.protocol import (
    MOST_REPAIRED,
    Answer,
    Ask,
    CallContext,
    CallTool,
    Cancel,
    DaemonMessage,
    FrameError,
    FrameReader,
    FrameTooLarge,
    Log,
    Result,
    WorkerMessage,
    encode_frame,
    well_formed_json,
)


def test_a_frame_is_judged_by_its_header_however_the_bytes_are_split() -> None:
    header = struct.pack(">I", 700 << 20)
    for cut in range(5):
        reader = FrameReader(1024, WorkerMessage)
        with pytest.raises(FrameTooLarge) as caught:
            reader.feed(header[:cut])
            reader.feed(header[cut:] + b"x" * 100)
        assert caught.value.length == 700 << 20
        assert not reader.partial, "nothing of the refused frame is held"


def test_a_large_frame_behind_a_good_one_is_refused_and_the_good_one_kept() -> None:
    reader = FrameReader(1024, WorkerMessage)
    good = encode_frame(["result", 1, b'{"content":[]}'])
    with pytest.raises(FrameTooLarge) as caught:
        reader.feed(good + struct.pack(">I", 5000) + b"x" * 10)
    assert caught.value.messages == [Result(1, b'{"content":[]}')]


@pytest.mark.parametrize("message", [
    ["result", "1", b"{}"], ["result", True, b"{}"], ["result", 1.0, b"{}"], ["result", 1, {}], ["result", 1],
    ["result", 1, b"{}", "extra"], ["log", 1, "shout", b"1"], ["progress", 1, "x", None, None],
    ["output", 3, b"", 0], ["ghost", 1], {"op": "result"}, 42,
])
def test_a_message_of_the_wrong_shape_is_refused(message: object) -> None:
    reader = FrameReader(1024, WorkerMessage)
    before = encode_frame(["log", 7, "info", b'"ok"'])
    with pytest.raises(FrameError) as caught:
        reader.feed(before + encode_frame(message))
    assert caught.value.messages == [Log(7, "info", b'"ok"')]
    assert not reader.partial


def test_untyped_reading_is_unchanged() -> None:
    reader = FrameReader()
    frames = encode_frame(["call", 1, "t", b"{}", ["", "", "", "", "", ""], False]) + encode_frame(["cancel", 1])
    assert reader.feed(frames[:3]) == []
    assert reader.feed(frames[3:]) == [["call", 1, "t", b"{}", ["", "", "", "", "", ""], False], ["cancel", 1]]


def test_the_daemons_messages_are_typed_and_as_small_as_lists() -> None:
    context = CallContext("s1", "m1", "claude", "/p", "/p", "t1")
    call = CallTool(7, "greet", b'{"name":"x"}', context, True)
    as_list = ["call", 7, "greet", b'{"name":"x"}', ["s1", "m1", "claude", "/p", "/p", "t1"], True]
    assert encode_frame(call) == encode_frame(as_list)
    assert encode_frame(Cancel(7)) == encode_frame(["cancel", 7])
    reader = FrameReader(type=DaemonMessage)
    assert reader.feed(encode_frame(as_list) + encode_frame(["cancel", 7])) == [call, Cancel(7)]
    assert reader.feed(encode_frame(call))[0].context.agent == "claude"
    # The context of the call before: sent as nothing at all
    assert reader.feed(encode_frame(["call", 8, "greet", b"{}", None, False]))[0].context is None


def test_a_worker_refuses_a_daemon_message_of_the_wrong_shape() -> None:
    reader = FrameReader(type=DaemonMessage)
    with pytest.raises(FrameError):
        reader.feed(encode_frame(["call", 7, "greet", "not bytes", ["", "", "", "", "", ""], False]))


def test_what_a_worker_sends_is_what_the_daemon_reads() -> None:
    sent = [Result(3, b'{"content":[]}'), Log(3, "info", b'"hi"')]
    reader = FrameReader(1024, WorkerMessage)
    assert reader.feed(b"".join(encode_frame(m) for m in sent)) == sent
    assert encode_frame(Result(3, None)) == encode_frame(["result", 3, None])


def test_a_tools_question_and_its_answer_are_typed_messages() -> None:
    ask = Ask(3, 1, "elicitation/create", b'{"message":"ok?"}')
    assert FrameReader(1024, WorkerMessage).feed(encode_frame(ask)) == [ask]
    with pytest.raises(FrameError):  # a worker may ask only what the daemon relays to clients
        FrameReader(1024, WorkerMessage).feed(encode_frame(["ask", 3, 1, "roots/list", b"{}"]))
    answers = [Answer(3, 1, b'{"action":"accept"}'), Answer(3, 2, None, "the client cannot be asked")]
    assert FrameReader(type=DaemonMessage).feed(b"".join(encode_frame(a) for a in answers)) == answers


def test_a_string_that_is_not_utf8_is_a_malformed_message_however_it_arrives() -> None:
    # msgspec reads such a str with UnicodeDecodeError, not DecodeError: the reader must still say
    # "malformed" (the daemon then distrusts the worker) rather than let the error end the channel.
    body = b"\x94\xa3log\x07\xa2\xce\x00\xc4\x01x"  # ["log", 7, <two bytes that are not UTF-8>, b"x"]
    bad = struct.pack(">I", len(body)) + body
    before = encode_frame(["log", 7, "info", b'"ok"'])
    assert FrameReader(1024, WorkerMessage).single_frame(bad) is None  # left to feed, which says what it is
    for data in (bad, before + bad):
        reader = FrameReader(1024, WorkerMessage)
        with pytest.raises(FrameError, match="malformed") as caught:
            reader.feed(data)
        assert caught.value.messages == ([] if data is bad else [Log(7, "info", b'"ok"')])


@pytest.mark.parametrize(("sent", "read"), [
    (rb'"cut \ud83d"', "cut \ufffd"),  # half a pair, alone
    (rb'"\udc00 and \ud800\ud800"', "\ufffd and \ufffd\ufffd"),  # a low half alone; two highs
    (rb'"\\\ud83d"', "\\\ufffd"),  # an escaped backslash, then half a pair
    (rb'"\\ud83d\udc00"', "\\ud83d\ufffd"),  # a backslash and the text "ud83d", then a low half alone
])
def test_lone_surrogate_escapes_read_as_u_fffd(sent: bytes, read: str) -> None:
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(sent)
    assert msgspec.json.decode(well_formed_json(sent)) == read


@pytest.mark.parametrize("sent", [rb'"\ud83d\ude00 \\ud83d"', rb'"plain"', rb'{"a":'])
def test_json_without_lone_surrogates_is_not_rewritten(sent: bytes) -> None:
    assert well_formed_json(sent) is None


def test_json_past_the_bound_is_not_looked_at() -> None:
    sent = b'"' + b"x" * MOST_REPAIRED + rb'\ud83d"'
    assert well_formed_json(sent) is None
    assert well_formed_json(b'"' + b"x" * (MOST_REPAIRED - 10) + rb'\ud83d"') is not None
