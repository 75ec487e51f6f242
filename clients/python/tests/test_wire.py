"""Frames, replies and exceptions, without a server."""

from __future__ import annotations

import pickle
import struct
from typing import Any, Dict, List

import msgpack
import pytest

import rankd
from rankd import _wire


def frame(message: object) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


def test_a_request_frame_is_a_big_endian_length_and_a_msgpack_map() -> None:
    data = _wire.encode({"op": "get", "board": "b", "player": "é"}, 7)
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert msgpack.unpackb(data[4:], raw=False) == {"op": "get", "board": "b", "player": "é", "id": 7}


def test_a_ping_is_these_bytes() -> None:
    # 13 bytes: a map of 2, "op", "ping", "id", 1.
    assert _wire.encode({"op": "ping"}, 1) == bytes.fromhex(
        "0000000d 82 a26f70 a470696e67 a26964 01".replace(" ", "")
    )


def test_fields_left_none_are_not_sent() -> None:
    assert _wire.request("top", board="b", limit=None, offset=0) == {"op": "top", "board": "b", "offset": 0}


def test_set_many_entries_from_pairs_or_a_dict() -> None:
    assert _wire.entries([("a", 1), ("b", 2)]) == [["a", 1], ["b", 2]]
    assert _wire.entries({"a": 1, "b": 2}) == [["a", 1], ["b", 2]]
    assert _wire.entries(iter([("a", -(2**63))])) == [["a", -(2**63)]]


def test_a_value_msgpack_cannot_carry_is_refused_before_sending() -> None:
    with pytest.raises((OverflowError, TypeError)):
        _wire.encode({"op": "set", "score": 2**64}, 1)
    with pytest.raises(TypeError):
        _wire.encode({"op": "set", "score": object()}, 1)


def test_frames_are_cut_from_any_split_of_the_bytes() -> None:
    data = frame({"id": 1, "ok": "pong"}) + frame({"id": 2, "ok": [1, 2]})
    for split in range(len(data) + 1):
        buffer = _wire.FrameBuffer()
        bodies = []
        for part in (data[:split], data[split:]):
            buffer.feed(part)
            while (body := buffer.pop()) is not None:
                bodies.append(msgpack.unpackb(body))
        assert bodies == [{"id": 1, "ok": "pong"}, {"id": 2, "ok": [1, 2]}]


def test_absurd_lengths_are_protocol_errors() -> None:
    for length in (0, _wire.MAX_REPLY_FRAME + 1):
        buffer = _wire.FrameBuffer()
        buffer.feed(struct.pack(">I", length))
        with pytest.raises(rankd.ProtocolError):
            buffer.pop()


def test_a_reply_gives_its_result_or_its_error() -> None:
    ok = msgpack.packb({"id": 3, "ok": {"rank": 1, "score": -5, "count": 2}})
    assert _wire.parse_reply(ok, 3) == {"rank": 1, "score": -5, "count": 2}
    assert _wire.parse_reply(msgpack.packb({"id": 3, "ok": None}), 3) is None
    err = _wire.parse_reply(msgpack.packb({"id": 3, "err": {"code": "conflict", "msg": "other config"}}), 3)
    assert isinstance(err, rankd.RankdError)
    assert (err.code, err.msg, str(err)) == ("conflict", "other config", "conflict: other config")


def test_an_error_with_id_0_answers_the_oldest_request() -> None:
    err = _wire.parse_reply(msgpack.packb({"id": 0, "err": {"code": "too_large", "msg": "frame"}}), 9)
    assert isinstance(err, rankd.RankdError) and err.code == "too_large"


def test_a_push_answers_no_request() -> None:
    push = _wire.parse_reply(msgpack.packb({"watch": 1, "event": None}), 4)
    assert isinstance(push, _wire.Push) and (push.watch, push.event) == (1, None)
    push = _wire.parse_reply(
        msgpack.packb({"watch": 7, "event": [{"player": "p", "score": 1, "rank": 1}]}), None
    )
    assert isinstance(push, _wire.Push) and push.watch == 7 and push.event[0]["player"] == "p"


@pytest.mark.parametrize("push", [{"watch": 1}, {"watch": "1", "event": None}, {"watch": -1, "event": 2}])
def test_pushes_the_protocol_does_not_allow(push: object) -> None:
    with pytest.raises(rankd.ProtocolError):
        _wire.parse_reply(msgpack.packb(push), 3)


