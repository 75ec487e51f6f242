"""What the tests share: the servers they are given (from the environment),
clients of both kinds behind one blocking face, and small helpers.

The environment (rankd's `cargo test --test python_client` sets it):

- `RANKD_ADDR`: host:port of a rankd for most tests (they use boards of
  their own, so the server may be shared and need not be fresh);
- `RANKD_TLS_CA`: the server speaks TLS with a certificate from this CA,
  for `localhost` (every address below then speaks TLS);
- `RANKD_WRITE_TOKEN`, `RANKD_READ_TOKEN`: the server holds these tokens
  with these roles;
- `RANKD_TLS_CLIENT_CERT`, `RANKD_TLS_CLIENT_KEY`: the servers require
  client certificates (mutual TLS), and this one is signed for them;
- `RANKD_CONFORMANCE_ADDR`: one or two comma-separated addresses of fresh
  servers without tokens, for the shared conformance steps (the first runs
  them with `Client`, the second with `AsyncClient`);
- `RANKD_SLOW_ADDR`: a server without tokens, started with
  `--idle-timeout-secs 1 --debug-commit-delay-ms 1000` (rankd's test
  build), for idle closes and timeouts.

A test that needs what is not set is skipped, naming the variable.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import pytest

import rankd

#: The name the test certificates carry.
TLS_NAME = "localhost"


@dataclass(frozen=True)
class Env:
    addr: Optional[str]
    tls_ca: Optional[str]
    write_token: Optional[str]
    read_token: Optional[str]
    client_cert: Optional[str]
    client_key: Optional[str]
    conformance_addrs: List[str]
    slow_addr: Optional[str]

    @staticmethod
    def load() -> Env:
        get = os.environ.get
        conformance = [a.strip() for a in get("RANKD_CONFORMANCE_ADDR", "").split(",") if a.strip()]
        return Env(
            addr=get("RANKD_ADDR") or None,
            tls_ca=get("RANKD_TLS_CA") or None,
            write_token=get("RANKD_WRITE_TOKEN") or None,
            read_token=get("RANKD_READ_TOKEN") or None,
            client_cert=get("RANKD_TLS_CLIENT_CERT") or None,
            client_key=get("RANKD_TLS_CLIENT_KEY") or None,
            conformance_addrs=conformance,
            slow_addr=get("RANKD_SLOW_ADDR") or None,
        )

    def tls_options(self) -> Dict[str, Any]:
        """The TLS arguments of a client for these servers (none in plaintext)."""
        if self.tls_ca is None:
            return {}
        options: Dict[str, Any] = {"ca_file": self.tls_ca, "server_hostname": TLS_NAME}
        if self.client_cert is not None:
            options.update(certfile=self.client_cert, keyfile=self.client_key)
        return options


ENV = Env.load()


def split_addr(addr: str) -> Dict[str, Any]:
    host, port = addr.rsplit(":", 1)
    return {"host": host, "port": int(port)}


def needs(what: Optional[object], variable: str) -> None:
    if not what:
        pytest.skip(f"needs {variable}")


# -- clients of both kinds --------------------------------------------------


class AsyncDriver:
    """Drives an `AsyncClient` from blocking test code: every method runs
    to completion on one event loop kept for the client's life, so the same
    test runs against both clients. (The loop runs only during calls: a
    test about what happens *between* calls is written with asyncio.)"""

    def __init__(self, client: rankd.AsyncClient) -> None:
        self.client = client
        self.loop = asyncio.new_event_loop()
        try:
            self.run(client.connect())
        except BaseException:
            self.loop.close()
            raise

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(attr(*args, **kwargs))

        return call

    def close(self) -> None:
        if not self.loop.is_closed():
            self.run(self.client.close())
            self.loop.close()

    def __enter__(self) -> AsyncDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


AnyClient = Union[rankd.Client, AsyncDriver]

KINDS = ["blocking", "async"]


def open_client(kind: str, **options: Any) -> AnyClient:
    """A connected client of `kind` ("blocking" or "async")."""
    if kind == "blocking":
        return rankd.Client(**options)
    return AsyncDriver(rankd.AsyncClient(**options))


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Polls `condition` until it holds; fails naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout} s for {what} in vain")
        time.sleep(0.02)


def wait_for_server_close(db: AnyClient, timeout: float = 10.0) -> None:
    """Waits until the client's connection has seen the server close it (a
    peek at the client's internals: the next call must then reconnect
    before it sends anything)."""
    if isinstance(db, rankd.Client):
        conn = db._conn
        assert conn is not None, "the client is connected"
        wait_until(conn.dropped, "the server to close the connection", timeout)
    else:
        aconn = db.client._conn
        assert aconn is not None, "the client is connected"

        def closed() -> bool:
            db.run(asyncio.sleep(0.01))  # lets the reader task run
            return aconn.failure is not None

        wait_until(closed, "the server to close the connection", timeout)


def write(db: AnyClient, method: str, *args: Any, **kwargs: Any) -> Tuple[Any, Optional[rankd.WriteInfo]]:
    """Calls the write `method` and returns its result with the client's
    `last_write` as the caller sees it (per thread for `Client`, per task
    for `AsyncClient`: so, for the latter, read in the task that wrote)."""
    if isinstance(db, AsyncDriver):
        client = db.client

        async def run() -> Tuple[Any, Optional[rankd.WriteInfo]]:
            result = await getattr(client, method)(*args, **kwargs)
            return result, client.last_write

        written: Tuple[Any, Optional[rankd.WriteInfo]] = db.run(run())
        return written
    return getattr(db, method)(*args, **kwargs), db.last_write


def next_event(db: AnyClient, watch: Any, timeout: Optional[float] = 10.0) -> Any:
    """`watch.get(timeout)`, for a watch of either kind of client (an
    `AsyncDriver`'s loop runs while it waits)."""
    if isinstance(db, AsyncDriver):
        return db.run(watch.get(timeout))
    return watch.get(timeout)


def events_until_quiet(db: AnyClient, watch: Any, quiet: float = 1.0, limit: float = 30.0) -> List[Any]:
    """The events of `watch` until none comes for `quiet` seconds."""
    deadline = time.monotonic() + limit
    events: List[Any] = []
    while time.monotonic() < deadline:
        try:
            events.append(next_event(db, watch, quiet))
        except TimeoutError as exc:
            if isinstance(exc, rankd.RankdConnectionError):
                raise
            return events
    pytest.fail(f"{watch!r} did not fall quiet within {limit} s")


def event_where(
    db: AnyClient, watch: Any, wanted: Callable[[Any], bool], what: str, timeout: float = 10.0
) -> Any:
    """Takes events of `watch` until one is `wanted`; fails naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    seen: List[Any] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"no event {what} within {timeout} s; got {seen!r:.500}")
        try:
            event = next_event(db, watch, left)
        except TimeoutError as exc:
            if isinstance(exc, rankd.RankdConnectionError):
                raise
            continue
        if wanted(event):
            return event
        seen.append(event)


class Proxy:
    """Relays TCP connections to `upstream` (host:port) byte for byte (so
    TLS too), and on cue stops handing one connection's replies to the
    client: a reply lost on the way, as after a network failure."""

    def __init__(self, upstream: str) -> None:
        self.upstream = split_addr(upstream)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.listener.getsockname()[1]}"
        #: Per accepted connection: set to withhold the server's bytes.
        self.holds: List[threading.Event] = []
        self._socks: List[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def hold_replies(self, connection: int) -> None:
        """From now on, the server's bytes on `connection` (0: the first
        accepted) are read and dropped."""
        self.holds[connection].set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection((self.upstream["host"], self.upstream["port"]))
            hold = threading.Event()
            with self._lock:
                self._socks += [client, server]
                self.holds.append(hold)
            threading.Thread(target=self._relay, args=(client, server, None), daemon=True).start()
            threading.Thread(target=self._relay, args=(server, client, hold), daemon=True).start()

    @staticmethod
    def _relay(source: socket.socket, sink: socket.socket, hold: Optional[threading.Event]) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if hold is None or not hold.is_set():
                    sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for sock in self._socks:
                sock.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
