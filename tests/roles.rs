//! Role tokens against the real server: a `read` token reads and cannot
//! write (every write op answers `unauthorized` and changes nothing), a
//! `write` token does everything, `auth` answers the role; the tokens come
//! from `--tokens-file`, `RANKD_TOKENS_FILE` or `[[tokens]]` in `--config`;
//! the third failed `auth` on a connection closes it, pipelined or not,
//! and is counted; the tokens never show in anything the server prints or
//! in its metrics; `--auth-token` is gone (tokens never on the command line).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::arg;
use common::ops::{self, same_value};
use rankd_client::{set_call, Call, Client, ConnectOptions, OpKind};
use rmpv::Value;

const READ_TOKEN: &str = "r-secret-7f3a9c1e5b";
const WRITE_TOKEN: &str = "w-secret-2d8b4e6a0c";
/// A wrong token a client sends: someone's secret too, so never printed either.
const WRONG_TOKEN: &str = "x-not-a-token-91c4e7";
/// How long a test waits for something that takes milliseconds.
const DEADLINE: Duration = Duration::from_secs(30);

/// The `[[tokens]]` array giving [`READ_TOKEN`] the read role and
/// [`WRITE_TOKEN`] the write role.
fn tokens_toml() -> String {
    format!(
        "[[tokens]]\nrole = \"read\"\ntoken = \"{READ_TOKEN}\"\n\n[[tokens]]\nrole = \"write\"\ntoken = \"{WRITE_TOKEN}\"\n"
    )
}

/// Writes `contents` as `name` in `dir`.
fn write(dir: &tempfile::TempDir, name: &str, contents: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path
}

/// A server (2 shards, stderr captured) with the role tokens in a
/// `--tokens-file`.
fn with_tokens_file(dir: &tempfile::TempDir, env: &[(&str, &str)]) -> common::Server {
    let file = write(dir, "tokens.toml", &tokens_toml());
    common::Server::start_capturing(2, &["--tokens-file", arg(&file)], env)
}

fn auth_call(token: &str) -> Call {
    Call::new(OpKind::Auth).with("token", token)
}

fn role(name: &str) -> Value {
    Value::Map(vec![("role".into(), name.into())])
}

/// A plain connection that ran `auth` with `token` (raw, so the answer is
/// checked as it is on the wire) and got `want`.
async fn authed(server: &common::Server, token: &str, want: &Value) -> Client {
    let mut client = server.client().await;
    let got = client.call::<Value>(auth_call(token)).await.unwrap_or_else(|e| panic!("auth: {e}"));
    assert!(same_value(&got, want), "auth answered {got}, want {want}");
    client
}

/// One request of every write op, none of which may apply under a read
/// token: each would change board `b` (or create board `c`).
fn write_ops() -> Vec<(&'static str, Call)> {
    vec![
        ("create_board", Call::new(OpKind::CreateBoard).with("board", "c")),
        ("drop_board", Call::new(OpKind::DropBoard).with("board", "b")),
        ("set", set_call("b", "p", 100, rankd_client::Mode::Set)),
        (
            "set_many",
            Call::new(OpKind::SetMany).with("board", "b").with(
                "entries",
                Value::Array(vec![Value::Array(vec!["p".into(), 1.into()]), Value::Array(vec!["s".into(), 2.into()])]),
            ),
        ),
        ("remove", Call::new(OpKind::Remove).with("board", "b").with("player", "q")),
    ]
}

/// One request of every read op (and `boards`, `ping`) with its result on
/// board `b` holding p=7, q=3, r=9 (rank order q, p, r) and no other board.
fn read_ops() -> Vec<ops::Op> {
    let mut reads = vec![("ping", Call::new(OpKind::Ping), Value::from("pong"))];
    reads.extend(ops::read_b());
    // After `get p`: a player b does not hold.
    reads.insert(2, ("get", Call::new(OpKind::Get).with("board", "b").with("player", "s"), Value::Nil));
    reads.push(("boards", Call::new(OpKind::Boards), ops::boards_b(3)));
    // Watches are reads: the id is the connection's own (checked apart).
    let watched = Value::Map(vec![("watch".into(), Value::Nil)]);
    reads.push(("watch", Call::new(OpKind::Watch).with("board", "b").with("top", 3), watched));
    reads.push(("unwatch", Call::new(OpKind::Unwatch).with("watch", 999), Value::from(false)));
    reads
}

