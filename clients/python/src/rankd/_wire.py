"""What both clients share: the frames on the wire, the reading of a reply,
the request maps, and the connection settings (address, timeouts, TLS).

A frame is a 4-byte big-endian length and one msgpack value; a request is a
map with `id` and `op`, a reply a map with the same `id` and `ok` or `err`
(see docs/PROTOCOL.md in the rankd repository).
"""

from __future__ import annotations

import random
import ssl
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import msgpack

from ._errors import ProtocolError, RankdError

HEADER = struct.Struct(">I")

#: The longest request body the client sends unless told otherwise: the
#: server's default `max_frame` (1 MiB). A server closes the connection on a
#: longer frame, failing every request in flight there.
MAX_FRAME = 1 << 20

#: A reply frame longer than this is not from rankd (whose largest reply, a
#: `top` of 1000 entries with 256-byte names, is well under 1 MiB): the
#: connection is dropped instead of buffering whatever follows.
MAX_REPLY_FRAME = 64 << 20

#: Ops that change nothing, so a read whose connection broke may simply be
#: sent again on a new one. Every other op (writes, and ops this client does
#: not know) is never re-sent once it may have reached the server, unless it
#: is a write guarded by a `wid` (see `is_guarded`). (A `watch` lives and
#: dies with its connection: one lost with its connection may be asked again
#: on the next.)
READ_OPS = frozenset(
    {"ping", "auth", "boards", "get", "count", "rank", "rank_of_score", "top", "around", "ranks", "watch"}
)

#: The writes that take a `wid` (protocol 1.1): the server applies a
#: (board, wid) at most once, so such a write may be sent again.
WID_OPS = frozenset({"set", "set_many", "remove"})


def request(op: str, **fields: Any) -> Dict[str, Any]:
    """The request map for `op`; fields that are None are left out, so the
    server's documented defaults apply."""
    req: Dict[str, Any] = {"op": op}
    req.update((name, value) for name, value in fields.items() if value is not None)
    return req


def score(value: Any) -> Any:
    """A score as sent: an int, or, on a board with fields, any mapping made
    a plain dict (msgpack packs only dicts as maps)."""
    return dict(value) if isinstance(value, Mapping) else value


def entries(items: Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]) -> List[List[Any]]:
    """`set_many` entries as the protocol's `[player, score]` lists (a score
    a dict on a board with fields)."""
    pairs = items.items() if isinstance(items, Mapping) else items
    return [[player, score(value)] for player, value in pairs]


def is_read(req: Mapping[str, Any]) -> bool:
    return req.get("op") in READ_OPS


def is_guarded(req: Mapping[str, Any]) -> bool:
    """Whether `req` is a write the server applies at most once: a `set`,
    `set_many` or `remove` carrying a `wid`."""
    return req.get("op") in WID_OPS and req.get("wid") is not None


#: Seconds before the first re-send of a guarded write; each further one
#: waits twice as long, up to `RETRY_DELAY_MAX`.
RETRY_DELAY = 0.1
RETRY_DELAY_MAX = 2.0


def retry_delay(retry: int) -> float:
    """The longest wait, in seconds, before the `retry`-th re-send (1-based)
    of a write: min(0.1 s × 2^(retry-1), 2 s). The wait itself is
    `retry_wait`."""
    return float(min(RETRY_DELAY * 2 ** (retry - 1), RETRY_DELAY_MAX))


def retry_wait(retry: int, draw: Callable[[], float] = random.random) -> float:
    """Seconds to wait before the `retry`-th re-send of a write: a random
    time between half and all of `retry_delay(retry)`, so that clients that
    lost the same server do not come back in step. (`draw`: a number in
    [0, 1).)"""
    cap = retry_delay(retry)
    return cap / 2 + cap / 2 * draw()


def within(timeout: Optional[float], deadline: Optional[float]) -> Optional[float]:
    """`timeout` (None: none), shortened to end by `deadline` (a
    `time.monotonic()` instant; None: none)."""
    if deadline is None:
        return timeout
    left = max(deadline - time.monotonic(), 0.001)
    return left if timeout is None else min(timeout, left)


