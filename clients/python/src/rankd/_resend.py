"""Sending a call again after its connection broke, for both clients: which
requests may go again, after how long, and what the caller is told when they
may not. Each client runs its own I/O loop (blocking, or awaited) around the
decisions made here.

A read goes again once, on a new connection. A write goes again only when
it carries a `wid` (the server applies a (board, wid) at most once), up to
`write_retries` times; any other write that may have reached the server
makes the call fail with `maybe_applied`.
"""

from __future__ import annotations

import contextvars
from typing import Any, List, Mapping, Optional, Protocol, Sequence

from . import _wire
from ._errors import ProtocolError, RankdConnectionError, RankdTimeout, _Broken, _failure
from ._requests import result
from .types import WriteInfo


class Policy(Protocol):
    """A client's settings for sending writes again (read at each decision:
    they are public attributes a caller may change)."""

    retry_writes: bool
    write_retries: int


def check_write_retries(write_retries: int) -> None:
    if write_retries < 0:
        raise ValueError("write_retries must be 0 or more")


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
    the caller to tell a duplicate (even one answered by an error)."""
    if sent.get("op") in _wire.WID_OPS:
        last_write.set(WriteInfo(wid=sent.get("wid"), dup=isinstance(outcome, _wire.Dup), sends=sends))
    return result(outcome)


class Resends:
    """One call's requests, sent as one pipeline, across the connections
    they go on: what was answered (`done`), what is still to answer
    (`rest`), how many times they were sent (`sends`)."""

    def __init__(self, requests: Sequence[Mapping[str, Any]], policy: Policy, where: str) -> None:
        self.done: List[Any] = []
        self.rest: Sequence[Mapping[str, Any]] = requests
        self.sends = 1
        #: The re-sends of guarded writes used (at most `write_retries`);
        #: back to 0 once the rest holds none.
        self.retries = 0
        #: A write still unanswered was sent by an earlier attempt: it may
        #: have applied, whatever happens to the next one.
        self.in_doubt = False
        self._policy = policy
        #: Where the call ran, for the messages of its failures.
        self._where = where
        #: The `wid` of the call's one guarded write, told to the caller
        #: with a failure, so that it may send the write again itself.
        self._wid = requests[0].get("wid") if len(requests) == 1 and _wire.is_guarded(requests[0]) else None

    def broke(self, broken: _Broken, opened: bool) -> int:
        """Takes in what the connection answered before it broke (`broken`),
        and decides whether the rest goes again on a new connection. It
        does up to `write_retries` times (also after a timeout) if it holds
        writes and each carries a `wid`, with `retry_writes`; else once, if
        it holds only reads or requests that never left, and the connection
        was not new (`opened`: a call reconnects once) nor late. Never after
        the server broke the protocol. Raises the call's
        `RankdConnectionError` if not; else returns the `retry` to
        reconnect for: the retry-th re-send of guarded writes (it first
        waits `_wire.retry_delay(retry)`), or 0."""
        self.done.extend(broken.results)
        self.rest = self.rest[len(broken.results) :]
        writes = not all(_wire.is_read(req) for req in self.rest)
        guarded = (
            self._policy.retry_writes
            and writes
            and all(_wire.is_read(req) or _wire.is_guarded(req) for req in self.rest)
        )
        in_doubt = writes and (self.in_doubt or broken.sent)
        if guarded and self.retries < self._policy.write_retries and not broken.protocol:
            self.retries += 1
        elif guarded or opened or broken.timed_out or broken.protocol or in_doubt:
            raise _failure(
                broken,
                writes=writes,
                where=self._where,
                in_doubt=in_doubt,
                results=self.answered(),
                sends=self.sends,
                wid=self._wid,
            ) from broken
        self.in_doubt = in_doubt
        self.sends += 1
        return self.retries if guarded else 0

    def connect_failed(self, exc: RankdConnectionError, retry: int) -> int:
        """After the connection to send the rest again on could not be made
        (`exc`), for the `retry`-th re-send (0: a lone re-send): returns the
        next retry to try connecting for, each try counting as a re-send;
        raises `exc` when nothing sent may have applied (the caller learns
        only that the server is unreachable), else, once the re-sends run
        out, an error with `maybe_applied`."""
        if not self.in_doubt:
            raise exc
        if retry and retry < self._policy.write_retries:
            return retry + 1
        cls = type(exc) if isinstance(exc, RankdTimeout) else RankdConnectionError
        note = f"a write was sent {self.sends - 1} times and may or may not have applied (at most once)"
        raise cls(f"{exc}; {note}", maybe_applied=True, results=self.answered(), wid=self._wid) from exc

    def protocol_broken(self, exc: ProtocolError) -> None:
        """Completes `exc`, raised by a server breaking the protocol (it
        carries the results of its own attempt), for the caller."""
        exc.maybe_applied = not all(_wire.is_read(req) for req in self.rest)
        exc.results = [_wire.plain(o) for o in self.done + exc.results]

    def answered(self) -> List[Any]:
        """The results (or `RankdError`s) answered so far, without `Dup` marks."""
        return [_wire.plain(o) for o in self.done]