/// Every read op on `client` answers as [`read_ops`] says.
async fn reads_see_the_first_state(client: &mut Client, who: &str) {
    let ops = read_ops();
    let calls: Vec<Call> = ops.iter().map(|(_, call, _)| call.clone()).collect();
    let replies = client.pipeline::<Value>(&calls).await.unwrap_or_else(|e| panic!("{who}: the read pipeline: {e}"));
    for ((name, _, want), reply) in ops.iter().zip(replies) {
        let got = reply.unwrap_or_else(|e| panic!("{who}: {name}: {e}"));
        if *name == "watch" {
            assert!(got["watch"].as_u64().is_some_and(|id| id > 0), "{who}: watch: got {got}");
            continue;
        }
        assert!(same_value(&got, want), "{who}: {name}: got {got}, want {want}");
    }
}

/// The whole of the roles' contract on a server holding [`READ_TOKEN`]
/// (read) and [`WRITE_TOKEN`] (write), however it got them.
async fn roles_hold(server: &common::Server) {
    // The op lists cover the protocol.
    let (writes, reads) = (write_ops(), read_ops());
    let names = writes.iter().map(|(name, _)| *name).chain(reads.iter().map(|(name, _, _)| *name));
    ops::assert_every_op_is_tried(names.chain(["auth", "backup"]));

    // Nothing but ping and auth before auth.
    let mut anonymous = server.client().await;
    assert_eq!(anonymous.ping().await.expect("ping needs no token"), "pong");
    assert_eq!(anonymous.count("b").await.unwrap_err().code(), Some("unauthorized"), "count before auth");

    // The writer fills board b.
    let mut writer = authed(server, WRITE_TOKEN, &role("write")).await;
    let setup = ops::fill_b();
    let calls: Vec<Call> = setup.iter().map(|(_, call, _)| call.clone()).collect();
    let replies = writer.pipeline::<Value>(&calls).await.expect("the writer's setup");
    for ((_, _, want), reply) in setup.iter().zip(replies) {
        let got = reply.expect("the writer's setup");
        assert!(same_value(&got, want), "setup: got {got}, want {want}");
    }

    // The reader reads everything and writes nothing, pipelined or not.
    let mut reader = authed(server, READ_TOKEN, &role("read")).await;
    reads_see_the_first_state(&mut reader, "read token").await;
    let calls: Vec<Call> = writes.iter().map(|(_, call)| call.clone()).collect();
    let replies = reader.pipeline::<Value>(&calls).await.expect("the read token's write pipeline");
    for ((name, _), reply) in writes.iter().zip(replies) {
        let err = reply.expect_err(&format!("{name} under a read token"));
        assert_eq!(err.code(), Some("unauthorized"), "{name} under a read token: {err}");
    }
    for (name, call) in &writes {
        let err = reader.call::<Value>(call.clone()).await.expect_err(&format!("{name} under a read token"));
        assert_eq!(err.code(), Some("unauthorized"), "{name} under a read token, alone: {err}");
    }
    // A backup copies everything and holds every shard: the write role's.
    let err = reader.call::<Value>(Call::new(OpKind::Backup)).await.expect_err("backup under a read token");
    assert_eq!(err.code(), Some("unauthorized"), "backup under a read token: {err}");
    let mut backing_up = authed(server, WRITE_TOKEN, &role("write")).await;
    let (header, _) = ops::backup_to_the_end(&mut backing_up).await;
    assert_eq!(header.shards, 2);
    // Refused writes are no failed auths: the connection stays, still reading.
    reads_see_the_first_state(&mut reader, "read token, after refused writes").await;
    // And nothing changed for the writer either (no board c, p still 7, ...).
    reads_see_the_first_state(&mut writer, "write token, after the refused writes").await;

    // A read connection through connect_with, too.
    let options = ConnectOptions { token: Some(READ_TOKEN.into()), ..Default::default() };
    let mut reader2 = Client::connect_with(&server.addr, &options).await.expect("connect_with the read token");
    reads_see_the_first_state(&mut reader2, "read token via connect_with").await;
    assert_eq!(reader2.set("b", "p", 1, rankd_client::Mode::Set).await.unwrap_err().code(), Some("unauthorized"));
    let wrong = ConnectOptions { token: Some(WRONG_TOKEN.into()), ..Default::default() };
    assert!(Client::connect_with(&server.addr, &wrong).await.is_err(), "connect_with a wrong token succeeded");

    // The writer writes everything; the reader sees it.
    let options = ConnectOptions { token: Some(WRITE_TOKEN.into()), ..Default::default() };
    let mut writer2 = Client::connect_with(&server.addr, &options).await.expect("connect_with the write token");
    let replies = writer2.pipeline::<Value>(&calls).await.expect("the write token's writes");
    let want = [
        Value::from(true),                      // create_board c
        Value::from(true),                      // drop_board b
        Value::from(100),                       // set b p 100 (b made anew)
        Value::Array(vec![1.into(), 2.into()]), // set_many p 1, s 2
        Value::from(false),                     // remove q: gone with the old b
    ];
    for (((name, _), reply), want) in writes.iter().zip(replies).zip(want) {
        let got = reply.unwrap_or_else(|e| panic!("{name} under the write token: {e}"));
        assert!(same_value(&got, &want), "{name} under the write token: got {got}, want {want}");
    }
    assert_eq!(reader.get("b", "p").await.expect("get"), Some(1));
    assert_eq!(reader.get("b", "s").await.expect("get"), Some(2));
    assert_eq!(reader.count("b").await.expect("count"), 2);
    let mut boards: Vec<String> = reader.boards().await.expect("boards").into_iter().map(|b| b.board).collect();
    boards.sort();
    assert_eq!(boards, ["b", "c"]);
    assert!(writer.remove("b", "s").await.expect("remove"), "s was on b");
    assert!(writer.drop_board("c").await.expect("drop_board"), "c existed");
    assert_eq!(reader.count("b").await.expect("count"), 1);
}

