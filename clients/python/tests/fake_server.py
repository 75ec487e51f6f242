"""A scripted stand-in for rankd, for what a real server will not do on
cue: stay silent, close mid-request, answer with the wrong id, push watch
events between replies.

Each accepted connection runs the next script, a function given a
`FakeConnection`; the server records every request it reads.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import msgpack

_HEADER = struct.Struct(">I")


class FakeConnection:
    def __init__(self, server: FakeServer, sock: socket.socket, index: int) -> None:
        self.server = server
        self.sock = sock
        #: Which connection this is (0 for the first accepted).
        self.index = index
        # (The script's thread and the test's may both send: whole frames.)
        self._send_lock = threading.Lock()

    def read(self) -> Optional[Dict[str, Any]]:
        """The next request, or None once the client has closed."""
        header = self._read_exactly(_HEADER.size)
        if header is None:
            return None
        (length,) = _HEADER.unpack(header)
        body = self._read_exactly(length)
        if body is None:
            return None
        request: Dict[str, Any] = msgpack.unpackb(body, raw=False)
        with self.server.lock:
            self.server.requests.append((self.index, request))
            self.server.times.append(time.monotonic())
        return request

    def _read_exactly(self, n: int) -> Optional[bytes]:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def send(self, message: Any) -> None:
        body = msgpack.packb(message, use_bin_type=True)
        with self._send_lock:
            self.sock.sendall(_HEADER.pack(len(body)) + body)

    def push(self, watch: int, event: Any) -> None:
        """A watch's push: `{"watch": id, "event": event}`, without `id`."""
        self.send({"watch": watch, "event": event})

    def ok(self, request: Dict[str, Any], result: Any) -> None:
        self.send({"id": request["id"], "ok": result})

    def err(self, request: Dict[str, Any], code: str, msg: str = "refused") -> None:
        self.send({"id": request["id"], "err": {"code": code, "msg": msg}})

    def close(self) -> None:
        self.sock.close()


def answer(conn: FakeConnection, request: Dict[str, Any]) -> None:
    """What rankd would answer on an empty server without tokens, roughly."""
    op = request.get("op")
    result: Any = {
        "ping": "pong",
        "auth": True,
        "set": request.get("score"),
        "get": None,
        "count": 0,
        "top": [],
        "echo": request.get("text"),  # (no rankd op: a reply as big as the request)
    }.get(str(op))
    conn.ok(request, result)


def serve(conn: FakeConnection) -> None:
    """Answers every request until the client closes."""
    while True:
        request = conn.read()
        if request is None:
            return
        answer(conn, request)


def serve_then_close(replies: int) -> Callable[[FakeConnection], None]:
    """Reads requests, answers the first `replies`, and closes on reading
    the next one (which is never answered)."""

    def script(conn: FakeConnection) -> None:
        for _ in range(replies):
            request = conn.read()
            if request is None:
                return
            answer(conn, request)
        conn.read()
        conn.close()

    return script


def erring(*codes: str) -> Callable[[FakeConnection], None]:
    """Answers the first requests with the errors `codes`, one each in
    turn, then every request as `answer` does."""

    def script(conn: FakeConnection) -> None:
        for code in codes:
            request = conn.read()
            if request is None:
                return
            conn.err(request, code, f"scripted {code}")
        serve(conn)

    return script


def always(code: str) -> Callable[[FakeConnection], None]:
    """Answers every request with the error `code`."""

    def script(conn: FakeConnection) -> None:
        while (request := conn.read()) is not None:
            conn.err(request, code, f"scripted {code}")

    return script


def close_at_once(conn: FakeConnection) -> None:
    conn.close()
    conn.server.closed.set()


def silent(conn: FakeConnection) -> None:
    """Reads every request and answers none, until the test ends."""
    while conn.read() is not None:
        pass


class FakeServer:
    """Listens on 127.0.0.1; the n-th connection runs `scripts[n]`."""

    def __init__(self, *scripts: Callable[[FakeConnection], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.scripts = list(scripts)
        #: (connection index, request) for every request read.
        self.requests: List[Any] = []
        #: When each of `requests` was read (`time.monotonic()`).
        self.times: List[float] = []
        self.lock = threading.Lock()
        #: Set by `close_at_once`.
        self.closed = threading.Event()
        #: How many connections were accepted.
        self.accepted = 0
        #: The accepted connections, in order.
        self.connections: List[FakeConnection] = []
        self._socks: List[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def address(self) -> Dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.port}

    def _accept(self) -> None:
        for index, script in enumerate(self.scripts):
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self._socks.append(sock)
            with self.lock:
                self.accepted += 1
            conn = FakeConnection(self, sock, index)
            with self.lock:
                self.connections.append(conn)
            threading.Thread(target=script, args=(conn,), daemon=True).start()

    def sent(self, op: str, connection: Optional[int] = None) -> List[Dict[str, Any]]:
        """The requests of `op` read, on every connection or on one."""
        with self.lock:
            return [
                r for i, r in self.requests if r.get("op") == op and (connection is None or i == connection)
            ]

    def times_of(self, op: str) -> List[float]:
        """When each request of `op` was read (`time.monotonic()`)."""
        with self.lock:
            return [t for (_, r), t in zip(self.requests, self.times) if r.get("op") == op]

    def ops(self, connection: Optional[int] = None) -> List[str]:
        """The ops read, on every connection or on one."""
        with self.lock:
            return [r.get("op") for i, r in self.requests if connection is None or i == connection]

    def stop(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux)
        except OSError:
            pass
        self.listener.close()
        for sock in self._socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
