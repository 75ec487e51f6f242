"""The oracle smoke test (every op against a brute-force model) with the
blocking client and with the asyncio client."""

from __future__ import annotations

from typing import Callable

from smoke_scenario import Mismatch, Smoke
from support import ENV, AnyClient


def test_every_op_agrees_with_the_oracle(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    db = connect()
    smoke = Smoke(db, prefix=board("smoke") + "_", write_token=ENV.write_token)
    try:
        passed = smoke.run()
    except Mismatch as exc:
        raise AssertionError(f"{exc}\n(after {smoke.check.passed} checks passed)") from None
    assert passed > 4000, f"only {passed} checks ran"
