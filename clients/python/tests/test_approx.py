"""`approx=True` on `rank` and `rank_of_score`: what is sent (against the
fake server), and against a live server that the exact rank lies within
`rank ± error`, and that a dense board refuses it."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Dict

import pytest
from fake_server import FakeConnection, FakeServer
from support import AnyClient

import rankd


def approx_answers(conn: FakeConnection) -> None:
    while True:
        request = conn.read()
        if request is None:
            return
        if request["op"] == "rank":
            result: Any = {"rank": 3, "score": 7, "count": 10}
            if request.get("approx"):
                result = {**result, "error": 2}
        else:
            result = {"rank": 4, "error": 1} if request.get("approx") else 4
        conn.ok(request, result)


def test_approx_is_sent_only_when_asked_for() -> None:
    with FakeServer(approx_answers, approx_answers) as server:
        with rankd.Client(**server.address) as db:
            assert db.rank("b", "p") == {"rank": 3, "score": 7, "count": 10}
            assert db.rank("b", "p", approx=True) == {"rank": 3, "score": 7, "count": 10, "error": 2}
            assert db.rank_of_score("b", 5) == 4
            assert db.rank_of_score("b", 5, approx=True, window="all") == {"rank": 4, "error": 1}

        async def main() -> None:
            async with rankd.AsyncClient(**server.address) as db:
                assert (await db.rank("b", "p", approx=True)) == {
                    "rank": 3,
                    "score": 7,
                    "count": 10,
                    "error": 2,
                }
                assert (await db.rank_of_score("b", 5, approx=True)) == {"rank": 4, "error": 1}
                assert (await db.rank_of_score("b", 5)) == 4

        asyncio.run(main())
        ranks = server.sent("rank")
        assert ["approx" in r for r in ranks] == [False, True, True]
        assert all(r["approx"] is True for r in ranks if "approx" in r)
        of_score = server.sent("rank_of_score")
        assert ["approx" in r for r in of_score] == [False, True, True, False]
        assert of_score[1]["window"] == "all"


def test_live_bounds_hold_and_dense_refuses(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    db = connect()
    name = board("approx")
    scores: Dict[str, int] = {f"p{i}": (i * 7919) % 1000 for i in range(500)}
    db.set_many(name, list(scores.items()))
    deadline = time.monotonic() + 30
    while True:  # the summary is refreshed in the background: wait until it counts every player
        got = db.rank(name, "p1", approx=True)
        if got is not None and got["count"] == len(scores):
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    for player in list(scores)[::25]:
        exact = db.rank(name, player)
        approx = db.rank(name, player, approx=True)
        assert exact is not None and approx is not None
        assert abs(exact["rank"] - approx["rank"]) <= approx["error"]
        assert approx["score"] == exact["score"]
    for score in (-5, 0, 333, 999, 5000):
        est = db.rank_of_score(name, score, approx=True)
        assert abs(db.rank_of_score(name, score) - est["rank"]) <= est["error"]
    assert db.rank(name, "nobody", approx=True) is None
    dense = board("approx_dense")
    db.create_board(dense, ties="dense")
    db.set(dense, "a", 1)
    with pytest.raises(rankd.RankdError) as raised:
        db.rank(dense, "a", approx=True)
    assert raised.value.code == "bad_request"
