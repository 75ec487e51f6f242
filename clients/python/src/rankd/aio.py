"""The asyncio client: `rankd.AsyncClient`, the public face of an
`_async_session.AsyncSession` (which runs the calls)."""

from __future__ import annotations

import ssl
from types import TracebackType
from typing import (
    Any,
    Callable,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
    cast,
    overload,
)

from . import _requests, _resend, _wire
from ._async_session import AsyncSession
from ._async_watch import AsyncWatch
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

__all__ = ["AsyncClient", "AsyncWatch"]


class AsyncClient(AsyncSession):
    """An asyncio connection to a rankd server, with the same methods as
    `rankd.Client`, as coroutines.

    Connects on `await client.connect()`, `async with`, or the first call
    (then runs `auth` with `token`). Any number of tasks may call at once:
    their requests are pipelined on the one connection, and each awaits its
    own reply. Use it from one event loop.

    The arguments are those of `rankd.Client`. `timeout` bounds the wait for
    each reply (from its request's sending, or from the reply before it): a
    reply that does not come in time raises `RankdTimeout` in its call and
    fails the connection, since every reply behind it is late too; of the
    calls waiting behind it, reads are sent again on a new connection, and
    so are writes carrying a `wid` (with `retry_writes`); other writes raise
    `RankdConnectionError` with `maybe_applied`.

    `last_write` is per task: the last write this task awaited.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7070,
        *,
        timeout: Optional[float] = 30.0,
        connect_timeout: Optional[float] = None,
        tls: Union[bool, ssl.SSLContext] = False,
        ca_file: Optional[str] = None,
        server_hostname: Optional[str] = None,
        certfile: Optional[str] = None,
        keyfile: Optional[str] = None,
        token: Optional[str] = None,
        retry_writes: bool = True,
        write_retries: int = 3,
        retry_deadline: float = 60.0,
        max_frame: int = _wire.MAX_FRAME,
    ) -> None:
        _resend.check(write_retries, retry_deadline)
        settings = _wire.Settings.make(
            host,
            port,
            timeout=timeout,
            connect_timeout=connect_timeout,
            tls=tls,
            ca_file=ca_file,
            server_hostname=server_hostname,
            certfile=certfile,
            keyfile=keyfile,
            max_frame=max_frame,
        )
        super().__init__(
            settings,
            token=token,
            retry_writes=retry_writes,
            write_retries=write_retries,
            retry_deadline=retry_deadline,
        )

    # -- connection ---------------------------------------------------------

    @property
    def last_write(self) -> Optional[WriteInfo]:
        """How the last write call answered by the server (`set`, `set_many`,
        `remove`, or `call` of one of them) awaited *by the current task*
        went: its `wid`, whether the server answered it as a duplicate
        (`dup`), and how many times it was sent. None before the first.
        (Per task: tasks of `asyncio.gather` each see their own, and their
        caller none of theirs.)"""
        return self._last_write.get()

    @property
    def last_dup(self) -> bool:
        """Whether this task's last write was answered `"dup": true`: the
        server had already applied its (board, wid) and changed nothing."""
        info = self._last_write.get()
        return info is not None and info.dup

    async def connect(self) -> AsyncClient:
        """Connects now (and authenticates), if not connected; returns the client."""
        await self._live()
        return self

    async def close(self) -> None:
        """Closes the connection and ends every watch; calls still waiting
        and later calls raise `RankdConnectionError`."""
        await self._close()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        live = self._conn is not None and self._conn.failure is None
        state = "closed" if self._closed else "connected" if live else "disconnected"
        tls = " tls" if self._settings.ssl_context is not None else ""
        return f"<rankd.AsyncClient {self._settings.address}{tls} {state}>"

    # -- generic requests ---------------------------------------------------

    async def call(self, op: str, **fields: Any) -> Any:
        """Runs `op` with `fields` and returns its result; raises `RankdError`
        if the server answers an error. Fields that are None are not sent.
        (A `set`, `set_many` or `remove` gets a `wid` with `retry_writes`.)"""
        return await self._call(_wire.request(op, **fields))

    async def pipeline(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Sends every request (maps without `id`) before awaiting the
        replies; returns their outcomes in order, each the result or the
        `RankdError` the server answered (returned, not raised). The requests
        are sent as they are, except that with `retry_writes` each `set`,
        `set_many` and `remove` without a `wid` gets one (in a copy). A
        failure raises `RankdConnectionError`, with `results` and `wids` as
        for `Client.pipeline`."""
        return await self._run(list(requests))

    # -- operations ---------------------------------------------------------

    async def ping(self) -> str:
        """`"pong"`."""
        return cast(str, await self._call(_requests.ping()))

    async def auth(self, token: str) -> Auth:
        """Authenticates this connection; the client re-authenticates with
        `token` after every reconnection. `True`, or `{"role": "read"|"write"}`
        on a server with token roles; `RankdError("unauthorized")` if refused."""
        # Stored first: should this call have to reconnect, the new
        # connection presents this token, not one it replaces (perhaps
        # revoked meanwhile). Put back if refused.
        previous, self._token = self._token, token
        try:
            return cast(Auth, await self._call(_requests.auth(token)))
        except BaseException:
            self._token = previous
            raise

    async def create_board(
        self,
        board: str,
        *,
        order: Optional[Order] = None,
        ties: Optional[Ties] = None,
        windows: Optional[Sequence[Window]] = None,
        keep: Optional[int] = None,
        fields: Optional[Sequence[Field]] = None,
    ) -> bool:
        """True if created, False if it already existed with this config
        (`RankdError("conflict")` if with another). `fields` (2 to 4
        `{"name", "order", "min", "max"}` dicts, ranked in turn) makes a
        board of composite scores, whose scores are dicts `{field: int}`
        in every call and result (its `order` is then ignored)."""
        req = _requests.create_board(board, order=order, ties=ties, windows=windows, keep=keep, fields=fields)
        return cast(bool, await self._call(req))

    async def drop_board(self, board: str) -> bool:
        """True if the board existed. Its watches get a last push of None
        and end."""
        return cast(bool, await self._call(_requests.drop_board(board)))

    async def boards(
        self, prefix: Optional[str] = None, *, after: Optional[str] = None, limit: Optional[int] = None
    ) -> List[Board]:
        """One page of boards with their configs and counts, in byte order
        of their names: those whose name starts with `prefix`, after the
        board named `after`, at most `limit` (1 to 10 000; the server's
        default, 1000). Ask again with `after` set to the last name until a
        page comes back shorter than `limit`, or call `all_boards`."""
        return cast(List[Board], await self._call(_requests.boards(prefix, after=after, limit=limit)))

    async def all_boards(self, prefix: Optional[str] = None, *, page: int = 1000) -> List[Board]:
        """Every board whose name starts with `prefix`, asked for `page` at a
        time (a server may hold millions: see `boards`)."""
        found: List[Board] = []
        after: Optional[str] = None
        while True:
            got = await self.boards(prefix, after=after, limit=page)
            found.extend(got)
            after = _requests.next_page(got, page)
            if after is None:
                return found

    @overload
    async def set(
        self, board: str, player: str, score: int, *, mode: Optional[Mode] = None, wid: Optional[str] = None
    ) -> int: ...

    @overload
    async def set(
        self,
        board: str,
        player: str,
        score: Mapping[str, int],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> Scores: ...

    async def set(
        self,
        board: str,
        player: str,
        score: Union[int, Mapping[str, int]],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> Score:
        """Writes a score; returns the score stored (in the board's first
        window). On a board with fields, `score` is a dict `{field: int}`
        (every field for `"set"` and `"best"`; `"incr"` adds those given)
        and so is the result. `wid` (1-64 bytes, never repeated for another write on the
        board) makes the write apply at most once; with `retry_writes` the
        client picks one when it is not given. `last_write` tells whether
        the server answered it as a duplicate."""
        return cast(Score, await self._call(_requests.set(board, player, score, mode=mode, wid=wid)))

    async def set_many(
        self,
        board: str,
        entries: Union[Mapping[str, Score], Iterable[Tuple[str, Score]]],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> List[Any]:
        """Writes up to 10 000 `(player, score)` pairs (or a dict) in one
        request; returns the stored scores in entry order (dicts on a board
        with fields). `wid` as for `set`."""
        return cast(List[int], await self._call(_requests.set_many(board, entries, mode=mode, wid=wid)))

    async def get(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[int]:
        """The player's score (a dict on a board with fields), or None."""
        req = _requests.get(board, player, window=window, period=period)
        return cast(Optional[int], await self._call(req))

    async def remove(self, board: str, player: str, *, wid: Optional[str] = None) -> bool:
        """True if the player was on the board. `wid` as for `set`."""
        return cast(bool, await self._call(_requests.remove(board, player, wid=wid)))

    async def count(
        self, board: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> int:
        """The number of players."""
        return cast(int, await self._call(_requests.count(board, window=window, period=period)))

    @overload
    async def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[False] = ...,
    ) -> Optional[Rank]: ...

    @overload
    async def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[True],
    ) -> Optional[ApproxRank]: ...

    async def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        approx: bool = False,
    ) -> Union[Optional[Rank], Optional[ApproxRank]]:
        """`{"rank", "score", "count"}`, or None if the player is absent.

        With `approx=True`, an estimate from the board's bucket summary
        (no fan-out over the shards): `{"rank", "score", "count", "error"}`,
        the exact rank lying within `rank ± error` as of the summary. A dense
        board refuses it (`bad_request`)."""
        req = _requests.rank(board, player, window=window, period=period, approx=approx)
        return cast(Union[Optional[Rank], Optional[ApproxRank]], await self._call(req))

    @overload
    async def rank_of_score(
        self,
        board: str,
        score: int,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[False] = ...,
    ) -> int: ...

    @overload
    async def rank_of_score(
        self,
        board: str,
        score: int,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[True],
    ) -> ApproxRankOfScore: ...

    async def rank_of_score(
        self,
        board: str,
        score: Union[int, Mapping[str, int]],
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        approx: bool = False,
    ) -> Union[int, ApproxRankOfScore]:
        """The rank a new player with `score` would get (a dict with every
        field on a board with fields).

        With `approx=True`, `{"rank", "error"}` from the board's bucket
        summary alone: the exact rank lies within `rank ± error`."""
        req = _requests.rank_of_score(board, score, window=window, period=period, approx=approx)
        return cast(Union[int, ApproxRankOfScore], await self._call(req))

    async def top(
        self,
        board: str,
        *,
        limit: Optional[int] = None,
        offset: Optional[int] = None,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """`limit` entries (default 10, at most 1000) from `offset`, best first."""
        req = _requests.top(board, limit=limit, offset=offset, window=window, period=period)
        return cast(List[Entry], await self._call(req))

    async def around(
        self,
        board: str,
        player: str,
        *,
        before: Optional[int] = None,
        after: Optional[int] = None,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """The player with up to `before` better and `after` worse neighbours
        (default 5 each, at most 500); empty if the player is absent."""
        req = _requests.around(board, player, before=before, after=after, window=window, period=period)
        return cast(List[Entry], await self._call(req))

    async def ranks(
        self,
        board: str,
        players: Sequence[str],
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """Where `players` (1 to 1000 names) stand: those with a score, each
        once, best first, with their board-wide ranks (protocol 1.1)."""
        req = _requests.ranks(board, players, window=window, period=period)
        return cast(List[Entry], await self._call(req))

    # -- watches ------------------------------------------------------------

    @overload
    async def watch(
        self,
        board: str,
        *,
        top: int,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[TopEvent], object]] = None,
    ) -> AsyncWatch[TopEvent]: ...

    @overload
    async def watch(
        self,
        board: str,
        *,
        player: str,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[PlayerEvent], object]] = None,
    ) -> AsyncWatch[PlayerEvent]: ...

    async def watch(
        self,
        board: str,
        *,
        top: Optional[int] = None,
        player: Optional[str] = None,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[Any], object]] = None,
    ) -> AsyncWatch[Any]:
        """Follows a board's best `top` (1-100) entries, or one `player`'s
        rank, as `rankd.Client.watch` does; returns an `AsyncWatch`: `async
        for event in w`, or `await w.get(timeout)`. `callback` (a function,
        or a coroutine function) is called with each event by a task of the
        watch's own."""
        req = _requests.watch(
            board, top=top, player=player, window=window, period=period, interval_ms=interval_ms
        )
        watch: AsyncWatch[Any] = AsyncWatch(self, req, buffer)
        await self._follow(watch)
        if callback is not None:
            watch._start(callback)
        return watch

    async def unwatch(self, watch: AsyncWatch[Any]) -> bool:
        """Ends `watch`: True if the server had it active. Events it received
        before can still be taken. (A watch whose connection was lost, or
        whose board was dropped, is ended without asking: False.)"""
        return await self._unwatch(watch)
