"""The blocking client's connection: one socket, its frames, and a
selector to wait on it with a deadline (`rankd.Client` keeps one)."""

from __future__ import annotations

import selectors
import socket
import ssl
import time
from typing import Any, List, Optional, Sequence

from . import _wire
from ._errors import ProtocolError, _Broken
from ._watch import Registry

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
        #: The watches living on this connection.
        self.registry = Registry()

    @classmethod
    def open(cls, settings: _wire.Settings, connect_timeout: Optional[float]) -> _Connection:
        """A connection to the server, connected (and the TLS handshake
        done) within `connect_timeout` seconds each."""
        sock = socket.create_connection((settings.host, settings.port), timeout=connect_timeout)
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
                    if isinstance(outcome, _wire.Push):
                        self.registry.dispatch(outcome)
                    else:
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

    def buffered(self) -> bool:
        """Whether bytes were read that no exchange or pump has parsed yet."""
        return bool(self.frames)

    def pump(self) -> int:
        """Reads what has arrived, without waiting, and dispatches the pushes
        in it; returns how many. Between exchanges, the server sends nothing
        but pushes. Raises `OSError` (or `ProtocolError`) once the connection
        is closed or broken, after dispatching what came before."""
        closed: Optional[BaseException] = None
        try:
            for _ in range(64):  # (a server that never stops sending cannot hold the caller here)
                if not (self._ssl_pending() or self.selector.select(0)):
                    break
                before = len(self.frames)
                self._receive()
                if len(self.frames) == before:
                    break  # (only TLS bookkeeping was readable)
        except OSError as exc:
            closed = exc
        pushes = 0
        while True:
            body = self.frames.pop()
            if body is None:
                break
            outcome = _wire.parse_reply(body, None)  # a reply here breaks the protocol
            if isinstance(outcome, _wire.Push):
                self.registry.dispatch(outcome)
            pushes += 1
        if closed is not None:
            raise closed
        return pushes

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
