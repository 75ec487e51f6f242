"""A game service's side of rankd, with the `rankd` package (clients/python):
results of 500 matches posted at once by the asyncio client (each adds the
points won to the player's season total), then one player's rank and the
players around them.

    pip install ./clients/python
    RANKD_SERVER=127.0.0.1:7070 python3 examples/python/leaderboard.py

(`RANKD_TOKEN` too, if the server wants one.)
"""

import asyncio
import os
import random

import rankd


async def main() -> None:
    host, port = os.environ.get("RANKD_SERVER", "127.0.0.1:7070").rsplit(":", 1)
    async with rankd.AsyncClient(host, int(port), token=os.environ.get("RANKD_TOKEN")) as db:
        board = "example_season"
        await db.drop_board(board)  # start the season afresh on every run
        rng = random.Random(7)
        matches = [(f"player{rng.randrange(50):02}", rng.randrange(1, 30)) for _ in range(500)]
        # One task per match: the requests are pipelined on the one connection.
        await asyncio.gather(*(db.set(board, player, points, mode="incr") for player, points in matches))
        me = await db.rank(board, "player07")
        assert me is not None
        print(f"player07: #{me['rank']} of {me['count']} with {me['score']} points")
        for entry in await db.around(board, "player07", before=2, after=2):
            print(f"{entry['rank']:>4}  {entry['player']}  {entry['score']}")


if __name__ == "__main__":
    asyncio.run(main())
