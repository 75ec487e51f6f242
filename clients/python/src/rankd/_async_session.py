"""What runs an asyncio `rankd.AsyncClient`'s calls: its one connection
over time (opened on first use, authenticated, replaced when it fails),
calls on it with their re-sends (`_resend`), and the waits for watch events.

`rankd.AsyncClient` is its public face: each method there builds its
request (`_requests`) and runs it here.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from . import _requests, _resend, _wire
from ._aio_connection import _Connection, _forget
from ._async_watch import AsyncWatch
from ._errors import RankdConnectionError, RankdError, _Broken, _failure, _unreachable
from ._watch import Wait
from .types import WriteInfo

T = TypeVar("T")


class AsyncSession:
    """The connection and the private machinery of `rankd.AsyncClient`,
    which adds the public methods. A base class rather than a member: the
    public attributes read and counted here (`retry_writes`,
    `write_retries`, `retry_deadline`, `reconnects`) stay the client's own."""

    def __init__(
        self,
        settings: _wire.Settings,
        *,
        token: Optional[str],
        retry_writes: bool,
        write_retries: int,
        retry_deadline: float,
    ) -> None:
        self._settings = settings
        self._token = token
        self._conn: Optional[_Connection] = None
        # Made on first use, inside the event loop (Python 3.9 binds a lock
        # to the loop current when it is made).
        self._connect_lock: Optional[asyncio.Lock] = None
        self._connected_once = False
        self._closed = False
        self._ids = _wire.Numbering(settings.max_frame)
        #: Whether writes get a `wid` and are sent again (see `rankd.Client`).
        self.retry_writes = retry_writes
        #: How many times at most a write with a `wid` is sent again.
        self.write_retries = write_retries
        #: Seconds after a write's first send past which it is not sent again.
        self.retry_deadline = retry_deadline
        #: The active watches.
        self._watches: Set[AsyncWatch[Any]] = set()
        self._last_write: contextvars.ContextVar[Optional[WriteInfo]] = contextvars.ContextVar(
            "rankd_last_write", default=None
        )
        #: How many times a broken connection was replaced by a new one.
        self.reconnects = 0

    async def _close(self) -> None:
        """`AsyncClient.close`."""
        self._closed = True
        for watch in list(self._watches):
            watch._end("the client is closed")
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close("the client is closed")

    # -- connection ---------------------------------------------------------

    async def _open(self, deadline: Optional[float] = None) -> _Connection:
        """A new connection, authenticated with the token if there is one;
        connected and authenticated by `deadline` (a `time.monotonic()`
        instant) if one is given."""
        settings = self._settings
        connect_timeout = _wire.within(settings.connect_timeout, deadline)
        try:
            conn = await _Connection.open(settings, connect_timeout)
        except (asyncio.TimeoutError, OSError) as exc:
            timed_out = isinstance(exc, asyncio.TimeoutError)
            raise _unreachable(settings.address, connect_timeout, exc, timed_out=timed_out) from exc
        if self._token is not None:
            try:
                authenticated = self._exchange(conn, [_requests.auth(self._token)])
                if deadline is None:
                    (outcome,) = await authenticated
                else:
                    try:
                        (outcome,) = await asyncio.wait_for(authenticated, _wire.within(None, deadline))
                    except asyncio.TimeoutError:
                        late = "no reply to auth before the retry deadline"
                        raise _Broken(late, sent=True, results=[], timed_out=True) from None
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

    async def _live(self, deadline: Optional[float] = None) -> Tuple[_Connection, bool]:
        """The connection for the next request, and whether this call opened
        it: a connection that broke or that the server closed is replaced
        (by one made by `deadline`, if given)."""
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
            conn = await self._open(deadline)
            if self._closed:  # closed while connecting
                await conn.close("the client is closed")
                raise RankdConnectionError("the client is closed")
            self._conn = conn
            if self._connected_once:
                self.reconnects += 1
            self._connected_once = True
            return conn, True

    async def _exchange(self, conn: _Connection, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Sends `requests` and awaits their outcomes; raises `_Broken` if
        the connection fails (or a reply is late)."""
        return await self._exchange_frames(conn, *self._ids.frames(requests))

    async def _exchange_frames(self, conn: _Connection, ids: Sequence[int], payload: bytes) -> List[Any]:
        """Sends the frames `payload` of the requests `ids`, as `_exchange`."""
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
        except BaseException:  # cancelled: nobody awaits the others
            _forget(futures)
            raise
        return results

    # -- calls --------------------------------------------------------------

    async def _run_on(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[Any], _Connection, int]:
        """The outcomes (results, `Dup`s or `RankdError`s) of `requests`,
        sent as one pipeline; the connection that answered them; how many
        times they were sent. What is answered is kept; the rest may go
        again (`_resend.Resends` decides): on a new connection when this one
        breaks, on the same one after `overloaded` or `internal`."""
        call = _resend.Resends(requests, self, f"{self._settings.address} during a call")
        # Encoded first: a value msgpack cannot carry, or a request over
        # `max_frame`, raises before anything is sent.
        ids, payload = self._ids.frames(requests)
        conn, _ = await self._live()
        while True:
            call.sending()
            try:
                results = await self._exchange_frames(conn, ids, payload)
            except _Broken as broken:
                wait = call.broke(broken)
            else:
                again = call.answered(results)
                if again is None:
                    return call.outcomes, conn, call.sends
                wait = again
            ids, payload = self._ids.frames(call.rest)
            conn = await self._reconnect(call, wait)

    async def _reconnect(self, call: _resend.Resends, wait: float) -> _Connection:
        """After waiting `wait` seconds, the connection to send `call`'s rest
        again on (the same one if it is still open); trying again while
        `call` allows. A new connection is
        made by the call's retry deadline."""
        while True:
            await asyncio.sleep(wait)
            try:
                conn, opened = await self._live(call.deadline)
                call.check_reconnected(opened)
            except RankdConnectionError as exc:
                wait = call.connect_failed(exc)
                continue
            except RankdError as err:  # the token was refused
                call.refused(err)
                raise
            return conn

    async def _run(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """The outcomes of `requests` (see `_run_on`), without `Dup` marks."""
        if not requests:
            return []
        outcomes, _, _ = await self._run_on(_resend.prepare(requests, self))
        return [_wire.plain(o) for o in outcomes]

    async def _call(self, req: Mapping[str, Any]) -> Any:
        (sent,) = _resend.prepare([req], self)
        (outcome,), _, sends = await self._run_on([sent])
        return _resend.settle(sent, outcome, sends, self._last_write)

    # -- watches: the pushes' side ------------------------------------------

    async def _subscribe(self, watch: AsyncWatch[Any]) -> None:
        """Asks the server for `watch` (on the current connection, or a new
        one) and attaches it to the connection that answered."""
        (outcome,), conn, _ = await self._run_on([watch._request])
        wid = _requests.watch_result(outcome)
        if watch._ended is not None:  # closed while asking
            if conn.failure is None:
                conn.registry.retire(wid)
                try:
                    await self._exchange(conn, [_requests.unwatch(wid)])
                except _Broken:
                    pass
            return
        if conn.failure is None:  # (else it asks again)
            watch._attach(conn.registry, wid)

    async def _next_event(self, watch: AsyncWatch[T], timeout: Optional[float]) -> T:
        """`AsyncWatch.get`: one waiter asks again for a watch whose
        connection was lost, the others await it."""
        loop = asyncio.get_running_loop()
        waiting = Wait(timeout, loop.time())
        while True:
            if watch._ready(self._closed):
                return watch._events.popleft()
            if watch._registry is None:
                # Its connection was lost: ask again on a new one.
                if watch._asking is not None:  # another waiter asks
                    await asyncio.wait([watch._asking])
                    continue
                waiting.resubscribe(self._settings.address)
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
            wait = waiting.left(loop.time())
            waiter: asyncio.Future[None] = loop.create_future()
            watch._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, wait)
            except asyncio.TimeoutError:
                pass  # (raised above, on the next turn)
            finally:
                if waiter in watch._waiters:
                    watch._waiters.remove(waiter)

    async def _follow(self, watch: AsyncWatch[Any]) -> None:
        """Asks the server for a new `watch` and keeps it among the active."""
        await self._subscribe(watch)
        self._watches.add(watch)

    async def _unwatch(self, watch: AsyncWatch[Any]) -> bool:
        """`AsyncClient.unwatch`: the watch ends here whatever the server says."""
        registry, wid = watch._registry, watch.id
        watch._end("unwatched")
        conn = self._conn
        if registry is None or wid is None or conn is None or conn.failure is not None:
            return False
        if registry is not conn.registry:
            return False
        registry.retire(wid)
        try:
            (outcome,) = await self._exchange(conn, [_requests.unwatch(wid)])
        except _Broken:
            return False  # the watch went with the connection
        finally:
            registry.unretire(wid)
        return bool(_requests.result(outcome))
