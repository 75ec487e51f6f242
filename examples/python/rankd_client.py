"""A small Python client for the rankd wire protocol (version 1).

The protocol (see protocol.md) is: TCP, every message is a 4-byte big-endian
length followed by one msgpack map. Requests carry an `id` that the server
echoes; responses come back in request order.

Only dependency: the `msgpack` package.

    with RankdClient("127.0.0.1", 7070) as db:
        db.set("arena", "alice", 1200)
        print(db.top("arena", limit=3))

Over TLS, with a token (read from the environment, not the source):

    with RankdClient("rankd.internal", 7070, ca_file="ca.pem",
                     token=os.environ["RANKD_TOKEN"]) as db:
        print(db.top("arena"))
"""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from typing import Any

import msgpack

__all__ = ["RankdClient", "RankdError", "ProtocolError"]

_LENGTH = struct.Struct(">I")


class RankdError(Exception):
    """An error answered by the server: `{"err": {"code", "msg"}}`."""

    def __init__(self, code: str, msg: str) -> None:
        super().__init__(f"{code}: {msg}")
        self.code = code
        self.msg = msg


class ProtocolError(Exception):
    """The server broke the protocol (bad framing, wrong id) or went away."""


class RankdClient:
    """One connection to a rankd server.

    Not thread-safe: use one client per thread (connections are cheap).
    Optional arguments left as None are omitted from the request, so the
    server applies its documented defaults.
    """

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float | None = 30.0,
        *,
        tls: bool = False,
        ca_file: str | None = None,
        server_hostname: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        token: str | None = None,
    ) -> None:
        """Connect; over TLS when `tls` or `ca_file` is given (the system's
        roots unless `ca_file`; `certfile`/`keyfile` for mutual TLS), then
        `auth` with `token` if given (raising RankdError if refused)."""
        sock = socket.create_connection((host, port), timeout=timeout)
        # Requests are small and latency-bound; don't let Nagle delay them.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._tls = tls or ca_file is not None or certfile is not None
        if self._tls:
            context = ssl.create_default_context(cafile=ca_file)
            if certfile is not None:
                context.load_cert_chain(certfile, keyfile)
            sock = context.wrap_socket(sock, server_hostname=server_hostname or host)
        self._sock = sock
        self._rfile = self._sock.makefile("rb")
        self._next_id = 1
        if token is not None:
            self.auth(token)

    # -- connection ---------------------------------------------------------

    def close(self) -> None:
        self._rfile.close()
        self._sock.close()

    def __enter__(self) -> RankdClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- framing ------------------------------------------------------------

    def _stamp(self, request: dict[str, Any]) -> tuple[int, bytes]:
        """Give a copy of `request` a fresh id and return (id, frame bytes)."""
        req_id = self._next_id
        self._next_id += 1
        body = msgpack.packb({**request, "id": req_id}, use_bin_type=True)
        return req_id, _LENGTH.pack(len(body)) + body

    def _read_frame(self) -> Any:
        header = self._rfile.read(_LENGTH.size)
        if len(header) < _LENGTH.size:
            raise ProtocolError("connection closed by server")
        (length,) = _LENGTH.unpack(header)
        body = self._rfile.read(length)
        if len(body) < length:
            raise ProtocolError("connection closed mid-frame")
        return msgpack.unpackb(body, raw=False)

    def _read_response(self, req_id: int) -> dict[str, Any]:
        resp = self._read_frame()
        if not isinstance(resp, dict):
            raise ProtocolError(f"response is not a map: {resp!r}")
        got = resp.get("id")
        # Errors the server raises before it could read an id (too_large,
        # some bad_frame) carry id 0; they still answer this request.
        if got != req_id and not (got == 0 and "err" in resp):
            raise ProtocolError(f"expected response id {req_id}, got {got!r}")
        return resp

    @staticmethod
    def _result(resp: dict[str, Any]) -> Any:
        if "err" in resp:
            err = resp["err"]
            raise RankdError(str(err.get("code")), str(err.get("msg", "")))
        return resp.get("ok")

    # -- generic requests ---------------------------------------------------

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request map (without `id`) and return the raw response map."""
        req_id, frame = self._stamp(request)
        self._sock.sendall(frame)
        return self._read_response(req_id)

    def call(self, op: str, **fields: Any) -> Any:
        """Run `op` and return its `ok` result; raise RankdError on `err`.

        Fields whose value is None are dropped (that is how optional fields
        fall back to server defaults). Useful for ops this class doesn't wrap.
        """
        req = {"op": op, **{k: v for k, v in fields.items() if v is not None}}
        return self._result(self.request(req))

    def pipeline(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send every request before reading any response.

        Returns the raw response maps in request order; errors are returned,
        not raised, so one failed request doesn't hide the others' results.

        Sending happens on a helper thread while this thread reads: with a
        long pipeline the server's replies could otherwise fill the socket
        buffers while we are still blocked sending, and both sides would wait
        on each other forever. An SSL socket cannot be written and read from
        two threads at once, so over TLS the requests go in windows small
        enough for their replies to fit the buffers, each read before the next.
        """
        if self._tls:
            window = 128
            return [
                response
                for start in range(0, len(requests), window)
                for response in self._pipeline_in_turn(requests[start : start + window])
            ]
        stamped = [self._stamp(r) for r in requests]
        payload = b"".join(frame for _, frame in stamped)
        send_error: list[BaseException] = []

        def send() -> None:
            try:
                self._sock.sendall(payload)
            except BaseException as exc:  # re-raised on the caller's thread
                send_error.append(exc)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        try:
            responses = [self._read_response(req_id) for req_id, _ in stamped]
        finally:
            sender.join()
        if send_error:
            raise send_error[0]
        return responses

    def _pipeline_in_turn(self, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Send a few requests, then read their replies (one thread)."""
        stamped = [self._stamp(r) for r in requests]
        self._sock.sendall(b"".join(frame for _, frame in stamped))
        return [self._read_response(req_id) for req_id, _ in stamped]

    # -- operations ---------------------------------------------------------

    def ping(self) -> str:
        return self.call("ping")

    def auth(self, token: str) -> bool | dict[str, str]:
        """`True`, or `{"role": "read"|"write"}` on a server with token roles."""
        return self.call("auth", token=token)

    def create_board(
        self,
        board: str,
        order: str | None = None,
        ties: str | None = None,
        windows: list[str] | None = None,
        keep: int | None = None,
    ) -> bool:
        """True if created, False if it already existed with this config."""
        return self.call(
            "create_board", board=board, order=order, ties=ties, windows=windows, keep=keep
        )

    def drop_board(self, board: str) -> bool:
        return self.call("drop_board", board=board)

    def boards(self) -> list[dict[str, Any]]:
        return self.call("boards")

    def set(self, board: str, player: str, score: int, mode: str | None = None) -> int:
        """Write a score; returns the score stored (first window)."""
        return self.call("set", board=board, player=player, score=score, mode=mode)

    def set_many(
        self, board: str, entries: list[tuple[str, int]], mode: str | None = None
    ) -> list[int]:
        entries_list = [[player, score] for player, score in entries]
        return self.call("set_many", board=board, entries=entries_list, mode=mode)

    def get(
        self, board: str, player: str, window: str | None = None, period: int | None = None
    ) -> int | None:
        return self.call("get", board=board, player=player, window=window, period=period)

    def remove(self, board: str, player: str) -> bool:
        return self.call("remove", board=board, player=player)

    def count(self, board: str, window: str | None = None, period: int | None = None) -> int:
        return self.call("count", board=board, window=window, period=period)

    def rank(
        self, board: str, player: str, window: str | None = None, period: int | None = None
    ) -> dict[str, int] | None:
        """`{"rank", "score", "count"}`, or None if the player is absent."""
        return self.call("rank", board=board, player=player, window=window, period=period)

    def rank_of_score(
        self, board: str, score: int, window: str | None = None, period: int | None = None
    ) -> int:
        return self.call("rank_of_score", board=board, score=score, window=window, period=period)

    def top(
        self,
        board: str,
        limit: int | None = None,
        offset: int | None = None,
        window: str | None = None,
        period: int | None = None,
    ) -> list[dict[str, Any]]:
        """Entries `{"player", "score", "rank"}`, best first."""
        return self.call(
            "top", board=board, limit=limit, offset=offset, window=window, period=period
        )

    def around(
        self,
        board: str,
        player: str,
        before: int | None = None,
        after: int | None = None,
        window: str | None = None,
        period: int | None = None,
    ) -> list[dict[str, Any]]:
        """The player with up to `before` better and `after` worse neighbours."""
        return self.call(
            "around",
            board=board,
            player=player,
            before=before,
            after=after,
            window=window,
            period=period,
        )
