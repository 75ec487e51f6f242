"""The asyncio client: `rankd.AsyncClient`."""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from types import TracebackType
from typing import Any, Deque, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union, cast

from . import _wire
from ._errors import RankdConnectionError, RankdError, RankdTimeout, _Broken, _failure
from .types import Auth, Board, Entry, Mode, Order, Rank, Ties, Window

__all__ = ["AsyncClient"]

#: How long closing waits for the server to acknowledge (TLS close_notify).
_CLOSE_WAIT = 2.0

#: Frames queued by calls in one turn of the event loop go out in one write
#: (one syscall, one TCP segment for many small requests), unless they add
#: up to this much, which is written at once.
_FLUSH_AT = 64 * 1024


class _Connection:
    """One connection. Calls queue their frames, written together at the end
    of the event loop's turn, so concurrent calls pipeline; a reader task
    hands each reply to the oldest call waiting, since replies come back in
    request order; one timer watches the oldest call's reply."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: Optional[float]
    ) -> None:
        self.reader = reader
        self.writer = writer
        #: (request id, future for its outcome), in send order.
        self.pending: Deque[Tuple[int, "asyncio.Future[Any]"]] = deque()
        #: Why the connection is unusable, once it is.
        self.failure: Optional[_Broken] = None
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        #: Frames not yet handed to the transport, and how many requests
        #: they hold (the newest in `pending`): those were never sent.
        self._unwritten: List[bytes] = []
        self._unwritten_bytes = 0
        self._unwritten_requests = 0
        self._flush_handle: Optional[asyncio.Handle] = None
        #: Loop time since which the oldest pending call waits: when it was
        #: sent, or when the reply before it came.
        self._waiting_since = 0.0
        self._watchdog: Optional[asyncio.TimerHandle] = None
        # (Concurrent drain() calls were not allowed before Python 3.10.)
        self._drain_lock = asyncio.Lock()
        self._task = self._loop.create_task(self._read_replies())

    @classmethod
    async def open(cls, settings: _wire.Settings) -> _Connection:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                settings.host,
                settings.port,
                ssl=settings.ssl_context,
                server_hostname=settings.server_hostname,
            ),
            settings.connect_timeout,
        )
        return cls(reader, writer, settings.timeout)

    def send(self, ids: Sequence[int], payload: bytes) -> List["asyncio.Future[Any]"]:
        """Queues the frames of requests `ids`; returns a future per reply."""
        if self.failure is not None:
            raise _Broken(str(self.failure), sent=False, results=[])
        if not self.pending:
            self._waiting_since = self._loop.time()
        futures: List["asyncio.Future[Any]"] = []
        for rid in ids:
            future = self._loop.create_future()
            self.pending.append((rid, future))
            futures.append(future)
        self._unwritten.append(payload)
        self._unwritten_bytes += len(payload)
        self._unwritten_requests += len(ids)
        if self._unwritten_bytes >= _FLUSH_AT:
            self._flush()
        elif self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)
        if self._timeout is not None and self._watchdog is None:
            self._watchdog = self._loop.call_later(self._timeout, self._check_late)
        return futures

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if self._unwritten and self.failure is None:
            self.writer.write(b"".join(self._unwritten))
        self._unwritten.clear()
        self._unwritten_bytes = 0
        self._unwritten_requests = 0

    async def drain(self) -> None:
        """Waits while the transport holds more than it should (flow control)."""
        if self.writer.transport.get_write_buffer_size() == 0:
            return
        try:
            async with self._drain_lock:
                await self.writer.drain()
        except (OSError, RuntimeError) as exc:
            self.fail(f"connection failed: {exc}")

    def _check_late(self) -> None:
        self._watchdog = None
        if self.failure is not None or not self.pending or self._timeout is None:
            return
        left = self._waiting_since + self._timeout - self._loop.time()
        if left > 0:
            self._watchdog = self._loop.call_later(left, self._check_late)
            return
        # Every reply behind the late one is late too: the connection fails.
        # The late call times out; the others may go again on a new one.
        _, late = self.pending.popleft()
        if not late.done():
            late.set_exception(
                _Broken(f"no reply within {self._timeout} s", sent=True, results=[], timed_out=True)
            )
        self.fail(f"an earlier call got no reply within {self._timeout} s")

    async def _read_replies(self) -> None:
        try:
            while True:
                header = await self.reader.readexactly(_wire.HEADER.size)
                (length,) = _wire.HEADER.unpack(header)
                _wire.check_length(length)
                body = await self.reader.readexactly(length)
                expected = self.pending[0][0] if self.pending else None
                outcome = _wire.parse_reply(body, expected)
                if outcome is _wire.PUSH:
                    continue
                _, future = self.pending.popleft()
                self._waiting_since = self._loop.time()
                if not future.done():  # its caller may have been cancelled
                    future.set_result(outcome)
        except asyncio.IncompleteReadError:
            self.fail("connection closed by the server")
        except RankdConnectionError as exc:  # a ProtocolError
            self.fail(str(exc), protocol=True)
        except OSError as exc:
            self.fail(f"connection failed: {exc}")

    def fail(self, reason: str, *, protocol: bool = False) -> None:
        """Marks the connection unusable and fails every call waiting on it."""
        if self.failure is None:
            self.failure = _Broken(reason, sent=True, results=[], protocol=protocol)
        for handle in (self._flush_handle, self._watchdog):
            if handle is not None:
                handle.cancel()
        self._flush_handle = self._watchdog = None
        unsent = self._unwritten_requests  # the newest pending: never written
        self._unwritten.clear()
        self._unwritten_bytes = self._unwritten_requests = 0
        while self.pending:
            _, future = self.pending.popleft()
            sent = len(self.pending) >= unsent
            if not future.done():
                future.set_exception(_Broken(reason, sent=sent, results=[], protocol=protocol))
        self.writer.close()

    async def close(self, reason: str) -> None:
        self.fail(reason)
        if not self._task.done():
            self._task.cancel()
        try:
            await self._task
        except BaseException:  # its own cancellation, or a failure already recorded
            pass
        try:
            await asyncio.wait_for(self.writer.wait_closed(), _CLOSE_WAIT)
        except asyncio.TimeoutError:  # a TLS close the server does not answer
            try:
                self.writer.transport.abort()
            except Exception:  # (an SSL transport already torn down)
                pass
        except Exception:  # a reset is no news now
            pass


def _forget(futures: Iterable["asyncio.Future[Any]"]) -> None:
    """Marks the failures of futures nobody will await as seen (asyncio
    would log them as 'never retrieved')."""
    for future in futures:
        if future.done():
            if not future.cancelled():
                future.exception()
        else:
            future.add_done_callback(lambda f: f.cancelled() or f.exception())


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
    calls waiting behind it, reads are sent again on a new connection and
    writes raise `RankdConnectionError` with `maybe_applied`.
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
    ) -> None:
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
        #: How many times a broken connection was replaced by a new one.
        self.reconnects = 0

    # -- connection ---------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Connects now (and authenticates), if not connected; returns the client."""
        await self._live()
        return self

    async def close(self) -> None:
        """Closes the connection; calls still waiting and later calls raise
        `RankdConnectionError`."""
        self._closed = True
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

    async def _run(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """The outcomes (results or `RankdError`s) of `requests`, sent as one
        pipeline. A connection that broke is replaced, once per call: before
        sending, or after a failure that lost only reads (or requests that
        never left), which are then sent again."""
        if not requests:
            return []
        writes = not all(_wire.is_read(req) for req in requests)
        # Encoded first: a value msgpack cannot carry raises before anything
        # is sent. (Ids are per connection: a retry reuses them.)
        ids, payload = self._encode(requests)
        conn, opened = await self._live()
        while True:
            try:
                return await self._exchange(conn, ids, payload)
            except _Broken as broken:
                retry = (
                    not opened
                    and not broken.timed_out
                    and not broken.protocol
                    and (not writes or not broken.sent)
                )
                if not retry:
                    where = f"{self._settings.address} during a call"
                    raise _failure(broken, writes=writes, where=where) from broken
            conn, opened = await self._live()

    async def _call(self, req: Mapping[str, Any]) -> Any:
        (outcome,) = await self._run([req])
        if isinstance(outcome, RankdError):
            raise outcome
        return outcome

    # -- generic requests ---------------------------------------------------

    async def call(self, op: str, **fields: Any) -> Any:
        """Runs `op` with `fields` and returns its result; raises `RankdError`
        if the server answers an error. Fields that are None are not sent."""
        return await self._call(_wire.request(op, **fields))

    async def pipeline(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Sends every request (maps without `id`, sent as they are) before
        awaiting the replies; returns their outcomes in order, each the
        result or the `RankdError` the server answered (returned, not raised)."""
        return await self._run(list(requests))

    # -- operations ---------------------------------------------------------

    async def ping(self) -> str:
        """`"pong"`."""
        return cast(str, await self._call(_wire.request("ping")))

    async def auth(self, token: str) -> Auth:
        """Authenticates this connection; the client re-authenticates with
        `token` after every reconnection. `True`, or `{"role": "read"|"write"}`
        on a server with token roles; `RankdError("unauthorized")` if refused."""
        result = cast(Auth, await self._call(_wire.request("auth", token=token)))
        self._token = token
        return result

    async def create_board(
        self,
        board: str,
        *,
        order: Optional[Order] = None,
        ties: Optional[Ties] = None,
        windows: Optional[Sequence[Window]] = None,
        keep: Optional[int] = None,
    ) -> bool:
        """True if created, False if it already existed with this config
        (`RankdError("conflict")` if with another)."""
        windows_list = None if windows is None else list(windows)
        req = _wire.request(
            "create_board", board=board, order=order, ties=ties, windows=windows_list, keep=keep
        )
        return cast(bool, await self._call(req))

    async def drop_board(self, board: str) -> bool:
        """True if the board existed."""
        return cast(bool, await self._call(_wire.request("drop_board", board=board)))

    async def boards(self) -> List[Board]:
        """Every board with its config and count."""
        return cast(List[Board], await self._call(_wire.request("boards")))

    async def set(self, board: str, player: str, score: int, *, mode: Optional[Mode] = None) -> int:
        """Writes a score; returns the score stored (in the board's first window)."""
        req = _wire.request("set", board=board, player=player, score=score, mode=mode)
        return cast(int, await self._call(req))

    async def set_many(
        self,
        board: str,
        entries: Union[Mapping[str, int], Iterable[Tuple[str, int]]],
        *,
        mode: Optional[Mode] = None,
    ) -> List[int]:
        """Writes up to 10 000 `(player, score)` pairs (or a dict) in one
        request; returns the stored scores in entry order."""
        req = _wire.request("set_many", board=board, entries=_wire.entries(entries), mode=mode)
        return cast(List[int], await self._call(req))

    async def get(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[int]:
        """The player's score, or None."""
        req = _wire.request("get", board=board, player=player, window=window, period=period)
        return cast(Optional[int], await self._call(req))

    async def remove(self, board: str, player: str) -> bool:
        """True if the player was on the board."""
        return cast(bool, await self._call(_wire.request("remove", board=board, player=player)))

    async def count(
        self, board: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> int:
        """The number of players."""
        return cast(int, await self._call(_wire.request("count", board=board, window=window, period=period)))

    async def rank(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[Rank]:
        """`{"rank", "score", "count"}`, or None if the player is absent."""
        req = _wire.request("rank", board=board, player=player, window=window, period=period)
        return cast(Optional[Rank], await self._call(req))

    async def rank_of_score(
        self, board: str, score: int, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> int:
        """The rank a new player with `score` would get."""
        req = _wire.request("rank_of_score", board=board, score=score, window=window, period=period)
        return cast(int, await self._call(req))

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
