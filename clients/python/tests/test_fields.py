"""Composite scores (protocol 1.1): `create_board(..., fields=[...])`, and
dicts `{field: int}` as scores both ways. Offline against a scripted
server for what goes on the wire; against a real rankd (`RANKD_ADDR`) for
ranking, `incr` per field and the errors."""

from __future__ import annotations

import types
from typing import Any, Callable, Dict, List

import pytest
from fake_server import FakeConnection, FakeServer
from support import AnyClient, open_client

import rankd

FIELDS: List[rankd.Field] = [
    {"name": "trophies", "order": "desc", "max": 1000},
    {"name": "retries", "order": "asc", "min": 0, "max": 100},
]


def echo(conn: FakeConnection) -> None:
    """Answers a write with its score(s) as sent, reads with fixed maps."""
    row = {"player": "a", "score": {"trophies": 3, "retries": 1}, "rank": 1}
    while (request := conn.read()) is not None:
        result: Any = {
            "create_board": True,
            "set": request.get("score"),
            "set_many": [score for _, score in request.get("entries", [])],
            "get": row["score"],
            "rank": {"rank": 1, "score": row["score"], "count": 1},
            "rank_of_score": 2,
            "top": [row],
        }[request["op"]]
        conn.ok(request, result)


def test_fields_and_dict_scores_go_out_as_msgpack_maps(kind: str) -> None:
    with FakeServer(echo) as server:
        with open_client(kind, **server.address) as db:
            assert db.create_board("cup", fields=FIELDS, ties="dense") is True
            # Any mapping is sent as a map (a read-only view included).
            score = types.MappingProxyType({"trophies": 5, "retries": 2})
            assert db.set("cup", "a", score) == {"trophies": 5, "retries": 2}
            assert db.set("cup", "a", {"retries": 1}, mode="incr") == {"retries": 1}
            assert db.set_many("cup", {"a": {"trophies": 1, "retries": 0}, "b": score}) == [
                {"trophies": 1, "retries": 0},
                {"trophies": 5, "retries": 2},
            ]
            assert db.rank_of_score("cup", {"trophies": 5, "retries": 2}) == 2
            assert db.get("cup", "a") == {"trophies": 3, "retries": 1}
            rank = db.rank("cup", "a")
            assert rank is not None and rank["score"] == {"trophies": 3, "retries": 1}
            assert db.top("cup")[0]["score"] == {"trophies": 3, "retries": 1}
    sent = {op: server.sent(op)[0] for op in ("create_board", "set", "set_many", "rank_of_score")}
    assert sent["create_board"]["fields"] == FIELDS and sent["create_board"]["ties"] == "dense"
    assert "order" not in sent["create_board"]
    assert sent["set"]["score"] == {"trophies": 5, "retries": 2}
    assert sent["set_many"]["entries"][1] == ["b", {"trophies": 5, "retries": 2}]
    assert sent["rank_of_score"]["score"] == {"trophies": 5, "retries": 2}


def test_a_plain_board_is_created_without_fields(kind: str) -> None:
    with FakeServer(echo) as server:
        with open_client(kind, **server.address) as db:
            db.create_board("plain")
    assert "fields" not in server.sent("create_board")[0]


def scores(trophies: int, retries: int) -> Dict[str, int]:
    return {"trophies": trophies, "retries": retries}


def test_composite_boards_rank_field_by_field(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    db = connect()
    name = board("cup")
    assert db.create_board(name, fields=FIELDS) is True
    assert db.create_board(name, fields=FIELDS) is False, "the same config again"
    listed = [b for b in db.boards() if b["board"] == name]
    assert listed[0]["fields"] == [
        {"name": "trophies", "order": "desc", "min": 0, "max": 1000},
        {"name": "retries", "order": "asc", "min": 0, "max": 100},
    ]
    assert db.set_many(name, [("a", scores(10, 5)), ("b", scores(10, 2)), ("c", scores(12, 9))]) == [
        scores(10, 5),
        scores(10, 2),
        scores(12, 9),
    ]
    # Most trophies first, then fewest retries.
    assert [(e["player"], e["rank"]) for e in db.top(name)] == [("c", 1), ("b", 2), ("a", 3)]
    assert db.set(name, "a", {"retries": -4}, mode="incr") == scores(10, 1), "missing fields add 0"
    assert db.set(name, "a", scores(1, 0), mode="best") == scores(10, 1), "the better whole kept"
    assert db.rank(name, "a") == {"rank": 2, "score": scores(10, 1), "count": 3}
    assert db.rank_of_score(name, scores(11, 0)) == 2
    assert [e["player"] for e in db.around(name, "b", before=1, after=1)] == ["a", "b"]
    assert [e["player"] for e in db.ranks(name, ["b", "nobody", "c"])] == ["c", "b"]
    assert db.get(name, "c") == scores(12, 9)

    def refused(call: Callable[[], Any]) -> str:
        with pytest.raises(rankd.RankdError) as raised:
            call()
        return raised.value.code

    assert refused(lambda: db.set(name, "d", 5)) == "bad_request", "an integer on a board with fields"
    assert refused(lambda: db.set(name, "d", {"trophies": 1})) == "bad_request", "set needs every field"
    assert refused(lambda: db.set(name, "a", {"trophies": 991}, mode="incr")) == "bad_request", "past max"
    assert db.get(name, "a") == scores(10, 1), "a refused incr changes nothing"
    plain = board("plain")
    db.create_board(plain)
    assert refused(lambda: db.set(plain, "p", scores(1, 1))) == "bad_request", "a map on a plain board"
    too_few: List[rankd.Field] = [FIELDS[0]]
    assert refused(lambda: db.create_board(board("bad"), fields=too_few)) == "bad_request"