def new_wid() -> str:
    """A fresh write id: 32 hex digits of a random UUID."""
    return uuid.uuid4().hex


def with_wids(requests: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """`requests`, each `set`, `set_many` and `remove` without a `wid` given
    one (in a copy: the caller's maps are left alone)."""
    return [
        {**req, "wid": new_wid()} if req.get("op") in WID_OPS and req.get("wid") is None else req
        for req in requests
    ]


def encode(req: Mapping[str, Any], request_id: int) -> bytes:
    """One frame: `req` with `id` set to `request_id`.

    Raises TypeError (or OverflowError) for a value msgpack cannot carry,
    before anything is sent.
    """
    body: bytes = msgpack.packb({**req, "id": request_id}, use_bin_type=True)
    if len(body) > 0xFFFFFFFF:
        raise OverflowError("a request frame must be under 4 GiB")
    return HEADER.pack(len(body)) + body


#: The most bytes a request id takes in msgpack (a uint64: 0xcf and 8
#: bytes). A request is sent again with a new id, perhaps a longer one.
MAX_ID_SIZE = 9


class Numbering:
    """A client's request ids, 1, 2, 3, ...: a reply names the request it
    answers by its id. Requests longer than `max_frame` are refused here."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._next = 1
        self.max_frame = max_frame

    def frames(self, requests: Sequence[Mapping[str, Any]]) -> Tuple[List[int], bytes]:
        """The ids given to `requests` and their frames, to send as one
        write. Ids are used up only once every request has encoded. Raises
        `RankdError("too_large")` if a request's body would be over
        `max_frame` with the longest id (`MAX_ID_SIZE` bytes; the server
        would close the connection on it): nothing is sent. Counting the
        longest id, a request that passes its first send passes its
        re-sends, whatever their ids."""
        ids = list(range(self._next, self._next + len(requests)))
        frames = [encode(req, rid) for req, rid in zip(requests, ids)]
        for index, (frame, rid) in enumerate(zip(frames, ids)):
            size = len(frame) - HEADER.size + MAX_ID_SIZE - len(msgpack.packb(rid))
            if size > self.max_frame:
                which = f"request {index} of the pipeline" if len(requests) > 1 else "the request"
                raise RankdError(
                    "too_large",
                    f"{which} (`{requests[index].get('op')}`, {size} bytes counting {MAX_ID_SIZE} for "
                    f"its id) is over the client's max_frame of {self.max_frame} bytes: not sent",
                )
        self._next += len(requests)
        return ids, b"".join(frames)


class FrameBuffer:
    """Bytes read from a connection, cut into frames."""

    def __init__(self) -> None:
        self._data = bytearray()

    def feed(self, data: bytes) -> None:
        self._data += data

    def __len__(self) -> int:
        """How many bytes are held (of frames not yet popped)."""
        return len(self._data)

    def pop(self) -> Optional[bytes]:
        """The next complete frame's body, or None until more bytes arrive."""
        if len(self._data) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._data)
        check_length(length)
        end = HEADER.size + length
        if len(self._data) < end:
            return None
        body = bytes(self._data[HEADER.size : end])
        # (deleting a bytearray's head is cheap in CPython: it moves a pointer)
        del self._data[:end]
        return body


def check_length(length: int) -> None:
    if length == 0 or length > MAX_REPLY_FRAME:
        raise ProtocolError(f"the server sent a frame of {length} bytes")


class Push:
    """A frame that answers no request: a watch's push (protocol 1.1),
    `{"watch": id, "event": value}`."""

    __slots__ = ("watch", "event")

    def __init__(self, watch: int, event: Any) -> None:
        self.watch = watch
        self.event = event

    def __repr__(self) -> str:
        return f"Push(watch={self.watch}, event={self.event!r:.100})"


