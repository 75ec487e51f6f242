"""The asyncio client's connection: one stream, its frames and the calls
waiting on them (`rankd.AsyncClient` keeps one)."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any, Deque, Iterable, List, Optional, Sequence, Tuple

from . import _wire
from ._errors import RankdConnectionError, _Broken
from ._watch import Registry

_log = logging.getLogger("rankd")

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
        #: The watches living on this connection.
        self.registry = Registry()
        self._task = self._loop.create_task(self._read_replies())

    @classmethod
    async def open(cls, settings: _wire.Settings, connect_timeout: Optional[float]) -> _Connection:
        """A connection to the server, connected (and the TLS handshake
        done) within `connect_timeout` seconds."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                settings.host,
                settings.port,
                ssl=settings.ssl_context,
                server_hostname=settings.server_hostname,
            ),
            connect_timeout,
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
                if isinstance(outcome, _wire.Push):
                    self.registry.dispatch(outcome)
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
        for watch in self.registry.all():
            # Its waiters wake, and it asks again on a new connection.
            watch._detach()
            watch._wake()
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
