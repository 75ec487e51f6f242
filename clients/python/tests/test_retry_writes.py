"""Idempotent writes (protocol 1.1 `wid`), against the scripted stand-in:
with `retry_writes` (the default) every `set`, `set_many` and `remove`
carries a `wid`, and a write whose connection was lost, or whose reply
timed out, is sent again with the same `wid` on a new connection, at most
`write_retries` times; a reply with `"dup": true` shows in `last_write`.

The stand-in's `Ledger` applies a (board, wid) once, as rankd does, so a
retried `incr` can be seen to count once.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Dict, List, Tuple

import pytest
from fake_server import FakeConnection, FakeServer, answer, serve, serve_then_close, silent
from support import AsyncDriver, open_client, write

import rankd


class Ledger:
    """Scores the stand-in keeps across its connections, with the result of
    every (board, wid) it applied."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.scores: Dict[str, int] = {}
        self.applied: Dict[Tuple[str, Any], Any] = {}

    def apply(self, req: Dict[str, Any]) -> Tuple[Any, bool]:
        """The write's result, and whether it was a repeat of its wid."""
        with self.lock:
            key = (req["board"], req.get("wid"))
            if req.get("wid") is not None and key in self.applied:
                return self.applied[key], True
            if req["op"] == "set":
                player, score = req["player"], req["score"]
                base = self.scores.get(player, 0) if req.get("mode") == "incr" else 0
                self.scores[player] = result = base + score
            else:
                result = [
                    self.apply({**req, "op": "set", "player": p, "score": s, "wid": None})[0]
                    for p, s in req["entries"]
                ]
            if req.get("wid") is not None:
                self.applied[key] = result
            return result, False

    def answer(self, conn: FakeConnection, req: Dict[str, Any]) -> None:
        if req.get("op") in ("set", "set_many"):
            result, dup = self.apply(req)
            conn.send({"id": req["id"], "ok": result, **({"dup": True} if dup else {})})
        else:
            answer(conn, req)

    def serve(self, conn: FakeConnection) -> None:
        while True:
            req = conn.read()
            if req is None:
                return
            self.answer(conn, req)

    def apply_then_close(self, conn: FakeConnection) -> None:
        """Applies the first request and closes without answering it."""
        req = conn.read()
        if req is not None:
            self.apply(req)
        conn.close()

    def apply_then_stall(self, conn: FakeConnection) -> None:
        """Applies the first request and never answers anything."""
        req = conn.read()
        if req is not None:
            self.apply(req)
        silent(conn)


def wids(server: FakeServer, op: str = "set") -> List[Any]:
    return [r.get("wid") for r in server.sent(op)]


def test_writes_carry_a_wid_of_their_own(kind: str) -> None:
    with FakeServer(serve) as server:
        with open_client(kind, **server.address) as db:
            db.set("b", "p", 1)
            db.set("b", "p", 2)
            db.call("set", board="b", player="p", score=3)
            db.pipeline([{"op": "set", "board": "b", "player": "p", "score": 4}])
            db.set("b", "p", 5, wid="order-17")
            db.remove("b", "p")
            db.get("b", "p")
            sent = wids(server)
            assert all(isinstance(w, str) and len(w) == 32 for w in sent[:4]), sent
            assert len(set(sent[:4])) == 4, "a wid per write"
            assert sent[4] == "order-17", "a wid given is sent as it is"
            assert wids(server, "remove")[0] is not None
            assert "wid" not in server.sent("get")[0]


def test_a_write_whose_connection_is_lost_goes_again_with_its_wid_and_counts_once(kind: str) -> None:
    ledger = Ledger()
    with FakeServer(ledger.apply_then_close, ledger.serve) as server:
        with open_client(kind, **server.address) as db:
            total, info = write(db, "set", "b", "p", 5, mode="incr")
            assert total == 5 and ledger.scores == {"p": 5}, "the incr counted once"
            first, again = wids(server)
            assert first == again and first is not None
            assert info == rankd.WriteInfo(wid=first, dup=True, sends=2)
            assert db.reconnects == 1
            total, info = write(db, "set", "b", "p", 5, mode="incr")
            assert total == 10 and info is not None and not info.dup and info.sends == 1


