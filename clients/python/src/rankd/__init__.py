"""A client for rankd, the sharded ranking server: exact ranks, durably,
over length-prefixed msgpack on TCP (or TLS).

    import rankd

    with rankd.Client("127.0.0.1", 7070) as db:
        db.set("arena", "alice", 1200)
        print(db.rank("arena", "alice"))   # {'rank': 1, 'score': 1200, 'count': 1}

`rankd.AsyncClient` has the same methods as coroutines, for asyncio.
"""

from ._errors import ProtocolError, RankdConnectionError, RankdError, RankdTimeout
from .aio import AsyncClient
from .client import Client
from .types import Auth, Board, Entry, Mode, Order, Rank, Ties, Window

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Auth",
    "Board",
    "Client",
    "Entry",
    "Mode",
    "Order",
    "ProtocolError",
    "Rank",
    "RankdConnectionError",
    "RankdError",
    "RankdTimeout",
    "Ties",
    "Window",
]
