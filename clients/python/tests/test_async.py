"""What only the asyncio client does: many tasks calling at once on one
connection, their requests pipelined, each answered with its own reply."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict

from support import ENV, needs, split_addr

import rankd


def options() -> Dict[str, Any]:
    needs(ENV.addr, "RANKD_ADDR")
    return {**split_addr(str(ENV.addr)), **ENV.tls_options(), "token": ENV.write_token}


def test_concurrent_calls_share_one_connection(board: Callable[[str], str]) -> None:
    name = board("concurrent")

    async def main() -> None:
        async with rankd.AsyncClient(**options()) as db:
            stored = await asyncio.gather(*(db.set(name, f"p{i:04}", i) for i in range(1000)))
            assert stored == list(range(1000))
            ranks = await asyncio.gather(*(db.rank(name, f"p{i:04}") for i in range(0, 1000, 100)))
            assert [r["rank"] if r else None for r in ranks] == [1000 - i for i in range(0, 1000, 100)]
            assert await db.count(name) == 1000
            top = await db.top(name, limit=3)
            assert [(e["player"], e["score"], e["rank"]) for e in top] == [
                ("p0999", 999, 1),
                ("p0998", 998, 2),
                ("p0997", 997, 3),
            ]
            assert db.reconnects == 0

    asyncio.run(main())


def test_writes_on_one_connection_apply_in_the_order_sent(board: Callable[[str], str]) -> None:
    name = board("order")

    async def main() -> None:
        async with rankd.AsyncClient(**options()) as db:
            await db.create_board(name, ties="ordinal")
            # Equal scores on an ordinal board rank by who reached them first:
            # the order the calls were made, though all run at once.
            await asyncio.gather(*(db.set(name, f"p{i}", 7) for i in (3, 1, 4, 0, 2)))
            assert [e["player"] for e in await db.top(name)] == ["p3", "p1", "p4", "p0", "p2"]
            totals = await asyncio.gather(*(db.set(name, "sum", 1, mode="incr") for _ in range(200)))
            assert totals == list(range(1, 201))

    asyncio.run(main())


def test_an_error_fails_only_its_own_call(board: Callable[[str], str]) -> None:
    name = board("own_error")

    async def main() -> None:
        async with rankd.AsyncClient(**options()) as db:
            outcomes = await asyncio.gather(
                db.set(name, "a", 1),
                db.call("fly"),
                db.top(name, limit=1001),
                db.get(name, "a"),
                return_exceptions=True,
            )
            assert outcomes[0] == 1 and outcomes[3] == 1
            assert [getattr(o, "code", o) for o in outcomes[1:3]] == ["unknown_op", "bad_request"]

    asyncio.run(main())


def test_a_pipeline_beside_other_calls(board: Callable[[str], str]) -> None:
    name = board("pipeline")

    async def main() -> None:
        async with rankd.AsyncClient(**options()) as db:
            writes = [{"op": "set", "board": name, "player": f"p{i}", "score": i} for i in range(5000)]
            stored, pong = await asyncio.gather(db.pipeline(writes), db.ping())
            assert stored == list(range(5000)) and pong == "pong"
            assert await db.count(name) == 5000

    asyncio.run(main())
