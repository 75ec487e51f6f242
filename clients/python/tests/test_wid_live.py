"""Idempotent writes against a real rankd (`RANKD_ADDR`): a (board, wid)
applies once; a repeat answers the first result with `"dup": true`; a
write whose reply is lost is sent again by the client with its wid and
counts once."""

from __future__ import annotations

import uuid
from typing import Callable

import pytest
from support import ENV, AnyClient, Proxy, write

import rankd


def test_a_repeated_incr_counts_once_and_answers_dup(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("wid_incr")
    db = connect()
    wid = uuid.uuid4().hex
    assert write(db, "set", name, "p", 5, mode="incr", wid=wid) == (
        5,
        rankd.WriteInfo(wid=wid, dup=False, sends=1),
    )
    # Sent again, as a client does after a timeout; from another connection too.
    assert write(db, "set", name, "p", 5, mode="incr", wid=wid) == (
        5,
        rankd.WriteInfo(wid=wid, dup=True, sends=1),
    )
    other = connect()
    assert write(other, "set", name, "p", 5, mode="incr", wid=wid) == (
        5,
        rankd.WriteInfo(wid=wid, dup=True, sends=1),
    )
    assert db.get(name, "p") == 5, "counted once"
    total, info = write(db, "set", name, "p", 5, mode="incr")
    assert total == 10 and info is not None and not info.dup and info.wid is not None and len(info.wid) == 32
    assert db.call("set", board=name, player="p", score=1, mode="incr", wid=wid) == 5, "the first result"


def test_set_many_and_remove_apply_once(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("wid_many")
    db = connect()
    assert write(db, "set_many", name, [("a", 1), ("b", 2)], mode="incr", wid="batch-1") == (
        [1, 2],
        rankd.WriteInfo(wid="batch-1", dup=False, sends=1),
    )
    result, info = write(db, "set_many", name, [("a", 1), ("b", 2)], mode="incr", wid="batch-1")
    assert result == [1, 2] and info is not None and info.dup
    assert write(db, "remove", name, "a", wid="rm-1")[0] is True
    db.set(name, "a", 9)
    result, info = write(db, "remove", name, "a", wid="rm-1")
    assert result is True and info is not None and info.dup, "the first result; a is still there"
    assert db.get(name, "a") == 9
    assert db.get(name, "b") == 2


def test_a_wid_is_per_board(connect: Callable[..., AnyClient], board: Callable[[str], str]) -> None:
    one, two = board("wid_one"), board("wid_two")
    db = connect()
    assert write(db, "set", one, "p", 1, mode="incr", wid="w")[1] == rankd.WriteInfo(
        wid="w", dup=False, sends=1
    )
    assert write(db, "set", two, "p", 1, mode="incr", wid="w")[1] == rankd.WriteInfo(
        wid="w", dup=False, sends=1
    )


def test_a_wid_reused_by_another_kind_of_write_is_refused(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("wid_kind")
    db = connect()
    db.set(name, "p", 1, wid="mixed")
    with pytest.raises(rankd.RankdError) as refused:
        db.remove(name, "p", wid="mixed")
    assert refused.value.code == "bad_request"
    assert db.get(name, "p") == 1


def test_a_wid_out_of_range_is_a_bad_request(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("wid_range")
    db = connect()
    for wid in ("", "w" * 65):
        with pytest.raises(rankd.RankdError) as refused:
            db.set(name, "p", 1, wid=wid)
        assert refused.value.code == "bad_request"
    assert db.set(name, "p", 2, wid="w" * 64) == 2


def test_a_write_whose_reply_is_lost_is_sent_again_and_counts_once(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("wid_lost")
    with Proxy(str(ENV.addr)) as proxy:
        db = connect(addr=proxy.addr, token=ENV.write_token, timeout=1.5)
        assert db.ping() == "pong"
        proxy.hold_replies(0)  # the server applies the next write; its reply never arrives
        total, info = write(db, "set", name, "p", 5, mode="incr")
        assert total == 5, "the first send's result"
        assert info is not None and info.dup and info.sends == 2, info
        assert db.reconnects == 1
        total, info = write(db, "set", name, "p", 5, mode="incr")
        assert total == 10 and info is not None and not info.dup
    assert connect().get(name, "p") == 10, "each incr counted once"
