//! A live top 5 (protocol 1.1): one task watches the board's best five
//! while another posts match results as idempotent writes, retried with
//! the same `wid` if an answer does not come, so a retried `incr` counts
//! once.
//!
//! ```sh
//! cargo run --release -- serve                      # a rankd on 127.0.0.1:7070
//! cargo run -p rankd-client --example live_top      # or: -- host:port [board]
//! ```
//!
//! The address is the first argument, else `RANKD_SERVER`, else
//! `127.0.0.1:7070`.

use std::time::Duration;

use futures_util::StreamExt;
use rankd_client::{
    set_call, ConnectOptions, Mode, RetryPolicy, RetryingClient, WatchEvent, WatchSpec, Watcher, Written,
};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args.next().or_else(|| std::env::var("RANKD_SERVER").ok());
    let addr = addr.unwrap_or_else(|| "127.0.0.1:7070".to_string());
    let board = args.next().unwrap_or_else(|| "example.live".to_string());
    let options = ConnectOptions::default();

    // The watch first: its first push is the board as it stands.
    let mut watcher = Watcher::connect_with(&addr, &options).await?;
    watcher.watch(&WatchSpec::top(&board, 5).interval(Duration::from_millis(200))).await?;

    let writer = {
        let (addr, board) = (addr.clone(), board.clone());
        let policy = RetryPolicy { timeout: Duration::from_secs(2), retries: 5, ..RetryPolicy::default() };
        tokio::spawn(async move {
            let mut rankd = RetryingClient::connect_with(&addr, &options, policy).await?;
            let players = ["alice", "bob", "carol", "dave", "erin", "frank"];
            for round in 0..30u64 {
                let player = players[(round % 6) as usize];
                rankd.set(&board, player, (round % 5 + 1) as i64, Mode::Incr).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // A service's own transaction id as the wid: sent twice (as after
            // a crash between sending and hearing back), it counts once.
            let wid = format!("bonus-{}", std::process::id());
            let bonus = || set_call(&board, "erin", 100, Mode::Incr);
            let first: Written<i64> = rankd.write_with_wid(bonus(), &wid).await?;
            let again: Written<i64> = rankd.write_with_wid(bonus(), &wid).await?;
            println!("erin's bonus: {} then {} (dup: {})", first.value, again.value, again.dup);
            Ok::<_, rankd_client::ClientError>(rankd.retried())
        })
    };

    let mut writing = Some(writer);
    while let Some(push) = watcher.next().await {
        match push?.event {
            WatchEvent::Top(entries) => {
                let row: Vec<String> =
                    entries.iter().map(|e| format!("#{} {} {}", e.rank, e.player, e.score)).collect();
                println!("top 5: {}", row.join(", "));
            }
            WatchEvent::Ended => {
                println!("the board was dropped");
                break;
            }
            WatchEvent::Player(_) => unreachable!("no player watch here"),
        }
        if writing.as_ref().is_some_and(|writer| writer.is_finished()) {
            let retried = writing.take().expect("checked above").await??;
            println!("writes done ({retried} retried); waiting a second for a last push");
            let last = tokio::time::timeout(Duration::from_secs(1), watcher.next()).await;
            if let Ok(Some(Ok(push))) = last {
                println!("last push: {:?}", push.event);
            }
            break;
        }
    }
    Ok(())
}
