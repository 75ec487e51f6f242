"""`boards` answers in pages (protocol 1.1): a page is at most `limit`
long, starts after `after`, keeps to `prefix`; `all_boards` walks them."""

from __future__ import annotations

from typing import Callable

from support import AnyClient


def test_boards_come_in_pages_and_all_boards_walks_them(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    db = connect()
    prefix = board("pages") + "_"
    names = [f"{prefix}{i}" for i in range(5)]
    for name in names:
        db.set(name, "p", 1)
    first = db.boards(prefix, limit=2)
    assert [b["board"] for b in first] == names[:2]
    second = db.boards(prefix, after=first[-1]["board"], limit=2)
    assert [b["board"] for b in second] == names[2:4]
    last = db.boards(prefix, after=second[-1]["board"], limit=2)
    assert [b["board"] for b in last] == names[4:], "a short page: the last"
    assert [b["board"] for b in db.all_boards(prefix, page=2)] == names
    assert all(b["count"] == 1 for b in db.all_boards(prefix, page=3))
    assert db.boards(prefix + "nothing") == []
