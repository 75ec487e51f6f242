"""The server's errors arrive as `RankdError` with the protocol's code, and
leave the connection usable."""

from __future__ import annotations

from typing import Any, Callable, Dict

import pytest
from support import AnyClient, wait_for_server_close

import rankd


def error_of(call: Callable[..., Any], *args: Any, **kwargs: Any) -> rankd.RankdError:
    with pytest.raises(rankd.RankdError) as raised:
        call(*args, **kwargs)
    assert raised.value.msg, "the server explains its errors"
    return raised.value


def test_error_codes(connect: Callable[..., AnyClient], board: Callable[[str], str]) -> None:
    db = connect()
    name = board("errors")
    assert db.create_board(name, order="asc") is True
    assert error_of(db.call, "fly").code == "unknown_op"
    assert error_of(db.create_board, name, order="desc").code == "conflict"
    bad_requests: Dict[str, Callable[[], Any]] = {
        "a string score": lambda: db.call("set", board=name, player="p", score="12"),
        "a score past i64": lambda: db.set(name, "p", 2**63),
        "a missing player": lambda: db.call("get", board=name),
        "a bad board name": lambda: db.count("no spaces"),
        "limit over 1000": lambda: db.top(name, limit=1001),
        "before over 500": lambda: db.around(name, "p", before=501),
        "an unknown mode": lambda: db.set(name, "p", 1, mode="double"),  # type: ignore[arg-type]
        "a future period": lambda: db.count(name, period=1),
        "a window the board lacks": lambda: db.count(name, window="daily"),
    }
    for what, call in bad_requests.items():
        assert error_of(call).code == "bad_request", what
    assert error_of(db.set_many, name, [("p", 1)] * 10001).code == "too_large"
    assert db.set(name, "top", 2**63 - 1) == 2**63 - 1
    incr = error_of(db.set, name, "top", 1, mode="incr")
    assert incr.code == "bad_request" and db.get(name, "top") == 2**63 - 1, "a failed incr changes nothing"
    assert db.ping() == "pong"
    assert db.count(name) == 1, "no failed write applied"
    assert db.reconnects == 0, "errors never cost the connection"


def test_errors_in_a_pipeline_are_returned_in_place(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    db = connect()
    name = board("pipeline_errors")
    outcomes = db.pipeline(
        [
            {"op": "set", "board": name, "player": "a", "score": 5},
            {"op": "set", "board": name, "player": "b", "score": "five"},
            {"op": "fly"},
            {"op": "rank", "board": name, "player": "a"},
        ]
    )
    assert outcomes[0] == 5 and outcomes[3] == {"rank": 1, "score": 5, "count": 1}
    assert [type(o) for o in outcomes[1:3]] == [rankd.RankdError, rankd.RankdError]
    assert [o.code for o in outcomes[1:3]] == ["bad_request", "unknown_op"]


def test_a_frame_over_the_servers_limit_closes_the_connection_and_the_client_reconnects(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    db = connect()
    name = board("too_large")
    assert db.set(name, "p", 1) == 1
    # A header announcing 4 GiB: the server answers `too_large` (id 0) and
    # closes. Sent on the client's own connection, past its API.
    announce = (0xFFFFFFFF).to_bytes(4, "big")
    if isinstance(db, rankd.Client):
        assert db._conn is not None
        db._conn.sock.sendall(announce)
    else:
        assert db.client._conn is not None
        db.client._conn.writer.write(announce)
    too_large = error_of(db.ping)  # the reply with id 0 answers the oldest call
    assert too_large.code == "too_large"
    # The server closes: once the client has seen it, a write (with the
    # token, on a server that needs one) goes on a new connection.
    wait_for_server_close(db)
    assert db.set(name, "p", 2) == 2
    assert db.reconnects == 1
    assert db.get(name, "p") == 2
