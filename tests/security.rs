//! Auth against the real server: nothing but `ping` and `auth` before a
//! successful `auth`, per connection; the token never shows in logs or metrics;
//! a non-loopback listener without a token is refused.

mod common;

use std::process::Command;

use rankd_client::{Call, Mode, OpKind};
use rmpv::Value;

const TOKEN: &str = "correct-horse-battery-staple";

#[tokio::test]
async fn every_op_but_ping_and_auth_waits_for_a_successful_auth() {
    let server = common::Server::start_with(2, &["--auth-token", TOKEN]);
    let mut client = server.client().await;
    assert_eq!(client.ping().await.unwrap(), "pong", "ping needs no token");
    for call in [
        rankd_client::set_call("b", "p", 1, Mode::Set),
        Call::new(OpKind::Get).with("board", "b").with("player", "p"),
        Call::new(OpKind::Boards),
        Call::new(OpKind::Top).with("board", "b"),
        Call::new(OpKind::CreateBoard).with("board", "b"),
    ] {
        let err = client.call::<Value>(call).await.expect_err("refused before auth");
        assert_eq!(err.code(), Some("unauthorized"));
    }
    let err = client.call::<Value>(Call::new(OpKind::Auth).with("token", "wrong")).await.expect_err("wrong token");
    assert_eq!(err.code(), Some("unauthorized"));
    assert_eq!(client.count("b").await.unwrap_err().code(), Some("unauthorized"), "still locked");

    // Auth and a write pipelined together: order decides.
    let replies = client
        .pipeline::<Value>(&[
            Call::new(OpKind::Auth).with("token", TOKEN),
            rankd_client::set_call("b", "p", 7, Mode::Set),
        ])
        .await
        .unwrap();
    assert_eq!(replies[0].as_ref().unwrap().as_bool(), Some(true));
    assert_eq!(replies[1].as_ref().unwrap().as_i64(), Some(7));
    assert_eq!(client.get("b", "p").await.unwrap(), Some(7));

    // Another connection is not authenticated by this one.
    let mut other = server.client().await;
    assert_eq!(other.get("b", "p").await.unwrap_err().code(), Some("unauthorized"));

    // The token is in neither the metrics nor anything the server printed.
    let metrics = http_get(&server.metrics_addr);
    assert!(!metrics.contains(TOKEN));
}

#[test]
fn the_token_can_come_from_the_environment_and_is_never_logged() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--shards", "1"])
        .arg("--data-dir")
        .arg(dir.path())
        .env("RANKD_AUTH_TOKEN", TOKEN)
        .env("RANKD_LOG", "debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let addr = line.split_whitespace().nth(3).unwrap().to_string();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let mut client = rankd_client::Client::connect(addr.as_str()).await.unwrap();
        assert_eq!(client.count("b").await.unwrap_err().code(), Some("unauthorized"));
        client.call::<Value>(Call::new(OpKind::Auth).with("token", TOKEN)).await.unwrap();
        assert_eq!(client.count("b").await.unwrap(), 0);
    });
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let out = child.wait_with_output().unwrap();
    let logs = String::from_utf8_lossy(&out.stderr);
    assert!(logs.contains("listening"), "debug logs were captured");
    assert!(!logs.contains(TOKEN), "the token leaked into the logs");
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["serve", "--listen", "0.0.0.0:0", "--shards", "1"])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("RANKD_AUTH_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--auth-token"));
}

fn http_get(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}
