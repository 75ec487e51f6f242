//! A leaderboard in a few calls: writes some scores, then prints the top 3
//! and one player's rank.
//!
//! ```sh
//! cargo run --release -- serve                       # a rankd on 127.0.0.1:7070
//! cargo run -p rankd-client --example leaderboard    # or: -- host:port [board]
//! ```
//!
//! The address is the first argument, else `RANKD_SERVER`, else
//! `127.0.0.1:7070`. With `RANKD_TLS_CA` (a CA certificate file) it speaks
//! TLS, and with `RANKD_TOKEN` it presents that token (a write token: it
//! writes).

use rankd_client::{Client, ConnectOptions, Mode, TlsOptions};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().or_else(|| std::env::var("RANKD_SERVER").ok());
    let addr = addr.unwrap_or_else(|| "127.0.0.1:7070".to_string());
    let board = args.next().unwrap_or_else(|| "example.arena".to_string());
    let options = ConnectOptions {
        tls: std::env::var_os("RANKD_TLS_CA")
            .map(|ca| TlsOptions { ca_file: Some(ca.into()), ..TlsOptions::default() }),
        token: std::env::var("RANKD_TOKEN").ok().map(Into::into),
        ..ConnectOptions::default()
    };
    let mut rankd = Client::connect_with(&addr, &options).await?;

    // One round trip for many players (at most 10 000 a call)...
    let entries = [("alice", 1200), ("bob", 900), ("carol", 1450), ("dave", 900), ("erin", 300)];
    rankd.set_many(&board, &entries, Mode::Set).await?;
    // ...and one at a time: `best` keeps the better of old and new.
    let kept = rankd.set(&board, "bob", 1000, Mode::Best).await?;
    println!("bob's best is {kept}");

    println!("top 3 of {board}:");
    for entry in rankd.top(&board, 3, 0).await? {
        println!("  #{} {} ({})", entry.rank, entry.player, entry.score);
    }
    match rankd.rank(&board, "dave").await? {
        Some(me) => println!("dave is #{} of {} with {}", me.rank, me.count, me.score),
        None => println!("dave has no score on {board}"),
    }
    Ok(())
}
