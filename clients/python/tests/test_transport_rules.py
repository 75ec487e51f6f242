"""The shared transport rules (clients/conformance/transport.md) that the
other files do not cover, against the scripted stand-in, for both clients:
a write with a `wid` answered `overloaded` or `internal` goes again on the
same connection, within `write_retries` and `retry_deadline`; re-sends wait
a random backoff; a request over `max_frame` is refused unsent; a token
refused on reconnecting fails the calls waiting with `unauthorized`; a reply
is late only `timeout` after the later of its send and the reply before it.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from typing import Any, List

import pytest
from fake_server import (
    FakeConnection,
    FakeServer,
    always,
    answer,
    close_at_once,
    erring,
    serve,
    serve_then_close,
    silent,
)
from support import open_client, wait_for_server_close, write

import rankd
from rankd import _wire


def gaps(times: List[float]) -> List[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


def test_a_write_answered_internal_goes_again_on_the_same_connection(kind: str) -> None:
    with FakeServer(erring("internal")) as server:
        with open_client(kind, **server.address) as db:
            total, info = write(db, "set", "b", "p", 7)
            assert total == 7, "the second send's answer is the write's result"
            first, again = server.sent("set")
            assert first["wid"] == again["wid"] and first["wid"] is not None
            assert info == rankd.WriteInfo(wid=first["wid"], dup=False, sends=2)
            assert server.accepted == 1 and db.reconnects == 0, "on the same connection"
            assert 0.05 <= gaps(server.times_of("set"))[0] < 1, "after the first backoff (50-100 ms)"


def test_an_overloaded_write_goes_again_and_reads_do_not(kind: str) -> None:
    with FakeServer(erring("overloaded", "overloaded")) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdError) as shed:
                db.count("b")
            assert shed.value.code == "overloaded" and shed.value.wid is None
            assert db.set("b", "p", 3) == 3
            assert server.ops() == ["count", "set", "set"]


def test_an_overloaded_write_fails_after_the_retries_with_its_wid_and_sends(kind: str) -> None:
    with FakeServer(always("overloaded")) as server:
        with open_client(kind, **server.address, write_retries=2) as db:
            with pytest.raises(rankd.RankdError) as shed:
                db.set("b", "p", 1, mode="incr")
            assert server.ops() == ["set"] * 3, "sent once, then twice again"
            (wid,) = {r["wid"] for r in server.sent("set")}
            assert shed.value.code == "overloaded"
            assert (shed.value.wid, shed.value.sends, shed.value.maybe_applied) == (wid, 3, False)
            first, second = gaps(server.times_of("set"))
            assert 0.05 <= first < 0.5 and 0.1 <= second < 0.6, "backoffs of 50-100 ms, then 100-200 ms"
            assert server.accepted == 1


def test_an_internal_error_that_lasts_is_a_write_in_doubt(kind: str) -> None:
    with FakeServer(always("internal")) as server:
        with open_client(kind, **server.address, write_retries=1) as db:
            with pytest.raises(rankd.RankdConnectionError) as in_doubt:
                db.set_many("b", [("p", 1)])
            (wid,) = {r["wid"] for r in server.sent("set_many")}
            failure = in_doubt.value
            assert failure.maybe_applied and (failure.wid, failure.sends) == (wid, 2)
            assert "may or may not have applied" in str(failure)
            assert isinstance(failure.__cause__, rankd.RankdError) and failure.__cause__.code == "internal"
            with pytest.raises(rankd.RankdError) as final:  # a write without a wid: not sent again
                db.create_board("b")
            assert final.value.code == "internal" and final.value.maybe_applied
            assert server.ops().count("create_board") == 1


def test_a_pipeline_sends_again_only_its_writes_answered_overloaded_or_internal(kind: str) -> None:
    def script(conn: FakeConnection) -> None:
        # The first set is shed once; the second fails twice; the rest is served.
        failures = {"a": ["overloaded"], "c": ["internal", "internal"]}
        while (request := conn.read()) is not None:
            codes = failures.get(request.get("player", ""), [])
            if request["op"] == "set" and codes:
                conn.err(request, codes.pop(0))
            else:
                conn.ok(request, request.get("score"))

    with FakeServer(script) as server:
        with open_client(kind, **server.address) as db:
            outcomes = db.pipeline(
                [
                    {"op": "set", "board": "b", "player": "a", "score": 1},
                    {"op": "get", "board": "b", "player": "a"},
                    {"op": "set", "board": "b", "player": "c", "score": 3},
                ]
            )
            assert outcomes == [1, None, 3]
            assert [r["player"] for r in server.sent("set")] == ["a", "c", "a", "c", "c"]
            assert len(server.sent("get")) == 1 and server.accepted == 1


def test_a_pipelined_write_whose_retries_run_out_keeps_its_error_in_place(kind: str) -> None:
    with FakeServer(erring("overloaded", "internal", "internal")) as server:
        with open_client(kind, **server.address, write_retries=1) as db:
            outcomes = db.pipeline(
                [
                    {"op": "set", "board": "b", "player": "a", "score": 1},
                    {"op": "set", "board": "b", "player": "c", "score": 3},
                ]
            )
            # a: overloaded, then internal (retries used up); c: internal, then 3.
            shed, three = outcomes
            assert three == 3
            assert isinstance(shed, rankd.RankdError) and shed.code == "internal"
            assert shed.wid == server.sent("set")[0]["wid"] and shed.sends == 2 and shed.maybe_applied


def test_the_retry_deadline_is_at_most_five_minutes(kind: str) -> None:
    for deadline in (300.5, 600, 0, -1, float("nan")):
        with pytest.raises(ValueError, match="dedup horizon"):
            open_client(kind, port=1, retry_deadline=deadline)
    with FakeServer(serve) as server:
        with open_client(kind, **server.address, retry_deadline=300) as db:
            assert db.retry_deadline == 300


def test_the_retry_deadline_stops_resends_with_retries_left(kind: str) -> None:
    with FakeServer(always("overloaded")) as server:
        with open_client(kind, **server.address, write_retries=50, retry_deadline=0.5) as db:
            started = time.monotonic()
            with pytest.raises(rankd.RankdError) as shed:
                db.set("b", "p", 1)
            assert time.monotonic() - started < 2
            times = server.times_of("set")
            # Re-sends after waits of 50-100, 100-200, 200-400, 400-800 ms:
            # the second always starts within 0.5 s, the fourth never.
            assert 3 <= len(times) <= 4 and shed.value.sends == len(times)
            assert times[-1] - times[0] <= 0.5 + 0.05, "no re-send starts after the deadline"


def test_the_retry_deadline_holds_without_a_timeout(kind: str) -> None:
    # Every connection closes on the write: re-sent on a new one each time.
    with FakeServer(*[serve_then_close(0)] * 10) as server:
        options = dict(timeout=None, write_retries=50, retry_deadline=0.5)
        with open_client(kind, **server.address, **options) as db:
            with pytest.raises(rankd.RankdConnectionError) as in_doubt:
                db.set("b", "p", 1)
            times = server.times_of("set")
            assert 3 <= len(times) <= 4 and times[-1] - times[0] <= 0.5 + 0.05
            failure = in_doubt.value
            assert failure.maybe_applied and failure.wid is not None and failure.sends == len(times)
            assert "retry_deadline" in str(failure)


def test_a_request_over_max_frame_is_refused_and_not_sent(kind: str) -> None:
    with FakeServer(serve) as server:
        with open_client(kind, **server.address) as db:
            entries = [(f"{i:02100d}", i) for i in range(1000)]  # 2 MiB
            with pytest.raises(rankd.RankdError) as refused:
                db.set_many("b", entries)
            assert refused.value.code == "too_large"
            assert "not sent" in refused.value.msg and "1048576" in refused.value.msg
            with pytest.raises(rankd.RankdError, match="request 1 of the pipeline"):
                db.pipeline([{"op": "ping"}, {"op": "echo", "text": "x" * (2 << 20)}])
            assert db.ping() == "pong", "the connection is still usable"
            assert server.ops() == ["ping"], "nothing else reached the server"
            assert server.accepted == 1 and db.reconnects == 0


def test_max_frame_may_be_set(kind: str) -> None:
    with FakeServer(serve) as server:
        with open_client(kind, **server.address, max_frame=200) as db:
            assert db.set("b", "p" * 100, 1) == 1
            with pytest.raises(rankd.RankdError, match="max_frame of 200 bytes"):
                db.set("b", "p" * 200, 1)
            assert server.ops() == ["set"]
    with pytest.raises(ValueError):
        open_client(kind, port=1, max_frame=0)


def refusing(conn: FakeConnection) -> None:
    """Refuses every token."""
    while (request := conn.read()) is not None:
        conn.err(request, "unauthorized", "unknown token")


def accepting_then_closing(conn: FakeConnection) -> None:
    """Accepts the token, then closes on reading the next request."""
    request = conn.read()
    assert request is not None and request["op"] == "auth"
    conn.ok(request, True)
    serve_then_close(0)(conn)


def test_a_token_refused_on_reconnecting_fails_the_call_with_unauthorized(kind: str) -> None:
    with FakeServer(accepting_then_closing, refusing) as server:
        with open_client(kind, **server.address, token="t") as db:
            with pytest.raises(rankd.RankdError) as refused:
                db.set("b", "p", 1)
            assert refused.value.code == "unauthorized"
            (wid,) = {r["wid"] for r in server.sent("set")}
            assert refused.value.wid == wid and refused.value.maybe_applied, "the first send may have applied"
            assert [r["token"] for r in server.sent("auth")] == ["t", "t"]


def test_async_a_refused_token_fails_every_call_waiting_for_the_connection() -> None:
    async def main() -> None:
        with FakeServer(accepting_then_closing, refusing, refusing, refusing) as server:
            async with rankd.AsyncClient(**server.address, token="t") as db:
                outcomes = await asyncio.gather(db.set("b", "p", 1), db.count("b"), return_exceptions=True)
                for outcome in outcomes:
                    assert isinstance(outcome, rankd.RankdError) and outcome.code == "unauthorized", outcome

    asyncio.run(main())


def test_a_pipeline_answered_slowly_times_out_reply_by_reply(kind: str) -> None:
    def slowly(conn: FakeConnection) -> None:
        while (request := conn.read()) is not None:
            time.sleep(0.2)
            conn.ok(request, "pong")

    with FakeServer(slowly) as server:
        with open_client(kind, **server.address, timeout=0.5) as db:
            started = time.monotonic()
            assert db.pipeline([{"op": "ping"}] * 5) == ["pong"] * 5
            assert time.monotonic() - started > 0.9, "the whole took longer than the timeout"
            assert server.accepted == 1


def test_the_backoff_is_random_between_half_and_all_of_its_cap() -> None:
    caps = [_wire.retry_delay(n) for n in (1, 2, 3, 5, 6, 10)]
    assert caps == [0.1, 0.2, 0.4, 1.6, 2.0, 2.0]
    for n, cap in zip((1, 2, 3, 5, 6, 10), caps):
        assert _wire.retry_wait(n, lambda: 0.0) == pytest.approx(cap / 2)
        assert _wire.retry_wait(n, lambda: 0.999999) == pytest.approx(cap, rel=1e-5)
        waits = {_wire.retry_wait(n) for _ in range(200)}
        assert all(cap / 2 <= w <= cap for w in waits) and len(waits) > 100


def test_the_new_error_fields_survive_pickling() -> None:
    error = rankd.RankdError("overloaded", "shed")
    error.wid, error.sends = "w", 4
    again = pickle.loads(pickle.dumps(error))
    assert (again.code, again.wid, again.sends, again.maybe_applied) == ("overloaded", "w", 4, False)
    assert rankd.RankdError("internal", "x").maybe_applied
    failure = rankd.RankdConnectionError("lost", maybe_applied=True, wid="w", sends=3)
    again_failure: Any = pickle.loads(pickle.dumps(failure))
    assert (again_failure.wid, again_failure.sends) == ("w", 3)


# -- per request: reads once more, writes by their own rules (a pipeline) ---


def closing_on_a_write(conn: FakeConnection) -> None:
    """Reads requests until a write (`set`), answering none, and closes."""
    while (request := conn.read()) is not None and request["op"] != "set":
        pass
    conn.close()


def test_a_pipelined_read_goes_again_once_while_its_guarded_write_goes_on(kind: str) -> None:
    # Three connections close on the pipeline; the fourth serves.
    with FakeServer(*[closing_on_a_write] * 3, serve) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdConnectionError) as lost:
                db.pipeline(
                    [
                        {"op": "get", "board": "b", "player": "p"},
                        {"op": "set", "board": "b", "player": "p", "score": 1},
                    ]
                )
            assert server.ops(0) == server.ops(1) == ["get", "set"], "the read went once more, then no more"
            assert server.ops(2) == server.ops(3) == ["set"], "the write went on alone, and was answered"
            failure = lost.value
            (wid,) = {r["wid"] for r in server.sent("set")}
            assert failure.results == [] and failure.wids == [None, wid]
            assert failure.maybe_applied and failure.wid is None and failure.sends == 4
            assert not isinstance(failure, rankd.RankdTimeout)


def test_a_pipelined_read_whose_own_reply_was_late_is_not_sent_again(kind: str) -> None:
    with FakeServer(silent, serve) as server:
        with open_client(kind, **server.address, timeout=0.3) as db:
            with pytest.raises(rankd.RankdTimeout) as late:
                db.pipeline(
                    [
                        {"op": "get", "board": "b", "player": "p"},
                        {"op": "set", "board": "b", "player": "p", "score": 1},
                        {"op": "count", "board": "b"},
                    ]
                )
            # (the count behind it would go again, but the call fails with the
            # get: its result could not be told)
            assert server.ops(0) == ["get", "set", "count"]
            assert server.ops(1) == ["set"], "only the write went again"
            assert late.value.wids == [None, server.sent("set")[0]["wid"], None] and late.value.maybe_applied


def test_a_pipelined_request_behind_a_late_one_goes_again(kind: str) -> None:
    with FakeServer(silent, serve) as server:
        with open_client(kind, **server.address, timeout=0.3) as db:
            requests = [{"op": "set", "board": "b", "player": "p", "score": 1}, {"op": "count", "board": "b"}]
            assert db.pipeline(requests) == [1, 0]
            assert server.ops(0) == ["set", "count"] and server.ops(1) == ["set", "count"]


def test_a_read_goes_once_more_after_a_connection_the_call_opened_broke(kind: str) -> None:
    # The server closed the idle connection (a restart); the call opens a
    # new one, which breaks too: the read goes once more, on a third.
    with FakeServer(close_at_once, serve_then_close(0), serve) as server:
        with open_client(kind, **server.address) as db:
            wait_for_server_close(db)
            assert db.count("b") == 0
            assert server.ops(1) == ["count"] and server.ops(2) == ["count"]


def test_a_failed_pipeline_names_the_wid_of_each_of_its_writes(kind: str) -> None:
    # An unguarded write in doubt ends the pipeline at once: its guarded
    # write, in doubt too, is named by its wid.
    with FakeServer(serve_then_close(1), serve) as server:
        with open_client(kind, **server.address) as db:
            requests = [
                {"op": "ping"},
                {"op": "set", "board": "b", "player": "p", "score": 1, "mode": "incr"},
                {"op": "create_board", "board": "c"},
                {"op": "count", "board": "b"},
            ]
            with pytest.raises(rankd.RankdConnectionError) as in_doubt:
                db.pipeline(requests)
            (sent,) = server.sent("set")
            failure = in_doubt.value
            assert failure.results == ["pong"] and failure.maybe_applied and failure.sends == 1
            assert failure.wids == [None, sent["wid"], None, None]
            assert failure.wid is None, "`wid` names the write of a one-write call only"
            assert "wid" not in requests[1], "the caller's map is left alone"


def test_a_pipeline_whose_write_retries_run_out_names_its_wids(kind: str) -> None:
    with FakeServer(*[serve_then_close(0)] * 2) as server:
        with open_client(kind, **server.address, write_retries=1) as db:
            with pytest.raises(rankd.RankdConnectionError) as in_doubt:
                db.pipeline(
                    [
                        {"op": "set", "board": "b", "player": "a", "score": 1},
                        {"op": "remove", "board": "b", "player": "c", "wid": "mine"},
                    ]
                )
            first = server.sent("set")[0]["wid"]
            failure = in_doubt.value
            assert failure.wids == [first, "mine"] and failure.sends == 2 and failure.maybe_applied
            again: Any = pickle.loads(pickle.dumps(failure))
            assert again.wids == [first, "mine"]


def closing_the_door_after_overloaded(conn: FakeConnection) -> None:
    """Answers the first request `overloaded`, then closes the connection
    and stops listening: every reconnect is refused."""
    request = conn.read()
    assert request is not None
    conn.err(request, "overloaded", "shed")
    conn.server.listener.close()
    conn.close()


def test_a_shed_write_whose_reconnects_fail_uses_its_retries_and_names_its_wid(kind: str) -> None:
    with FakeServer(closing_the_door_after_overloaded) as server:
        with open_client(kind, **server.address, write_retries=2) as db:
            started = time.monotonic()
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.set("b", "p", 1)
            # It waited the backoffs of two retries (50-100, then 100-200 ms).
            assert time.monotonic() - started >= 0.15
            (sent,) = server.sent("set")
            error = failure.value
            assert (error.wid, error.sends, error.maybe_applied) == (sent["wid"], 1, False)
            assert "write_retries (2) used up" in str(error)


def test_a_request_that_fits_max_frame_only_with_a_short_id_is_refused_before_it_is_sent(kind: str) -> None:
    def shed_once(conn: FakeConnection) -> None:
        shed = False
        while (request := conn.read()) is not None:
            if request["op"] == "set" and not shed:
                shed = True
                conn.err(request, "overloaded", "shed")
            else:
                answer(conn, request)

    req = {"op": "set", "board": "b", "player": "p" * 150, "score": 1, "wid": "w"}
    # Ids 1-126 go to a pipeline of pings: the set's first id is 127 (one
    # byte of msgpack), its re-send's 128 (two).
    exact = len(_wire.encode(req, 127)) - _wire.HEADER.size
    assert len(_wire.encode(req, 128)) - _wire.HEADER.size == exact + 1
    with FakeServer(shed_once, shed_once) as server:
        with open_client(kind, **server.address, max_frame=exact) as db:
            db.pipeline([{"op": "ping"}] * 126)
            with pytest.raises(rankd.RankdError) as refused:
                db.call("set", board="b", player="p" * 150, score=1, wid="w")
            assert refused.value.code == "too_large" and "not sent" in refused.value.msg
            assert server.sent("set") == [], "refused before its first send, not after"
        with open_client(kind, **server.address, max_frame=exact + 8) as db:
            # (9 bytes for the id fit)
            assert db.call("set", board="b", player="p" * 150, score=1, wid="w") == 1
