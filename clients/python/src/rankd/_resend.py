"""Sending a call's requests again, for both clients: which requests may go
again, after how long, and what the caller is told when they may not. Each
client runs its own I/O loop (blocking, or awaited) around the decisions
made here (clients/conformance/transport.md states the rules).

The decisions are made for each request of a call (a `pipeline` holds
many). A read, or a write that never left, goes again once, on a new
connection, after its connection broke, but not after its own reply was
late. Once a read may not go again, the call fails with that read's
connection error, after the call's guarded writes (below) have run their
course. A write goes again only when it carries
a `wid` (the server applies a (board, wid) at most once) and the client
retries writes: after its reply was late or its connection broke (on a new
connection), or after the server answered it `overloaded` or `internal` (on
the same one); up to `write_retries` times, each after a random backoff
(`_wire.retry_wait`), and none starting more than `retry_deadline` seconds
after its first send. Any other write that may have reached the server makes
the call fail with `maybe_applied`, and with the `wid` of each of its writes.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any, List, Mapping, Optional, Protocol, Sequence

from . import _wire
from ._errors import ProtocolError, RankdConnectionError, RankdError, RankdTimeout, _Broken, _failure
from ._requests import result
from .types import WriteInfo

#: The server's answers after which a write with a `wid` is sent again: it
#: shed the write (`overloaded`: never applied) or failed it (`internal`: it
#: may or may not have applied).
RETRY_CODES = frozenset({"overloaded", "internal"})

#: The longest `retry_deadline`, in seconds: well within the server's dedup
#: horizon (10 minutes by default), past which a `wid` sent again is no
#: longer recognised and the write may apply twice.
MAX_RETRY_DEADLINE = 300.0


class Policy(Protocol):
    """A client's settings for sending writes again (read at each decision:
    they are public attributes a caller may change)."""

    retry_writes: bool
    write_retries: int
    retry_deadline: float


def check(write_retries: int, retry_deadline: float) -> None:
    """Raises ValueError for retry settings a client refuses."""
    if write_retries < 0:
        raise ValueError("write_retries must be 0 or more")
    if not 0 < retry_deadline <= MAX_RETRY_DEADLINE:  # (NaN too)
        raise ValueError(
            f"retry_deadline must be over 0 and at most {MAX_RETRY_DEADLINE:g} seconds, not "
            f"{retry_deadline!r}: the server remembers a write's wid for its dedup horizon "
            "(10 minutes by default), and a write sent again after that may apply twice"
        )


def prepare(requests: Sequence[Mapping[str, Any]], policy: Policy) -> List[Mapping[str, Any]]:
    """`requests` as sent: with `retry_writes`, writes get a `wid`."""
    return _wire.with_wids(requests) if policy.retry_writes else list(requests)


def settle(
    sent: Mapping[str, Any],
    outcome: Any,
    sends: int,
    last_write: contextvars.ContextVar[Optional[WriteInfo]],
) -> Any:
    """The result of one call's request `sent`, answered by `outcome` after
    `sends` sendings; a write's course is kept in `last_write` first, for
    the caller to tell a duplicate (even one answered by an error). A write
    sent again until the server's error ended it, and that may have applied
    (`internal`), raises `RankdConnectionError` with `maybe_applied`, as one
    whose connection was lost does."""
    if sent.get("op") in _wire.WID_OPS:
        last_write.set(WriteInfo(wid=sent.get("wid"), dup=isinstance(outcome, _wire.Dup), sends=sends))
    if isinstance(outcome, RankdError) and outcome.wid is not None and outcome.maybe_applied:
        raise RankdConnectionError(
            f"the server answered `{outcome.code}` ({outcome.msg}) to a write sent {outcome.sends} "
            "times: it may or may not have applied (at most once)",
            maybe_applied=True,
            wid=outcome.wid,
            sends=outcome.sends,
            wids=[outcome.wid],
        ) from outcome
    return result(outcome)


class Resends:
    """One call's requests, sent as one pipeline, across the sends (and the
    connections) they take: each request's outcome once settled, those
    still to send (`rest`), how many times each was sent.

    A client sends the rest (calling `sending` first) and hands over what
    came back: `answered` when every reply came, `broke` when the
    connection failed, `connect_failed` when no connection could be made to
    send it again on. Each either ends the call (returns None, or raises)
    or returns how long to wait before sending the rest again.

    A request leaves the rest once settled (answered for good), or once a
    read is lost (it may not go again): then only the call's guarded
    writes go on, and the call raises the read's failure when they are
    done."""

    def __init__(self, requests: Sequence[Mapping[str, Any]], policy: Policy, where: str) -> None:
        self._requests = list(requests)
        count = len(self._requests)
        #: Each request's outcome (a result, a `Dup` or a `RankdError`); for
        #: a write to send again, the error it was answered.
        self._outcomes: List[Any] = [None] * count
        self._settled = [False] * count
        #: The requests to send next (indices, in order).
        self._todo = list(range(count))
        #: How many times each request was sent.
        self._sends = [0] * count
        #: The writes an earlier send may have applied: lost in flight, or
        #: answered `internal`.
        self._doubt = [False] * count
        #: The requests other than guarded writes sent again after a lost
        #: connection (they go again once).
        self._resent = [False] * count
        #: The failure of the first read lost for good, which ends the call
        #: once its guarded writes are done.
        self._lost: Optional[_Broken] = None
        #: The re-sends of guarded writes decided (at most `write_retries`).
        self.retries = 0
        #: Why writes were not sent again, once they were not.
        self._stopped = ""
        #: When the call was first sent (`time.monotonic()`).
        self._first_send: Optional[float] = None
        self._policy = policy
        #: Where the call ran, for the messages of its failures.
        self._where = where
        #: The `wid` of the call's one guarded write, told to the caller
        #: with a failure, so that it may send the write again itself.
        lone = self._requests[0] if count == 1 else None
        self._wid = lone.get("wid") if lone is not None and _wire.is_guarded(lone) else None
        #: The `wid` of each request that carries one (None for the others),
        #: told to the caller with a failure.
        self.wids: List[Optional[str]] = [
            req.get("wid") if _wire.is_guarded(req) else None for req in self._requests
        ]

    @property
    def rest(self) -> List[Mapping[str, Any]]:
        """The requests to send (again)."""
        return [self._requests[i] for i in self._todo]

    @property
    def outcomes(self) -> List[Any]:
        """Every request's outcome, once the call is done."""
        return list(self._outcomes)

    @property
    def sends(self) -> int:
        """How many times the call was sent (the most of any request)."""
        return max(self._sends, default=0)

    @property
    def deadline(self) -> Optional[float]:
        """The `time.monotonic()` instant after which guarded writes are no
        longer sent again, once they are being sent again (else None)."""
        if not self.retries or self._first_send is None:
            return None
        return self._first_send + self._policy.retry_deadline

    def check_reconnected(self, opened: bool) -> None:
        """Raises `RankdTimeout` if the connection to send guarded writes
        again on is new (`opened`) and was made past the retry deadline (a
        connect bounded by it may still end a little after)."""
        deadline = self.deadline
        if opened and deadline is not None and time.monotonic() > deadline:
            raise RankdTimeout(f"{self._where}: the retry deadline passed while reconnecting")

    def sending(self) -> None:
        """Counts a sending of the rest (called just before it)."""
        if self._first_send is None:
            self._first_send = time.monotonic()
        for i in self._todo:
            self._sends[i] += 1

    def answered(self, outcomes: Sequence[Any]) -> Optional[float]:
        """Takes in the outcomes of the whole rest. Returns None once the
        call is done (see `outcomes`); else the seconds to wait before
        sending the rest, guarded writes the server answered `overloaded`
        or `internal`, again on the same connection. When re-sends are used
        up, such a write's outcome is the server's error, with the write's
        `wid`, `sends` and `maybe_applied` set. Raises the failure of a
        read lost earlier, once the rest is done."""
        self._todo = self._take(outcomes)
        if self._todo:
            wait = self._next_wait()
            if wait is not None:
                return wait
            self._give_up()
        if self._lost is not None:
            raise self._error(self._lost, writes=False) from self._lost
        return None

    def broke(self, broken: _Broken) -> float:
        """Takes in what the connection answered before it broke (`broken`),
        and decides, request by request, what goes again on a new
        connection: each write with a `wid` (with `retry_writes`), also
        after a timeout, while re-sends are left (`_next_wait`); each read,
        and each write that never left, once, unless its own reply was the
        late one. Nothing after the server broke the protocol. A write that
        may not go again (it may have applied, or went again already), or a
        guarded write out of re-sends, raises the call's
        `RankdConnectionError` at once; a read that may not go again is lost:
        the call will raise its failure, and only its guarded writes go
        again until then (nothing goes again for the other requests, whose
        results could not be told). Returns how long to wait first."""
        again = self._take(broken.results)
        unanswered = self._todo[len(broken.results) :]
        #: The request whose own reply was late, if one was.
        late = unanswered[0] if broken.timed_out and unanswered else None
        for i in unanswered:
            self._outcomes[i] = None
            if broken.sent and not _wire.is_read(self._requests[i]):
                self._doubt[i] = True
        self._todo = sorted(again + unanswered)
        writes = not all(_wire.is_read(req) for req in self.rest)
        guarded = [i for i in self._todo if self._guarded(i)]
        stuck = [
            i
            for i in self._todo
            if not self._guarded(i)
            and (broken.protocol or i == late or self._resent[i] or self._doubt[i])
        ]
        if broken.protocol or any(not _wire.is_read(self._requests[i]) for i in stuck):
            wait: Optional[float] = None
        else:
            wait = self._next_wait() if guarded else 0.0
        if wait is None:
            self._give_up()
            raise self._error(broken, writes=writes) from broken
        if stuck and self._lost is None:
            self._lost = broken
        if self._lost is not None:
            self._todo = guarded  # the call fails: the rest would go for nothing
            if not self._todo:
                raise self._error(self._lost, writes=False) from self._lost
        for i in self._todo:
            self._resent[i] = True
        return wait

    def connect_failed(self, exc: RankdConnectionError) -> float:
        """After the connection to send the rest again on could not be made
        (`exc`): returns how long to wait before trying again, each try
        counting as a re-send, while guarded writes are to go again (or
        anything sent may have applied); else raises `exc` (the caller
        learns only that the server is unreachable). Once the re-sends run
        out, raises an error with the writes' `wid`s, `sends`, and
        `maybe_applied` if a send may have applied."""
        if not any(self._guarded(i) or self._doubt[i] for i in self._todo):
            exc.results, exc.wids, exc.sends = self.results_so_far(), self.wids, self.sends
            exc.maybe_applied = self._maybe_applied()
            raise exc
        wait = self._next_wait()
        if wait is not None:
            return wait
        self._give_up()
        maybe_applied = self._maybe_applied()
        cls = type(exc) if isinstance(exc, RankdTimeout) else RankdConnectionError
        if maybe_applied:
            note = f"a write was sent {self.sends} times and may or may not have applied (at most once)"
        else:
            note = f"a write was sent {self.sends} times and did not apply"
        raise cls(
            f"{exc}; {note} ({self._stopped})",
            maybe_applied=maybe_applied,
            results=self.results_so_far(),
            wid=self._wid,
            sends=self.sends,
            wids=self.wids,
        ) from exc

    def refused(self, err: RankdError) -> None:
        """Completes `err`, the server's refusal of the token on the new
        connection the rest was to go on (it ends the call), with the
        call's writes, when they carry a `wid`."""
        if any(wid is not None for wid in self.wids):
            err.wid, err.sends, err.wids = self._wid, self.sends, self.wids
            err.maybe_applied = self._maybe_applied()

    def protocol_broken(self, exc: ProtocolError) -> None:
        """Completes `exc`, raised by a server breaking the protocol (it
        carries the results of its own attempt), for the caller."""
        again = self._take(exc.results)
        self._todo = sorted(again + self._todo[len(exc.results) :])
        writes = not all(_wire.is_read(req) for req in self.rest)
        self._give_up()
        exc.maybe_applied = writes or self._maybe_applied()
        exc.wid = self._wid if exc.maybe_applied else None
        exc.sends, exc.wids = self.sends, self.wids
        exc.results = self.results_so_far()

    def results_so_far(self) -> List[Any]:
        """The results (or `RankdError`s) of the requests settled before the
        first unsettled one, without `Dup` marks."""
        done: List[Any] = []
        for outcome, settled in zip(self._outcomes, self._settled):
            if not settled:
                break
            done.append(_wire.plain(outcome))
        return done

    # -- internals ----------------------------------------------------------

    def _maybe_applied(self) -> bool:
        """Whether a write the caller is not told the result of (past
        `results_so_far()`) applied or may have."""
        for i in range(len(self.results_so_far()), len(self._requests)):
            if _wire.is_read(self._requests[i]):
                continue
            outcome = self._outcomes[i]
            if self._doubt[i] or (
                self._settled[i] and not (isinstance(outcome, RankdError) and not outcome.maybe_applied)
            ):
                return True
        return False

    def _error(self, broken: _Broken, *, writes: bool) -> RankdConnectionError:
        """The call's failure after `broken` (a rest holding writes if
        `writes`): with its results so far, `wid`s and sends."""
        return _failure(
            broken,
            writes=writes,
            where=self._where,
            in_doubt=self._maybe_applied(),
            results=self.results_so_far(),
            sends=self.sends,
            wid=self._wid,
            wids=self.wids,
            stopped=self._stopped,
        )

    def _guarded(self, i: int) -> bool:
        """Whether request `i` is a write this client sends again."""
        return self._policy.retry_writes and _wire.is_guarded(self._requests[i])

    def _take(self, outcomes: Sequence[Any]) -> List[int]:
        """Settles the outcomes of the first requests of the rest, except
        guarded writes answered `overloaded` or `internal`: returns those,
        to send again."""
        again: List[int] = []
        for i, outcome in zip(self._todo, outcomes):
            self._outcomes[i] = outcome
            if isinstance(outcome, RankdError) and outcome.code in RETRY_CODES and self._guarded(i):
                if outcome.code == "internal":
                    self._doubt[i] = True
                again.append(i)
            else:
                self._settle(i)
        return again

    def _settle(self, i: int) -> None:
        """Request `i`'s outcome is final; an error ending a guarded write
        carries its `wid` and how many times it was sent."""
        self._settled[i] = True
        outcome = self._outcomes[i]
        if isinstance(outcome, RankdError) and self._guarded(i):
            outcome.wid = self._requests[i].get("wid")
            outcome.sends = self._sends[i]
            if outcome.code in RETRY_CODES:
                outcome.maybe_applied = outcome.code == "internal" or self._doubt[i]

    def _give_up(self) -> None:
        """No more re-sends: writes answered an error keep it as their outcome."""
        for i in self._todo:
            if isinstance(self._outcomes[i], RankdError):
                self._settle(i)
        self._todo = [i for i in self._todo if not self._settled[i]]

    def _next_wait(self) -> Optional[float]:
        """The wait before the next re-send of guarded writes, which it
        counts; None (and why in `_stopped`) once `write_retries` are used
        up, or if the re-send would start past the retry deadline."""
        policy = self._policy
        if self.retries >= policy.write_retries:
            self._stopped = f"write_retries ({policy.write_retries}) used up"
            return None
        wait = _wire.retry_wait(self.retries + 1)
        first = time.monotonic() if self._first_send is None else self._first_send
        if time.monotonic() + wait > first + policy.retry_deadline:
            self._stopped = f"retry_deadline ({policy.retry_deadline:g} s) reached"
            return None
        self.retries += 1
        return wait
