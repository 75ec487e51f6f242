"""Types of the protocol's values, for type checkers (at run time the
results are plain dicts, lists, ints and strings)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Literal, Optional, TypedDict, Union

__all__ = [
    "ApproxRank",
    "ApproxRankOfScore",
    "Auth",
    "Board",
    "Entry",
    "Field",
    "Mode",
    "Order",
    "PlayerEvent",
    "Rank",
    "Score",
    "Scores",
    "Ties",
    "TopEvent",
    "Window",
    "WriteInfo",
]

#: `"desc"`: a higher score is better (the default); `"asc"`: lower is better.
Order = Literal["desc", "asc"]
#: How equal scores rank: `"competition"` (1224, the default), `"dense"` (1223),
#: `"ordinal"` (1234, who reached the score first ranks higher).
Ties = Literal["competition", "dense", "ordinal"]
#: What a write does: `"set"` replaces (the default), `"best"` keeps the
#: better of old and new, `"incr"` adds.
Mode = Literal["set", "best", "incr"]
#: The time windows a board may keep (weeks start Monday 00:00 UTC).
Window = Literal["all", "daily", "weekly", "monthly"]


#: A score on a board with fields (composite scores, protocol 1.1): one
#: integer per field, by name, e.g. `{"trophies": 30, "retries": 2}`.
Scores = Dict[str, int]
#: A score on either kind of board.
Score = Union[int, Scores]


class _FieldRequired(TypedDict):
    name: str
    max: int


class Field(_FieldRequired, total=False):
    """One field of a board with fields, as `create_board` takes it and
    `boards` lists it (with every key): `name` (1-32 bytes of a-z, 0-9, _),
    `order` (`"desc"`, the server's default, or `"asc"`), `min` (default 0)
    and `max`, both inclusive."""

    order: Order
    min: int


class Rank(TypedDict):
    """A player's place: `rank` (1-based), `score`, and `count` (players on the board).
    On a board with fields, `score` is a dict (`Scores`) at run time."""

    rank: int
    score: int
    count: int


class ApproxRank(TypedDict):
    """`rank(..., approx=True)`: an estimate from the board's bucket summary.
    The exact rank (as of the summary, refreshed every 250 ms) lies within
    `rank ± error`; `count` is the board's count as of the summary."""

    rank: int
    score: int
    count: int
    error: int


class ApproxRankOfScore(TypedDict):
    """`rank_of_score(..., approx=True)`: the exact answer lies within `rank ± error`."""

    rank: int
    error: int


class Entry(TypedDict):
    """One line of a leaderboard (`top`, `around`, `ranks`). On a board with
    fields, `score` is a dict (`Scores`) at run time."""

    player: str
    score: int
    rank: int


class _BoardConfig(TypedDict):
    board: str
    order: str
    ties: str
    windows: List[str]
    keep: int
    count: int


class Board(_BoardConfig, total=False):
    """A board's config and its `count` (first window, current period), from
    `boards`; `fields` only on a board with fields (each with `min` and `max`)."""

    fields: List[Field]


#: `auth`'s answer: `True`, or `{"role": "read" | "write"}` on a server with token roles.
Auth = Union[bool, Dict[str, str]]


#: What a `top` watch pushes: the list `top` would answer; None once, last,
#: when the board is dropped (the watch then ends).
TopEvent = Optional[List[Entry]]
#: What a `player` watch pushes: what `rank` would answer, None while the
#: player is absent (and, last, when the board is dropped).
PlayerEvent = Optional[Rank]


@dataclass(frozen=True)
class WriteInfo:
    """How the last write call (`set`, `set_many`, `remove`, or `call` of
    one of them) of a thread or task went: see `Client.last_write`."""

    #: The write id the request carried (the caller's, or the one the
    #: client made with `retry_writes`), or None.
    wid: Optional[str]
    #: The server had already applied this (board, wid): it answered the
    #: first application's result, with `"dup": true`, and changed nothing.
    #: (After a re-send, this means the attempt that timed out or lost its
    #: connection had applied.)
    dup: bool
    #: How many times the request was sent (1, or more after re-sends).
    sends: int
