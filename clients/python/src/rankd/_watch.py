"""What the watches of both clients share: a connection's table of watches
(pushes are dispatched by the id the server gave), a watch's state (what it
asked for, its unread events, whether it has ended), and the bookkeeping of
one wait for its next event.

A push is `{"watch": id, "event": value}`, with no `id` key; ids are unique
per connection, so the table belongs to the connection: a new connection
starts with none, and a watch whose connection is gone asks again on the
next one (its first push there is the current state).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any, Deque, Dict, Generic, List, Mapping, Optional, Set, TypeVar

from ._errors import ProtocolError, RankdConnectionError, WatchEnded
from ._wire import Push

T = TypeVar("T")

#: Pushes for ids no watch holds (yet) are kept, this many per id (the
#: newest), for at most `ORPHAN_IDS` ids: a push may be read after the
#: `watch` reply and before the caller has its `Watch`.
ORPHAN_EVENTS = 16
ORPHAN_IDS = 64

#: How many times one wait for a watch's event asks again for the watch,
#: whose connection keeps being lost, before it raises.
RESUBSCRIBES_PER_GET = 3


class Registry:
    """One connection's watches, by the id the server gave them."""

    def __init__(self) -> None:
        self.watches: Dict[int, WatchState[Any]] = {}
        #: Pushes for ids not (yet) attached.
        self._orphans: OrderedDict[int, Deque[Any]] = OrderedDict()
        #: Ids being unwatched: their last pushes are dropped.
        self._retired: Set[int] = set()

    def dispatch(self, push: Push) -> None:
        watch = self.watches.get(push.watch)
        if watch is not None:
            watch._deliver(push.event)
        elif push.watch not in self._retired:
            events = self._orphans.get(push.watch)
            if events is None:
                events = self._orphans[push.watch] = deque(maxlen=ORPHAN_EVENTS)
                while len(self._orphans) > ORPHAN_IDS:
                    self._orphans.popitem(last=False)
            events.append(push.event)

    def attach(self, watch_id: int, watch: WatchState[Any]) -> None:
        """Gives `watch` the id the server answered, with what was pushed for
        it already."""
        self.watches[watch_id] = watch
        for event in self._orphans.pop(watch_id, ()):
            watch._deliver(event)

    def detach(self, watch_id: int) -> None:
        self.watches.pop(watch_id, None)
        self._orphans.pop(watch_id, None)

    def retire(self, watch_id: int) -> None:
        """Drops pushes for `watch_id` until `unretire` (an `unwatch` in flight)."""
        self.detach(watch_id)
        self._retired.add(watch_id)

    def unretire(self, watch_id: int) -> None:
        self._retired.discard(watch_id)

    def all(self) -> List[WatchState[Any]]:
        return list(self.watches.values())


def watch_id(result: Any) -> int:
    """The id in a `watch` reply, `{"watch": uint}`."""
    got = result.get("watch") if isinstance(result, dict) else None
    if not isinstance(got, int) or isinstance(got, bool) or got < 0:
        raise ProtocolError(f"a watch reply is not {{watch: uint}}: {result!r:.200}")
    return got


class WatchState(Generic[T]):
    """What a watch asked for, its unread events and whether it ended; the
    clients' `Watch` and `AsyncWatch` add the waiting."""

    #: The board watched.
    board: str
    #: The N of a `top` watch, else None.
    top: Optional[int]
    #: The player of a `player` watch, else None.
    player: Optional[str]
    #: The server's id of this watch on its current connection (it changes
    #: when the watch asks again on a new connection); None when it has none.
    id: Optional[int]
    #: How many times the watch asked again on a new connection, after the
    #: one it lived on was lost.
    resubscribes: int

    def __init__(self, request: Mapping[str, Any], buffer: int) -> None:
        if buffer < 1:
            raise ValueError("a watch's buffer holds at least 1 event")
        self._request: Dict[str, Any] = dict(request)
        self.board = str(request["board"])
        self.top = request.get("top")
        self.player = request.get("player")
        self.id = None
        self.resubscribes = 0
        self._events: Deque[T] = deque(maxlen=buffer)
        self._ended: Optional[str] = None
        self._registry: Optional[Registry] = None

    @property
    def active(self) -> bool:
        """Whether the watch may still deliver events (it has not ended)."""
        return self._ended is None

    @property
    def ended(self) -> Optional[str]:
        """Why the watch ended (`"unwatched"`, `"the board was dropped"`,
        `"the client is closed"`, ...), or None while it is active. Events
        received before the end can still be taken."""
        return self._ended

    @property
    def pending(self) -> int:
        """How many received events are waiting to be taken."""
        return len(self._events)

    def _attach(self, registry: Registry, watch_id: int) -> None:
        self._registry = registry
        self.id = watch_id
        registry.attach(watch_id, self)

    def _detach(self) -> None:
        if self._registry is not None and self.id is not None:
            self._registry.detach(self.id)
        self._registry = None
        self.id = None

    def _deliver(self, event: Any) -> None:
        if self._ended is not None:
            return
        self._events.append(event)
        if event is None and self.top is not None:
            # A top list is never nil otherwise: the board was dropped, and
            # the server ended the watch after this last push.
            self._end("the board was dropped")
        else:
            self._wake()

    def _end(self, reason: str) -> None:
        if self._ended is None:
            self._ended = reason
            self._detach()
        self._wake()

    def _ready(self, closed: bool) -> bool:
        """Whether an event waits to be taken; raises `WatchEnded` once the
        watch has ended (ending it if its client is `closed`) and every
        event it received was taken."""
        if self._events:
            return True
        if self._ended is None and closed:
            self._end("the client is closed")
        if self._ended is not None:
            raise WatchEnded(self._ended)
        return False

    def _wake(self) -> None:
        """Tells whoever waits for an event that something happened."""

    def _describe(self) -> str:
        what = f"top={self.top}" if self.top is not None else f"player={self.player!r}"
        state = f"ended: {self._ended}" if self._ended is not None else f"id={self.id}"
        return f"{self.board!r} {what} {state}"


class Wait:
    """One wait for a watch's next event (a `get`): its deadline, and how
    many times it asked again for the watch. Both clients' waits loop on
    it, around their own ways of waiting."""

    def __init__(self, timeout: Optional[float], now: float) -> None:
        self._timeout = timeout
        self._deadline = None if timeout is None else now + timeout
        self._resubscribed = 0

    def resubscribe(self, address: str) -> None:
        """Counts asking again for the watch, whose connection was lost;
        raises `RankdConnectionError` instead when that happened
        `RESUBSCRIBES_PER_GET` times in this wait: a server that keeps
        dropping the connection should not hold the caller forever."""
        if self._resubscribed == RESUBSCRIBES_PER_GET:
            raise RankdConnectionError(
                f"{address}: the connection of a watch was lost {self._resubscribed} times in one wait"
            )
        self._resubscribed += 1

    def left(self, now: float) -> Optional[float]:
        """Seconds left to wait at `now` (None: forever); raises
        `TimeoutError` once there are none."""
        wait = None if self._deadline is None else self._deadline - now
        if wait is not None and wait <= 0:
            raise TimeoutError(f"no event within {self._timeout} s")
        return wait
