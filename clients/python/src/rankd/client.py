"""The blocking client: `rankd.Client`, the public face of a
`_sync_session.SyncSession` (which runs the calls)."""

from __future__ import annotations

import ssl
from types import TracebackType
from typing import (
    Any,
    Callable,
    Iterable,
    List,
    Literal,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
    cast,
    overload,
)

from . import _requests, _resend, _wire
from ._sync_session import SyncSession
from ._sync_watch import Watch
from .types import (
    ApproxRank,
    ApproxRankOfScore,
    Auth,
    Board,
    Entry,
    Field,
    Mode,
    Order,
    PlayerEvent,
    Rank,
    Score,
    Scores,
    Ties,
    TopEvent,
    Window,
    WriteInfo,
)

__all__ = ["Client", "Watch"]


class Client(SyncSession):
    """A blocking connection to a rankd server.

    Connects (and runs `auth` with `token`) when created; raises
    `RankdConnectionError` if it cannot connect, `RankdError` if the token
    is refused. Calls take turns on one connection (a lock makes a client
    safe to share between threads); `pipeline` sends many requests before
    reading their replies; `watch` follows a board's top or a player's rank
    as the server pushes them; `AsyncClient` has the same methods for asyncio.

    Optional arguments left as None are not sent, so the server's defaults
    apply.

    Args:
        host, port: the server (default 127.0.0.1:7070).
        timeout: seconds to wait for each reply (default 30; None waits
            forever). A reply that does not come in time raises
            `RankdTimeout` and closes the connection.
        connect_timeout: seconds for the TCP connection and the TLS handshake
            (default: `timeout`).
        tls: speak TLS, trusting the system's root certificates; or an
            `ssl.SSLContext` to use as it is.
        ca_file: PEM file of the certificate authority to trust instead
            (implies TLS).
        server_hostname: the name the server's certificate must carry
            (default `host`).
        certfile, keyfile: a client certificate and its key, for a server
            requiring mutual TLS (implies TLS).
        token: `auth` with it right after connecting, and after every
            reconnection.
        retry_writes: give every `set`, `set_many` and `remove` without a
            `wid` a fresh one (a random UUID's 32 hex digits), and send a
            write carrying a `wid` again, with the same `wid`, after its reply
            timed out or its connection was lost (on a new connection), or
            after the server answered it `overloaded` or `internal` (on the
            same one): the server applies it at most once (protocol 1.1; a
            version-1 server ignores `wid`, so turn this off there).
            Default True.
        write_retries: how many times at most such a write is sent again
            (default 3), each after a random wait between half and all of
            0.1 s, then 0.2, 0.4, ... (at most 2 s); each attempt waits up
            to `timeout` for its reply.
        retry_deadline: seconds after a write's first send past which it is
            not sent again, whatever `write_retries` says (default 60; also
            with `timeout=None`). Over 300, or not positive, raises
            ValueError: the server remembers a `wid` for its dedup horizon
            (10 minutes by default), and a write sent again after that may
            apply twice.
        max_frame: the longest request, in bytes of its msgpack body, the
            client sends (default 1048576, the server's default
            `--max-frame`). A longer one raises `RankdError("too_large")`
            without being sent (a server closes the connection on it);
            the connection stays usable.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 7070,
        *,
        timeout: Optional[float] = 30.0,
        connect_timeout: Optional[float] = None,
        tls: Union[bool, ssl.SSLContext] = False,
        ca_file: Optional[str] = None,
        server_hostname: Optional[str] = None,
        certfile: Optional[str] = None,
        keyfile: Optional[str] = None,
        token: Optional[str] = None,
        retry_writes: bool = True,
        write_retries: int = 3,
        retry_deadline: float = 60.0,
        max_frame: int = _wire.MAX_FRAME,
    ) -> None:
        _resend.check(write_retries, retry_deadline)
        settings = _wire.Settings.make(
            host,
            port,
            timeout=timeout,
            connect_timeout=connect_timeout,
            tls=tls,
            ca_file=ca_file,
            server_hostname=server_hostname,
            certfile=certfile,
            keyfile=keyfile,
            max_frame=max_frame,
        )
        super().__init__(
            settings,
            token=token,
            retry_writes=retry_writes,
            write_retries=write_retries,
            retry_deadline=retry_deadline,
        )

    # -- connection ---------------------------------------------------------

    def close(self) -> None:
        """Closes the connection and ends every watch; later calls raise
        `RankdConnectionError`."""
        self._close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc: Optional[BaseException],
        tb: Optional[TracebackType],
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "connected" if self._conn is not None else "disconnected"
        tls = " tls" if self._settings.ssl_context is not None else ""
        return f"<rankd.Client {self._settings.address}{tls} {state}>"

    @property
    def last_write(self) -> Optional[WriteInfo]:
        """How the last write call answered by the server (`set`, `set_many`,
        `remove`, or `call` of one of them) made *by this thread* went: its
        `wid`, whether the server answered it as a duplicate (`dup`), and how
        many times it was sent. None before the first. (Per thread, so
        threads sharing the client each see their own.)"""
        return self._last_write.get()

    @property
    def last_dup(self) -> bool:
        """Whether this thread's last write was answered `"dup": true`: the
        server had already applied its (board, wid) and changed nothing."""
        info = self._last_write.get()
        return info is not None and info.dup

    # -- generic requests ---------------------------------------------------

    def call(self, op: str, **fields: Any) -> Any:
        """Runs `op` with `fields` and returns its result; raises `RankdError`
        if the server answers an error. Fields that are None are not sent.
        For ops (and fields) that have no method. (A `set`, `set_many` or
        `remove` gets a `wid` with `retry_writes`, as from its method.)"""
        return self._call(_wire.request(op, **fields))

    def pipeline(self, requests: Sequence[Mapping[str, Any]]) -> List[Any]:
        """Sends every request (maps like `{"op": "get", "board": "b",
        "player": "p"}`, without `id`) before reading the replies, and
        returns their outcomes in order: each the result, or the `RankdError`
        the server answered (returned, not raised, so one failed request
        does not hide the others' results). The requests are sent as they
        are, except that with `retry_writes` each `set`, `set_many` and
        `remove` without a `wid` gets one (in a copy). A transport failure
        raises `RankdConnectionError`, whose `results` and `wids` (each
        request's `wid`, or None) tell what was answered and which writes."""
        return self._run(list(requests))

    # -- operations ---------------------------------------------------------

    def ping(self) -> str:
        """`"pong"`."""
        return cast(str, self._call(_requests.ping()))

    def auth(self, token: str) -> Auth:
        """Authenticates this connection; the client re-authenticates with
        `token` after every reconnection. `True`, or `{"role": "read"|"write"}`
        on a server with token roles; `RankdError("unauthorized")` if refused
        (the third refusal on one connection closes it)."""
        # Stored first: should this call have to reconnect, the new
        # connection presents this token, not one it replaces (perhaps
        # revoked meanwhile). Put back if refused.
        previous, self._token = self._token, token
        try:
            return cast(Auth, self._call(_requests.auth(token)))
        except BaseException:
            self._token = previous
            raise

    def create_board(
        self,
        board: str,
        *,
        order: Optional[Order] = None,
        ties: Optional[Ties] = None,
        windows: Optional[Sequence[Window]] = None,
        keep: Optional[int] = None,
        fields: Optional[Sequence[Field]] = None,
    ) -> bool:
        """True if created, False if it already existed with this config
        (`RankdError("conflict")` if with another). `fields` (2 to 4
        `{"name", "order", "min", "max"}` dicts, ranked in turn) makes a
        board of composite scores, whose scores are dicts `{field: int}`
        in every call and result (its `order` is then ignored)."""
        req = _requests.create_board(board, order=order, ties=ties, windows=windows, keep=keep, fields=fields)
        return cast(bool, self._call(req))

    def drop_board(self, board: str) -> bool:
        """True if the board existed. Its watches get a last push of None
        and end."""
        return cast(bool, self._call(_requests.drop_board(board)))

    def boards(
        self, prefix: Optional[str] = None, *, after: Optional[str] = None, limit: Optional[int] = None
    ) -> List[Board]:
        """One page of boards with their configs and counts, in byte order
        of their names: those whose name starts with `prefix`, after the
        board named `after`, at most `limit` (1 to 10 000; the server's
        default, 1000). Ask again with `after` set to the last name until a
        page comes back shorter than `limit`, or call `all_boards`."""
        return cast(List[Board], self._call(_requests.boards(prefix, after=after, limit=limit)))

    def all_boards(self, prefix: Optional[str] = None, *, page: int = 1000) -> List[Board]:
        """Every board whose name starts with `prefix`, asked for `page` at a
        time (a server may hold millions: see `boards`)."""
        found: List[Board] = []
        after: Optional[str] = None
        while True:
            got = self.boards(prefix, after=after, limit=page)
            found.extend(got)
            after = _requests.next_page(got, page)
            if after is None:
                return found

    @overload
    def set(
        self, board: str, player: str, score: int, *, mode: Optional[Mode] = None, wid: Optional[str] = None
    ) -> int: ...

    @overload
    def set(
        self,
        board: str,
        player: str,
        score: Mapping[str, int],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> Scores: ...

    def set(
        self,
        board: str,
        player: str,
        score: Union[int, Mapping[str, int]],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> Score:
        """Writes a score; returns the score stored (in the board's first
        window). On a board with fields, `score` is a dict `{field: int}`
        (every field for `"set"` and `"best"`; `"incr"` adds those given)
        and so is the result. `wid` (1-64 bytes, never repeated for another write on the
        board) makes the write apply at most once; with `retry_writes` the
        client picks one when it is not given. `last_write` tells whether
        the server answered it as a duplicate."""
        return cast(Score, self._call(_requests.set(board, player, score, mode=mode, wid=wid)))

    def set_many(
        self,
        board: str,
        entries: Union[Mapping[str, Score], Iterable[Tuple[str, Score]]],
        *,
        mode: Optional[Mode] = None,
        wid: Optional[str] = None,
    ) -> List[Any]:
        """Writes up to 10 000 `(player, score)` pairs (or a dict) in one
        request; returns the stored scores in entry order (dicts on a board
        with fields). `wid` as for `set`."""
        return cast(List[int], self._call(_requests.set_many(board, entries, mode=mode, wid=wid)))

    def remove(self, board: str, player: str, *, wid: Optional[str] = None) -> bool:
        """True if the player was on the board. `wid` as for `set`."""
        return cast(bool, self._call(_requests.remove(board, player, wid=wid)))

    # -- watches ------------------------------------------------------------

    @overload
    def watch(
        self,
        board: str,
        *,
        top: int,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[TopEvent], object]] = None,
    ) -> Watch[TopEvent]: ...

    @overload
    def watch(
        self,
        board: str,
        *,
        player: str,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[PlayerEvent], object]] = None,
    ) -> Watch[PlayerEvent]: ...

    def watch(
        self,
        board: str,
        *,
        top: Optional[int] = None,
        player: Optional[str] = None,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        interval_ms: Optional[int] = None,
        buffer: int = 1,
        callback: Optional[Callable[[Any], object]] = None,
    ) -> Watch[Any]:
        """Follows a board's best `top` (1-100) entries, or one `player`'s
        rank: the server pushes the current value at once, then each new one
        when it changes (at most once per `interval_ms`, 10-60000, default
        100). Returns a `Watch`: iterate it (`for event in w`), or take
        events with `w.get(timeout)`; or give `callback`, which a thread of
        the watch's own calls with each event.

        A `top` event is the list `top` would answer; a `player` event what
        `rank` would answer, or None while the player is absent. When the
        board is dropped, a `top` watch gets None and ends.

        `buffer`: how many unread events the watch keeps; when full, the
        oldest goes (each event is a whole state, so the newest is what
        matters). A connection holds at most 64 watches (then
        `RankdError("too_large")`). If the connection is lost, the watch
        asks again on a new one when next waited on; its first event there
        is the current state."""
        req = _requests.watch(
            board, top=top, player=player, window=window, period=period, interval_ms=interval_ms
        )
        watch: Watch[Any] = Watch(self, req, buffer)
        self._follow(watch)
        if callback is not None:
            watch._start(callback)
        return watch

    def unwatch(self, watch: Watch[Any]) -> bool:
        """Ends `watch`: True if the server had it active. Events it received
        before can still be taken. (A watch whose connection was lost, or
        whose board was dropped, is ended without asking: False.)"""
        return self._unwatch(watch)

    def get(
        self, board: str, player: str, *, window: Optional[Window] = None, period: Optional[int] = None
    ) -> Optional[int]:
        """The player's score (a dict on a board with fields), or None."""
        req = _requests.get(board, player, window=window, period=period)
        return cast(Optional[int], self._call(req))

    def count(self, board: str, *, window: Optional[Window] = None, period: Optional[int] = None) -> int:
        """The number of players."""
        return cast(int, self._call(_requests.count(board, window=window, period=period)))

    @overload
    def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[False] = ...,
    ) -> Optional[Rank]: ...

    @overload
    def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[True],
    ) -> Optional[ApproxRank]: ...

    def rank(
        self,
        board: str,
        player: str,
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        approx: bool = False,
    ) -> Union[Optional[Rank], Optional[ApproxRank]]:
        """`{"rank", "score", "count"}`, or None if the player is absent.

        With `approx=True`, an estimate from the board's bucket summary
        (no fan-out over the shards): `{"rank", "score", "count", "error"}`,
        the exact rank lying within `rank ± error` as of the summary. A dense
        board refuses it (`bad_request`)."""
        req = _requests.rank(board, player, window=window, period=period, approx=approx)
        return cast(Union[Optional[Rank], Optional[ApproxRank]], self._call(req))

    @overload
    def rank_of_score(
        self,
        board: str,
        score: int,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[False] = ...,
    ) -> int: ...

    @overload
    def rank_of_score(
        self,
        board: str,
        score: int,
        *,
        window: Optional[Window] = ...,
        period: Optional[int] = ...,
        approx: Literal[True],
    ) -> ApproxRankOfScore: ...

    def rank_of_score(
        self,
        board: str,
        score: Union[int, Mapping[str, int]],
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
        approx: bool = False,
    ) -> Union[int, ApproxRankOfScore]:
        """The rank a new player with `score` would get (a dict with every
        field on a board with fields).

        With `approx=True`, `{"rank", "error"}` from the board's bucket
        summary alone: the exact rank lies within `rank ± error`."""
        req = _requests.rank_of_score(board, score, window=window, period=period, approx=approx)
        return cast(Union[int, ApproxRankOfScore], self._call(req))

    def top(
        self,
        board: str,
        *,
        limit: Optional[int] = None,
        offset: Optional[int] = None,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """`limit` entries (default 10, at most 1000) from `offset`, best first."""
        req = _requests.top(board, limit=limit, offset=offset, window=window, period=period)
        return cast(List[Entry], self._call(req))

    def around(
        self,
        board: str,
        player: str,
        *,
        before: Optional[int] = None,
        after: Optional[int] = None,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """The player with up to `before` better and `after` worse neighbours
        (default 5 each, at most 500); empty if the player is absent."""
        req = _requests.around(board, player, before=before, after=after, window=window, period=period)
        return cast(List[Entry], self._call(req))

    def ranks(
        self,
        board: str,
        players: Sequence[str],
        *,
        window: Optional[Window] = None,
        period: Optional[int] = None,
    ) -> List[Entry]:
        """Where `players` (1 to 1000 names) stand: those with a score, each
        once, best first, with their board-wide ranks: a friends leaderboard
        in one call (protocol 1.1)."""
        req = _requests.ranks(board, players, window=window, period=period)
        return cast(List[Entry], self._call(req))