def test_a_reply_marked_dup_is_a_dup() -> None:
    dup = _wire.parse_reply(msgpack.packb({"id": 3, "ok": 12, "dup": True}), 3)
    assert dup == _wire.Dup(12) and _wire.plain(dup) == 12
    assert _wire.parse_reply(msgpack.packb({"id": 3, "ok": 12, "dup": False}), 3) == 12


def test_writes_get_a_wid_of_their_own_and_reads_none() -> None:
    mine = {"op": "set", "board": "b", "player": "p", "score": 1, "wid": "mine"}
    requests: List[Dict[str, Any]] = [
        {"op": "set", "board": "b", "player": "p", "score": 1},
        {"op": "set_many", "board": "b", "entries": [["p", 1]]},
        {"op": "remove", "board": "b", "player": "p"},
        {"op": "get", "board": "b", "player": "p"},
        {"op": "drop_board", "board": "b"},
        mine,
    ]
    sent = _wire.with_wids(requests)
    wids = [r.get("wid") for r in sent]
    assert all(isinstance(w, str) and len(w) == 32 for w in wids[:3])
    assert len(set(wids[:3])) == 3
    assert wids[3:] == [None, None, "mine"]
    assert "wid" not in requests[0], "the caller's maps are left alone"
    assert _wire.is_guarded(sent[0]) and not _wire.is_guarded(requests[0]) and not _wire.is_guarded(sent[3])
    assert [_wire.retry_delay(n) for n in (1, 2, 3, 10)] == [0.1, 0.2, 0.4, 2.0]


@pytest.mark.parametrize(
    "reply",
    [{"id": 4, "ok": 1}, {"id": 0, "ok": 1}, [1, 2], "pong", {"id": 5, "err": "not a map"}],
)
def test_replies_the_protocol_does_not_allow(reply: object) -> None:
    with pytest.raises(rankd.ProtocolError):
        _wire.parse_reply(msgpack.packb(reply), 5)


def test_bytes_that_are_not_msgpack() -> None:
    with pytest.raises(rankd.ProtocolError):
        _wire.parse_reply(b"\xc1", 1)


def test_the_exception_families() -> None:
    assert not issubclass(rankd.RankdError, ConnectionError)
    assert issubclass(rankd.RankdConnectionError, ConnectionError)
    assert issubclass(rankd.RankdTimeout, rankd.RankdConnectionError)
    assert issubclass(rankd.RankdTimeout, TimeoutError)
    assert issubclass(rankd.ProtocolError, rankd.RankdConnectionError)
    timeout = rankd.RankdTimeout("no reply", maybe_applied=True, results=[1], wid="w1")
    again = pickle.loads(pickle.dumps(timeout))
    assert (type(again), str(again), again.maybe_applied, again.results, again.wid) == (
        rankd.RankdTimeout,
        "no reply",
        True,
        [1],
        "w1",
    )
    ended = pickle.loads(pickle.dumps(rankd.WatchEnded("unwatched")))
    assert ended.reason == "unwatched" and not issubclass(rankd.WatchEnded, ConnectionError)
    error = pickle.loads(pickle.dumps(rankd.RankdError("bad_request", "no board")))
    assert (error.code, error.msg) == ("bad_request", "no board")


def test_tls_settings() -> None:
    plain = _wire.Settings.make(
        "db.internal",
        7070,
        timeout=5,
        connect_timeout=None,
        tls=False,
        ca_file=None,
        server_hostname=None,
        certfile=None,
        keyfile=None,
    )
    assert plain.ssl_context is None and plain.server_hostname is None and plain.connect_timeout == 5
    tls = _wire.Settings.make(
        "10.0.0.1",
        7070,
        timeout=5,
        connect_timeout=1,
        tls=True,
        ca_file=None,
        server_hostname="rankd.internal",
        certfile=None,
        keyfile=None,
    )
    assert tls.ssl_context is not None and tls.ssl_context.check_hostname
    assert tls.server_hostname == "rankd.internal" and tls.connect_timeout == 1


def test_the_version_is_the_packages() -> None:
    assert rankd.__version__.count(".") == 2
