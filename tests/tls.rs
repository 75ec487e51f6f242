//! TLS on the client port against the real server, with certificates made
//! at test time (a CA, a server certificate for `localhost` and 127.0.0.1
//! signed by it, client certificates for mutual TLS): every op of the
//! protocol round-trips over TLS 1.2 and 1.3; a plaintext client on a TLS
//! port gets no answer, is disconnected and counted; `--tls-client-ca`
//! refuses clients without a certificate it signed; SIGHUP reloads the
//! certificate without touching open connections and keeps the old one when
//! the new files are bad; `--metrics-tls` serves the metrics over HTTPS
//! only; a TLS listener beyond loopback still needs a token.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::certs::{Ca, Pem, TlsFiles};
use common::ops::{self, same_value};
use common::{arg, Running};
use rankd_client::{Call, Client, ConnectOptions, Mode, OpKind, TlsOptions};
use rmpv::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;

/// How long a test waits for something that takes milliseconds.
const DEADLINE: Duration = Duration::from_secs(30);
const TOKEN: &str = "tls-test-token-0123456789";

// --- clients ----------------------------------------------------------------

/// Options for a TLS client that trusts only `ca_file` and checks the name
/// "localhost".
fn tls_to(ca_file: &Path) -> TlsOptions {
    TlsOptions { ca_file: Some(ca_file.to_path_buf()), server_name: Some("localhost".into()), ..Default::default() }
}

fn options(tls: TlsOptions) -> ConnectOptions {
    ConnectOptions { tls: Some(tls), ..Default::default() }
}

/// A TLS client trusting `ca_file` (panics if it cannot connect).
async fn tls_client(addr: &str, ca_file: &Path) -> Client {
    Client::connect_with(addr, &options(tls_to(ca_file)))
        .await
        .unwrap_or_else(|e| panic!("TLS connect to {addr} trusting {}: {e}", ca_file.display()))
}

/// The file of the server's `--tls-client-ca` in [`start_mutual`].
const CLIENT_CA: &str = "client-ca.pem";

/// A server with mutual TLS: the certificate of `tls`, and `client_ca`'s
/// certificate as `--tls-client-ca`, written as [`CLIENT_CA`] in `tls.pem`
/// (overwrite it and SIGHUP to change it).
fn start_mutual(tls: &TlsFiles, client_ca: &Ca) -> common::Server {
    let client_ca_file = tls.pem.ca(CLIENT_CA, client_ca);
    common::Server::start_with(1, &[tls.server_args().as_slice(), &["--tls-client-ca", arg(&client_ca_file)]].concat())
}

/// Options for a TLS client like [`tls_to`] `tls`'s CA that shows a client
/// certificate signed by `ca` (written as `<name>.pem` and `<name>.key`).
fn client_signed_by(tls: &TlsFiles, name: &str, ca: &Ca) -> ConnectOptions {
    let (cert, key) = tls.pem.pair(name, &ca.client_cert());
    options(TlsOptions { client_cert: Some(cert), client_key: Some(key), ..tls_to(&tls.ca_file) })
}

/// Whether a TLS client with `options` is refused: either the connection
/// (the handshake) fails or, if the handshake's failure only shows later
/// (TLS 1.3 sends the client's certificate after the client is done), its
/// first call does. Bounded by [`DEADLINE`].
async fn refused(addr: &str, options: &ConnectOptions) -> Result<String, String> {
    let attempt = async {
        match Client::connect_with(addr, options).await {
            Err(e) => Ok(format!("connect failed: {e}")),
            Ok(mut client) => match client.ping().await {
                Err(e) => Ok(format!("first call failed: {e}")),
                Ok(pong) => Err(format!("the server answered {pong:?}")),
            },
        }
    };
    tokio::time::timeout(DEADLINE, attempt).await.unwrap_or_else(|_| Err("neither refused nor answered".into()))
}

