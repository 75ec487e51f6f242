"""What each op sends and what its reply means, for both clients.

A method of `rankd.Client` or `rankd.AsyncClient` is a shell: it builds its
request here, sends it (blocking, or awaited) and casts the result to its
return type. The request is built once, here, so the two clients cannot
drift apart; a result needs no converting at run time, since the public
types are TypedDicts over the plain dicts and lists msgpack gives.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

from . import _wire
from ._errors import RankdError
from ._watch import watch_id
from .types import Board, Field, Mode, Order, Score, Ties, Window

Request = Dict[str, Any]


def result(outcome: Any) -> Any:
    """The result of an outcome (a result, a `Dup` or a `RankdError`):
    a call's `RankdError` is raised; `pipeline` returns it instead."""
    if isinstance(outcome, RankdError):
        raise outcome
    return _wire.plain(outcome)


def ping() -> Request:
    return _wire.request("ping")


def auth(token: str) -> Request:
    return _wire.request("auth", token=token)


def create_board(
    board: str,
    *,
    order: Optional[Order],
    ties: Optional[Ties],
    windows: Optional[Sequence[Window]],
    keep: Optional[int],
    fields: Optional[Sequence[Field]],
) -> Request:
    # A list and plain dicts, which msgpack packs whatever sequence and mappings were given.
    return _wire.request(
        "create_board",
        board=board,
        order=order,
        ties=ties,
        windows=None if windows is None else list(windows),
        keep=keep,
        fields=None if fields is None else [dict(field) for field in fields],
    )


def drop_board(board: str) -> Request:
    return _wire.request("drop_board", board=board)


def boards(prefix: Optional[str], *, after: Optional[str], limit: Optional[int]) -> Request:
    return _wire.request("boards", prefix=prefix, after=after, limit=limit)


def next_page(got: Sequence[Board], page: int) -> Optional[str]:
    """Where `all_boards` asks next (the `after` of its next `boards`) once a
    page of at most `page` boards came back as `got`; None after the last
    page, the first one shorter than `page`."""
    if len(got) < page:
        return None
    return got[-1]["board"]


def set(
    board: str, player: str, score: Union[int, Mapping[str, int]], *, mode: Optional[Mode], wid: Optional[str]
) -> Request:
    return _wire.request("set", board=board, player=player, score=_wire.score(score), mode=mode, wid=wid)


def set_many(
    board: str,
    entries: Union[Mapping[str, Score], Iterable[Tuple[str, Score]]],
    *,
    mode: Optional[Mode],
    wid: Optional[str],
) -> Request:
    return _wire.request("set_many", board=board, entries=_wire.entries(entries), mode=mode, wid=wid)


def remove(board: str, player: str, *, wid: Optional[str]) -> Request:
    return _wire.request("remove", board=board, player=player, wid=wid)


def get(board: str, player: str, *, window: Optional[Window], period: Optional[int]) -> Request:
    return _wire.request("get", board=board, player=player, window=window, period=period)


def count(board: str, *, window: Optional[Window], period: Optional[int]) -> Request:
    return _wire.request("count", board=board, window=window, period=period)


def rank(
    board: str, player: str, *, window: Optional[Window], period: Optional[int], approx: bool
) -> Request:
    return _wire.request(
        "rank", board=board, player=player, window=window, period=period, approx=True if approx else None
    )


def rank_of_score(
    board: str,
    score: Union[int, Mapping[str, int]],
    *,
    window: Optional[Window],
    period: Optional[int],
    approx: bool,
) -> Request:
    return _wire.request(
        "rank_of_score",
        board=board,
        score=_wire.score(score),
        window=window,
        period=period,
        approx=True if approx else None,
    )


def top(
    board: str,
    *,
    limit: Optional[int],
    offset: Optional[int],
    window: Optional[Window],
    period: Optional[int],
) -> Request:
    return _wire.request("top", board=board, limit=limit, offset=offset, window=window, period=period)


def around(
    board: str,
    player: str,
    *,
    before: Optional[int],
    after: Optional[int],
    window: Optional[Window],
    period: Optional[int],
) -> Request:
    return _wire.request(
        "around", board=board, player=player, before=before, after=after, window=window, period=period
    )


def ranks(board: str, players: Sequence[str], *, window: Optional[Window], period: Optional[int]) -> Request:
    return _wire.request("ranks", board=board, players=list(players), window=window, period=period)


def watch(
    board: str,
    *,
    top: Optional[int],
    player: Optional[str],
    window: Optional[Window],
    period: Optional[int],
    interval_ms: Optional[int],
) -> Request:
    """The `watch` request; raises ValueError unless exactly one of `top`
    and `player` is given (the server would refuse it, after a round trip)."""
    if (top is None) == (player is None):
        raise ValueError("watch takes exactly one of top= and player=")
    return _wire.request(
        "watch", board=board, top=top, player=player, window=window, period=period, interval_ms=interval_ms
    )


def watch_result(outcome: Any) -> int:
    """The server's id of a watch, from the outcome of its `watch` request."""
    return watch_id(result(outcome))


def unwatch(watch: int) -> Request:
    return _wire.request("unwatch", watch=watch)
