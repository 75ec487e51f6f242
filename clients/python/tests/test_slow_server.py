"""A real server that closes idle connections after a second and takes a
second to commit each write (`RANKD_SLOW_ADDR`): the client replaces a
connection the server closed; a write that outlives the timeout raises
`RankdTimeout` with `maybe_applied` (and indeed applies) when the client
does not retry writes, and is sent again with its `wid`, applying once,
when it does."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Dict, Optional

import pytest
from support import ENV, needs, open_client, split_addr, wait_for_server_close, wait_until, write

import rankd


def slow_options(**overrides: Any) -> Dict[str, Any]:
    needs(ENV.slow_addr, "RANKD_SLOW_ADDR")
    return {**split_addr(str(ENV.slow_addr)), **ENV.tls_options(), **overrides}


def test_a_connection_closed_while_idle_is_replaced(kind: str, board: Callable[[str], str]) -> None:
    with open_client(kind, **slow_options()) as db:
        assert db.ping() == "pong"
        wait_for_server_close(db)  # after the server's idle timeout
        name = board("idle")
        assert db.set(name, "p", 3) == 3, "the write went on a new connection"
        assert db.reconnects == 1


def test_async_a_connection_closed_while_the_loop_idles_is_replaced(board: Callable[[str], str]) -> None:
    async def main() -> None:
        async with rankd.AsyncClient(**slow_options()) as db:
            conn = db._conn
            assert conn is not None
            started = time.monotonic()
            while conn.failure is None:  # the reader task sees the server close
                assert time.monotonic() - started < 10, "the server closes idle connections"
                await asyncio.sleep(0.05)
            assert await db.set(board("idle_async"), "p", 4) == 4
            assert db.reconnects == 1

    asyncio.run(main())


def test_a_write_that_outlives_the_timeout(kind: str, board: Callable[[str], str]) -> None:
    name = board("timeout")
    with open_client(kind, **slow_options(timeout=0.5, retry_writes=False)) as db:
        started = time.monotonic()
        with pytest.raises(rankd.RankdTimeout) as late:
            db.set(name, "p", 42)
        assert time.monotonic() - started < 0.95, "raised at the timeout, not at the reply"
        assert late.value.maybe_applied
        assert db.ping() == "pong"
        assert db.reconnects == 1
    with open_client(kind, **slow_options()) as check:
        # It was in flight: it applies once committed, as maybe_applied warned.
        wait_until(lambda: check.get(name, "p") == 42, "the timed-out write to apply")


def test_a_write_that_outlives_the_timeout_is_sent_again_and_counts_once(
    kind: str, board: Callable[[str], str]
) -> None:
    name = board("retried")
    with open_client(kind, **slow_options(timeout=0.7, write_retries=4)) as db:
        wid: Optional[str]
        try:
            total, info = write(db, "set", name, "p", 5, mode="incr")
        except rankd.RankdTimeout as late:
            # (Every re-send timed out too: a server may commit each answer.)
            assert late.maybe_applied and late.wid is not None
            wid = late.wid
        else:
            assert total == 5, "the first send applied; a re-send answered its result"
            assert info is not None and info.sends > 1 and info.dup
            wid = info.wid
        assert db.reconnects >= 1
        assert wid is not None and len(wid) == 32
    with open_client(kind, **slow_options()) as check:
        wait_until(lambda: check.get(name, "p") == 5, "the write to apply")
        time.sleep(1.5)  # every send has committed or been refused by now
        assert check.get(name, "p") == 5, "applied once, though sent several times"


def test_async_a_late_write_fails_the_reads_behind_it_which_go_again(board: Callable[[str], str]) -> None:
    async def main() -> None:
        async with rankd.AsyncClient(**slow_options(timeout=0.5, retry_writes=False)) as db:
            late, pong = await asyncio.gather(
                db.set(board("late"), "p", 1), db.ping(), return_exceptions=True
            )
            assert isinstance(late, rankd.RankdTimeout) and late.maybe_applied
            assert pong == "pong"
            assert db.reconnects == 1

    asyncio.run(main())


def test_no_timeout_waits_for_the_reply(kind: str, board: Callable[[str], str]) -> None:
    with open_client(kind, **slow_options(timeout=None)) as db:
        assert db.set(board("patient"), "p", 5) == 5
