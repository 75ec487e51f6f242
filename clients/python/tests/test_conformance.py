"""The shared conformance steps (`clients/conformance/cases.json` in the
rankd repository, or the file `RANKD_CONFORMANCE_CASES` names), which every
client runs: in order, on one connection, against a fresh server without a
token (`RANKD_CONFORMANCE_ADDR`; its first address for `Client`, its second
for `AsyncClient`).

Each step is `{"name", "request": <op map without id>}` and either `"ok":
<result>`, compared by deep equality (integers by value, `true` is not
`1`), or `"err": <code>`. Requests go out exactly as written (through
`pipeline`, which adds only the id: `retry_writes` is off, so writes get
no `wid` of the client's).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List

import pytest
from support import ENV, needs, open_client, split_addr

import rankd

CASES = Path(
    os.environ.get("RANKD_CONFORMANCE_CASES")
    or Path(__file__).resolve().parents[2] / "conformance" / "cases.json"
)


def same(got: Any, want: Any) -> bool:
    """Deep equality of a decoded reply and a JSON value, types included."""
    if isinstance(want, bool) or isinstance(got, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(want, int):
        return isinstance(got, int) and got == want
    if isinstance(want, float):
        return isinstance(got, (int, float)) and got == want
    if want is None or isinstance(want, str):
        return type(got) is type(want) and got == want
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return (
            isinstance(got, dict) and got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
        )
    return False


def test_same_is_strict() -> None:
    assert same({"a": [1, None, "x"]}, {"a": [1, None, "x"]})
    assert same(2**64 - 1, 2**64 - 1)
    assert not same(1, True) and not same(True, 1) and not same(0, None) and not same("1", 1)
    assert not same({"a": 1, "b": 2}, {"a": 1}) and not same([1], [1, 1])


def load_steps() -> List[Dict[str, Any]]:
    if not CASES.exists():
        pytest.skip(f"no conformance steps at {CASES}")
    cases = json.loads(CASES.read_text(encoding="utf-8"))
    assert cases.get("version") == 1, f"{CASES}: a version this runner does not know"
    steps: List[Dict[str, Any]] = cases["steps"]
    for step in steps:
        assert isinstance(step.get("request"), dict) and ("ok" in step) != ("err" in step), (
            f"a malformed step: {step}"
        )
    return steps


@pytest.mark.parametrize("server", [0, 1], ids=["blocking", "async"])
def test_the_conformance_steps(server: int) -> None:
    steps = load_steps()
    needs(ENV.conformance_addrs, "RANKD_CONFORMANCE_ADDR")
    needs(len(ENV.conformance_addrs) > server, "a second address in RANKD_CONFORMANCE_ADDR (for AsyncClient)")
    kind = ["blocking", "async"][server]
    addr = ENV.conformance_addrs[server]
    failures: List[str] = []
    with open_client(kind, **split_addr(addr), **ENV.tls_options(), retry_writes=False) as db:
        for number, step in enumerate(steps, 1):
            try:
                (outcome,) = db.pipeline([step["request"]])
            except rankd.RankdConnectionError as exc:
                outcome = exc
            if "err" in step:
                got_code = outcome.code if isinstance(outcome, rankd.RankdError) else None
                if got_code != step["err"]:
                    want = f"error {step['err']!r}"
                    failures.append(f"step {number} {step['name']!r}: expected {want}, got {outcome!r:.300}")
            elif isinstance(outcome, Exception) or not same(outcome, step["ok"]):
                failures.append(
                    f"step {number} {step['name']!r}: expected {step['ok']!r:.300}, got {outcome!r:.300}"
                )
        assert db.reconnects == 0, "every step ran on one connection"
    assert not failures, f"{len(failures)} of {len(steps)} steps failed:\n" + "\n".join(failures)
