"""Watches against a real rankd (`RANKD_ADDR`): a `top` watch follows
writes and falls quiet on what `top` answers; a `player` watch follows one
player; unwatching stops the pushes; a connection holds 64 watches; dropping
the board ends a `top` watch with None."""

from __future__ import annotations

import random
import time
from typing import Any, Callable, List

import pytest
from support import AnyClient, AsyncDriver, event_where, events_until_quiet, next_event

import rankd


def test_a_top_watch_ends_on_what_top_answers(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("watch_top")
    db = connect()
    writer = connect()
    watch = db.watch(name, top=5, interval_ms=10, buffer=1000)
    assert next_event(db, watch) == [], "the first push is the current state: an empty board"
    rng = random.Random(5)
    for round_ in range(20):
        # Writes from another connection, and on the watching one between pushes.
        writer.set_many(
            name, [(f"p{rng.randrange(40):02}", rng.randrange(1, 50)) for _ in range(20)], mode="incr"
        )
        db.set(name, f"p{rng.randrange(40):02}", rng.randrange(1, 50), mode="incr")
        if round_ % 5 == 0:
            time.sleep(0.05)
    fresh = db.top(name, limit=5)
    events = events_until_quiet(db, watch)
    assert events, "the writes were pushed"
    assert events[-1] == fresh, "the last push is what top answers"
    for event in events:
        assert isinstance(event, list) and 0 < len(event) <= 5
        assert [e["rank"] for e in event] == sorted(e["rank"] for e in event)
    assert all(a != b for a, b in zip(events, events[1:])), "a push only when the value changes"
    assert len(events) < 20 * 21, "pushes are coalesced, not one per write"


def test_a_player_watch_follows_the_player(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("watch_player")
    db = connect()
    writer = connect()
    watch = db.watch(name, player="alice", interval_ms=10, buffer=100)
    assert next_event(db, watch) is None, "alice is absent"
    writer.set(name, "alice", 10)
    assert event_where(db, watch, lambda e: e is not None, "for alice") == {
        "rank": 1,
        "score": 10,
        "count": 1,
    }
    writer.set(name, "bob", 20)
    assert event_where(db, watch, lambda e: e and e["count"] == 2, "with bob") == {
        "rank": 2,
        "score": 10,
        "count": 2,
    }
    writer.set(name, "carol", 5)  # below alice: her rank stays, the count does not
    assert event_where(db, watch, lambda e: e and e["count"] == 3, "with carol") == {
        "rank": 2,
        "score": 10,
        "count": 3,
    }
    writer.remove(name, "alice")
    assert event_where(db, watch, lambda e: e is None, "without alice") is None
    assert watch.active, "a player watch stays open while the player is absent"
    writer.set(name, "alice", 30)
    assert event_where(db, watch, lambda e: e is not None, "for alice again") == {
        "rank": 1,
        "score": 30,
        "count": 3,
    }
    assert rank_of(db, name, "alice") == {"rank": 1, "score": 30, "count": 3}


def rank_of(db: AnyClient, board: str, player: str) -> Any:
    return db.rank(board, player)


def test_a_watch_of_a_window_and_period(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("watch_window")
    db = connect()
    db.create_board(name, windows=["all", "daily"])
    db.set(name, "a", 3)
    watch = db.watch(name, top=1, window="daily", period=0, interval_ms=10)
    assert next_event(db, watch) == [{"player": "a", "score": 3, "rank": 1}]


def test_unwatch_stops_the_pushes(connect: Callable[..., AnyClient], board: Callable[[str], str]) -> None:
    name = board("unwatch")
    db = connect()
    kept = db.watch(name, top=3, interval_ms=10)
    gone = db.watch(name, top=3, interval_ms=10)
    assert next_event(db, kept) == next_event(db, gone) == []
    gone_id = gone.id
    assert db.unwatch(gone) is True
    assert db.unwatch(gone) is False
    assert db.call("unwatch", watch=gone_id) is False, "the server no longer has it"
    db.set(name, "p", 1)
    assert next_event(db, kept) == [{"player": "p", "score": 1, "rank": 1}]
    with pytest.raises(rankd.WatchEnded):
        next_event(db, gone, 0.5)
    db.set(name, "q", 2)
    assert event_where(db, kept, lambda e: len(e) == 2, "with q")[0]["player"] == "q"
    for _ in range(3):
        assert db.ping() == "pong"
    registry = connection_of(db).registry
    assert gone_id not in registry._orphans, "no push came for the unwatched id"
    assert db.unwatch(kept) is True
    assert not kept.active


def connection_of(db: AnyClient) -> Any:
    """The client's connection (a peek at its internals)."""
    conn = db.client._conn if isinstance(db, AsyncDriver) else db._conn
    assert conn is not None
    return conn


def test_a_connection_holds_64_watches(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("many_watches")
    db = connect()
    watches: List[Any] = [db.watch(name, top=1) for _ in range(64)]
    assert len({w.id for w in watches}) == 64, "ids unique on the connection"
    with pytest.raises(rankd.RankdError) as refused:
        db.watch(name, player="p")
    assert refused.value.code == "too_large"
    assert db.unwatch(watches.pop()) is True
    watches.append(db.watch(name, player="p"))
    db.set(name, "p", 7)
    assert event_where(db, watches[-1], lambda e: e is not None, "for p") == {
        "rank": 1,
        "score": 7,
        "count": 1,
    }
    other = connect()
    assert next_event(other, other.watch(name, top=1)) == [{"player": "p", "score": 7, "rank": 1}], (
        "the limit is per connection"
    )


def test_dropping_the_board_ends_its_top_watches(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    name = board("dropped")
    db = connect()
    db.set(name, "p", 1)
    top = db.watch(name, top=2, interval_ms=10, buffer=10)
    player = db.watch(name, player="p", interval_ms=10, buffer=10)
    assert next_event(db, top) == [{"player": "p", "score": 1, "rank": 1}]
    assert next_event(db, player) == {"rank": 1, "score": 1, "count": 1}
    assert connect().drop_board(name) is True
    assert event_where(db, top, lambda e: e is None, "None") is None
    assert not top.active and top.ended == "the board was dropped"
    with pytest.raises(rankd.WatchEnded):
        next_event(db, top)
    assert event_where(db, player, lambda e: e is None, "None") is None
    assert db.call("unwatch", watch=player.id) is False, "the server ended the player watch too"
    assert db.ping() == "pong"
