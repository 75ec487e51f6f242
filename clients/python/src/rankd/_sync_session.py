"""What runs a blocking `rankd.Client`'s calls: its one connection over
time (opened, authenticated, replaced when it breaks or the server closes
it), calls on it with their re-sends (`_resend`), and the waits for watch
events, in which one thread at a time reads the socket for every watch.

`rankd.Client` is its public face: each method there builds its request
(`_requests`) and runs it here.
"""

from __future__ import annotations

import contextvars
import selectors
import socket
import threading
import time
from typing import Any, List, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from . import _requests, _resend, _wire
from ._connection import _Connection
from ._errors import ProtocolError, RankdConnectionError, RankdError, _Broken, _failure, _unreachable
from ._sync_watch import Watch
from ._watch import Wait
from .types import WriteInfo

T = TypeVar("T")


class SyncSession:
    """The connection and the private machinery of `rankd.Client`, which
    adds the public methods. A base class rather than a member: the public
    attributes read and counted here (`retry_writes`, `write_retries`,
    `retry_deadline`, `reconnects`) stay the client's own."""

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
        #: Whether writes get a `wid` and are sent again (see `rankd.Client`).
        self.retry_writes = retry_writes
        #: How many times at most a write with a `wid` is sent again.
        self.write_retries = write_retries
        #: Seconds after a write's first send past which it is not sent again.
        self.retry_deadline = retry_deadline
        self._lock = threading.RLock()
        #: Signalled when a watch gets an event or ends, or the connection goes.
        self._cond = threading.Condition(self._lock)
        self._conn: Optional[_Connection] = None
        self._closed = False
        self._ids = _wire.Numbering(settings.max_frame)
        #: The active watches.
        self._watches: Set[Watch[Any]] = set()
        #: The thread reading pushes for the watches, if one is (it waits
        #: for the socket without the lock; `_poke` wakes it).
        self._pump_owner: Optional[int] = None
        self._wake_pair: Optional[Tuple[socket.socket, socket.socket]] = None
        self._last_write: contextvars.ContextVar[Optional[WriteInfo]] = contextvars.ContextVar(
            "rankd_last_write", default=None
        )
        #: How many times a broken connection was replaced by a new one.
        self.reconnects = 0
        with self._lock:
            self._conn = self._open()

    def _close(self) -> None:
        """`Client.close`."""
        with self._lock:
            self._closed = True
            for watch in list(self._watches):
                watch._end("the client is closed")
            self._drop()
            if self._pump_owner is None:
                self._close_wake()

    # -- connection ---------------------------------------------------------

    def _open(self, deadline: Optional[float] = None) -> _Connection:
        """A new connection, authenticated with the token if there is one;
        connected and authenticated by `deadline` (a `time.monotonic()`
        instant) if one is given."""
        settings = self._settings
        connect_timeout = _wire.within(settings.connect_timeout, deadline)
        try:
            conn = _Connection.open(settings, connect_timeout)
        except OSError as exc:  # (socket.timeout too)
            timed_out = isinstance(exc, socket.timeout)
            raise _unreachable(settings.address, connect_timeout, exc, timed_out=timed_out) from exc
        if self._token is not None:
            try:
                ids, payload = self._ids.frames([_requests.auth(self._token)])
                (outcome,) = conn.exchange(payload, ids, _wire.within(settings.timeout, deadline))
            except _Broken as broken:
                conn.close()
                where = f"{settings.address} during auth"
                raise _failure(broken, writes=False, where=where) from broken
            except BaseException:
                conn.close()
                raise
            if isinstance(outcome, RankdError):
                conn.close()
                raise outcome
        return conn

    def _drop(self) -> None:
        """Closes the connection (its watches will ask again on the next)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            for watch in conn.registry.all():
                watch._detach()
            conn.close()
            self._notify()

    def _live(self, deadline: Optional[float] = None) -> Tuple[_Connection, bool]:
        """The connection for the next request, and whether this call opened
        it: a connection that broke, or that the server closed while idle,
        is replaced by a new one (made by `deadline`, if given)."""
        if self._closed:
            raise RankdConnectionError("the client is closed")
        if self._conn is not None and not self._conn.dropped():
            return self._conn, False
        if self._conn is not None:
            self._drop()
        self._conn = self._open(deadline)
        self.reconnects += 1
        return self._conn, True

    def _exchange(self, conn: _Connection, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        ids, payload = self._ids.frames(requests)
        return conn.exchange(payload, ids, self._settings.timeout)

    # -- calls --------------------------------------------------------------

    def _run_on(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[Any], _Connection, int]:
        """The outcomes (results, `Dup`s or `RankdError`s) of `requests`,
        sent as one pipeline; the connection that answered them; how many
        times they were sent. What is answered is kept; the rest may go
        again (`_resend.Resends` decides): on a new connection when this one
        breaks, on the same one after `overloaded` or `internal`."""
        call = _resend.Resends(requests, self, f"{self._settings.address} during a call")
        with self._lock:
            # Encoded first: a value msgpack cannot carry, or a request over
            # `max_frame`, raises before anything is sent.
            ids, payload = self._ids.frames(requests)
            conn, _ = self._live()
            while True:
                call.sending()
                try:
                    results = conn.exchange(payload, ids, self._settings.timeout)
                except _Broken as broken:
                    self._drop()
                    wait = call.broke(broken)
                except ProtocolError as exc:  # (an OSError too: caught first)
                    self._drop()
                    call.protocol_broken(exc)
                    raise
                except BaseException:
                    # An interrupt may leave replies unread: the connection
                    # is out of step, start afresh.
                    self._drop()
                    raise
                else:
                    if conn.buffered():
                        self._poke()  # pushes read past the last reply
                    again = call.answered(results)
                    if again is None:
                        return call.outcomes, conn, call.sends
                    wait = again
                ids, payload = self._ids.frames(call.rest)
                conn = self._reconnect(call, wait)

    def _reconnect(self, call: _resend.Resends, wait: float) -> _Connection:
        """After waiting `wait` seconds, the connection to send `call`'s rest
        again on (the same one if it is still open);
        trying again while `call` allows. A new connection is made by the
        call's retry deadline."""
        while True:
            time.sleep(wait)
            try:
                conn, opened = self._live(call.deadline)
                call.check_reconnected(opened)
            except RankdConnectionError as exc:
                wait = call.connect_failed(exc)
                continue
            except RankdError as err:  # the token was refused
                call.refused(err)
                raise
            return conn

    def _run(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """The outcomes of `requests` (see `_run_on`), without `Dup` marks."""
        if not requests:
            return []
        outcomes, _, _ = self._run_on(_resend.prepare(requests, self))
        return [_wire.plain(o) for o in outcomes]

    def _call(self, req: Mapping[str, Any]) -> Any:
        (sent,) = _resend.prepare([req], self)
        (outcome,), _, sends = self._run_on([sent])
        return _resend.settle(sent, outcome, sends, self._last_write)

    # -- watches: the pushes' side ------------------------------------------

    def _notify(self) -> None:
        """Wakes the threads waiting for watch events (with the lock held)."""
        self._cond.notify_all()
        self._poke()

    def _poke(self) -> None:
        """Wakes the thread waiting on the socket for pushes, if one is."""
        if self._pump_owner is not None and self._wake_pair is not None:
            try:
                self._wake_pair[1].send(b"\0")
            except OSError:  # full: it has been woken already
                pass

    def _close_wake(self) -> None:
        pair, self._wake_pair = self._wake_pair, None
        if pair is not None:
            for sock in pair:
                sock.close()

    def _subscribe(self, watch: Watch[Any]) -> None:
        """Asks the server for `watch` (on the current connection, or a new
        one) and attaches it to the connection that answered."""
        (outcome,), conn, _ = self._run_on([watch._request])
        watch._attach(conn.registry, _requests.watch_result(outcome))

    def _next_event(self, watch: Watch[T], timeout: Optional[float]) -> T:
        """`Watch.get`: reads the socket for every watch while it waits."""
        waiting = Wait(timeout, time.monotonic())
        with self._lock:
            while True:
                if watch._ready(self._closed):
                    return watch._events.popleft()
                conn = self._conn
                if conn is None or watch._registry is not conn.registry:
                    # Its connection was lost: ask again on a new one.
                    waiting.resubscribe(self._settings.address)
                    try:
                        self._subscribe(watch)
                    except RankdError as err:
                        watch._end(f"asking again was refused: {err}")
                        raise
                    watch.resubscribes += 1
                    continue
                wait = waiting.left(time.monotonic())
                if self._pump_owner is not None:
                    # Another thread reads the socket; it signals what it reads.
                    self._cond.wait(wait)
                    continue
                self._pump_owner = threading.get_ident()
                try:
                    self._pump(conn, wait)
                finally:
                    self._pump_owner = None
                    self._cond.notify_all()
                    if self._closed:
                        self._close_wake()

    def _pump(self, conn: _Connection, wait: Optional[float]) -> None:
        """Dispatches the pushes that have arrived; if none had, waits (the
        lock released) until the socket is readable, another thread pokes,
        or `wait` seconds pass."""
        try:
            if conn.pump():
                return
        except ProtocolError:
            if self._conn is conn:
                self._drop()
            raise
        except OSError:  # closed or reset: its watches will ask again
            if self._conn is conn:
                self._drop()
            return
        if self._wake_pair is None:
            pair = socket.socketpair()
            for sock in pair:
                sock.setblocking(False)
            self._wake_pair = pair
        wake = self._wake_pair[0]
        try:
            while wake.recv(4096):
                pass
        except OSError:  # (BlockingIOError: drained)
            pass
        self._lock.release()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(conn.sock, selectors.EVENT_READ)
                selector.register(wake, selectors.EVENT_READ)
                selector.select(wait)
        except (OSError, ValueError):  # a socket closed meanwhile by another thread
            pass
        finally:
            self._lock.acquire()

    def _follow(self, watch: Watch[Any]) -> None:
        """Asks the server for a new `watch` and keeps it among the active."""
        with self._lock:
            self._subscribe(watch)
            self._watches.add(watch)

    def _unwatch(self, watch: Watch[Any]) -> bool:
        """`Client.unwatch`: the watch ends here whatever the server says."""
        with self._lock:
            registry, wid = watch._registry, watch.id
            watch._end("unwatched")
            conn = self._conn
            if registry is None or wid is None or conn is None or registry is not conn.registry:
                return False
            if conn.dropped():
                self._drop()
                return False
            registry.retire(wid)
            try:
                (outcome,) = self._exchange(conn, [_requests.unwatch(wid)])
            except _Broken:
                self._drop()  # the watch went with the connection
                return False
            except BaseException:
                self._drop()
                raise
            finally:
                registry.unretire(wid)
            if conn.buffered():
                self._poke()
            return bool(_requests.result(outcome))