#[tokio::test]
async fn a_read_token_reads_and_cannot_write_a_write_token_does_everything() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = with_tokens_file(&dir, &[]);
    roles_hold(&server).await;
}

#[tokio::test]
async fn role_tokens_can_come_from_a_file_named_in_the_environment() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(&dir, "tokens.toml", &tokens_toml());
    let server = common::Server::start_with_env(2, &[], &[("RANKD_TOKENS_FILE", arg(&file))]);
    roles_hold(&server).await;
}

#[tokio::test]
async fn role_tokens_can_come_from_the_config_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(&dir, "rankd.toml", &format!("max_batch = 1024\n\n{}", tokens_toml()));
    let server = common::Server::start_with(2, &["--config", arg(&config)]);
    roles_hold(&server).await;
}

/// After `send_raw` / three failures: the connection is closed (EOF or a
/// reset) without another reply, within [`DEADLINE`].
async fn assert_closed(client: &mut Client, what: &str) {
    match tokio::time::timeout(DEADLINE, client.read_raw::<Value>()).await {
        Err(_) => panic!("{what}: the connection was not closed within {DEADLINE:?}"),
        Ok(Ok(Some(reply))) => panic!("{what}: another reply came instead of the close: {reply}"),
        Ok(Ok(None) | Err(_)) => {}
    }
}

#[tokio::test]
async fn the_third_failed_auth_closes_the_connection() {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = with_tokens_file(&dir, &[]);
    const FAILURES: &str = "rankd_auth_failures_total";
    assert_eq!(server.counter(FAILURES, &[]), 0.0, "no failed auth yet");

    // One at a time: two failures leave the connection usable, the third
    // is answered and closes it.
    let mut client = server.client().await;
    let mut other = server.client().await;
    for attempt in 1..=2 {
        let err = client.call::<Value>(auth_call(WRONG_TOKEN)).await.expect_err("a wrong token");
        assert_eq!(err.code(), Some("unauthorized"), "failed auth {attempt}: {err}");
        assert_eq!(client.ping().await.expect("ping after a failed auth"), "pong");
        // Failures count per connection: another connection's two failures
        // do not add to this one's.
        let err = other.call::<Value>(auth_call(WRONG_TOKEN)).await.expect_err("a wrong token");
        assert_eq!(err.code(), Some("unauthorized"), "the other connection's failed auth {attempt}: {err}");
    }
    assert_eq!(other.ping().await.expect("the other connection, two failures in"), "pong");
    let err = client.call::<Value>(auth_call(WRONG_TOKEN)).await.expect_err("a wrong token");
    assert_eq!(err.code(), Some("unauthorized"), "the third failed auth is answered: {err}");
    assert_closed(&mut client, "after the third failed auth").await;
    // The other connection (two failures) can still authenticate.
    let got = other.call::<Value>(auth_call(WRITE_TOKEN)).await.expect("the right token after two failures");
    assert!(same_value(&got, &role("write")), "auth answered {got}");
    assert_eq!(other.count("b").await.expect("count after auth"), 0);

    // Pipelined: five wrong auths and a ping in one write; exactly three
    // replies (all unauthorized, in order), then the close.
    let mut piped = server.client().await;
    let mut bytes = Vec::new();
    for id in 1..=5 {
        auth_call(WRONG_TOKEN).encode(id, &mut bytes);
    }
    Call::new(OpKind::Ping).encode(6, &mut bytes);
    piped.send_raw(&bytes).await.expect("send the pipeline");
    for id in 1..=3u64 {
        let reply = tokio::time::timeout(DEADLINE, piped.read_raw::<Value>())
            .await
            .unwrap_or_else(|_| panic!("no reply {id} within {DEADLINE:?}"))
            .unwrap_or_else(|e| panic!("reply {id}: {e}"))
            .unwrap_or_else(|| panic!("the connection closed before reply {id}"));
        assert_eq!(common::field(&reply, "id"), Some(&Value::from(id)), "reply {id}: {reply}");
        let code = common::field(&reply, "err").and_then(|err| common::field(err, "code"));
        assert_eq!(code, Some(&Value::from("unauthorized")), "reply {id}: {reply}");
    }
    assert_closed(&mut piped, "after the third pipelined failed auth").await;

    // 2 + 2 + 1 one at a time, 3 pipelined (the 4th and 5th never ran).
    common::wait_until(DEADLINE, "8 failed auths to be counted", async || server.counter(FAILURES, &[]) >= 8.0).await;
    assert_eq!(server.counter(FAILURES, &[]), 8.0, "{FAILURES}");
}

