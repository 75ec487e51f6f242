"""Broken connections, timeouts and a misbehaving server, against a scripted
stand-in (fake_server.py), for what a real rankd will not do on cue.

The rules: a read that was in flight is sent again, once, on a new
connection (re-authenticating with the client's token); a write that was in
flight is not, and raises
`RankdConnectionError` with `maybe_applied` -- unless it carries a `wid`
and the client retries writes (the default), which test_retry_writes.py
covers: these tests turn `retry_writes` off.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from typing import Any, Callable, Dict, List

import pytest
from fake_server import FakeConnection, FakeServer, answer, close_at_once, serve, serve_then_close, silent
from support import AsyncDriver, open_client

import rankd


def test_a_write_in_flight_when_the_connection_breaks_is_not_sent_again(kind: str) -> None:
    with FakeServer(serve_then_close(0), serve) as server:
        with open_client(kind, **server.address, retry_writes=False) as db:
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.set("b", "p", 5)
            assert failure.value.maybe_applied
            assert failure.value.wid is None, "no wid: retry_writes is off"
            assert "may or may not have applied" in str(failure.value)
            assert server.ops() == ["set"], "the set went out once, on the first connection"
            assert "wid" not in server.requests[0][1]
            assert db.ping() == "pong", "the next call reconnects"
            assert db.reconnects == 1
            assert server.ops(1) == ["ping"]


def test_a_read_in_flight_when_the_connection_breaks_is_sent_again(kind: str) -> None:
    with FakeServer(serve_then_close(1), serve) as server:
        with open_client(kind, **server.address) as db:
            assert db.ping() == "pong"
            assert db.get("b", "p") is None
            assert db.reconnects == 1
            assert server.ops(0) == ["ping", "get"] and server.ops(1) == ["get"]


def test_a_call_reconnects_only_once(kind: str) -> None:
    with FakeServer(serve_then_close(0), serve_then_close(0), serve) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.count("b")
            assert not failure.value.maybe_applied, "a read applies nothing"
            assert server.ops() == ["count", "count"]
            assert db.count("b") == 0, "the next call reconnects again"


def test_a_pipeline_sends_again_only_the_reads_not_answered(kind: str) -> None:
    with FakeServer(serve_then_close(2), serve) as server:
        with open_client(kind, **server.address) as db:
            requests = [
                {"op": "ping"},
                {"op": "count", "board": "b"},
                {"op": "get", "board": "b", "player": "p"},
            ]
            assert db.pipeline(requests) == ["pong", 0, None]
            assert server.ops(1) == ["get"]


def test_a_pipeline_with_a_write_gives_what_was_answered_and_raises(kind: str) -> None:
    with FakeServer(serve_then_close(1), serve) as server:
        with open_client(kind, **server.address, retry_writes=False) as db:
            requests: List[Dict[str, Any]] = [
                {"op": "ping"},
                {"op": "set", "board": "b", "player": "p", "score": 3},
                {"op": "ping"},
            ]
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.pipeline(requests)
            assert failure.value.maybe_applied
            assert failure.value.results == ["pong"]


def test_a_pipeline_whose_write_was_answered_sends_the_reads_after_it_again(kind: str) -> None:
    with FakeServer(serve_then_close(2), serve) as server:
        with open_client(kind, **server.address, retry_writes=False) as db:
            requests: List[Dict[str, Any]] = [
                {"op": "ping"},
                {"op": "set", "board": "b", "player": "p", "score": 3},
                {"op": "ping"},
            ]
            assert db.pipeline(requests) == ["pong", 3, "pong"]
            assert server.ops(1) == ["ping"], "only the unanswered read went again"


def test_a_connection_the_server_closed_while_idle_is_replaced_before_a_write() -> None:
    with FakeServer(close_at_once, serve) as server:
        with rankd.Client(**server.address) as db:
            assert server.closed.wait(10)
            time.sleep(0.05)  # the FIN crosses loopback
            assert db.set("b", "p", 7) == 7, "the write went on a new connection"
            assert db.reconnects == 1
            assert server.ops(1) == ["set"]


def test_async_a_connection_the_server_closed_while_idle_is_replaced_before_a_write() -> None:
    async def main() -> None:
        with FakeServer(close_at_once, serve) as server:
            async with rankd.AsyncClient(**server.address) as db:
                while not server.closed.is_set():
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)  # the reader task sees the close
                assert await db.set("b", "p", 7) == 7
                assert db.reconnects == 1
                assert server.ops(1) == ["set"]

    asyncio.run(main())


def authenticating(then_close: bool) -> Callable[[FakeConnection], None]:
    """A script that expects `auth` with token "t" first, then serves (or
    answers one request and closes)."""

    def script(conn: FakeConnection) -> None:
        first = conn.read()
        assert first is not None and first["op"] == "auth"
        if first.get("token") != "t":
            conn.err(first, "unauthorized", "bad token")
            return
        conn.ok(first, {"role": "write"})
        if then_close:
            serve_then_close(1)(conn)
        else:
            serve(conn)

    return script


def test_the_token_is_sent_again_on_every_new_connection(kind: str) -> None:
    with FakeServer(authenticating(then_close=True), authenticating(then_close=False)) as server:
        with open_client(kind, **server.address, token="t") as db:
            assert db.ping() == "pong"
            assert db.get("b", "p") is None  # the server closes; the get is sent again
            assert db.reconnects == 1
            assert server.ops(0) == ["auth", "ping", "get"]
            assert server.ops(1) == ["auth", "get"]


def test_a_refused_token_raises_the_servers_error(kind: str) -> None:
    with FakeServer(authenticating(then_close=False)) as server:
        with pytest.raises(rankd.RankdError) as refused:
            open_client(kind, **server.address, token="wrong")
        assert refused.value.code == "unauthorized"


def test_a_reply_that_does_not_come_in_time(kind: str) -> None:
    with FakeServer(silent, silent, serve) as server:
        with open_client(kind, **server.address, timeout=0.3, retry_writes=False) as db:
            started = time.monotonic()
            with pytest.raises(rankd.RankdTimeout) as late_read:
                db.get("b", "p")
            assert 0.25 <= time.monotonic() - started < 5
            assert not late_read.value.maybe_applied
            assert isinstance(late_read.value, TimeoutError)
            with pytest.raises(rankd.RankdTimeout) as late_write:
                db.set("b", "p", 1)
            assert late_write.value.maybe_applied, "a timed-out write may have applied"
            assert db.ping() == "pong", "each timeout closed its connection; the next call opens a new one"
            assert db.reconnects == 2
            assert server.ops() == ["get", "set", "ping"], "nothing is sent again after a timeout"


def test_async_calls_behind_a_late_reply_fail_with_it_and_reads_are_sent_again() -> None:
    async def main() -> None:
        with FakeServer(silent, serve) as server:
            async with rankd.AsyncClient(**server.address, timeout=0.3, retry_writes=False) as db:
                late_write, read = await asyncio.gather(
                    db.set("b", "p", 1), db.count("b"), return_exceptions=True
                )
                assert isinstance(late_write, rankd.RankdTimeout) and late_write.maybe_applied
                assert read == 0, "the read queued behind the late reply went again on a new connection"
                assert server.ops(0) == ["set", "count"] and server.ops(1) == ["count"]

    asyncio.run(main())


def test_connecting_to_a_closed_port_raises_a_connection_error(kind: str) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(rankd.RankdConnectionError) as failure:
        open_client(kind, host="127.0.0.1", port=port)
    assert isinstance(failure.value.__cause__, ConnectionRefusedError)


def test_a_tls_handshake_that_does_not_finish_times_out(kind: str) -> None:
    with FakeServer(silent) as server:
        started = time.monotonic()
        with pytest.raises(rankd.RankdTimeout):
            open_client(kind, **server.address, tls=True, connect_timeout=0.3)
        assert time.monotonic() - started < 5


def test_a_reply_with_the_wrong_id_is_a_protocol_error(kind: str) -> None:
    def wrong_id(conn: FakeConnection) -> None:
        request = conn.read()
        assert request is not None
        conn.send({"id": request["id"] + 1, "ok": "pong"})
        silent(conn)

    with FakeServer(wrong_id, serve) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.ProtocolError):
                db.ping()
            assert db.ping() == "pong", "the next call opens a new connection"


def test_an_error_with_id_0_answers_the_call_and_pushes_are_skipped(kind: str) -> None:
    def odd_replies(conn: FakeConnection) -> None:
        first = conn.read()
        assert first is not None
        conn.send({"id": 0, "err": {"code": "too_large", "msg": "frame of 9 GB"}})
        second = conn.read()
        assert second is not None
        conn.send({"watch": 1, "event": [{"player": "p", "score": 1, "rank": 1}]})
        answer(conn, second)
        serve(conn)

    with FakeServer(odd_replies) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdError) as too_large:
                db.ping()
            assert too_large.value.code == "too_large"
            assert db.ping() == "pong"
            assert db.reconnects == 0


def test_a_closed_client_refuses_calls(kind: str) -> None:
    with FakeServer(serve) as server:
        with open_client(kind, **server.address) as db:
            if isinstance(db, AsyncDriver):
                db.run(db.client.close())  # (the driver's own close ends its loop too)
            else:
                db.close()
            with pytest.raises(rankd.RankdConnectionError, match="closed"):
                db.ping()


def test_async_close_fails_the_calls_waiting() -> None:
    async def main() -> None:
        with FakeServer(silent) as server:
            db = await rankd.AsyncClient(**server.address).connect()
            waiting = asyncio.ensure_future(db.count("b"))
            await asyncio.sleep(0.1)
            await db.close()
            with pytest.raises(rankd.RankdConnectionError):
                await waiting

    asyncio.run(main())


def test_async_connects_on_the_first_call() -> None:
    async def main() -> None:
        with FakeServer(serve) as server:
            db = rankd.AsyncClient(**server.address)
            assert server.accepted == 0
            assert await db.ping() == "pong"
            assert server.accepted == 1 and db.reconnects == 0
            await db.close()

    asyncio.run(main())


def test_a_long_pipeline_does_not_deadlock_on_full_buffers(kind: str) -> None:
    # The stand-in answers each request as it reads it, and stops reading
    # while a reply does not fit: a client that sent everything before
    # reading anything would wait forever.
    with FakeServer(serve) as server:
        with open_client(kind, **server.address) as db:
            requests = [{"op": "echo", "text": f"{i:01000}"} for i in range(20000)]
            assert db.pipeline(requests) == [f"{i:01000}" for i in range(20000)]


def test_the_tls_context_may_be_given_whole() -> None:
    context = ssl.create_default_context()
    with FakeServer(silent) as server:
        with pytest.raises(rankd.RankdTimeout):
            rankd.Client(**server.address, tls=context, connect_timeout=0.2)


def test_auth_with_a_new_token_reconnects_with_it_not_with_the_one_it_replaces(kind: str) -> None:
    def rotated(conn: FakeConnection) -> None:
        """A server whose tokens were rotated: the old one is refused."""
        while (request := conn.read()) is not None:
            if request.get("op") == "auth" and request.get("token") != "new":
                conn.err(request, "unauthorized", "wrong token")
            else:
                answer(conn, request)

    # The first connection answers the auth and a ping, then breaks on the
    # next request: the `auth` with the new token, which must reconnect.
    with FakeServer(serve_then_close(2), rotated) as server:
        with open_client(kind, **server.address, token="old", retry_writes=False) as db:
            assert db.ping() == "pong"
            assert db.auth("new") is True
            assert [r["token"] for r in server.sent("auth", 1)] == ["new", "new"]
            assert db.ping() == "pong"
