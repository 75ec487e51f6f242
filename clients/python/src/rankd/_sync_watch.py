"""`rankd.Watch`: the events of one watch of a blocking `rankd.Client`."""

from __future__ import annotations

import logging
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Type, TypeVar

from ._errors import RankdConnectionError, RankdError, WatchEnded
from ._watch import WatchState

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Watch"]

T = TypeVar("T")

_log = logging.getLogger("rankd")


class Watch(WatchState[T]):
    """A watch of a `Client` (see `Client.watch`): the events the server
    pushes, taken in order.

    `for event in watch:` waits for each event and ends when the watch ends;
    `watch.events(timeout)` also ends after `timeout` seconds without one;
    `watch.get(timeout)` takes one, raising `TimeoutError` when none comes in
    time and `WatchEnded` once the watch has ended and every event it
    received was taken. A watch ends by `close()` (or `Client.unwatch`), by
    closing its client, or, for a `top` watch, when its board is dropped (its
    last event is then None). The thread waiting reads the connection for
    every watch of the client (others' events are kept for them), and other
    threads may call the client meanwhile.
    """

    def __init__(self, client: Client, request: Mapping[str, Any], buffer: int) -> None:
        super().__init__(request, buffer)
        self._client = client
        self._thread: Optional[threading.Thread] = None
        self._stopped = threading.Event()

    def get(self, timeout: Optional[float] = None) -> T:
        """The next event, waiting up to `timeout` seconds (None: forever)."""
        if self._thread is not None and threading.current_thread() is not self._thread:
            raise RuntimeError("this watch's events go to its callback")
        return self._client._next_event(self, timeout)

    def events(self, timeout: Optional[float] = None) -> Iterator[T]:
        """Yields the events until the watch ends, or until none comes
        within `timeout` seconds (None: waits forever); the watch stays
        active after a timeout."""
        while True:
            try:
                event = self.get(timeout)
            except WatchEnded:
                return
            except RankdConnectionError:
                raise
            except TimeoutError:
                return
            yield event

    def __iter__(self) -> Iterator[T]:
        return self.events()

    def close(self) -> None:
        """Ends the watch (`Client.unwatch`); a lost connection is no error."""
        try:
            self._client.unwatch(self)
        except RankdConnectionError:
            pass

    def __enter__(self) -> Watch[T]:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<rankd.Watch {self._describe()}>"

    def _wake(self) -> None:
        self._client._notify()

    def _end(self, reason: str) -> None:
        super()._end(reason)
        self._client._watches.discard(self)
        self._stopped.set()

    def _start(self, callback: Callable[[T], object]) -> None:
        self._thread = threading.Thread(
            target=self._feed, args=(callback,), name=f"rankd-watch-{self.board}", daemon=True
        )
        self._thread.start()

    def _feed(self, callback: Callable[[T], object]) -> None:
        """The callback thread: calls `callback` with each event until the
        watch ends; a lost connection is tried again every second."""
        while True:
            try:
                for event in self.events():
                    try:
                        callback(event)
                    except Exception:
                        _log.exception("a callback of %r raised", self)
                return
            except RankdError:
                _log.exception("%r ended", self)
                return
            except RankdConnectionError as exc:
                _log.warning("%r: %s; trying again in 1 s", self, exc)
                if self._stopped.wait(1.0):
                    return
