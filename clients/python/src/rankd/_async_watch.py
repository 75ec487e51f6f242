"""`rankd.AsyncWatch`: the events of one watch of a `rankd.AsyncClient`."""

from __future__ import annotations

import asyncio
import inspect
import logging
from types import TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Callable,
    List,
    Mapping,
    Optional,
    Type,
    TypeVar,
)

from ._errors import RankdConnectionError, RankdError, WatchEnded
from ._watch import WatchState

if TYPE_CHECKING:
    from .aio import AsyncClient

__all__ = ["AsyncWatch"]

T = TypeVar("T")

_log = logging.getLogger("rankd")


class AsyncWatch(WatchState[T]):
    """A watch of an `AsyncClient` (see `AsyncClient.watch`): the events the
    server pushes, taken in order.

    `async for event in watch:` awaits each event and ends when the watch
    ends; `watch.events(timeout)` also ends after `timeout` seconds without
    one; `await watch.get(timeout)` takes one, raising `TimeoutError` when
    none comes in time and `WatchEnded` once the watch has ended and every
    event it received was taken. A watch ends by `await close()` (or
    `AsyncClient.unwatch`), by closing its client, or, for a `top` watch,
    when its board is dropped (its last event is then None).
    """

    def __init__(self, client: AsyncClient, request: Mapping[str, Any], buffer: int) -> None:
        super().__init__(request, buffer)
        self._client = client
        self._waiters: List[asyncio.Future[None]] = []
        #: Set while a waiter asks the server again for this watch.
        self._asking: Optional[asyncio.Future[None]] = None
        self._task: Optional[asyncio.Task[None]] = None

    async def get(self, timeout: Optional[float] = None) -> T:
        """The next event, waiting up to `timeout` seconds (None: forever)."""
        if self._task is not None and asyncio.current_task() is not self._task:
            raise RuntimeError("this watch's events go to its callback")
        return await self._client._next_event(self, timeout)

    async def events(self, timeout: Optional[float] = None) -> AsyncIterator[T]:
        """Yields the events until the watch ends, or until none comes
        within `timeout` seconds (None: waits forever); the watch stays
        active after a timeout."""
        while True:
            try:
                event = await self.get(timeout)
            except WatchEnded:
                return
            except RankdConnectionError:
                raise
            except TimeoutError:
                return
            yield event

    def __aiter__(self) -> AsyncIterator[T]:
        return self.events()

    async def close(self) -> None:
        """Ends the watch (`AsyncClient.unwatch`); a lost connection is no error."""
        try:
            await self._client.unwatch(self)
        except RankdConnectionError:
            pass

    async def __aenter__(self) -> AsyncWatch[T]:
        return self

    async def __aexit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<rankd.AsyncWatch {self._describe()}>"

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _end(self, reason: str) -> None:
        super()._end(reason)
        self._client._watches.discard(self)

    def _start(self, callback: Callable[[T], object]) -> None:
        self._task = asyncio.get_running_loop().create_task(self._feed(callback))

    async def _feed(self, callback: Callable[[T], object]) -> None:
        """The callback task: calls `callback` with each event (awaiting
        what it returns, if awaitable) until the watch ends; a lost
        connection is tried again every second."""
        while True:
            try:
                async for event in self.events():
                    try:
                        result = callback(event)
                        if inspect.isawaitable(result):
                            await result
                    except Exception:
                        _log.exception("a callback of %r raised", self)
                return
            except RankdError:
                _log.exception("%r ended", self)
                return
            except RankdConnectionError as exc:
                _log.warning("%r: %s; trying again in 1 s", self, exc)
                for _ in range(10):
                    await asyncio.sleep(0.1)
                    if self._ended is not None:
                        return
