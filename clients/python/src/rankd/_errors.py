"""The exceptions a call can raise.

Two families, because a caller handles them differently:

- `RankdError`: the server answered the request with an error. The
  connection is fine; the request did not apply (except `internal`, which
  may or may not have).
- `RankdConnectionError`: the transport failed (connect, TLS, a connection
  closed or reset, a timeout, a server breaking the protocol). Its
  `maybe_applied` says whether a write may have reached the server.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

__all__ = ["ProtocolError", "RankdConnectionError", "RankdError", "RankdTimeout", "WatchEnded"]


class RankdError(Exception):
    """The server answered `{"err": {"code", "msg"}}`.

    `code` is the protocol's error code: `bad_frame`, `bad_request`,
    `unknown_op`, `too_large`, `conflict`, `unauthorized`, `overloaded` or
    `internal`; `msg` is the server's explanation, for people. (`too_large`
    is also raised by the client itself, for a request over its
    `max_frame`: then the message says it was not sent.)

    `wid` and `sends` are set on the error that ends a write the client
    sent again with its `wid` (with `retry_writes`): that `wid`, and how many
    times the write was sent. `maybe_applied` says whether the request may
    have applied all the same: an `internal` error, or an `overloaded` one
    after an earlier send was lost. A write failed by `overloaded` alone
    never applied; sending it again with the same `wid` is safe either way.

    `wids` is set when the error ends a whole call (a token refused on
    reconnecting) that held writes with a `wid`: as on
    `RankdConnectionError`, one entry per request of the call.
    """

    code: str
    msg: str
    wid: Optional[str]
    sends: int
    maybe_applied: bool
    wids: List[Optional[str]]

    def __init__(self, code: str, msg: str) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg
        self.wid = None
        self.sends = 0
        self.maybe_applied = code == "internal"
        self.wids = []

    def __reduce__(self) -> Tuple[Any, ...]:
        state = {"wid": self.wid, "sends": self.sends, "maybe_applied": self.maybe_applied, "wids": self.wids}
        return (type(self), (self.code, self.msg), state)


class RankdConnectionError(ConnectionError):
    """The connection to the server failed, closed, timed out or broke the protocol.

    `maybe_applied` is True when a write (`set`, `set_many`, `remove`,
    `create_board`, `drop_board`, or an op unknown to the client) had been
    sent when the connection failed: the server may or may not have applied
    it. Reads are retried once on a new connection before this is raised;
    writes carrying a `wid` (with the client's `retry_writes`) are sent again
    with the same `wid`, up to the client's `write_retries` times, within its
    `retry_deadline`.

    `wid` is the write id of the write in doubt, when the failed call was one
    `set`, `set_many` or `remove` that carried one, and `sends` how many
    times it was sent: sending the same request again with this `wid`
    (within the server's dedup horizon, 10 minutes by default) applies it at
    most once. A write the server kept answering `internal` ends the same
    way (the server's `RankdError` is `__cause__`).

    `results` holds the results of the requests of a `pipeline` that were
    answered before the failure, in order (results or `RankdError`s): those
    before the first request left without an answer.

    `wids` has one entry per request of the failed call (a `pipeline`'s, in
    order): the `wid` of each `set`, `set_many` and `remove` that carried
    one (its own, or the one the client gave it, in a copy, with
    `retry_writes`), None for the other requests. A write past `results`
    may have applied (`maybe_applied` then says so); each request left
    without an answer was sent `sends` times. Sending such a write again
    with its `wid` applies it at most once, so a pipeline may be sent again
    whole with `wids` put back in its writes. (Empty for a failure outside
    a call, such as a watch's wait.)

    The client reconnects (once) on its next call; the cause, when there is
    one (an `OSError`, an `ssl.SSLError`), is `__cause__`.
    """

    maybe_applied: bool
    results: List[Any]
    wid: Optional[str]
    sends: int
    wids: List[Optional[str]]

    def __init__(
        self,
        message: str,
        *,
        maybe_applied: bool = False,
        results: Optional[List[Any]] = None,
        wid: Optional[str] = None,
        sends: int = 0,
        wids: Optional[List[Optional[str]]] = None,
    ) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied
        self.results = [] if results is None else results
        self.wid = wid
        self.sends = sends
        self.wids = [] if wids is None else wids

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def __reduce__(self) -> Tuple[Any, ...]:
        args = (type(self), str(self), self.maybe_applied, self.results, self.wid, self.sends, self.wids)
        return (_rebuild, args)


class RankdTimeout(RankdConnectionError, TimeoutError):
    """No reply within the client's `timeout` (or no connection within
    `connect_timeout`). The connection is closed (a late reply would answer
    the wrong call); the next call opens a new one."""


class ProtocolError(RankdConnectionError):
    """The server sent something the protocol does not allow: a frame that
    is not one msgpack map, a reply with an unexpected id, an absurd length.
    The connection is closed."""


class WatchEnded(Exception):
    """A watch has ended and every event it received has been taken: it was
    closed (`unwatch`), its board was dropped (a `top` watch), or its client
    was closed. `reason` says which."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"the watch has ended: {reason}")
        self.reason = reason

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.reason,))


class _Broken(Exception):
    """A connection failed during an exchange (internal: the clients turn it
    into a `RankdConnectionError`, or retry)."""

    def __init__(
        self,
        message: str,
        *,
        sent: bool,
        results: List[Any],
        timed_out: bool = False,
        protocol: bool = False,
    ) -> None:
        super().__init__(message)
        #: Whether any byte of the exchange was handed to the socket: if not,
        #: the server cannot have seen any of its requests.
        self.sent = sent
        #: The outcomes of the requests answered before the failure.
        self.results = results
        #: The failure is a reply that did not come in time.
        self.timed_out = timed_out
        #: The failure is the server breaking the protocol.
        self.protocol = protocol


def _rebuild(
    cls: type,
    message: str,
    maybe_applied: bool,
    results: List[Any],
    wid: Optional[str] = None,
    sends: int = 0,
    wids: Optional[List[Optional[str]]] = None,
) -> RankdConnectionError:
    exc: RankdConnectionError = cls(
        message, maybe_applied=maybe_applied, results=results, wid=wid, sends=sends, wids=wids
    )
    return exc


def _unreachable(
    address: str, connect_timeout: Optional[float], exc: Exception, *, timed_out: bool
) -> RankdConnectionError:
    """The public exception for a connection to `address` that could not be
    made (`exc`), or not within `connect_timeout` if `timed_out`."""
    if timed_out:
        return RankdTimeout(f"cannot connect to {address} within {connect_timeout} s")
    return RankdConnectionError(f"cannot connect to {address}: {exc}")


def _failure(
    broken: _Broken,
    *,
    writes: bool,
    where: str,
    in_doubt: bool = False,
    results: Optional[List[Any]] = None,
    sends: int = 1,
    wid: Optional[str] = None,
    wids: Optional[List[Optional[str]]] = None,
    stopped: str = "",
) -> RankdConnectionError:
    """The public exception for `broken`, a failure at `where` of an exchange
    that held a write if `writes`; `in_doubt` if an earlier attempt of the
    same call may have applied a write. `results`: the outcomes answered
    before (default `broken.results`); `sends`: how many times the call was
    sent; `wid`: that of the call's one write; `wids`: those of its
    requests; `stopped`: why it was not sent again, if it might have been."""
    maybe_applied = in_doubt or (writes and broken.sent)
    note = ""
    if maybe_applied:
        note = "; a write was in flight and may or may not have applied"
        if sends > 1:
            note = f"; a write was sent {sends} times and may or may not have applied (at most once)"
    if stopped:
        note += f" ({stopped})"
    cls = RankdTimeout if broken.timed_out else ProtocolError if broken.protocol else RankdConnectionError
    return cls(
        f"{where}: {broken}{note}",
        maybe_applied=maybe_applied,
        results=broken.results if results is None else results,
        wid=wid if maybe_applied else None,
        sends=sends,
        wids=wids,
    )
