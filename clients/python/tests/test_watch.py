"""Watches (protocol 1.1 pushes), against the scripted stand-in: pushes
(`{"watch": id, "event": value}`, no `id`) arrive between any two replies
and are never taken for one; each watch gets its own events; a `top`
watch's nil event (its board dropped) is its last; unwatching stops its
events; a watch whose connection is lost asks again on the next.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Dict, List, Optional

import pytest
from fake_server import FakeConnection, FakeServer, answer, serve, serve_then_close
from support import AsyncDriver, open_client, wait_until

import rankd


def entry(player: str, score: int, rank: int = 1) -> Dict[str, Any]:
    return {"player": player, "score": score, "rank": rank}


A, B, C, D = ([entry(p, s)] for p, s in (("a", 1), ("b", 2), ("c", 3), ("d", 4)))
ALICE = {"rank": 1, "score": 10, "count": 1}


def expect(conn: FakeConnection, op: str) -> Dict[str, Any]:
    request = conn.read()
    assert request is not None and request["op"] == op, f"expected {op}, got {request}"
    return request


class Watching:
    """A stand-in that answers `watch` with ids 1, 2, ... (per connection)
    and pushes each watch's first event at once, `unwatch` with whether the
    id was active, and everything else as `answer` does."""

    def __init__(self, first: Any = None) -> None:
        self.first = first
        self.active: Dict[int, Dict[str, Any]] = {}

    def __call__(self, conn: FakeConnection) -> None:
        next_id = 1
        while True:
            request = conn.read()
            if request is None:
                return
            if request["op"] == "watch":
                self.active[next_id] = request
                conn.ok(request, {"watch": next_id})
                conn.push(next_id, self.first)
                next_id += 1
            elif request["op"] == "unwatch":
                conn.ok(request, self.active.pop(request["watch"], None) is not None)
            else:
                answer(conn, request)


def next_event(db: Any, watch: Any, timeout: Optional[float] = 5.0) -> Any:
    """`watch.get(timeout)` for a watch of either kind of client."""
    if isinstance(db, AsyncDriver):
        return db.run(watch.get(timeout))
    return watch.get(timeout)


def test_pushes_between_replies_go_to_their_watches(kind: str) -> None:
    def script(conn: FakeConnection) -> None:
        first = expect(conn, "watch")
        conn.ok(first, {"watch": 1})
        conn.push(1, A)
        second = expect(conn, "watch")
        conn.push(1, B)  # before the reply
        conn.ok(second, {"watch": 2})
        conn.push(2, ALICE)
        get = expect(conn, "get")
        conn.push(1, C)
        conn.push(2, None)  # the player is absent
        conn.ok(get, 42)
        pings = [expect(conn, "ping"), expect(conn, "ping")]
        conn.ok(pings[0], "pong")
        conn.push(1, D)
        conn.ok(pings[1], "pong")
        serve(conn)

    with FakeServer(script) as server:
        with open_client(kind, **server.address) as db:
            top = db.watch("b", top=2, buffer=10)
            player = db.watch("b", player="alice", buffer=10)
            assert (top.id, player.id) == (1, 2)
            assert db.get("b", "alice") == 42
            assert db.pipeline([{"op": "ping"}, {"op": "ping"}]) == ["pong", "pong"]
            assert [next_event(db, top) for _ in range(4)] == [A, B, C, D]
            assert [next_event(db, player) for _ in range(2)] == [ALICE, None]
            assert player.active, "a player watch's None is the player's absence"
            assert server.sent("watch") == [
                {"op": "watch", "board": "b", "top": 2, "id": 1},
                {"op": "watch", "board": "b", "player": "alice", "id": 2},
            ]


def test_a_nil_event_is_a_top_watchs_last(kind: str) -> None:
    def script(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 5})
        conn.push(5, A)
        conn.push(5, None)  # the board was dropped
        conn.push(5, B)  # (no server sends this; the client must not take it)
        serve(conn)

    with FakeServer(script) as server:
        with open_client(kind, **server.address) as db:
            watch = db.watch("b", top=1, buffer=10)
            assert next_event(db, watch) == A
            assert next_event(db, watch) is None, "the None is delivered"
            assert not watch.active and watch.ended == "the board was dropped"
            with pytest.raises(rankd.WatchEnded) as ended:
                next_event(db, watch)
            assert ended.value.reason == "the board was dropped"
            assert db.ping() == "pong"
            if isinstance(db, AsyncDriver):
                assert db.unwatch(watch) is False
            else:
                assert db.unwatch(watch) is False
            assert server.sent("unwatch") == [], "an ended watch is not unwatched"


def test_iterating_a_watch_ends_with_it() -> None:
    def script(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 1})
        for event in (A, B, None):
            time.sleep(0.05)
            conn.push(1, event)
        serve(conn)

    with FakeServer(script) as server:
        with rankd.Client(**server.address) as db:
            assert list(db.watch("b", top=1, buffer=10)) == [A, B, None]


def test_async_iterating_a_watch_ends_with_it() -> None:
    def script(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 1})
        for event in (A, B, None):
            time.sleep(0.05)
            conn.push(1, event)
        serve(conn)

    async def main() -> None:
        with FakeServer(script) as server:
            async with rankd.AsyncClient(**server.address) as db:
                watch = await db.watch("b", top=1, buffer=10)
                assert [event async for event in watch] == [A, B, None]

    asyncio.run(main())


def test_a_watch_keeps_the_newest_events_its_buffer_holds(kind: str) -> None:
    def script(conn: FakeConnection) -> None:
        first = expect(conn, "watch")
        conn.ok(first, {"watch": 1})
        second = expect(conn, "watch")
        conn.ok(second, {"watch": 2})
        ping = expect(conn, "ping")
        for event in (A, B, C, D):
            conn.push(1, event)
            conn.push(2, event)
        conn.ok(ping, "pong")
        serve(conn)

    with FakeServer(script) as server:
        with open_client(kind, **server.address) as db:
            newest = db.watch("b", top=1)
            two = db.watch("b", top=1, buffer=2)
            assert db.ping() == "pong"  # read past every push
            assert newest.pending == 1 and next_event(db, newest) == D
            assert [next_event(db, two), next_event(db, two)] == [C, D]


def test_a_wait_that_times_out(kind: str) -> None:
    with FakeServer(Watching(first=A)) as server:
        with open_client(kind, **server.address) as db:
            watch = db.watch("b", top=1)
            assert next_event(db, watch) == A
            started = time.monotonic()
            with pytest.raises(TimeoutError) as late:
                next_event(db, watch, timeout=0.2)
            assert not isinstance(late.value, rankd.RankdConnectionError)
            assert 0.15 < time.monotonic() - started < 3
            assert watch.active
            if isinstance(db, AsyncDriver):

                async def drain() -> List[Any]:
                    assert isinstance(watch, rankd.AsyncWatch)
                    return [event async for event in watch.events(timeout=0.1)]

                assert db.run(drain()) == []
            else:
                assert list(watch.events(timeout=0.1)) == []


def test_unwatch_stops_the_events(kind: str) -> None:
    def script(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 3})
        conn.push(3, A)
        unwatch = expect(conn, "unwatch")
        assert unwatch["watch"] == 3
        conn.push(3, B)  # in flight when the unwatch arrived
        conn.ok(unwatch, True)
        serve(conn)

    with FakeServer(script) as server:
        with open_client(kind, **server.address) as db:
            watch = db.watch("b", top=1, buffer=10)
            assert next_event(db, watch) == A
            assert db.unwatch(watch) is True
            assert watch.ended == "unwatched"
            with pytest.raises(rankd.WatchEnded):
                next_event(db, watch, timeout=0.2)
            assert db.ping() == "pong"
            assert db.unwatch(watch) is False, "once"
            assert server.ops() == ["watch", "unwatch", "ping"]


def test_close_unwatches_and_a_context_manager_closes() -> None:
    with FakeServer(Watching(first=A)) as server:
        with rankd.Client(**server.address) as db:
            with db.watch("b", top=1) as watch:
                assert watch.get(5) == A
            assert watch.ended == "unwatched"
            watch.close()  # again: nothing to do
            assert server.ops() == ["watch", "unwatch"]


def test_many_watches_on_one_connection(kind: str) -> None:
    with FakeServer(Watching(first=A)) as server:
        with open_client(kind, **server.address) as db:
            watches = [db.watch(f"b{i}", top=1) for i in range(10)]
            assert [w.id for w in watches] == list(range(1, 11))
            # The stand-in pushes each first event after its reply: a ping
            # answered means all ten are sent before this thread pushes.
            assert db.ping() == "pong"
            conn = server.connections[0]
            for i, w in reversed(list(enumerate(watches, 1))):
                conn.push(i, [entry(w.board, i)])
            assert db.ping() == "pong"  # read past the pushes
            for i, w in enumerate(watches, 1):
                assert next_event(db, w) == [entry(w.board, i)], "the newest of its own"
            assert server.accepted == 1


def test_the_server_refusing_a_watch_raises_its_error(kind: str) -> None:
    def script(conn: FakeConnection) -> None:
        conn.err(expect(conn, "watch"), "too_large", "64 watches already")
        serve(conn)

    with FakeServer(script) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdError) as refused:
                db.watch("b", player="p")
            assert refused.value.code == "too_large"
            with pytest.raises(ValueError):
                db.watch("b")  # type: ignore[call-overload]
            with pytest.raises(ValueError):
                db.watch("b", top=1, player="p")  # type: ignore[call-overload]


def test_a_watch_asks_again_when_its_connection_is_lost(kind: str) -> None:
    def then_close(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 1})
        conn.push(1, A)
        time.sleep(0.1)
        conn.close()

    with FakeServer(then_close, Watching(first=B)) as server:
        with open_client(kind, **server.address) as db:
            watch = db.watch("b", top=3, interval_ms=50)
            assert next_event(db, watch) == A
            assert next_event(db, watch) == B, "the current state, from the new connection"
            assert watch.resubscribes == 1 and watch.id == 1 and db.reconnects == 1
            (again,) = server.sent("watch", 1)
            assert {k: v for k, v in again.items() if k != "id"} == {
                "op": "watch",
                "board": "b",
                "top": 3,
                "interval_ms": 50,
            }
            server.connections[1].push(1, C)
            assert next_event(db, watch) == C


def test_a_watch_that_cannot_ask_again_raises_and_tries_on_the_next_wait(kind: str) -> None:
    def then_close(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 1})
        conn.close()

    # Asking again goes once more after a broken connection, no more: the
    # second and third connections close too.
    with FakeServer(then_close, serve_then_close(0), serve_then_close(0), Watching(first=C)) as server:
        with open_client(kind, **server.address) as db:
            watch = db.watch("b", top=1)
            with pytest.raises(rankd.RankdConnectionError):
                next_event(db, watch)
            assert watch.active
            assert next_event(db, watch) == C


def test_closing_the_client_ends_its_watches(kind: str) -> None:
    with FakeServer(Watching(first=A)) as server:
        with open_client(kind, **server.address) as db:
            watch = db.watch("b", top=1)
            assert next_event(db, watch) == A
            if isinstance(db, AsyncDriver):
                db.run(db.client.close())
            else:
                db.close()
            assert watch.ended == "the client is closed"
            with pytest.raises(rankd.WatchEnded):
                next_event(db, watch)


def test_a_thread_waiting_for_events_while_others_call() -> None:
    # The waiting thread reads the connection without holding it: the other
    # thread's calls go on, and a push the call reads is handed over.
    def script(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 1})
        for _ in range(3):
            answer(conn, expect(conn, "ping"))
        ping = expect(conn, "ping")
        conn.push(1, B)
        conn.ok(ping, "pong")
        serve(conn)

    with FakeServer(script) as server:
        with rankd.Client(**server.address) as db:
            watch = db.watch("b", top=1)
            got: List[Any] = []
            waiter = threading.Thread(target=lambda: got.append(watch.get(10)))
            waiter.start()
            time.sleep(0.1)
            started = time.monotonic()
            for _ in range(4):
                assert db.ping() == "pong"
            assert time.monotonic() - started < 2, "the calls did not wait for the waiting thread"
            waiter.join(5)
            assert got == [B]


def test_a_thread_waiting_for_events_wakes_when_the_client_closes() -> None:
    with FakeServer(Watching()) as server:
        db = rankd.Client(**server.address)
        watch = db.watch("b", player="p")
        assert watch.get(5) is None  # the player is absent
        outcome: List[Any] = []

        def wait() -> None:
            try:
                watch.get()
            except rankd.WatchEnded as ended:
                outcome.append(ended.reason)

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.1)
        db.close()
        waiter.join(5)
        assert outcome == ["the client is closed"]


def test_a_callback_gets_the_events_on_a_thread_of_its_own() -> None:
    with FakeServer(Watching(first=A)) as server:
        with rankd.Client(**server.address) as db:
            seen: List[Any] = []
            threads: List[str] = []

            def on_event(event: Any) -> None:
                seen.append(event)
                threads.append(threading.current_thread().name)
                if len(seen) == 1:
                    raise RuntimeError("a callback's error is logged, not fatal")

            watch = db.watch("arena", top=1, callback=on_event, buffer=10)
            assert watch.id is not None
            # The server thread pushes A just after its reply; B, pushed from
            # here, could overtake it.
            wait_until(lambda: seen == [A], "the first event")
            server.connections[0].push(watch.id, B)
            wait_until(lambda: seen == [A, B], "the callback's events")
            assert threads[0] == "rankd-watch-arena"
            with pytest.raises(RuntimeError):
                watch.get()
            assert db.ping() == "pong"
            watch.close()
            assert watch._thread is not None
            watch._thread.join(5)
            assert not watch._thread.is_alive()


def test_async_a_callback_may_be_a_coroutine() -> None:
    async def main() -> None:
        with FakeServer(Watching(first=A)) as server:
            async with rankd.AsyncClient(**server.address) as db:
                seen: List[Any] = []

                async def on_event(event: Any) -> None:
                    await asyncio.sleep(0)
                    seen.append(event)

                plain = await db.watch("b", top=1, callback=seen.append)
                coroutine = await db.watch("b", top=1, callback=on_event, buffer=10)
                assert coroutine.id is not None
                server.connections[0].push(coroutine.id, B)
                for _ in range(100):
                    if seen.count(A) == 2 and B in seen:
                        break
                    await asyncio.sleep(0.02)
                assert sorted(map(str, seen)) == sorted(map(str, [A, A, B]))
                with pytest.raises(RuntimeError):
                    await plain.get()
                await plain.close()
                await coroutine.close()
                assert server.ops().count("unwatch") == 2

    asyncio.run(main())


def test_async_several_tasks_wait_on_several_watches() -> None:
    async def main() -> None:
        with FakeServer(Watching(first=A)) as server:
            async with rankd.AsyncClient(**server.address) as db:
                watches = await asyncio.gather(*(db.watch(f"b{i}", top=1, buffer=10) for i in range(5)))

                async def two(watch: rankd.AsyncWatch[rankd.TopEvent]) -> List[Any]:
                    return [await watch.get(5), await watch.get(5)]

                waiting = asyncio.gather(*(two(w) for w in watches))
                await asyncio.sleep(0.05)
                # Each first event is pushed after its reply: once a ping is
                # answered, none can come after the pushes below.
                assert await db.ping() == "pong"
                for w in watches:
                    assert w.id is not None
                    server.connections[0].push(w.id, [entry(w.board, w.id)])
                got = await waiting
                assert got == [[A, [entry(w.board, w.id or 0)]] for w in watches]
                assert await db.ping() == "pong"

    asyncio.run(main())


def test_async_a_watch_asks_again_after_a_late_reply_failed_the_connection() -> None:
    def stall_on_get(conn: FakeConnection) -> None:
        request = expect(conn, "watch")
        conn.ok(request, {"watch": 1})
        conn.push(1, A)
        while conn.read() is not None:  # answers nothing more
            pass

    async def main() -> None:
        with FakeServer(stall_on_get, Watching(first=B)) as server:
            async with rankd.AsyncClient(**server.address, timeout=0.3) as db:
                watch = await db.watch("b", top=1)
                assert await watch.get(5) == A
                with pytest.raises(rankd.RankdTimeout):
                    await db.get("b", "p")
                assert await watch.get(5) == B
                assert watch.resubscribes == 1

    asyncio.run(main())