class Dup:
    """The result of a write the server had already applied (a repeated
    `wid`): its reply carried `"dup": true` beside `"ok"`."""

    __slots__ = ("result",)

    def __init__(self, result: Any) -> None:
        self.result = result

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dup) and other.result == self.result

    def __repr__(self) -> str:
        return f"Dup({self.result!r})"


def plain(outcome: Any) -> Any:
    """An outcome without its `Dup` mark."""
    return outcome.result if isinstance(outcome, Dup) else outcome


def parse_reply(body: bytes, expected_id: Optional[int]) -> Any:
    """The outcome of the request `expected_id` that `body` answers: its `ok`
    result (wrapped in `Dup` when the reply says `"dup": true`), or a
    `RankdError` (returned, not raised); a `Push` for a frame that answers no
    request.

    Errors the server raises before it could read an id (`too_large`, some
    `bad_frame`) carry id 0: they answer the oldest request in flight.
    """
    try:
        reply = msgpack.unpackb(body, raw=False)
    except Exception as exc:  # msgpack raises several types for bad bytes
        raise ProtocolError(f"a reply is not msgpack: {exc}") from exc
    if not isinstance(reply, dict):
        raise ProtocolError(f"a reply is not a map: {reply!r:.200}")
    if "id" not in reply and "watch" in reply:
        watch = reply["watch"]
        if not isinstance(watch, int) or isinstance(watch, bool) or watch < 0 or "event" not in reply:
            raise ProtocolError(f"a push is not {{watch: uint, event}}: {reply!r:.200}")
        return Push(watch, reply["event"])
    got = reply.get("id")
    err = reply.get("err")
    if expected_id is None or (got != expected_id and not (got == 0 and err is not None)):
        raise ProtocolError(f"expected a reply with id {expected_id}, got {reply!r:.200}")
    if err is not None:
        if not isinstance(err, dict):
            raise ProtocolError(f"an error is not a map: {err!r:.200}")
        return RankdError(str(err.get("code")), str(err.get("msg", "")))
    if reply.get("dup") is True:
        return Dup(reply.get("ok"))
    return reply.get("ok")


@dataclass(frozen=True)
class Settings:
    """Where and how a client connects; the same for every reconnection."""

    host: str
    port: int
    #: Seconds to wait for each reply (None: forever).
    timeout: Optional[float]
    #: Seconds to wait for the TCP connection and the TLS handshake.
    connect_timeout: Optional[float]
    #: None for plaintext.
    ssl_context: Optional[ssl.SSLContext]
    #: The name the server's certificate must carry (and SNI).
    server_hostname: Optional[str]
    #: The longest request body sent (see `MAX_FRAME`).
    max_frame: int = MAX_FRAME

    @staticmethod
    def make(
        host: str,
        port: int,
        *,
        timeout: Optional[float],
        connect_timeout: Optional[float],
        tls: Union[bool, ssl.SSLContext],
        ca_file: Optional[str],
        server_hostname: Optional[str],
        certfile: Optional[str],
        keyfile: Optional[str],
        max_frame: int = MAX_FRAME,
    ) -> Settings:
        if isinstance(max_frame, bool) or not isinstance(max_frame, int) or max_frame < 1:
            raise ValueError(f"max_frame must be a positive number of bytes, not {max_frame!r}")
        if isinstance(tls, ssl.SSLContext):
            context: Optional[ssl.SSLContext] = tls
        elif tls or ca_file is not None or certfile is not None:
            # Verifies the certificate chain and the host name.
            context = ssl.create_default_context(cafile=ca_file)
            if certfile is not None:
                context.load_cert_chain(certfile, keyfile)
        else:
            context = None
        return Settings(
            host=host,
            port=int(port),
            timeout=timeout,
            connect_timeout=timeout if connect_timeout is None else connect_timeout,
            ssl_context=context,
            server_hostname=(server_hostname or host) if context is not None else None,
            max_frame=max_frame,
        )

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