/// A rustls client configuration trusting only `ca`, for the protocol
/// versions given.
fn rustls_config(ca: &Ca, versions: &[&'static rustls::SupportedProtocolVersion]) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert.der().clone()).expect("CA into the root store");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// A TLS stream to `addr` (name checked: "localhost") made by hand with
/// tokio-rustls, independent of rankd's client.
async fn raw_tls(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("server name");
    tokio_rustls::TlsConnector::from(config).connect(name, tcp).await
}

/// Reads until the peer closes (EOF, a reset, a TLS stream ending without
/// close_notify) or [`DEADLINE`] passes; returns what came and whether the
/// peer closed.
async fn read_until_closed(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let read_all = async {
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let closed = tokio::time::timeout(DEADLINE, read_all).await.is_ok();
    (got, closed)
}

/// The msgpack reply maps (with an `id`) that `bytes` starts with, read as
/// rankd frames, and the bytes they take.
fn reply_frames_taking(bytes: &[u8]) -> (Vec<Value>, usize) {
    let mut replies = Vec::new();
    let mut taken = 0;
    while let Some(head) = bytes.get(taken..taken + 4) {
        let len = u32::from_be_bytes(head.try_into().unwrap()) as usize;
        let Some(body) = bytes.get(taken + 4..taken + 4 + len) else { break };
        match rmpv::decode::read_value(&mut &body[..]) {
            Ok(value) if common::field(&value, "id").is_some() => replies.push(value),
            _ => break,
        }
        taken += 4 + len;
    }
    (replies, taken)
}

/// The msgpack reply maps (with an `id`) that `bytes` starts with.
fn reply_frames(bytes: &[u8]) -> Vec<Value> {
    reply_frames_taking(bytes).0
}

/// `GET <path>` over `stream` (HTTP/1.1, `Connection: close`); what came
/// back as text, and whether the server closed the connection (within
/// [`DEADLINE`]).
async fn http_get(mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin, path: &str) -> (String, bool) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    // A server that refuses plain HTTP may close before taking it all.
    if stream.write_all(request.as_bytes()).await.is_ok() {
        let _ = stream.flush().await;
    }
    let (response, closed) = read_until_closed(&mut stream).await;
    (String::from_utf8_lossy(&response).into_owned(), closed)
}

/// Every op of the protocol on `client`, a fresh connection to a fresh
/// server that needs no token: `ping`, `auth`, then [`ops::every_other_op`] once
/// pipelined and once a call at a time (the board is dropped at the end of
/// each round, so both rounds answer the same); then a 10 000-entry
/// `set_many` and a 1 000-entry `top`, frames far larger than one TLS
/// record. Returns every result by op name, in order.
async fn every_op(client: &mut Client) -> Vec<(String, Value)> {
    let mut results = Vec::new();
    results.push(("ping".to_string(), client.call::<Value>(Call::new(OpKind::Ping)).await.expect("ping")));
    let auth = client.call::<Value>(Call::new(OpKind::Auth).with("token", "anything")).await.expect("auth");
    results.push(("auth".to_string(), auth));
    let ops = ops::every_other_op();
    let calls: Vec<Call> = ops.iter().map(|(_, call, _)| call.clone()).collect();
    let replies = client.pipeline::<Value>(&calls).await.expect("the pipeline");
    for ((name, _, _), reply) in ops.iter().zip(replies) {
        results.push((format!("{name} (pipelined)"), reply.unwrap_or_else(|e| panic!("{name} (pipelined): {e}"))));
    }
    for (name, call, _) in &ops {
        let reply = client.call::<Value>(call.clone()).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        results.push((name.to_string(), reply));
    }
    let players: Vec<String> = (0..10_000).map(|i| format!("player-{i:05}")).collect();
    let entries: Vec<(&str, i64)> = players.iter().enumerate().map(|(i, p)| (p.as_str(), i as i64)).collect();
    let stored = client.set_many("big", &entries, Mode::Set).await.expect("a 10 000-entry set_many");
    results.push(("set_many (10 000)".to_string(), Value::from(stored.len())));
    let top = client.call::<Value>(Call::new(OpKind::Top).with("board", "big").with("limit", 1000)).await;
    results.push(("top (1 000)".to_string(), top.expect("a 1 000-entry top")));
    results
}

/// What [`every_op`] must answer, by protocol.md.
fn every_op_expected() -> Vec<(String, Value)> {
    let mut expected = vec![("ping".to_string(), Value::from("pong")), ("auth".to_string(), Value::from(true))];
    let ops = ops::every_other_op();
    expected.extend(ops.iter().map(|(name, _, want)| (format!("{name} (pipelined)"), want.clone())));
    // The same connection again: its second watch, and watch 1 is over.
    expected.extend(ops.iter().map(|(name, _, want)| match *name {
        "watch" => (name.to_string(), Value::Map(vec![("watch".into(), 2.into())])),
        "unwatch" => (name.to_string(), Value::from(false)),
        _ => (name.to_string(), want.clone()),
    }));
    expected.push(("set_many (10 000)".to_string(), Value::from(10_000)));
    let top = (0..1000i64)
        .map(|i| {
            Value::Map(vec![
                ("player".into(), format!("player-{:05}", 9999 - i).into()),
                ("score".into(), (9999 - i).into()),
                ("rank".into(), (i + 1).into()),
            ])
        })
        .collect();
    expected.push(("top (1 000)".to_string(), Value::Array(top)));
    expected
}

fn assert_same_results(what: &str, got: &[(String, Value)], want: &[(String, Value)]) {
    assert_eq!(got.len(), want.len(), "{what}: number of results");
    for ((name, got), (want_name, want)) in got.iter().zip(want) {
        assert_eq!(name, want_name);
        assert!(same_value(got, want), "{what}: {name}: got {got}, want {want}");
    }
}

// --- the tests -------------------------------------------------------------

#[tokio::test]
async fn every_op_round_trips_over_tls() {
    let tls = TlsFiles::new();
    let mut server = common::Server::start_capturing(2, &tls.server_args(), &[("RANKD_LOG", "trace")]);

    ops::assert_every_op_is_tried(
        ops::every_other_op().iter().map(|(name, _, _)| *name).chain(["ping", "auth", "backup"]),
    );

    let want = every_op_expected();
    let mut client = tls_client(&server.addr, &tls.ca_file).await;
    let over_tls = every_op(&mut client).await;
    assert_same_results("over TLS", &over_tls, &want);
    // A backup's stream over TLS holds the 10 000 players `every_op` left
    // (12 bytes of each name at least; most may still be in the change log,
    // a few entries).
    let mut backing_up = tls_client(&server.addr, &tls.ca_file).await;
    let (header, summary) = ops::backup_to_the_end(&mut backing_up).await;
    assert_eq!(header.shards, 2);
    assert!(summary.bytes > 12 * 10_000, "{summary:?}");

    // The same ops on a plaintext server answer the same.
    let plain = common::Server::start(2);
    let in_plaintext = every_op(&mut plain.client().await).await;
    assert_same_results("plaintext", &in_plaintext, &want);
    assert_same_results("TLS against plaintext", &over_tls, &in_plaintext);

    // The server's private key is in nothing it printed, even at trace level.
    drop(client);
    assert!(server.terminate().success(), "SIGTERM exits 0");
    let (stdout, stderr) = (server.stdout_text(), server.stderr_text());
    assert!(stdout.starts_with("rankd listening on "), "stdout was captured: {stdout:?}");
    assert!(stderr.contains("listening"), "the server's logs were captured:\n{stderr}");
    let key_pem = std::fs::read_to_string(&tls.key).expect("read the server's key");
    let key_lines: Vec<&str> = key_pem.lines().filter(|l| !l.starts_with("-----")).collect();
    assert!(!key_lines.is_empty());
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for line in &key_lines {
            assert!(!text.contains(line), "the server's private key leaked into its {name}");
        }
    }
}

#[tokio::test]
async fn tls_1_2_and_1_3_both_carry_frames() {
    let tls = TlsFiles::new();
    let server = common::Server::start_with(1, &tls.server_args());
    for (name, version) in [("TLS 1.2", &rustls::version::TLS12), ("TLS 1.3", &rustls::version::TLS13)] {
        let mut stream =
            raw_tls(&server.addr, rustls_config(&tls.ca, &[version])).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version), "{name} negotiated");
        let mut request = Vec::new();
        Call::new(OpKind::Ping).encode(42, &mut request);
        stream.write_all(&request).await.expect("send ping");
        let mut head = [0u8; 4];
        stream.read_exact(&mut head).await.unwrap_or_else(|e| panic!("{name}: read the reply's length: {e}"));
        let mut body = vec![0u8; u32::from_be_bytes(head) as usize];
        stream.read_exact(&mut body).await.unwrap_or_else(|e| panic!("{name}: read the reply: {e}"));
        let reply = rmpv::decode::read_value(&mut &body[..]).expect("a msgpack reply");
        assert_eq!(common::field(&reply, "id"), Some(&Value::from(42)), "{name}: {reply}");
        assert_eq!(common::field(&reply, "ok"), Some(&Value::from("pong")), "{name}: {reply}");
    }
}

