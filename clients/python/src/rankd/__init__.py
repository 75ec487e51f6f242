"""A client for rankd, the sharded ranking server: exact ranks, durably,
over length-prefixed msgpack on TCP (or TLS).

    import rankd

    with rankd.Client("127.0.0.1", 7070) as db:
        db.set("arena", "alice", 1200)
        print(db.rank("arena", "alice"))   # {'rank': 1, 'score': 1200, 'count': 1}

`rankd.AsyncClient` has the same methods as coroutines, for asyncio.
Writes carry a write id (`wid`) and are sent again after a lost connection
or a timeout, applying at most once; `watch` follows a board's top or a
player's rank as the server pushes them.
"""

from ._errors import ProtocolError, RankdConnectionError, RankdError, RankdTimeout, WatchEnded
from .aio import AsyncClient, AsyncWatch
from .client import Client, Watch
from .types import (
    ApproxRank,
    ApproxRankOfScore,
    Auth,
    Board,
    Entry,
    Field,
    Mode,
    Order,
    PlayerEvent,
    Rank,
    Score,
    Scores,
    Ties,
    TopEvent,
    Window,
    WriteInfo,
)

__version__ = "0.2.0"

__all__ = [
    "ApproxRank",
    "ApproxRankOfScore",
    "AsyncClient",
    "AsyncWatch",
    "Auth",
    "Board",
    "Client",
    "Entry",
    "Field",
    "Mode",
    "Order",
    "PlayerEvent",
    "ProtocolError",
    "Rank",
    "Score",
    "Scores",
    "RankdConnectionError",
    "RankdError",
    "RankdTimeout",
    "Ties",
    "TopEvent",
    "Watch",
    "WatchEnded",
    "Window",
    "WriteInfo",
]
