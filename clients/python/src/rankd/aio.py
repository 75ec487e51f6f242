"""The asyncio client: `rankd.AsyncClient`."""

from __future__ import annotations

import asyncio
import contextvars
import logging
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
    Set,
    Tuple,
    Type,
    TypeVar,
    Union,
    cast,
    overload,
)

from . import _wire
from ._aio_connection import _Connection, _forget
from ._async_watch import AsyncWatch
from ._errors import RankdConnectionError, RankdError, RankdTimeout, WatchEnded, _Broken, _failure
from ._watch import watch_id
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

T = TypeVar("T")

_log = logging.getLogger("rankd")

#: How many times one `AsyncWatch.get` asks again for a watch whose
#: connection keeps being lost, before it raises.
_RESUBSCRIBES_PER_GET = 3


class AsyncClient:
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
    ) -> None:
        if write_retries < 0:
            raise ValueError("write_retries must be 0 or more")
        self._settings = _wire.Settings.make(
            host,
            port,
            timeout=timeout,
            connect_timeout=connect_timeout,
            tls=tls,
            ca_file=ca_file,
            server_hostname=server_hostname,
            certfile=certfile,
            keyfile=keyfile,
        )
        self._token = token
        self._conn: Optional[_Connection] = None
        # Made on first use, inside the event loop (Python 3.9 binds a lock
        # to the loop current when it is made).
        self._connect_lock: Optional[asyncio.Lock] = None
        self._connected_once = False
        self._closed = False
        self._next_id = 1
        #: Whether writes get a `wid` and are sent again (see `rankd.Client`).
        self.retry_writes = retry_writes
        #: How many times at most a write with a `wid` is sent again.
        self.write_retries = write_retries
        #: The active watches.
        self._watches: Set[AsyncWatch[Any]] = set()
        self._last_write: contextvars.ContextVar[Optional[WriteInfo]] = contextvars.ContextVar(
            "rankd_last_write", default=None
        )
        #: How many times a broken connection was replaced by a new one.
        self.reconnects = 0

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
        self._closed = True
        for watch in list(self._watches):
            watch._end("the client is closed")
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close("the client is closed")

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

    async def _open(self) -> _Connection:
        """A new connection, authenticated with the token if there is one."""
        settings = self._settings
        try:
            conn = await _Connection.open(settings)
        except asyncio.TimeoutError as exc:
            raise RankdTimeout(
                f"cannot connect to {settings.address} within {settings.connect_timeout} s"
            ) from exc
        except OSError as exc:
            raise RankdConnectionError(f"cannot connect to {settings.address}: {exc}") from exc
        if self._token is not None:
            try:
                ids, payload = self._encode([_wire.request("auth", token=self._token)])
                (outcome,) = await self._exchange(conn, ids, payload)
            except _Broken as broken:
                await conn.close("auth failed")
                raise _failure(broken, writes=False, where=f"{settings.address} during auth") from broken
            except BaseException:
                await conn.close("auth failed")
                raise
            if isinstance(outcome, RankdError):
                await conn.close("auth refused")
                raise outcome
        return conn

    async def _live(self) -> Tuple[_Connection, bool]:
        """The connection for the next request, and whether this call opened
        it: a connection that broke or that the server closed is replaced."""
        if self._closed:
            raise RankdConnectionError("the client is closed")
        conn = self._conn
        if conn is not None and conn.failure is None:
            return conn, False
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            if self._closed:
                raise RankdConnectionError("the client is closed")
            conn = self._conn
            if conn is not None and conn.failure is None:
                return conn, False  # another task reconnected meanwhile
            if conn is not None:
                self._conn = None
                await conn.close("replaced")
            conn = await self._open()
            if self._closed:  # closed while connecting
                await conn.close("the client is closed")
                raise RankdConnectionError("the client is closed")
            self._conn = conn
            if self._connected_once:
                self.reconnects += 1
            self._connected_once = True
            return conn, True

    def _encode(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[int], bytes]:
        ids = list(range(self._next_id, self._next_id + len(requests)))
        payload = b"".join(_wire.encode(req, rid) for req, rid in zip(requests, ids))
        self._next_id += len(requests)
        return ids, payload

    async def _exchange(self, conn: _Connection, ids: Sequence[int], payload: bytes) -> List[Any]:
        """Sends the requests `ids` and awaits their outcomes; raises
        `_Broken` if the connection fails (or a reply is late)."""
        futures = conn.send(ids, payload)
        results: List[Any] = []
        try:
            await conn.drain()
            for future in futures:
                results.append(await future)
        except _Broken as broken:
            _forget(futures)
            broken.results = results
            raise
        return results

    def _prepare(self, requests: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
        """`requests` as sent: with `retry_writes`, writes get a `wid`."""
        return _wire.with_wids(requests) if self.retry_writes else list(requests)

    async def _run_on(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[Any], _Connection, int]:
        """The outcomes (results, `Dup`s or `RankdError`s) of `requests`,
        sent as one pipeline; the connection that answered them; how many
        times they were sent.

        When the connection breaks, what it answered is kept and the rest
        may go again on a new connection: once per call if the rest holds
        only reads, or requests that never left, and the failure was no
        timeout; up to `write_retries` times (also after a timeout) if it
        holds writes and each carries a `wid` (with `retry_writes`)."""
        where = f"{self._settings.address} during a call"
        single_wid = requests[0].get("wid") if len(requests) == 1 and _wire.is_guarded(requests[0]) else None
        # Encoded first: a value msgpack cannot carry raises before anything
        # is sent.
        ids, payload = self._encode(requests)
        done: List[Any] = []
        rest: Sequence[Mapping[str, Any]] = requests
        retries = 0
        sends = 1
        #: A write still unanswered was sent by an earlier attempt.
        sent_before = False
        conn, opened = await self._live()
        while True:
            try:
                results = await self._exchange(conn, ids, payload)
                return done + results, conn, sends
            except _Broken as broken:
                done.extend(broken.results)
                rest = rest[len(broken.results) :]
                writes = not all(_wire.is_read(req) for req in rest)
                guarded = (
                    self.retry_writes
                    and writes
                    and all(_wire.is_read(req) or _wire.is_guarded(req) for req in rest)
                )
                in_doubt = writes and (sent_before or broken.sent)
                if guarded and retries < self.write_retries and not broken.protocol:
                    retries += 1
                elif guarded or opened or broken.timed_out or broken.protocol or in_doubt:
                    raise _failure(
                        broken,
                        writes=writes,
                        where=where,
                        in_doubt=in_doubt,
                        results=[_wire.plain(o) for o in done],
                        sends=sends,
                        wid=single_wid,
                    ) from broken
                sent_before = in_doubt
                ids, payload = self._encode(rest)
                sends += 1
                conn, opened, retries = await self._reconnect_for_retry(
                    retries if guarded else 0, in_doubt, done, sends, single_wid
                )

    async def _reconnect_for_retry(
        self, retry: int, in_doubt: bool, done: List[Any], sends: int, wid: Optional[str]
    ) -> Tuple[_Connection, bool, int]:
        """A connection to send a call's rest again on, whether this call
        opened it, and the re-sends used: `retry` > 0 for the `retry`-th
        re-send of a guarded write, which first waits, and tries to connect
        (each try a re-send) until the re-sends run out."""
        while True:
            if retry:
                await asyncio.sleep(_wire.retry_delay(retry))
            try:
                conn, opened = await self._live()
                return conn, opened, retry
            except RankdConnectionError as exc:
                if not in_doubt:
                    raise
                if retry and retry < self.write_retries:
                    retry += 1
                    continue
                cls = type(exc) if isinstance(exc, RankdTimeout) else RankdConnectionError
                note = f"a write was sent {sends - 1} times and may or may not have applied (at most once)"
                raise cls(
                    f"{exc}; {note}",
                    maybe_applied=True,
                    results=[_wire.plain(o) for o in done],
                    wid=wid,
                ) from exc

    async def _run(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """The outcomes of `requests` (see `_run_on`), without `Dup` marks."""
        if not requests:
            return []
        outcomes, _, _ = await self._run_on(self._prepare(requests))
        return [_wire.plain(o) for o in outcomes]

    async def _call(self, req: Mapping[str, Any]) -> Any:
        (sent,) = self._prepare([req])
        (outcome,), _, sends = await self._run_on([sent])
        if sent.get("op") in _wire.WID_OPS:
            self._last_write.set(
                WriteInfo(wid=sent.get("wid"), dup=isinstance(outcome, _wire.Dup), sends=sends)
            )
        if isinstance(outcome, RankdError):
            raise outcome
        return _wire.plain(outcome)

    # -- watches: the pushes' side ------------------------------------------

    async def _subscribe(self, watch: AsyncWatch[Any]) -> None:
        """Asks the server for `watch` (on the current connection, or a new
        one) and attaches it to the connection that answered."""
        (outcome,), conn, _ = await self._run_on([watch._request])
        if isinstance(outcome, RankdError):
            raise outcome
        wid = watch_id(_wire.plain(outcome))
        if watch._ended is not None:  # closed while asking
            if conn.failure is None:
                conn.registry.retire(wid)
                try:
                    await self._exchange(conn, *self._encode([_wire.request("unwatch", watch=wid)]))
                except _Broken:
                    pass
            return
        if conn.failure is None:  # (else it asks again)
            watch._attach(conn.registry, wid)

    async def _next_event(self, watch: AsyncWatch[T], timeout: Optional[float]) -> T:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        resubscribed = 0
        while True:
            if watch._events:
                return watch._events.popleft()
            if watch._ended is not None:
                raise WatchEnded(watch._ended)
            if self._closed:
                watch._end("the client is closed")
                continue
            if watch._registry is None:
                # Its connection was lost: ask again on a new one.
                if watch._asking is not None:  # another waiter asks
                    await asyncio.wait([watch._asking])
                    continue
                if resubscribed == _RESUBSCRIBES_PER_GET:
                    raise RankdConnectionError(
                        f"{self._settings.address}: the connection of a watch was lost "
                        f"{resubscribed} times in one wait"
                    )
                resubscribed += 1
                watch._asking = loop.create_future()
                try:
                    await self._subscribe(watch)
                except RankdError as err:
                    watch._end(f"asking again was refused: {err}")
                    raise
                finally:
                    watch._asking.set_result(None)
                    watch._asking = None
                watch.resubscribes += 1
                continue
            wait = None if deadline is None else deadline - loop.time()
            if wait is not None and wait <= 0:
                raise TimeoutError(f"no event within {timeout} s")
            waiter: asyncio.Future[None] = loop.create_future()
            watch._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, wait)
            except asyncio.TimeoutError:
                pass  # (raised above, on the next turn)
            finally:
                if waiter in watch._waiters:
                    watch._waiters.remove(waiter)

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
        `set_many` and `remove` without a `wid` gets one (in a copy)."""
        return await self._run(list(requests))

    # -- operations ---------------------------------------------------------

    async def ping(self) -> str:
        """`"pong"`."""
        return cast(str, await self._call(_wire.request("ping")))

    async def auth(self, token: str) -> Auth:
        """Authenticates this connection; the client re-authenticates with
        `token` after every reconnection. `True`, or `{"role": "read"|"write"}`
        on a server with token roles; `RankdError("unauthorized")` if refused."""
        # Stored first: should this call have to reconnect, the new
        # connection presents this token, not one it replaces (perhaps
        # revoked meanwhile). Put back if refused.
        previous, self._token = self._token, token
        try:
            return cast(Auth, await self._call(_wire.request("auth", token=token)))
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
        windows_list = None if windows is None else list(windows)
        fields_list = None if fields is None else [dict(field) for field in fields]
        req = _wire.request(
            "create_board",
            board=board,
            order=order,
            ties=ties,
            windows=windows_list,
            keep=keep,
            fields=fields_list,
        )
        return cast(bool, await self._call(req))

    async def drop_board(self, board: str) -> bool:
        """True if the board existed. Its watches get a last push of None
        and end."""
        return cast(bool, await self._call(_wire.request("drop_board", board=board)))

    async def boards(
        self, prefix: Optional[str] = None, *, after: Optional[str] = None, limit: Optional[int] = None
    ) -> List[Board]:
        """One page of boards with their configs and counts, in byte order
        of their names: those whose name starts with `prefix`, after the
        board named `after`, at most `limit` (1 to 10 000; the server's
        default, 1000). Ask again with `after` set to the last name until a
        page comes back shorter than `limit`, or call `all_boards`."""
        return cast(
            List[Board], await self._call(_wire.request("boards", prefix=prefix, after=after, limit=limit))
        )

    async def all_boards(self, prefix: Optional[str] = None, *, page: int = 1000) -> List[Board]:
        """Every board whose name starts with `prefix`, asked for `page` at a
        time (a server may hold millions: see `boards`)."""
        found: List[Board] = []
        after: Optional[str] = None
        while True:
            got = await self.boards(prefix, after=after, limit=page)
            found.extend(got)
            if len(got) < page:
                return found
            after = got[-1]["board"]

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
        req = _wire.request("set", board=board, player=player, score=_wire.score(score), mode=mode, wid=wid)
        return cast(Score, await self._call(req))

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
        req = _wire.request("set_many", board=board, entries=_wire.entries(entries), mode=mode, wid=wid)
        return cast(List[int], await self._call(req))

    async def get(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[int]:
        """The player's score (a dict on a board with fields), or None."""
        req = _wire.request("get", board=board, player=player, window=window, period=period)
        return cast(Optional[int], await self._call(req))

    async def remove(self, board: str, player: str, *, wid: Optional[str] = None) -> bool:
        """True if the player was on the board. `wid` as for `set`."""
        req = _wire.request("remove", board=board, player=player, wid=wid)
        return cast(bool, await self._call(req))

    async def count(
        self, board: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> int:
        """The number of players."""
        return cast(int, await self._call(_wire.request("count", board=board, window=window, period=period)))

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
        req = _wire.request(
            "rank", board=board, player=player, window=window, period=period, approx=True if approx else None
        )
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
        req = _wire.request(
            "rank_of_score",
            board=board,
            score=_wire.score(score),
            window=window,
            period=period,
            approx=True if approx else None,
        )
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
        req = _wire.request("top", board=board, limit=limit, offset=offset, window=window, period=period)
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
        req = _wire.request(
            "around", board=board, player=player, before=before, after=after, window=window, period=period
        )
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
        req = _wire.request("ranks", board=board, players=list(players), window=window, period=period)
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
        if (top is None) == (player is None):
            raise ValueError("watch takes exactly one of top= and player=")
        req = _wire.request(
            "watch",
            board=board,
            top=top,
            player=player,
            window=window,
            period=period,
            interval_ms=interval_ms,
        )
        watch: AsyncWatch[Any] = AsyncWatch(self, req, buffer)
        await self._subscribe(watch)
        self._watches.add(watch)
        if callback is not None:
            watch._start(callback)
        return watch

    async def unwatch(self, watch: AsyncWatch[Any]) -> bool:
        """Ends `watch`: True if the server had it active. Events it received
        before can still be taken. (A watch whose connection was lost, or
        whose board was dropped, is ended without asking: False.)"""
        registry, wid = watch._registry, watch.id
        watch._end("unwatched")
        conn = self._conn
        if registry is None or wid is None or conn is None or conn.failure is not None:
            return False
        if registry is not conn.registry:
            return False
        registry.retire(wid)
        try:
            ids, payload = self._encode([_wire.request("unwatch", watch=wid)])
            (outcome,) = await self._exchange(conn, ids, payload)
        except _Broken:
            return False  # the watch went with the connection
        finally:
            registry.unretire(wid)
        if isinstance(outcome, RankdError):
            raise outcome
        return bool(_wire.plain(outcome))
