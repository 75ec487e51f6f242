//! Auth against the real server: nothing but `ping` and `auth` before a
//! successful `auth`, per connection; the token never shows in anything the
//! server prints (stdout, stderr at the most verbose log level) or in its
//! metrics; a non-loopback listener without a token is refused.

mod common;

use std::process::Command;

use rankd::client::{Call, Client};
use rmpv::Value;

const TOKEN: &str = "correct-horse-battery-staple";
/// A wrong token a client sends: someone's secret too, so never printed either.
const WRONG_TOKEN: &str = "incorrect-donkey-battery-staple";

#[tokio::test]
async fn every_op_but_ping_and_auth_waits_for_a_successful_auth() {
    let mut server = common::Server::start_capturing(2, &["--auth-token", TOKEN], &[("RANKD_LOG", "trace")]);
    let mut client = server.client().await;
    assert_eq!(client.ping().await.unwrap(), "pong", "ping needs no token");
    for call in [
        rankd::client::set_call("b", "p", 1, "set"),
        Call::new("get").with("board", "b").with("player", "p"),
        Call::new("boards"),
        Call::new("top").with("board", "b"),
        Call::new("create_board").with("board", "b"),
    ] {
        let err = client.call(call).await.expect_err("refused before auth");
        assert_eq!(err.code(), Some("unauthorized"));
    }
    let err = client.call(Call::new("auth").with("token", WRONG_TOKEN)).await.expect_err("wrong token");
    assert_eq!(err.code(), Some("unauthorized"));
    assert_eq!(client.count("b").await.unwrap_err().code(), Some("unauthorized"), "still locked");

    // Auth and a write pipelined together: order decides.
    let replies = client
        .pipeline(&[Call::new("auth").with("token", TOKEN), rankd::client::set_call("b", "p", 7, "set")])
        .await
        .unwrap();
    assert_eq!(replies[0].as_ref().unwrap().as_bool(), Some(true));
    assert_eq!(replies[1].as_ref().unwrap().as_i64(), Some(7));
    assert_eq!(client.get("b", "p").await.unwrap(), Some(7));

    // Another connection is not authenticated by this one.
    let mut other = server.client().await;
    assert_eq!(other.get("b", "p").await.unwrap_err().code(), Some("unauthorized"));

    // The token is in neither the metrics nor anything the server printed.
    let metrics = server.metrics_text();
    assert!(metrics.contains("rankd_requests_total"), "the metrics page was read");
    assert!(!metrics.contains(TOKEN) && !metrics.contains(WRONG_TOKEN), "a token is in the metrics");
    drop((client, other));
    assert!(server.terminate().success(), "SIGTERM exits 0");
    assert_never_printed(&server);
}

/// The captured stdout and stderr are the whole of the server's output
/// (from its first line to its last), and hold neither token.
fn assert_never_printed(server: &common::Server) {
    let (stdout, stderr) = (server.stdout_text(), server.stderr_text());
    assert!(stdout.starts_with("rankd listening on "), "stdout was captured: {stdout:?}");
    for line in ["listening", "shut down cleanly"] {
        assert!(stderr.contains(line), "the server's logs were captured (no {line:?} in them):\n{stderr}");
    }
    for (name, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        for token in [TOKEN, WRONG_TOKEN] {
            assert!(!text.contains(token), "the token {token:?} leaked into the server's {name}:\n{text}");
        }
    }
}

#[tokio::test]
async fn the_token_can_come_from_the_environment_and_is_never_logged() {
    let mut server = common::Server::start_capturing(1, &[], &[("RANKD_AUTH_TOKEN", TOKEN), ("RANKD_LOG", "trace")]);
    let mut client = Client::connect(server.addr.as_str()).await.unwrap();
    assert_eq!(client.count("b").await.unwrap_err().code(), Some("unauthorized"));
    let err = client.call(Call::new("auth").with("token", WRONG_TOKEN)).await.expect_err("wrong token");
    assert_eq!(err.code(), Some("unauthorized"));
    assert_eq!(client.call(Call::new("auth").with("token", TOKEN)).await.unwrap(), Value::from(true));
    assert_eq!(client.count("b").await.unwrap(), 0);
    drop(client);
    assert!(server.terminate().success(), "SIGTERM exits 0");
    assert_never_printed(&server);
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