/// A TLS client that stops reading while megabytes of replies pile up gets
/// every one of them, in order, once it reads again, with nothing more
/// asked: the server's writes wait on the full socket and then finish. (That
/// a write's last TLS records are flushed, not left in the TLS layer's
/// buffer, is pinned by `request_path::transmit`'s own test.)
#[tokio::test]
async fn a_tls_client_that_stopped_reading_gets_every_reply_once_it_reads() {
    const REQUESTS: u64 = 300;
    let tls = TlsFiles::new();
    let server = common::Server::start_with(1, &tls.server_args());
    let mut client = tls_client(&server.addr, &tls.ca_file).await;
    let players: Vec<String> = (0..1000).map(|i| format!("player-{i:05}")).collect();
    let entries: Vec<(&str, i64)> = players.iter().enumerate().map(|(i, p)| (p.as_str(), i as i64)).collect();
    client.set_many("big", &entries, Mode::Set).await.expect("set_many");

    let mut stream = raw_tls(&server.addr, rustls_config(&tls.ca, &[&rustls::version::TLS13])).await.expect("connect");
    let mut requests = Vec::new();
    for id in 1..=REQUESTS {
        Call::new(OpKind::Top).with("board", "big").with("limit", 1000).encode(id, &mut requests);
    }
    stream.write_all(&requests).await.expect("send the requests");
    stream.flush().await.expect("flush them");
    // ~10 MB of replies, more than the socket buffers hold: the server's
    // writes find the socket full while nobody reads.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut unparsed = Vec::new();
    let mut chunk = vec![0u8; 256 << 10];
    let mut ids = Vec::new();
    while (ids.len() as u64) < REQUESTS {
        let n = match tokio::time::timeout(DEADLINE, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => n,
            other => panic!("{} of {REQUESTS} replies, then {other:?}", ids.len()),
        };
        unparsed.extend_from_slice(&chunk[..n]);
        let (replies, taken) = reply_frames_taking(&unparsed);
        unparsed.drain(..taken);
        ids.extend(replies.iter().map(|reply| common::field(reply, "id").and_then(Value::as_u64).unwrap_or(0)));
    }
    assert_eq!(ids, (1..=REQUESTS).collect::<Vec<_>>(), "every reply, in order");
}