/// Every use of the tokens on `server`: both roles, a refused write, three
/// failed auths closing a connection, `connect_with`; then the metrics page
/// and, after SIGTERM, everything it printed hold no token.
async fn tokens_never_leak(mut server: common::Server) {
    let mut reader = authed(&server, READ_TOKEN, &role("read")).await;
    assert_eq!(reader.set("b", "p", 1, rankd_client::Mode::Set).await.unwrap_err().code(), Some("unauthorized"));
    let mut writer = authed(&server, WRITE_TOKEN, &role("write")).await;
    assert_eq!(writer.set("b", "p", 1, rankd_client::Mode::Set).await.expect("set"), 1);
    assert_eq!(reader.get("b", "p").await.expect("get"), Some(1));
    let mut failing = server.client().await;
    for _ in 0..3 {
        let err = failing.call::<Value>(auth_call(WRONG_TOKEN)).await.expect_err("a wrong token");
        assert_eq!(err.code(), Some("unauthorized"));
    }
    assert_closed(&mut failing, "after three failed auths").await;
    let options = ConnectOptions { token: Some(WRONG_TOKEN.into()), ..Default::default() };
    assert!(Client::connect_with(&server.addr, &options).await.is_err(), "connect_with a wrong token");

    let metrics = server.metrics_text();
    assert!(metrics.contains("rankd_requests_total"), "the metrics page was read");
    for token in [READ_TOKEN, WRITE_TOKEN, WRONG_TOKEN] {
        assert!(!metrics.contains(token), "the token {token:?} is in the metrics");
    }
    drop((reader, writer, failing));
    assert!(server.terminate().success(), "SIGTERM exits 0");
    server.assert_never_printed(&[READ_TOKEN, WRITE_TOKEN, WRONG_TOKEN]);
}

#[tokio::test]
async fn role_tokens_from_a_tokens_file_are_never_printed() {
    let dir = tempfile::tempdir().expect("temp dir");
    tokens_never_leak(with_tokens_file(&dir, &[("RANKD_LOG", "trace")])).await;
}

#[tokio::test]
async fn role_tokens_from_the_config_file_are_never_printed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write(&dir, "rankd.toml", &tokens_toml());
    let server = common::Server::start_capturing(2, &["--config", arg(&config)], &[("RANKD_LOG", "trace")]);
    tokens_never_leak(server).await;
}

#[test]
fn the_auth_token_flag_is_gone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_rankd"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--shards", "1"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--auth-token", WRITE_TOKEN])
        .env("RANKD_LOG", "warn")
        .env_remove("RANKD_AUTH_TOKEN")
        .env_remove("RANKD_TOKENS_FILE");
    let (status, stderr) = common::run_to_exit(&mut command, "rankd serve --auth-token to exit");
    assert!(!status.success(), "rankd serve took --auth-token");
    assert!(stderr.contains("--auth-token"), "the error names the flag:\n{stderr}");
    assert!(!stderr.contains(WRITE_TOKEN), "the refused flag's value is echoed:\n{stderr}");
}
