//! Composite scores (protocol 1.1): a cup ranked by most trophies, then
//! fewest retries, written and read with `FieldScores`, and watched.
//!
//! ```sh
//! cargo run -p rankd-client --example cup -- 127.0.0.1:7070
//! ```

use std::time::Duration;

use futures_util::StreamExt;
use rankd_client::{BoardSpec, Client, ClientError, FieldScores, FieldSpec, Mode, WatchEvent, WatchSpec, Watcher};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "127.0.0.1:7070".into());
    let board = format!("cup-{}", std::process::id());
    let mut rankd = Client::connect(&addr).await?;
    let fields = vec![FieldSpec::desc("trophies", 0, 1_000_000), FieldSpec::asc("retries", 0, 1000)];
    rankd.create_board_with(&board, &BoardSpec::with_fields(fields.clone())).await?;
    assert_eq!(rankd.board_fields(&board).await?, Some(fields));

    let score = |trophies, retries| FieldScores::from([("trophies", trophies), ("retries", retries)]);
    let entries = [("ann", score(30, 4)), ("bo", score(30, 1)), ("cy", score(12, 0))];
    rankd.set_many_fields(&board, &entries, Mode::Set).await?;
    // One retry fewer for ann: fields left out of an incr add 0.
    let ann = rankd.set_fields(&board, "ann", &FieldScores::new().with("retries", -3), Mode::Incr).await?;
    println!("ann now has {ann}");
    for entry in rankd.top_fields(&board, 10, 0).await? {
        println!("#{} {} {}", entry.rank, entry.player, entry.score);
    }
    let cy = rankd.rank_fields(&board, "cy").await?.ok_or("cy is on the board")?;
    println!("cy is #{} of {} with {} trophies", cy.rank, cy.count, cy.score.get("trophies").unwrap_or(0));
    println!("31 trophies would rank #{}", rankd.rank_of_fields(&board, &score(31, 9)).await?);
    println!("friends: {:?}", rankd.ranks_fields(&board, &["cy", "bo"]).await?);
    println!("around bo: {}", rankd.around_fields(&board, "bo", 1, 1).await?.len());
    // An integer score on this board is the server's bad_request.
    let refused = rankd.set(&board, "dee", 5, Mode::Set).await;
    assert!(matches!(refused, Err(ClientError::Server { ref code, .. }) if code == "bad_request"));

    let mut watcher = Watcher::connect(&addr).await?.with_scores::<FieldScores>();
    watcher.watch(&WatchSpec::player(&board, "cy")).await?;
    if let Some(push) = tokio::time::timeout(Duration::from_secs(5), watcher.next()).await?.transpose()? {
        if let WatchEvent::Player(Some(info)) = push.event {
            println!("watch: cy is #{} with {}", info.rank, info.score);
        }
    }
    rankd.drop_board(&board).await?;
    Ok(())
}