#[tokio::test]
async fn a_plaintext_client_on_a_tls_port_gets_no_answer_and_is_disconnected() {
    let tls = TlsFiles::new();
    let server = common::Server::start_with(1, &tls.server_args());
    const FAILURES: &str = "rankd_tls_handshake_failures_total";
    let before = server.counter(FAILURES, &[]);

    // A valid ping frame, in plaintext.
    let mut plain = tokio::net::TcpStream::connect(&server.addr).await.expect("TCP connect");
    let mut request = Vec::new();
    Call::new(OpKind::Ping).encode(1, &mut request);
    plain.write_all(&request).await.expect("send a plaintext ping");
    let (got, closed) = read_until_closed(&mut plain).await;
    assert!(closed, "the plaintext client was not disconnected within {DEADLINE:?} (got {} bytes)", got.len());
    let replies = reply_frames(&got);
    assert!(replies.is_empty(), "a plaintext client got msgpack replies: {replies:?}");
    assert!(!got.windows(4).any(|w| w == b"pong"), "a plaintext client got a pong: {got:?}");

    common::wait_until(DEADLINE, "the handshake failure to be counted", async || {
        server.counter(FAILURES, &[]) >= before + 1.0
    })
    .await;

    // The same through rankd's plain client: no reply, the connection ends.
    let mut client = Client::connect(server.addr.as_str()).await.expect("TCP connect");
    let reply = tokio::time::timeout(DEADLINE, client.call::<Value>(Call::new(OpKind::Ping)))
        .await
        .expect("the plaintext client was not disconnected");
    assert!(reply.is_err(), "a plaintext ping on a TLS port answered {reply:?}");
    common::wait_until(DEADLINE, "both handshake failures to be counted", async || {
        server.counter(FAILURES, &[]) >= before + 2.0
    })
    .await;

    // TLS clients are still served.
    assert_eq!(tls_client(&server.addr, &tls.ca_file).await.ping().await.expect("ping over TLS"), "pong");
}