def test_a_write_whose_reply_is_late_goes_again_with_its_wid(kind: str) -> None:
    ledger = Ledger()
    with FakeServer(ledger.apply_then_stall, ledger.serve) as server:
        with open_client(kind, **server.address, timeout=0.3) as db:
            total, info = write(db, "set", "b", "p", 7, mode="incr")
            assert total == 7 and ledger.scores == {"p": 7}
            assert info is not None and info.dup and info.sends == 2
            first, again = wids(server)
            assert first == again == info.wid
            assert db.reconnects == 1


def test_set_many_and_remove_go_again_too(kind: str) -> None:
    with FakeServer(serve_then_close(0), serve_then_close(1), serve) as server:
        with open_client(kind, **server.address) as db:
            db.set_many("b", [("p", 1)])
            db.remove("b", "p")
            assert server.ops() == ["set_many", "set_many", "remove", "remove"]
            first, again = wids(server, "set_many")
            assert first == again
            first, again = wids(server, "remove")
            assert first == again


def test_a_reply_marked_dup_is_the_result_and_shows_in_last_write(kind: str) -> None:
    def dup_replies(conn: FakeConnection) -> None:
        while True:
            req = conn.read()
            if req is None:
                return
            conn.send(
                {"id": req["id"], "ok": 12 if req["op"] == "set" else True, "dup": req.get("player") == "d"}
            )

    with FakeServer(dup_replies) as server:
        with open_client(kind, **server.address) as db:
            assert db.last_write is None
            result, info = write(db, "set", "b", "d", 1, wid="w-1")
            assert result == 12 and info == rankd.WriteInfo(wid="w-1", dup=True, sends=1)
            result, info = write(db, "set", "b", "e", 1)
            assert result == 12 and info is not None and not info.dup
            result, info = write(db, "remove", "b", "d", wid="w-2")
            assert result is True and info is not None and info.dup
            outcomes = db.pipeline([{"op": "set", "board": "b", "player": "d", "score": 1}, {"op": "ping"}])
            assert outcomes == [12, True], "a pipeline gives plain results"


def test_the_blocking_clients_last_write_is_per_thread() -> None:
    def dup_replies(conn: FakeConnection) -> None:
        while True:
            req = conn.read()
            if req is None:
                return
            conn.send({"id": req["id"], "ok": 1, "dup": True})

    with FakeServer(dup_replies) as server:
        with rankd.Client(**server.address) as db:
            db.set("b", "p", 1)
            assert db.last_dup
            seen: List[Any] = []
            thread = threading.Thread(target=lambda: seen.append(db.last_write))
            thread.start()
            thread.join()
            assert seen == [None], "another thread has made no write"


def test_write_retries_are_bounded_and_the_failure_names_the_wid(kind: str) -> None:
    with FakeServer(*[serve_then_close(0)] * 4) as server:
        with open_client(kind, **server.address, write_retries=2) as db:
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.set("b", "p", 1, mode="incr")
            assert server.ops() == ["set"] * 3, "sent once, then twice again"
            assert len(set(wids(server))) == 1
            assert failure.value.maybe_applied
            assert failure.value.wid == wids(server)[0], "the caller may send it again later with this wid"
            assert "3 times" in str(failure.value)


def test_write_retries_end_when_the_server_stays_away(kind: str) -> None:
    # The first connection closes with the write unanswered; the stand-in
    # stops listening, so reconnecting is refused: every re-send is spent.
    def close_everything(conn: FakeConnection) -> None:
        conn.read()
        conn.server.listener.close()
        conn.close()

    with FakeServer(close_everything) as server:
        with open_client(kind, **server.address, write_retries=2) as db:
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.set("b", "p", 1)
            assert failure.value.maybe_applied and failure.value.wid == wids(server)[0]
            assert isinstance(failure.value.__cause__, rankd.RankdConnectionError)
            assert server.ops() == ["set"]


