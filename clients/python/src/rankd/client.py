"""The blocking client: `rankd.Client`."""

from __future__ import annotations

import contextvars
import logging
import selectors
import socket
import ssl
import threading
import time
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
from ._connection import _Connection
from ._errors import (
    ProtocolError,
    RankdConnectionError,
    RankdError,
    RankdTimeout,
    WatchEnded,
    _Broken,
    _failure,
)
from ._sync_watch import Watch
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

__all__ = ["Client", "Watch"]

T = TypeVar("T")

_log = logging.getLogger("rankd")

#: How many times one `Watch.get` asks again for a watch whose connection
#: keeps being lost, before it raises.
_RESUBSCRIBES_PER_GET = 3


class Client:
    """A blocking connection to a rankd server.

    Connects (and runs `auth` with `token`) when created; raises
    `RankdConnectionError` if it cannot connect, `RankdError` if the token
    is refused. Calls take turns on one connection (a lock makes a client
    safe to share between threads); `pipeline` sends many requests before
    reading their replies; `watch` follows a board's top or a player's rank
    as the server pushes them; `AsyncClient` has the same methods for asyncio.

    Optional arguments left as None are not sent, so the server's defaults
    apply.

    Args:
        host, port: the server (default 127.0.0.1:7070).
        timeout: seconds to wait for each reply (default 30; None waits
            forever). A reply that does not come in time raises
            `RankdTimeout` and closes the connection.
        connect_timeout: seconds for the TCP connection and the TLS handshake
            (default: `timeout`).
        tls: speak TLS, trusting the system's root certificates; or an
            `ssl.SSLContext` to use as it is.
        ca_file: PEM file of the certificate authority to trust instead
            (implies TLS).
        server_hostname: the name the server's certificate must carry
            (default `host`).
        certfile, keyfile: a client certificate and its key, for a server
            requiring mutual TLS (implies TLS).
        token: `auth` with it right after connecting, and after every
            reconnection.
        retry_writes: give every `set`, `set_many` and `remove` without a
            `wid` a fresh one (a random UUID's 32 hex digits), and send a
            write carrying a `wid` again, with the same `wid`, after its reply
            timed out or its connection was lost: the server applies it at
            most once (protocol 1.1; a version-1 server ignores `wid`, so
            turn this off there). Default True.
        write_retries: how many times at most such a write is sent again
            (default 3), after waiting 0.1 s, then 0.2, 0.4, ... (at most
            2 s); each attempt waits up to `timeout` for its reply.
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
        #: Whether writes get a `wid` and are sent again (see the class doc).
        self.retry_writes = retry_writes
        #: How many times at most a write with a `wid` is sent again.
        self.write_retries = write_retries
        self._lock = threading.RLock()
        #: Signalled when a watch gets an event or ends, or the connection goes.
        self._cond = threading.Condition(self._lock)
        self._conn: Optional[_Connection] = None
        self._closed = False
        self._next_id = 1
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

    # -- connection ---------------------------------------------------------

    def close(self) -> None:
        """Closes the connection and ends every watch; later calls raise
        `RankdConnectionError`."""
        with self._lock:
            self._closed = True
            for watch in list(self._watches):
                watch._end("the client is closed")
            self._drop()
            if self._pump_owner is None:
                self._close_wake()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._conn is not None else "disconnected"
        tls = " tls" if self._settings.ssl_context is not None else ""
        return f"<rankd.Client {self._settings.address}{tls} {state}>"

    @property
    def last_write(self) -> Optional[WriteInfo]:
        """How the last write call answered by the server (`set`, `set_many`,
        `remove`, or `call` of one of them) made *by this thread* went: its
        `wid`, whether the server answered it as a duplicate (`dup`), and how
        many times it was sent. None before the first. (Per thread, so
        threads sharing the client each see their own.)"""
        return self._last_write.get()

    @property
    def last_dup(self) -> bool:
        """Whether this thread's last write was answered `"dup": true`: the
        server had already applied its (board, wid) and changed nothing."""
        info = self._last_write.get()
        return info is not None and info.dup

    def _open(self) -> _Connection:
        """A new connection, authenticated with the token if there is one."""
        settings = self._settings
        try:
            conn = _Connection.open(settings)
        except socket.timeout as exc:
            raise RankdTimeout(
                f"cannot connect to {settings.address} within {settings.connect_timeout} s"
            ) from exc
        except OSError as exc:
            raise RankdConnectionError(f"cannot connect to {settings.address}: {exc}") from exc
        if self._token is not None:
            try:
                (outcome,) = self._exchange(conn, [_wire.request("auth", token=self._token)])
            except _Broken as broken:
                conn.close()
                raise self._failure(broken, writes=False, during="auth") from broken
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

    def _live(self) -> Tuple[_Connection, bool]:
        """The connection for the next request, and whether this call opened
        it: a connection that broke, or that the server closed while idle,
        is replaced by a new one."""
        if self._closed:
            raise RankdConnectionError("the client is closed")
        if self._conn is not None and not self._conn.dropped():
            return self._conn, False
        if self._conn is not None:
            self._drop()
        self._conn = self._open()
        self.reconnects += 1
        return self._conn, True

    def _encode(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[int], bytes]:
        ids = list(range(self._next_id, self._next_id + len(requests)))
        payload = b"".join(_wire.encode(req, rid) for req, rid in zip(requests, ids))
        self._next_id += len(requests)
        return ids, payload

    def _exchange(self, conn: _Connection, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        ids, payload = self._encode(requests)
        return conn.exchange(payload, ids, self._settings.timeout)

    def _failure(self, broken: _Broken, *, writes: bool, during: str = "a call") -> RankdConnectionError:
        return _failure(broken, writes=writes, where=f"{self._settings.address} during {during}")

    def _prepare(self, requests: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
        """`requests` as sent: with `retry_writes`, writes get a `wid`."""
        return _wire.with_wids(requests) if self.retry_writes else list(requests)

    def _run_on(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[Any], _Connection, int]:
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
        with self._lock:
            # Encoded first: a value msgpack cannot carry raises before
            # anything is sent.
            ids, payload = self._encode(requests)
            done: List[Any] = []
            rest: Sequence[Mapping[str, Any]] = requests
            retries = 0
            sends = 1
            #: A write still unanswered was sent by an earlier attempt.
            sent_before = False
            conn, opened = self._live()
            while True:
                try:
                    results = conn.exchange(payload, ids, self._settings.timeout)
                except _Broken as broken:
                    self._drop()
                    done.extend(broken.results)
                    rest = rest[len(broken.results) :]
                    writes = not all(_wire.is_read(req) for req in rest)
                    guarded = (
                        self.retry_writes
                        and writes
                        and all(_wire.is_read(req) or _wire.is_guarded(req) for req in rest)
                    )
                    in_doubt = writes and (sent_before or broken.sent)
                    if guarded and retries < self.write_retries:
                        retries += 1
                    elif guarded or opened or broken.timed_out or in_doubt:
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
                    conn, opened, retries = self._reconnect_for_retry(
                        retries if guarded else 0, in_doubt, done, sends, single_wid
                    )
                    continue
                except ProtocolError as exc:  # (an OSError too: caught first)
                    self._drop()
                    exc.maybe_applied = not all(_wire.is_read(req) for req in rest)
                    exc.results = [_wire.plain(o) for o in done + exc.results]
                    raise
                except BaseException:
                    # An interrupt may leave replies unread: the connection
                    # is out of step, start afresh.
                    self._drop()
                    raise
                if conn.buffered():
                    self._poke()  # pushes read past the last reply
                return done + results, conn, sends

    def _reconnect_for_retry(
        self, retry: int, in_doubt: bool, done: List[Any], sends: int, wid: Optional[str]
    ) -> Tuple[_Connection, bool, int]:
        """A new connection to send a call's rest again on, whether it is
        new, and the re-sends used: `retry` > 0 for the `retry`-th re-send
        of a guarded write, which first waits, and tries to connect (each
        try a re-send) until the re-sends run out."""
        while True:
            if retry:
                time.sleep(_wire.retry_delay(retry))
            try:
                conn, opened = self._live()
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

    def _run(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """The outcomes of `requests` (see `_run_on`), without `Dup` marks."""
        if not requests:
            return []
        outcomes, _, _ = self._run_on(self._prepare(requests))
        return [_wire.plain(o) for o in outcomes]

    def _call(self, req: Mapping[str, Any]) -> Any:
        (sent,) = self._prepare([req])
        (outcome,), _, sends = self._run_on([sent])
        if sent.get("op") in _wire.WID_OPS:
            self._last_write.set(
                WriteInfo(wid=sent.get("wid"), dup=isinstance(outcome, _wire.Dup), sends=sends)
            )
        if isinstance(outcome, RankdError):
            raise outcome
        return _wire.plain(outcome)

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
        if isinstance(outcome, RankdError):
            raise outcome
        watch._attach(conn.registry, watch_id(_wire.plain(outcome)))

    def _next_event(self, watch: Watch[T], timeout: Optional[float]) -> T:
        deadline = None if timeout is None else time.monotonic() + timeout
        resubscribed = 0
        with self._lock:
            while True:
                if watch._events:
                    return watch._events.popleft()
                if watch._ended is not None:
                    raise WatchEnded(watch._ended)
                if self._closed:
                    watch._end("the client is closed")
                    continue
                conn = self._conn
                if conn is None or watch._registry is not conn.registry:
                    # Its connection was lost: ask again on a new one.
                    if resubscribed == _RESUBSCRIBES_PER_GET:
                        raise RankdConnectionError(
                            f"{self._settings.address}: the connection of a watch was lost "
                            f"{resubscribed} times in one wait"
                        )
                    resubscribed += 1
                    try:
                        self._subscribe(watch)
                    except RankdError as err:
                        watch._end(f"asking again was refused: {err}")
                        raise
                    watch.resubscribes += 1
                    continue
                wait = None if deadline is None else deadline - time.monotonic()
                if wait is not None and wait <= 0:
                    raise TimeoutError(f"no event within {timeout} s")
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

    # -- generic requests ---------------------------------------------------

    def call(self, op: str, **fields: Any) -> Any:
        """Runs `op` with `fields` and returns its result; raises `RankdError`
        if the server answers an error. Fields that are None are not sent.
        For ops (and fields) that have no method. (A `set`, `set_many` or
        `remove` gets a `wid` with `retry_writes`, as from its method.)"""
        return self._call(_wire.request(op, **fields))

    def pipeline(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Sends every request (maps like `{"op": "get", "board": "b",
        "player": "p"}`, without `id`) before reading the replies, and
        returns their outcomes in order: each the result, or the `RankdError`
        the server answered (returned, not raised, so one failed request
        does not hide the others' results). The requests are sent as they
        are, except that with `retry_writes` each `set`, `set_many` and
        `remove` without a `wid` gets one (in a copy)."""
        return self._run(list(requests))

    # -- operations ---------------------------------------------------------

    def ping(self) -> str:
        """`"pong"`."""
        return cast(str, self._call(_wire.request("ping")))

    def auth(self, token: str) -> Auth:
        """Authenticates this connection; the client re-authenticates with
        `token` after every reconnection. `True`, or `{"role": "read"|"write"}`
        on a server with token roles; `RankdError("unauthorized")` if refused
        (the third refusal on one connection closes it)."""
        # Stored first: should this call have to reconnect, the new
        # connection presents this token, not one it replaces (perhaps
        # revoked meanwhile). Put back if refused.
        previous, self._token = self._token, token
        try:
            return cast(Auth, self._call(_wire.request("auth", token=token)))
        except BaseException:
            self._token = previous
            raise

    def create_board(
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
        return cast(
            bool,
            self._call(
                _wire.request(
                    "create_board",
                    board=board,
                    order=order,
                    ties=ties,
                    windows=windows_list,
                    keep=keep,
                    fields=fields_list,
                )
            ),
        )

    def drop_board(self, board: str) -> bool:
        """True if the board existed. Its watches get a last push of None
        and end."""
        return cast(bool, self._call(_wire.request("drop_board", board=board)))

    def boards(
        self, prefix: Optional[str] = None, *, after: Optional[str] = None, limit: Optional[int] = None
    ) -> List[Board]:
        """One page of boards with their configs and counts, in byte order
        of their names: those whose name starts with `prefix`, after the
        board named `after`, at most `limit` (1 to 10 000; the server's
        default, 1000). Ask again with `after` set to the last name until a
        page comes back shorter than `limit`, or call `all_boards`."""
        return cast(
            List[Board], self._call(_wire.request("boards", prefix=prefix, after=after, limit=limit))
        )

    def all_boards(self, prefix: Optional[str] = None, *, page: int = 1000) -> List[Board]:
        """Every board whose name starts with `prefix`, asked for `page` at a
        time (a server may hold millions: see `boards`)."""
        found: List[Board] = []
        after: Optional[str] = None
        while True:
            got = self.boards(prefix, after=after, limit=page)
            found.extend(got)
            if len(got) < page:
                return found
            after = got[-1]["board"]

    @overload
    def set(
        self, board: str, player: str, score: int, *, mode: Optional[Mode] = None, wid: Optional[str] = None
    ) -> int: ...

    @overload
    def set(
        self,
        board: str,
        player: str,
        score: Mapping[str, int],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> Scores: ...

    def set(
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
        return cast(Score, self._call(req))

    def set_many(
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
        return cast(List[int], self._call(req))

    def remove(self, board: str, player: str, *, wid: Optional[str] = None) -> bool:
        """True if the player was on the board. `wid` as for `set`."""
        return cast(bool, self._call(_wire.request("remove", board=board, player=player, wid=wid)))

    # -- watches ------------------------------------------------------------

    @overload
    def watch(
        self,
        board: str,
        *,
        top: int,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[TopEvent], object]] = None,
    ) -> Watch[TopEvent]: ...

    @overload
    def watch(
        self,
        board: str,
        *,
        player: str,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[PlayerEvent], object]] = None,
    ) -> Watch[PlayerEvent]: ...

    def watch(
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
    ) -> Watch[Any]:
        """Follows a board's best `top` (1-100) entries, or one `player`'s
        rank: the server pushes the current value at once, then each new one
        when it changes (at most once per `interval_ms`, 10-60000, default
        100). Returns a `Watch`: iterate it (`for event in w`), or take
        events with `w.get(timeout)`; or give `callback`, which a thread of
        the watch's own calls with each event.

        A `top` event is the list `top` would answer; a `player` event what
        `rank` would answer, or None while the player is absent. When the
        board is dropped, a `top` watch gets None and ends.

        `buffer`: how many unread events the watch keeps; when full, the
        oldest goes (each event is a whole state, so the newest is what
        matters). A connection holds at most 64 watches (then
        `RankdError("too_large")`). If the connection is lost, the watch
        asks again on a new one when next waited on; its first event there
        is the current state."""
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
        watch: Watch[Any] = Watch(self, req, buffer)
        with self._lock:
            self._subscribe(watch)
            self._watches.add(watch)
        if callback is not None:
            watch._start(callback)
        return watch

    def unwatch(self, watch: Watch[Any]) -> bool:
        """Ends `watch`: True if the server had it active. Events it received
        before can still be taken. (A watch whose connection was lost, or
        whose board was dropped, is ended without asking: False.)"""
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
                (outcome,) = self._exchange(conn, [_wire.request("unwatch", watch=wid)])
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
            if isinstance(outcome, RankdError):
                raise outcome
            return bool(_wire.plain(outcome))

    def get(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[int]:
        """The player's score (a dict on a board with fields), or None."""
        req = _wire.request("get", board=board, player=player, window=window, period=period)
        return cast(Optional[int], self._call(req))

    def count(self, board: str, *, window: Optional[Window] = None, period: Optional[int] = None) -> int:
        """The number of players."""
        return cast(int, self._call(_wire.request("count", board=board, window=window, period=period)))

    @overload
    def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[False] = ...,
    ) -> Optional[Rank]: ...

    @overload
    def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[True],
    ) -> Optional[ApproxRank]: ...

    def rank(
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
        return cast(Union[Optional[Rank], Optional[ApproxRank]], self._call(req))

    @overload
    def rank_of_score(
        self,
        board: str,
        score: int,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[False] = ...,
    ) -> int: ...

    @overload
    def rank_of_score(
        self,
        board: str,
        score: int,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[True],
    ) -> ApproxRankOfScore: ...

    def rank_of_score(
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
        return cast(Union[int, ApproxRankOfScore], self._call(req))

    def top(
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
        return cast(List[Entry], self._call(req))

    def around(
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
        return cast(List[Entry], self._call(req))

    def ranks(
        self,
        board: str,
        players: Sequence[str],
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """Where `players` (1 to 1000 names) stand: those with a score, each
        once, best first, with their board-wide ranks: a friends leaderboard
        in one call (protocol 1.1)."""
        req = _wire.request("ranks", board=board, players=list(players), window=window, period=period)
        return cast(List[Entry], self._call(req))