#[tokio::test]
async fn at_the_connection_limit_a_tls_port_closes_new_connections_without_a_handshake() {
    let tls = TlsFiles::new();
    let mut args = tls.server_args();
    args.extend(["--max-connections", "1"]);
    let server = common::Server::start_with(1, &args);
    let mut first = tls_client(&server.addr, &tls.ca_file).await;
    assert_eq!(first.ping().await.expect("the first connection is served"), "pong");

    let refused = tokio::time::timeout(DEADLINE, Client::connect_with(&server.addr, &options(tls_to(&tls.ca_file))))
        .await
        .expect("the refusal comes at once");
    assert!(refused.is_err(), "a connection past the limit completed its TLS handshake");
    common::wait_until(DEADLINE, "the refusal to be counted", async || {
        server.counter("rankd_connections_refused_total", &[]) >= 1.0
    })
    .await;
    assert_eq!(server.counter("rankd_tls_handshake_failures_total", &[]), 0.0, "no handshake was attempted");
    assert_eq!(first.ping().await.expect("the first connection still works"), "pong");
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_signed_by_the_client_ca() {
    let tls = TlsFiles::new();
    let (client_ca, stranger_ca) = (Ca::new("rankd client CA"), Ca::new("someone else's CA"));
    let server = start_mutual(&tls, &client_ca);

    let no_cert = options(tls_to(&tls.ca_file));
    let refusal = refused(&server.addr, &no_cert).await;
    assert!(refusal.is_ok(), "a client without a certificate was served: {refusal:?}");

    let wrong_ca = client_signed_by(&tls, "stranger", &stranger_ca);
    let refusal = refused(&server.addr, &wrong_ca).await;
    assert!(refusal.is_ok(), "a client with a certificate from another CA was served: {refusal:?}");

    let with_cert = client_signed_by(&tls, "client", &client_ca);
    let mut client = Client::connect_with(&server.addr, &with_cert).await.expect("connect with a client certificate");
    assert_eq!(client.ping().await.expect("ping"), "pong");
    assert_eq!(client.set("b", "p", 5, Mode::Set).await.expect("set"), 5);
    assert_eq!(client.get("b", "p").await.expect("get"), Some(5));
}

/// SIGHUP to the server.
fn sighup(server: &common::Server) {
    let pid = libc::pid_t::try_from(server.pid()).expect("a pid");
    // SAFETY: kill(2) has no memory-safety preconditions.
    let sent = unsafe { libc::kill(pid, libc::SIGHUP) };
    assert_eq!(sent, 0, "kill -HUP {pid}: {}", std::io::Error::last_os_error());
}

fn reloads(server: &common::Server, outcome: &str) -> f64 {
    server.counter("rankd_tls_reloads_total", &[&format!("outcome=\"{outcome}\"")])
}

#[tokio::test]
async fn sighup_reloads_the_certificate_and_a_failed_reload_keeps_the_old_one() {
    let ca_a = Ca::new("rankd CA A");
    let ca_b = Ca::new("rankd CA B");
    let pem = Pem::new();
    let ca_a_file = pem.ca("ca-a.pem", &ca_a);
    let ca_b_file = pem.ca("ca-b.pem", &ca_b);
    let (cert, key) = pem.pair("server", &ca_a.server_cert());
    let server = common::Server::start_with(1, &["--tls-cert", arg(&cert), "--tls-key", arg(&key)]);

    let mut old = tls_client(&server.addr, &ca_a_file).await;
    assert_eq!(old.set("b", "p", 1, Mode::Set).await.expect("set before the reload"), 1);
    assert!(refused(&server.addr, &options(tls_to(&ca_b_file))).await.is_ok(), "CA B trusted before the reload");
    assert_eq!((reloads(&server, "ok"), reloads(&server, "failed")), (0.0, 0.0), "no reload yet");

    // A certificate from CA B at the same paths, then SIGHUP.
    let (cert_b, key_b) = pem.pair("server", &ca_b.server_cert());
    assert_eq!((&cert_b, &key_b), (&cert, &key), "same paths");
    sighup(&server);
    common::wait_until(DEADLINE, "rankd_tls_reloads_total{outcome=\"ok\"} to be 1", async || {
        reloads(&server, "ok") == 1.0
    })
    .await;
    assert_eq!(reloads(&server, "failed"), 0.0);

    let mut new = tls_client(&server.addr, &ca_b_file).await;
    assert_eq!(new.get("b", "p").await.expect("get on a new connection"), Some(1));
    let refusal = refused(&server.addr, &options(tls_to(&ca_a_file))).await;
    assert!(refusal.is_ok(), "a client trusting only CA A still connects after the reload: {refusal:?}");
    assert_eq!(old.ping().await.expect("the old connection after the reload"), "pong");
    assert_eq!(old.set("b", "p", 2, Mode::Set).await.expect("a write on the old connection"), 2);

    // A bad key: the reload fails and the CA B certificate stays.
    std::fs::write(&key, "this is not a PEM private key\n").expect("write garbage");
    sighup(&server);
    common::wait_until(DEADLINE, "rankd_tls_reloads_total{outcome=\"failed\"} to be 1", async || {
        reloads(&server, "failed") == 1.0
    })
    .await;
    assert_eq!(reloads(&server, "ok"), 1.0, "the failed reload is not counted ok");
    let mut after = tls_client(&server.addr, &ca_b_file).await;
    assert_eq!(after.get("b", "p").await.expect("get after a failed reload"), Some(2));
    let refusal = refused(&server.addr, &options(tls_to(&ca_a_file))).await;
    assert!(refusal.is_ok(), "a failed reload brought CA A's certificate back: {refusal:?}");
    assert_eq!(new.ping().await.expect("a connection from before the failed reload"), "pong");
    assert_eq!(old.get("b", "p").await.expect("the first connection, after both reloads"), Some(2));
}

#[tokio::test]
async fn sighup_reloads_the_client_ca() {
    let tls = TlsFiles::new();
    let (ca_x, ca_y) = (Ca::new("rankd client CA X"), Ca::new("rankd client CA Y"));
    let server = start_mutual(&tls, &ca_x);
    let as_x = client_signed_by(&tls, "client-x", &ca_x);
    let as_y = client_signed_by(&tls, "client-y", &ca_y);

    let mut old = Client::connect_with(&server.addr, &as_x).await.expect("connect with CA X's certificate");
    assert_eq!(old.ping().await.expect("ping"), "pong");
    assert!(refused(&server.addr, &as_y).await.is_ok(), "CA Y's client served before the reload");

    tls.pem.ca(CLIENT_CA, &ca_y);
    sighup(&server);
    common::wait_until(DEADLINE, "rankd_tls_reloads_total{outcome=\"ok\"} to be 1", async || {
        reloads(&server, "ok") == 1.0
    })
    .await;
    let mut new = Client::connect_with(&server.addr, &as_y).await.expect("connect with CA Y's certificate");
    assert_eq!(new.ping().await.expect("ping with CA Y's certificate"), "pong");
    let refusal = refused(&server.addr, &as_x).await;
    assert!(refusal.is_ok(), "CA X's client still served after the reload: {refusal:?}");
    assert_eq!(old.ping().await.expect("the connection from before the reload"), "pong");
}

#[tokio::test]
async fn metrics_tls_serves_the_metrics_over_https_only() {
    let tls = TlsFiles::new();
    let server = common::Server::start_with(1, &[tls.server_args().as_slice(), &["--metrics-tls"]].concat());
    // Some traffic, so the page has request series.
    assert_eq!(tls_client(&server.addr, &tls.ca_file).await.ping().await.expect("ping"), "pong");

    let config = rustls_config(&tls.ca, rustls::DEFAULT_VERSIONS);
    let https = raw_tls(&server.metrics_addr, config.clone()).await.expect("TLS to the metrics endpoint");
    let (response, closed) = http_get(https, "/metrics").await;
    assert!(closed, "the HTTPS connection was not closed after its response");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(head.starts_with("HTTP/1.1 200"), "GET /metrics over HTTPS: {head}");
    assert!(body.contains("rankd_requests_total"), "no metrics in the HTTPS answer:\n{body}");
    assert!(common::sample(body, "rankd_tls_handshake_failures_total", &[]).is_some(), "no handshake counter");

    let https = raw_tls(&server.metrics_addr, config).await.expect("TLS to the metrics endpoint");
    let (response, _) = http_get(https, "/healthz").await;
    assert!(response.starts_with("HTTP/1.1 200"), "GET /healthz over HTTPS: {response}");

    // Plain HTTP gets no metrics.
    let plain = tokio::net::TcpStream::connect(&server.metrics_addr).await.expect("TCP to the metrics endpoint");
    let (response, _) = http_get(plain, "/metrics").await;
    assert!(!response.contains("rankd_"), "plain HTTP got metrics:\n{response}");
    assert!(!response.contains(" 200 "), "plain HTTP got a 200:\n{response}");
}

/// `rankd serve` on 0.0.0.0 with TLS and `env` (the environment cleared of
/// tokens otherwise).
fn serve_beyond_loopback(data_dir: &Path, tls: &TlsFiles, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_rankd"));
    command
        .args(["serve", "--listen", "0.0.0.0:0", "--metrics-listen", "127.0.0.1:0", "--shards", "1"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(tls.server_args())
        .env("RANKD_LOG", "warn")
        .env_remove("RANKD_AUTH_TOKEN")
        .env_remove("RANKD_TOKENS_FILE")
        .envs(env.iter().copied());
    command
}

#[tokio::test]
async fn a_tls_server_beyond_loopback_needs_a_token() {
    let tls = TlsFiles::new();
    let data = tempfile::tempdir().expect("temp dir");

    // No token at all: refused, saying why.
    let mut command = serve_beyond_loopback(&data.path().join("none"), &tls, &[]);
    let (status, stderr) = common::run_to_exit(&mut command, "the server without a token to exit");
    assert!(!status.success(), "a TLS server listened on 0.0.0.0 without a token");
    assert!(stderr.to_lowercase().contains("token"), "the refusal does not mention a token:\n{stderr}");

    // With a token (a plain one from the environment, or role tokens from
    // a file): it starts and serves TLS, to authenticated clients only.
    let tokens_file = tls.pem.write("tokens.toml", &format!("[[tokens]]\nrole = \"write\"\ntoken = \"{TOKEN}\"\n"));
    let ways = [("plain", ("RANKD_AUTH_TOKEN", TOKEN)), ("roles", ("RANKD_TOKENS_FILE", arg(&tokens_file)))];
    for (way, env) in ways {
        let mut command = serve_beyond_loopback(&data.path().join(way), &tls, &[env]);
        let mut child = Running(command.stdout(Stdio::piped()).spawn().expect("spawn rankd"));
        let mut line = String::new();
        // Kept open until the end, so the server's stdout stays writable.
        let mut stdout = BufReader::new(child.0.stdout.take().expect("stdout"));
        stdout.read_line(&mut line).expect("read stdout");
        let addr = line
            .strip_prefix("rankd listening on ")
            .and_then(|rest| rest.split(' ').next())
            .unwrap_or_else(|| panic!("{way}: the server with a token did not start: {line:?}"));
        let port = addr.rsplit(':').next().expect("a port");
        assert!(addr.starts_with("0.0.0.0:"), "{way}: listening on {addr}");
        let options = ConnectOptions { token: Some(TOKEN.into()), ..options(tls_to(&tls.ca_file)) };
        let mut client = Client::connect_with(&format!("127.0.0.1:{port}"), &options)
            .await
            .unwrap_or_else(|e| panic!("{way}: TLS connect with the token: {e}"));
        assert_eq!(client.count("b").await.expect("count after auth"), 0, "{way}");
        let mut anonymous = tls_client(&format!("127.0.0.1:{port}"), &tls.ca_file).await;
        let refused = anonymous.count("b").await.unwrap_err();
        assert_eq!(refused.code(), Some("unauthorized"), "{way}: a token is required: {refused}");
    }
}

/// A TLS client that asks for a backup and never reads it: once a write
/// has waited the idle timeout the backup ends, and the connection closes
/// and frees its slot, although its close_notify cannot go out over the
/// full socket.
#[tokio::test]
async fn a_tls_backup_nobody_reads_frees_its_connection() {
    let tls = TlsFiles::new();
    let mut args = tls.server_args();
    args.extend(["--max-connections", "1", "--idle-timeout-secs", "2"]);
    let server = common::Server::start_with(1, &args);
    {
        // Far more than the socket buffers hold, so the backup's writes stall.
        let mut client = tls_client(&server.addr, &tls.ca_file).await;
        let players: Vec<String> = (0..300_000).map(|i| format!("{:x}-player-{i}", i * 2_654_435_761u64)).collect();
        for chunk in players.chunks(10_000) {
            let entries: Vec<(&str, i64)> = chunk.iter().enumerate().map(|(i, p)| (p.as_str(), i as i64)).collect();
            client.set_many("big", &entries, Mode::Set).await.expect("set_many");
        }
    }
    common::wait_until(DEADLINE, "the filling connection to close", async || {
        server.metric("rankd_connections_open", &[]) == 0.0
    })
    .await;
    let mut stream = raw_tls(&server.addr, rustls_config(&tls.ca, &[&rustls::version::TLS13])).await.expect("connect");
    let mut request = Vec::new();
    Call::named("backup").encode(1, &mut request);
    stream.write_all(&request).await.expect("ask for a backup");
    stream.flush().await.expect("flush it");
    // `stream` stays open and unread. Before the fix its slot was never
    // freed: every later connection was refused.
    common::wait_for(Duration::from_secs(60), "a new connection to be served", async || {
        match tokio::time::timeout(DEADLINE, async {
            let mut client = Client::connect_with(&server.addr, &options(tls_to(&tls.ca_file))).await?;
            client.ping().await
        })
        .await
        {
            Ok(Ok(pong)) => Ok(pong),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("no answer".into()),
        }
    })
    .await;
    drop(stream);
}
