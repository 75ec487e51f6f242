"""The blocking client: `rankd.Client`."""

from __future__ import annotations

import selectors
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple, Type, Union, cast

from . import _wire
from ._errors import ProtocolError, RankdConnectionError, RankdError, RankdTimeout, _Broken, _failure
from .types import Auth, Board, Entry, Mode, Order, Rank, Ties, Window

__all__ = ["Client"]

#: How much is read, and at most handed to the socket, at once.
_CHUNK = 256 * 1024


class _Connection:
    """One socket, non-blocking, driven by a selector: a call sends its
    requests while it reads replies, so a long pipeline never deadlocks on
    full socket buffers (the server stops reading when its replies are not
    read), on one thread, over TLS as well as plaintext."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self.frames = _wire.FrameBuffer()
        self.selector = selectors.DefaultSelector()
        self.selector.register(sock, selectors.EVENT_READ)

    @classmethod
    def open(cls, settings: _wire.Settings) -> _Connection:
        sock = socket.create_connection((settings.host, settings.port), timeout=settings.connect_timeout)
        try:
            # Requests are small and latency-bound: no Nagle delay.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if settings.ssl_context is not None:
                # The handshake runs here, under the connect timeout.
                sock = settings.ssl_context.wrap_socket(sock, server_hostname=settings.server_hostname)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def close(self) -> None:
        self.selector.close()
        self.sock.close()

    def dropped(self) -> bool:
        """Whether the server has closed this (idle) connection: then a
        request must go on a new one. Bytes the server sent unasked are kept
        for the next exchange."""
        try:
            if not self.selector.select(0) and not self._ssl_pending():
                return False
            data = self.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return False  # e.g. only TLS session tickets were readable
        except OSError:
            return True
        if not data:
            return True
        self.frames.feed(data)
        return False

    def _ssl_pending(self) -> int:
        # Decrypted bytes OpenSSL holds are invisible to the selector.
        return self.sock.pending() if isinstance(self.sock, ssl.SSLSocket) else 0

    def exchange(self, payload: bytes, ids: Sequence[int], timeout: Optional[float]) -> List[Any]:
        """Sends `payload` (the frames of requests `ids`) while reading their
        replies; returns the outcomes in order. Raises `_Broken` if the
        connection fails or a reply takes longer than `timeout`,
        `ProtocolError` if the server breaks the protocol."""
        results: List[Any] = []
        out = memoryview(payload)
        sent = 0
        events = selectors.EVENT_READ
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            # A request usually fits the socket's buffer at once: no need to
            # wait until it is writable.
            sent = self._send(out[:_CHUNK])
            while True:
                while len(results) < len(ids):
                    body = self.frames.pop()
                    if body is None:
                        break
                    outcome = _wire.parse_reply(body, ids[len(results)])
                    if outcome is not _wire.PUSH:
                        results.append(outcome)
                        deadline = None if timeout is None else time.monotonic() + timeout
                if len(results) == len(ids):
                    return results
                want = selectors.EVENT_READ | (selectors.EVENT_WRITE if sent < len(out) else 0)
                if want != events:
                    self.selector.modify(self.sock, want)
                    events = want
                if self._ssl_pending():
                    ready = selectors.EVENT_READ
                else:
                    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                    ready = 0
                    for _key, mask in self.selector.select(wait):
                        ready |= mask
                    if not ready and deadline is not None and time.monotonic() >= deadline:
                        raise _Broken(
                            f"no reply within {timeout} s", sent=sent > 0, results=results, timed_out=True
                        )
                if ready & selectors.EVENT_WRITE:
                    sent += self._send(out[sent : sent + _CHUNK])
                if ready & selectors.EVENT_READ:
                    self._receive()
        except ProtocolError as exc:  # (an OSError too: caught first)
            exc.results = results
            raise
        except OSError as exc:  # reset, broken pipe, TLS failure
            raise _Broken(f"connection failed: {exc}", sent=sent > 0, results=results) from exc
        finally:
            if events != selectors.EVENT_READ:
                try:
                    self.selector.modify(self.sock, selectors.EVENT_READ)
                except (OSError, ValueError, KeyError):
                    pass

    def _send(self, chunk: memoryview) -> int:
        try:
            return self.sock.send(chunk)
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return 0

    def _receive(self) -> None:
        try:
            data = self.sock.recv(_CHUNK)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        if not data:
            raise ConnectionResetError("connection closed by the server")
        self.frames.feed(data)
        while self._ssl_pending():
            self.frames.feed(self.sock.recv(self._ssl_pending()))


class Client:
    """A blocking connection to a rankd server.

    Connects (and runs `auth` with `token`) when created; raises
    `RankdConnectionError` if it cannot connect, `RankdError` if the token
    is refused. Calls take turns on one connection (a lock makes a client
    safe to share between threads); `pipeline` sends many requests before
    reading their replies; `AsyncClient` has the same methods for asyncio.

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
        self._lock = threading.RLock()
        self._conn: Optional[_Connection] = None
        self._closed = False
        self._next_id = 1
        #: How many times a broken connection was replaced by a new one.
        self.reconnects = 0
        with self._lock:
            self._conn = self._open()

    # -- connection ---------------------------------------------------------

    def close(self) -> None:
        """Closes the connection; later calls raise `RankdConnectionError`."""
        with self._lock:
            self._closed = True
            self._drop()

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
        if self._conn is not None:
            self._conn.close()
            self._conn = None

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

    def _run(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """The outcomes (results or `RankdError`s) of `requests`, sent as one
        pipeline. A connection that broke is replaced, once per call: before
        sending, or after a failure that lost only reads (or requests that
        never left), which are then sent again."""
        if not requests:
            return []
        writes = not all(_wire.is_read(req) for req in requests)
        with self._lock:
            # Encoded first: a value msgpack cannot carry raises before
            # anything is sent. (Ids are per connection: a retry reuses them.)
            ids, payload = self._encode(requests)
            conn, opened = self._live()
            while True:
                try:
                    return conn.exchange(payload, ids, self._settings.timeout)
                except _Broken as broken:
                    self._drop()
                    retry = not opened and not broken.timed_out and (not writes or not broken.sent)
                    if not retry:
                        raise self._failure(broken, writes=writes) from broken
                except ProtocolError as exc:
                    self._drop()
                    exc.maybe_applied = writes
                    raise
                except BaseException:
                    # An interrupt may leave replies unread: the connection
                    # is out of step, start afresh.
                    self._drop()
                    raise
                conn, opened = self._live()

    def _call(self, req: Mapping[str, Any]) -> Any:
        (outcome,) = self._run([req])
        if isinstance(outcome, RankdError):
            raise outcome
        return outcome

    # -- generic requests ---------------------------------------------------

    def call(self, op: str, **fields: Any) -> Any:
        """Runs `op` with `fields` and returns its result; raises `RankdError`
        if the server answers an error. Fields that are None are not sent.
        For ops (and fields) that have no method."""
        return self._call(_wire.request(op, **fields))

    def pipeline(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Sends every request (maps like `{"op": "get", "board": "b",
        "player": "p"}`, without `id`, sent as they are) before reading the
        replies, and returns their outcomes in order: each the result, or
        the `RankdError` the server answered (returned, not raised, so one
        failed request does not hide the others' results)."""
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
        result = cast(Auth, self._call(_wire.request("auth", token=token)))
        self._token = token
        return result

    def create_board(
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
        return cast(
            bool,
            self._call(
                _wire.request(
                    "create_board", board=board, order=order, ties=ties, windows=windows_list, keep=keep
                )
            ),
        )

    def drop_board(self, board: str) -> bool:
        """True if the board existed."""
        return cast(bool, self._call(_wire.request("drop_board", board=board)))

    def boards(self) -> List[Board]:
        """Every board with its config and count."""
        return cast(List[Board], self._call(_wire.request("boards")))

    def set(self, board: str, player: str, score: int, *, mode: Optional[Mode] = None) -> int:
        """Writes a score; returns the score stored (in the board's first window)."""
        return cast(int, self._call(_wire.request("set", board=board, player=player, score=score, mode=mode)))

    def set_many(
        self,
        board: str,
        entries: Union[Mapping[str, int], Iterable[Tuple[str, int]]],
        *,
        mode: Optional[Mode] = None,
    ) -> List[int]:
        """Writes up to 10 000 `(player, score)` pairs (or a dict) in one
        request; returns the stored scores in entry order."""
        req = _wire.request("set_many", board=board, entries=_wire.entries(entries), mode=mode)
        return cast(List[int], self._call(req))

    def get(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[int]:
        """The player's score, or None."""
        req = _wire.request("get", board=board, player=player, window=window, period=period)
        return cast(Optional[int], self._call(req))

    def remove(self, board: str, player: str) -> bool:
        """True if the player was on the board."""
        return cast(bool, self._call(_wire.request("remove", board=board, player=player)))

    def count(self, board: str, *, window: Optional[Window] = None, period: Optional[int] = None) -> int:
        """The number of players."""
        return cast(int, self._call(_wire.request("count", board=board, window=window, period=period)))

    def rank(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[Rank]:
        """`{"rank", "score", "count"}`, or None if the player is absent."""
        req = _wire.request("rank", board=board, player=player, window=window, period=period)
        return cast(Optional[Rank], self._call(req))

    def rank_of_score(
        self, board: str, score: int, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> int:
        """The rank a new player with `score` would get."""
        req = _wire.request("rank_of_score", board=board, score=score, window=window, period=period)
        return cast(int, self._call(req))

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
