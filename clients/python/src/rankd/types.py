"""Types of the protocol's values, for type checkers (at run time the
results are plain dicts, lists, ints and strings)."""

from __future__ import annotations

from typing import Dict, List, Literal, TypedDict, Union

__all__ = ["Auth", "Board", "Entry", "Mode", "Order", "Rank", "Ties", "Window"]

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


class Rank(TypedDict):
    """A player's place: `rank` (1-based), `score`, and `count` (players on the board)."""

    rank: int
    score: int
    count: int


class Entry(TypedDict):
    """One line of a leaderboard (`top`, `around`)."""

    player: str
    score: int
    rank: int


class Board(TypedDict):
    """A board's config and its `count` (first window, current period), from `boards`."""

    board: str
    order: str
    ties: str
    windows: List[str]
    keep: int
    count: int


#: `auth`'s answer: `True`, or `{"role": "read" | "write"}` on a server with token roles.
Auth = Union[bool, Dict[str, str]]