def test_writes_without_a_wid_are_still_not_sent_again(kind: str) -> None:
    # create_board and drop_board take no wid.
    with FakeServer(serve_then_close(0), serve) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.create_board("b")
            assert failure.value.maybe_applied and failure.value.wid is None
            assert server.ops() == ["create_board"]


def test_a_pipeline_sends_again_only_what_was_not_answered(kind: str) -> None:
    with FakeServer(serve_then_close(1), serve) as server:
        with open_client(kind, **server.address) as db:
            outcomes = db.pipeline(
                [
                    {"op": "set", "board": "b", "player": "a", "score": 1},
                    {"op": "set", "board": "b", "player": "b", "score": 2},
                    {"op": "get", "board": "b", "player": "a"},
                ]
            )
            assert outcomes == [1, 2, None]
            assert server.ops(0) == ["set", "set"] and server.ops(1) == ["set", "get"]
            assert server.sent("set", 0)[1]["wid"] == server.sent("set", 1)[0]["wid"]


def test_a_pipeline_with_a_write_without_wid_is_not_sent_again(kind: str) -> None:
    with FakeServer(serve_then_close(0), serve) as server:
        with open_client(kind, **server.address) as db:
            with pytest.raises(rankd.RankdConnectionError) as failure:
                db.pipeline(
                    [
                        {"op": "set", "board": "b", "player": "a", "score": 1},
                        {"op": "drop_board", "board": "b"},
                    ]
                )
            assert failure.value.maybe_applied and failure.value.wid is None
            assert server.ops() == ["set"], "the stand-in closed on reading the set"


def test_async_writes_behind_a_late_reply_go_again_with_their_wids() -> None:
    async def main() -> None:
        ledger = Ledger()
        with FakeServer(ledger.apply_then_stall, ledger.serve) as server:
            async with rankd.AsyncClient(**server.address, timeout=0.3) as db:
                totals = await asyncio.gather(
                    db.set("b", "p", 1, mode="incr"), db.set("b", "q", 2, mode="incr"), db.count("b")
                )
                assert list(totals) == [1, 2, 0]
                assert ledger.scores == {"p": 1, "q": 2}
                # (The read goes again at once, the writes after a pause.)
                assert sorted(server.ops(0)) == sorted(server.ops(1)) == ["count", "set", "set"]
                assert sorted(r["wid"] for r in server.sent("set", 0)) == sorted(
                    r["wid"] for r in server.sent("set", 1)
                )
                assert db.reconnects == 1

    asyncio.run(main())


def test_async_last_write_is_per_task() -> None:
    async def main() -> None:
        ledger = Ledger()
        with FakeServer(ledger.serve) as server:
            async with rankd.AsyncClient(**server.address) as db:

                async def incr(wid: str) -> Tuple[int, bool]:
                    total = await db.set("b", "p", 1, mode="incr", wid=wid)
                    return total, db.last_dup

                outcomes = await asyncio.gather(incr("w1"), incr("w1"), incr("w2"))
                assert list(outcomes) == [(1, False), (1, True), (2, False)]
                assert db.last_write is None, "the gathered tasks' writes are theirs"

    asyncio.run(main())


def test_retry_options(kind: str) -> None:
    with pytest.raises(ValueError):
        open_client(kind, port=1, write_retries=-1)
    with FakeServer(serve) as server:
        db: Callable[..., Any] = open_client
        with db(kind, **server.address, retry_writes=False) as client:
            client.set("b", "p", 1)
            assert "wid" not in server.sent("set")[0]
            if isinstance(client, AsyncDriver):
                assert client.client.retry_writes is False
            else:
                assert client.retry_writes is False and client.write_retries == 3
