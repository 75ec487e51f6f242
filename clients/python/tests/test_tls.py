"""TLS and token roles, against a server with a certificate from
`RANKD_TLS_CA` (for `localhost`) holding `RANKD_WRITE_TOKEN` (write) and
`RANKD_READ_TOKEN` (read); with `RANKD_TLS_CLIENT_CERT`/`_KEY`, a server
that requires client certificates. (The other tests run over TLS too when
these are set.)"""

from __future__ import annotations

import ssl
from typing import Any, Callable, Dict

import pytest
from support import ENV, AnyClient, needs, open_client, split_addr, wait_for_server_close

import rankd


def tls_with_tokens() -> None:
    needs(ENV.tls_ca, "RANKD_TLS_CA")
    needs(ENV.write_token, "RANKD_WRITE_TOKEN")
    needs(ENV.read_token, "RANKD_READ_TOKEN")


def options(**overrides: Any) -> Dict[str, Any]:
    return {**split_addr(str(ENV.addr)), **ENV.tls_options(), **overrides}


def assert_cannot_connect(kind: str, **overrides: Any) -> rankd.RankdConnectionError:
    """Connecting with `overrides` fails, at once or at the first call (a
    refused client certificate shows after a TLS 1.3 handshake)."""
    with pytest.raises(rankd.RankdConnectionError) as failure:
        with open_client(kind, **options(**overrides)) as db:
            db.ping()
    return failure.value


def test_auth_answers_the_tokens_role(kind: str, connect: Callable[..., AnyClient]) -> None:
    tls_with_tokens()
    writer = connect(token=ENV.write_token)
    assert writer.auth(str(ENV.write_token)) == {"role": "write"}
    reader = connect(token=ENV.read_token)
    assert reader.auth(str(ENV.read_token)) == {"role": "read"}


def test_a_read_token_reads_and_cannot_write(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    tls_with_tokens()
    name = board("roles")
    writer = connect(token=ENV.write_token)
    assert writer.set(name, "alice", 10) == 10
    reader = connect(token=ENV.read_token)
    assert reader.get(name, "alice") == 10
    assert reader.rank(name, "alice") == {"rank": 1, "score": 10, "count": 1}
    for write in (
        lambda: reader.set(name, "bob", 5),
        lambda: reader.set_many(name, [("bob", 5)]),
        lambda: reader.remove(name, "alice"),
        lambda: reader.create_board(board("nope")),
        lambda: reader.drop_board(name),
    ):
        with pytest.raises(rankd.RankdError) as refused:
            write()
        assert refused.value.code == "unauthorized"
    assert reader.ping() == "pong" and reader.reconnects == 0
    assert writer.count(name) == 1


def test_without_a_token_only_ping_and_auth_are_served(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    tls_with_tokens()
    db = connect(token=None)
    assert db.ping() == "pong"
    with pytest.raises(rankd.RankdError) as refused:
        db.count(board("anon"))
    assert refused.value.code == "unauthorized"
    assert db.auth(str(ENV.read_token)) == {"role": "read"}
    assert db.count(board("anon")) == 0


def test_a_wrong_token_is_refused_at_connect(kind: str) -> None:
    tls_with_tokens()
    with pytest.raises(rankd.RankdError) as refused:
        open_client(kind, **options(token="not-a-token"))
    assert refused.value.code == "unauthorized"


def test_the_third_failed_auth_closes_and_the_client_comes_back_with_its_token(
    connect: Callable[..., AnyClient], board: Callable[[str], str]
) -> None:
    tls_with_tokens()
    db = connect(token=ENV.write_token)
    for _ in range(3):
        with pytest.raises(rankd.RankdError) as refused:
            db.auth("guess")
        assert refused.value.code == "unauthorized"
    wait_for_server_close(db)
    name = board("after_lockout")
    assert db.set(name, "p", 1) == 1, "a new connection, authenticated with the write token"
    assert db.reconnects == 1


def test_a_certificate_from_another_ca_is_refused(kind: str) -> None:
    needs(ENV.tls_ca, "RANKD_TLS_CA")
    # The system's roots do not include the test CA.
    failure = assert_cannot_connect(kind, ca_file=None, tls=True)
    assert isinstance(failure.__cause__, ssl.SSLCertVerificationError)


def test_a_certificate_for_another_name_is_refused(kind: str) -> None:
    needs(ENV.tls_ca, "RANKD_TLS_CA")
    failure = assert_cannot_connect(kind, server_hostname="not-rankd.example")
    assert isinstance(failure.__cause__, ssl.SSLCertVerificationError)


def test_the_address_itself_is_a_name_the_certificate_carries(kind: str) -> None:
    needs(ENV.tls_ca, "RANKD_TLS_CA")
    with open_client(kind, **options(server_hostname=None, token=ENV.write_token)) as db:
        assert db.ping() == "pong"  # 127.0.0.1 is in the test certificate


def test_a_plaintext_client_gets_no_answer_from_a_tls_port(kind: str) -> None:
    needs(ENV.tls_ca, "RANKD_TLS_CA")
    with pytest.raises(rankd.RankdConnectionError):
        with open_client(kind, **split_addr(str(ENV.addr)), timeout=5) as db:
            db.ping()


def test_mutual_tls_needs_the_client_certificate(kind: str) -> None:
    needs(ENV.tls_ca, "RANKD_TLS_CA")
    needs(ENV.client_cert, "RANKD_TLS_CLIENT_CERT")
    with open_client(kind, **options(token=ENV.write_token)) as db:
        assert db.ping() == "pong"
    assert_cannot_connect(kind, certfile=None, keyfile=None, token=ENV.write_token)
