"""A live leaderboard with the `rankd` package (clients/python): one task
watches the top 5 of a board, pushed by the server as it changes, while
another posts match results, each with a write id (`wid`) so that a result
sent again (a retry, a replayed message) counts once.

    pip install ./clients/python
    RANKD_SERVER=127.0.0.1:7070 python3 examples/python/live_top.py

(`RANKD_TOKEN` too, if the server wants one.) Needs a server that speaks
protocol 1.1's watches and wids.
"""

import asyncio
import os
import random
import uuid

import rankd


async def show(watch: "rankd.AsyncWatch[rankd.TopEvent]") -> None:
    # Each event is the whole top 5; pushes stop coming once nothing changes.
    async for entries in watch.events(timeout=1.0):
        if entries is None:
            print("the board was dropped")
            return
        print("  ".join(f"#{e['rank']} {e['player']} {e['score']}" for e in entries))


async def main() -> None:
    host, port = os.environ.get("RANKD_SERVER", "127.0.0.1:7070").rsplit(":", 1)
    async with rankd.AsyncClient(host, int(port), token=os.environ.get("RANKD_TOKEN")) as db:
        board = f"example_live_{uuid.uuid4().hex[:8]}"
        async with await db.watch(board, top=5, interval_ms=200) as watch:
            shown = asyncio.create_task(show(watch))
            rng = random.Random(7)
            for match in range(40):
                player, points = f"player{rng.randrange(12):02}", rng.randrange(1, 30)
                wid = f"match-{match}"
                await db.set(board, player, points, mode="incr", wid=wid)
                if match % 10 == 0:  # the same result posted twice: counted once
                    await db.set(board, player, points, mode="incr", wid=wid)
                    assert db.last_dup
                await asyncio.sleep(0.02)
            await shown
            assert watch.active
        top = await db.top(board, limit=5)
        print("final:", "  ".join(f"#{e['rank']} {e['player']} {e['score']}" for e in top))
        await db.drop_board(board)


if __name__ == "__main__":
    asyncio.run(main())
