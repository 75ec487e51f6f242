"""The oracle smoke scenario (formerly examples/python/smoke.py): every op
on one connection, each answer compared with a brute-force model kept here
(`OracleBoard`). Run by test_smoke.py with both clients.

Boards are named with a prefix of the caller's, so runs can share a server.
"""

from __future__ import annotations

import difflib
import pprint
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from rankd import RankdError

SEED = 20240601
PLAYERS = 200
SCORE_MIN, SCORE_MAX = -5, 15  # small range, so there are plenty of ties
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

ORDERS = ("desc", "asc")
TIES = {"competition": "comp", "dense": "dense", "ordinal": "ord"}


class Mismatch(Exception):
    """The server's answer differs from the oracle's; the message holds the diff."""


class Checker:
    """Counts checks; stops at the first mismatch with a readable diff."""

    def __init__(self) -> None:
        self.passed = 0

    def eq(self, label: str, got: Any, want: Any) -> None:
        if got != want:
            got_text = pprint.pformat(got, width=100).splitlines()
            want_text = pprint.pformat(want, width=100).splitlines()
            diff = "\n".join(difflib.unified_diff(want_text, got_text, "expected", "server", lineterm=""))
            raise Mismatch(f"FAIL {label}\n{diff}")
        self.passed += 1

    def error(self, label: str, code: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Check that fn(...) raises RankdError with `code`."""
        try:
            result = fn(*args, **kwargs)
        except RankdError as exc:
            self.eq(label, exc.code, code)
        else:
            raise Mismatch(f"FAIL {label}\nexpected error {code!r}, got ok {result!r}")


@dataclass
class OracleBoard:
    """The expected state of one board, with ranks computed by brute force."""

    order: str = "desc"
    ties: str = "competition"
    scores: Dict[str, int] = field(default_factory=dict)
    # For ordinal ties: a sequence number of when each player reached its score.
    reached: Dict[str, int] = field(default_factory=dict)
    clock: int = 0

    def better(self, a: int, b: int) -> bool:
        """True if score `a` ranks strictly better than score `b`."""
        return a > b if self.order == "desc" else a < b

    def write(self, player: str, score: int, mode: str = "set") -> int:
        old = self.scores.get(player)
        if mode == "set" or (mode == "best" and old is None):
            new = score
        elif mode == "best" and old is not None:
            new = score if self.better(score, old) else old
        elif mode == "incr":
            new = (old or 0) + score
            if not I64_MIN <= new <= I64_MAX:
                raise OverflowError(player)
        else:
            raise ValueError(mode)
        if new != old:  # an unchanged score keeps its reach time
            self.clock += 1
            self.reached[player] = self.clock
        self.scores[player] = new
        return new

    def remove(self, player: str) -> bool:
        self.reached.pop(player, None)
        return self.scores.pop(player, None) is not None

    def rank_of_score(self, score: int) -> int:
        """Rank a newcomer with `score` would get."""
        others = self.scores.values()
        if self.ties == "competition":
            return 1 + sum(self.better(s, score) for s in others)
        if self.ties == "dense":
            return 1 + len({s for s in others if self.better(s, score)})
        return 1 + sum(self.better(s, score) or s == score for s in others)

    def rank_of(self, player: str) -> int:
        score = self.scores[player]
        if self.ties != "ordinal":
            return self.rank_of_score(score)
        mine = self.reached[player]
        return 1 + sum(
            self.better(s, score) or (s == score and self.reached[p] < mine) for p, s in self.scores.items()
        )

    def ordered(self) -> List[Dict[str, Any]]:
        """All entries best first, in the protocol's list order."""

        def key(player: str) -> Tuple[int, Any]:
            score = self.scores[player]
            tie = self.reached[player] if self.ties == "ordinal" else player.encode()
            return (-score if self.order == "desc" else score, tie)

        return [
            {"player": p, "score": self.scores[p], "rank": self.rank_of(p)}
            for p in sorted(self.scores, key=key)
        ]

    def rank(self, player: str) -> Dict[str, int] | None:
        if player not in self.scores:
            return None
        return {
            "rank": self.rank_of(player),
            "score": self.scores[player],
            "count": len(self.scores),
        }

    def top(self, limit: int = 10, offset: int = 0) -> List[Dict[str, Any]]:
        return self.ordered()[offset : offset + limit]

    def around(self, player: str, before: int = 5, after: int = 5) -> List[Dict[str, Any]]:
        entries = self.ordered()
        names = [e["player"] for e in entries]
        if player not in names:
            return []
        i = names.index(player)
        return entries[max(0, i - before) : i + after + 1]


def entries_of(items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Keep only the documented keys: servers may add new response fields."""
    return [{k: e.get(k) for k in ("player", "score", "rank")} for e in items]


def rank_of(result: Dict[str, Any] | None) -> Dict[str, Any] | None:
    return None if result is None else {k: result.get(k) for k in ("rank", "score", "count")}


def make_players(rng: random.Random) -> List[str]:
    """Distinct names whose byte order differs from numeric and insert order."""
    names: set[str] = {"Zed", "zed", "é-accent", "日本", "a.b:c-d_e"}
    while len(names) < PLAYERS:
        names.add(f"p{rng.randrange(10 ** rng.randrange(1, 6))}")
    players = sorted(names)
    rng.shuffle(players)
    return players


def random_score(rng: random.Random) -> int:
    return rng.randint(SCORE_MIN, SCORE_MAX)


class Smoke:
    """The test scenario: drives one connection and mirrors every write in an oracle."""

    def __init__(self, db: Any, prefix: str, write_token: Optional[str]) -> None:
        """`db`: a connected client (any kind with the blocking methods);
        `prefix`: the start of every board name used; `write_token`: the
        client's token, when the server holds token roles."""
        self.db = db
        self.prefix = prefix
        self.write_token = write_token
        self.check = Checker()
        self.players = make_players(random.Random(SEED))
        self.boards: Dict[str, OracleBoard] = {}  # board name -> expected state

    # -- helpers -------------------------------------------------------------

    def write(self, name: str, player: str, score: int, mode: str = "set") -> None:
        want = self.boards[name].write(player, score, mode)
        got = self.db.set(name, player, score, mode=mode)
        self.check.eq(f"{name}: set {player!r} {score} mode={mode}", got, want)

    def write_many(self, name: str, entries: List[Tuple[str, int]], mode: str = "set") -> None:
        oracle = self.boards[name]
        want = [oracle.write(p, s, mode) for p, s in entries]
        got = self.db.set_many(name, entries, mode=mode)
        self.check.eq(f"{name}: set_many {len(entries)} entries mode={mode}", got, want)

    # -- phases --------------------------------------------------------------

    def basics(self) -> None:
        self.check.eq("ping", self.db.ping(), "pong")
        if self.write_token is None:
            self.check.eq("auth without server token", self.db.auth("any-token"), True)
        else:
            self.check.eq("auth with a write token", self.db.auth(self.write_token), {"role": "write"})

    def create_boards(self) -> None:
        for order in ORDERS:
            for ties, short in TIES.items():
                name = f"{self.prefix}{short}_{order}"
                self.check.eq(f"create {name}", self.db.create_board(name, order=order, ties=ties), True)
                self.check.eq(
                    f"create {name} again, same config",
                    self.db.create_board(name, order=order, ties=ties),
                    False,
                )
                self.boards[name] = OracleBoard(order=order, ties=ties)
        self.check.error(
            "create with a different config",
            "conflict",
            self.db.create_board,
            f"{self.prefix}comp_desc",
            order="asc",
            ties="competition",
        )

    def populate(self, name: str) -> None:
        """The same deterministic write sequence goes to every board."""
        rng = random.Random(SEED + 1)
        first, rest = self.players[:150], self.players[150:]
        self.write_many(name, [(p, random_score(rng)) for p in first])
        for p in rest:
            self.write(name, p, random_score(rng))
        for _ in range(100):
            mode = rng.choice(["set", "best", "incr"])
            score = rng.randint(-3, 3) if mode == "incr" else random_score(rng)
            self.write(name, rng.choice(self.players), score, mode)
        # Writes that leave a score unchanged must not move ordinal reach time.
        oracle = self.boards[name]
        for p in rng.sample(self.players, 10):
            self.write(name, p, oracle.scores[p], "set")
            self.write(name, p, 0, "incr")
        self.write_many(name, [(p, random_score(rng)) for p in rng.sample(self.players, 40)], "best")
        self.write_many(name, [(p, rng.randint(-2, 2)) for p in rng.sample(self.players, 40)], "incr")
        # Remove some players; re-adding a few must count as reaching anew.
        removed = rng.sample(self.players, 20)
        for p in removed:
            self.check.eq(f"{name}: remove {p!r}", self.db.remove(name, p), oracle.remove(p))
        self.check.eq(f"{name}: remove absent", self.db.remove(name, removed[0]), False)
        for p in removed[:8]:
            self.write(name, p, random_score(rng), rng.choice(["set", "best", "incr"]))

    def verify_reads(self, name: str) -> None:
        oracle, db = self.boards[name], self.db
        present = sorted(oracle.scores)
        absent = [p for p in self.players if p not in oracle.scores] + ["nobody"]

        self.check.eq(f"{name}: count", db.count(name), len(oracle.scores))
        self.check.eq(
            f"{name}: count window=all period=0",
            db.count(name, window="all", period=0),
            len(oracle.scores),
        )
        for p in present:
            self.check.eq(f"{name}: get {p!r}", db.get(name, p), oracle.scores[p])
            self.check.eq(f"{name}: rank {p!r}", rank_of(db.rank(name, p)), oracle.rank(p))
        for p in absent:
            self.check.eq(f"{name}: get absent {p!r}", db.get(name, p), None)
            self.check.eq(f"{name}: rank absent {p!r}", db.rank(name, p), None)
        lo, hi = min(oracle.scores.values()), max(oracle.scores.values())
        for s in [I64_MIN, *range(lo - 1, hi + 2), I64_MAX]:
            self.check.eq(f"{name}: rank_of_score {s}", db.rank_of_score(name, s), oracle.rank_of_score(s))

        self.check.eq(f"{name}: top default", entries_of(db.top(name)), oracle.top())
        self.check.eq(f"{name}: top all", entries_of(db.top(name, limit=1000)), oracle.top(1000))
        for limit, offset in [(1, 0), (7, 0), (25, 13), (50, 150), (10, 1000)]:
            self.check.eq(
                f"{name}: top limit={limit} offset={offset}",
                entries_of(db.top(name, limit=limit, offset=offset)),
                oracle.top(limit, offset),
            )

        ordered = [e["player"] for e in oracle.ordered()]
        targets = [ordered[0], ordered[1], ordered[len(ordered) // 2], ordered[-2], ordered[-1]]
        for p in targets:
            self.check.eq(f"{name}: around {p!r}", entries_of(db.around(name, p)), oracle.around(p))
            for before, after in [(0, 0), (3, 7), (12, 0), (0, 12), (500, 500)]:
                self.check.eq(
                    f"{name}: around {p!r} before={before} after={after}",
                    entries_of(db.around(name, p, before=before, after=after)),
                    oracle.around(p, before, after),
                )
        self.check.eq(f"{name}: around absent", db.around(name, absent[0]), [])
        # A friends leaderboard: some present, some absent, one named twice.
        friends = targets + absent[:3] + [targets[0]]
        want = [e for e in oracle.ordered() if e["player"] in set(friends)]
        self.check.eq(f"{name}: ranks of {len(friends)} names", entries_of(db.ranks(name, friends)), want)

    def extremes(self) -> None:
        """The whole i64 range is valid; incr overflow is refused and changes nothing."""
        name = f"{self.prefix}extremes"
        self.check.eq(f"create {name}", self.db.create_board(name), True)
        self.boards[name] = OracleBoard()
        self.write(name, "max", I64_MAX)
        self.write(name, "min", I64_MIN)
        self.write(name, "zero", 0)
        self.check.error("incr overflow", "bad_request", self.db.set, name, "max", 1, mode="incr")
        self.check.error("incr underflow", "bad_request", self.db.set, name, "min", -1, mode="incr")
        self.check.eq("after overflow: max unchanged", self.db.get(name, "max"), I64_MAX)
        self.check.eq("after overflow: min unchanged", self.db.get(name, "min"), I64_MIN)
        self.check.eq(f"{name}: top", entries_of(self.db.top(name)), self.boards[name].top())

    def implicit_board(self) -> None:
        """The first write to an unknown board creates it with the default config."""
        name = f"{self.prefix}implicit"
        self.check.eq(f"{name}: count before creation", self.db.count(name), 0)
        self.check.eq(f"{name}: top before creation", self.db.top(name), [])
        self.boards[name] = OracleBoard()
        self.write(name, "solo", 42)
        self.check.eq(
            f"create {name} after implicit creation",
            self.db.create_board(name, order="desc", ties="competition", windows=["all"], keep=1),
            False,
        )

    def pipelining(self) -> None:
        name = f"{self.prefix}comp_desc"
        oracle = self.boards[name]
        rng = random.Random(SEED + 2)
        requests: List[Dict[str, Any]] = []
        expected: List[Any] = []
        for i in range(100):
            player = rng.choice(self.players)
            kind = i % 4
            if kind == 0:
                requests.append({"op": "ping"})
                expected.append("pong")
            elif kind == 1:
                requests.append({"op": "get", "board": name, "player": player})
                expected.append(oracle.scores.get(player))
            elif kind == 2:
                requests.append({"op": "rank", "board": name, "player": player})
                expected.append(oracle.rank(player))
            else:
                requests.append({"op": "count", "board": name})
                expected.append(len(oracle.scores))
        outcomes = self.db.pipeline(requests)
        self.check.eq("pipeline: outcome count", len(outcomes), len(requests))
        for i, (req, got, want) in enumerate(zip(requests, outcomes, expected)):
            if isinstance(got, RankdError):
                got = {"err": got.code}
            elif req["op"] == "rank":
                got = rank_of(got)
            self.check.eq(f"pipeline[{i}] {req['op']}", got, want)
        # An error in a pipeline is its own outcome, not the others'.
        mixed = self.db.pipeline([{"op": "ping"}, {"op": "no_such_op"}, {"op": "count", "board": name}])
        self.check.eq("pipeline: ok, error, ok", mixed[0::2], ["pong", len(oracle.scores)])
        self.check.eq("pipeline: the error", getattr(mixed[1], "code", mixed[1]), "unknown_op")

    def errors(self) -> None:
        name = f"{self.prefix}comp_desc"
        before = self.db.get(name, self.players[0])
        self.check.error("unknown op", "unknown_op", self.db.call, "no_such_op")
        self.check.error(
            "set with a string score",
            "bad_request",
            self.db.call,
            "set",
            board=name,
            player=self.players[0],
            score="12",
        )
        self.check.eq("ping after errors", self.db.ping(), "pong")
        self.check.eq("bad set changed nothing", self.db.get(name, self.players[0]), before)

    def list_boards(self) -> None:
        listed = {b.get("board"): b for b in self.db.boards() if str(b.get("board")).startswith(self.prefix)}
        want = {
            name: {
                "board": name,
                "order": o.order,
                "ties": o.ties,
                "windows": ["all"],
                "keep": 1,
                "count": len(o.scores),
            }
            for name, o in self.boards.items()
        }
        got = {
            name: {k: b.get(k) for k in ("board", "order", "ties", "windows", "keep", "count")}
            for name, b in listed.items()
        }
        self.check.eq("boards", got, want)

    def drop(self) -> None:
        name = f"{self.prefix}dense_asc"
        self.check.eq(f"drop {name}", self.db.drop_board(name), True)
        self.check.eq(f"drop {name} again", self.db.drop_board(name), False)
        self.check.eq("drop never-created board", self.db.drop_board(f"{self.prefix}never_created"), False)
        self.check.eq(f"{name}: count after drop", self.db.count(name), 0)
        self.check.eq(f"{name}: top after drop", self.db.top(name), [])
        self.check.eq(f"{name}: get after drop", self.db.get(name, self.players[0]), None)
        del self.boards[name]
        self.list_boards()

    def run(self) -> int:
        self.basics()
        self.create_boards()
        for name in list(self.boards):
            self.populate(name)
            self.verify_reads(name)
        self.extremes()
        self.implicit_board()
        self.pipelining()
        self.errors()
        self.list_boards()
        self.drop()
        return self.check.passed
