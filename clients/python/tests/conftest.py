"""Fixtures: clients of both kinds for `RANKD_ADDR`, and board names of
each test's own (see support.py for the environment the tests read)."""

from __future__ import annotations

import itertools
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
from support import ENV, KINDS, AnyClient, needs, open_client, split_addr


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def connect(kind: str) -> Iterator[Callable[..., AnyClient]]:
    """Opens clients of this test's kind to `RANKD_ADDR`, with the TLS
    options and the write token (unless given others), closing them at the
    end. Keyword arguments override the defaults; `addr=` another server."""
    needs(ENV.addr, "RANKD_ADDR")
    opened: List[AnyClient] = []

    def open_one(addr: Optional[str] = None, **overrides: Any) -> AnyClient:
        options: Dict[str, Any] = {**split_addr(addr or str(ENV.addr)), **ENV.tls_options()}
        if addr is None and ENV.write_token is not None:
            options["token"] = ENV.write_token
        options.update(overrides)
        client = open_client(kind, **options)
        opened.append(client)
        return client

    yield open_one
    for client in opened:
        client.close()


_boards = itertools.count()


@pytest.fixture
def board() -> Callable[[str], str]:
    """Board names no other test (or run) uses: `board("arena")`."""
    run = uuid.uuid4().hex[:8]

    def name(base: str = "b") -> str:
        return f"py{run}_{next(_boards)}_{base}"

    return name
