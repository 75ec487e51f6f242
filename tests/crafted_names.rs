//! Hostile player names over TCP: two names crafted so that their storage
//! keys share one unkeyed 128-bit xxHash3 (what the record cache keyed by
//! once) stay two players, with their own scores and ranks, through writes
//! that move them, a removal, and kill -9.

mod common;

use rankd_client::{Client, Mode};
use rankd_shards::CRAFTED_PAIR;

/// Every figure of the two players and the board, against what was written.
async fn check(client: &mut Client, scores: &[(&str, Option<i64>)]) {
    let present: Vec<i64> = scores.iter().filter_map(|(_, score)| *score).collect();
    assert_eq!(client.count("hostile").await.unwrap(), present.len() as u64);
    for (player, score) in scores {
        assert_eq!(client.get("hostile", player).await.unwrap(), *score, "{player:?}");
        let rank = client.rank("hostile", player).await.unwrap().map(|r| r.rank);
        let better = |s: i64| present.iter().filter(|other| **other > s).count() as u64 + 1;
        assert_eq!(rank, score.map(better), "{player:?}'s rank");
    }
    let top: Vec<(String, i64)> =
        client.top("hostile", 10, 0).await.unwrap().into_iter().map(|e| (e.player, e.score)).collect();
    let mut want: Vec<(String, i64)> =
        scores.iter().filter_map(|(player, score)| Some((player.to_string(), (*score)?))).collect();
    want.sort_by_key(|entry| std::cmp::Reverse(entry.1));
    assert_eq!(top, want);
}

#[tokio::test]
async fn names_crafted_to_share_an_unkeyed_hash_stay_two_players() {
    let (a, b) = CRAFTED_PAIR;
    let mut server = common::Server::start(1);
    let mut client = server.client().await;
    client.set("hostile", a, 10, Mode::Set).await.unwrap();
    client.set("hostile", b, 20, Mode::Set).await.unwrap();
    check(&mut client, &[(a, Some(10)), (b, Some(20))]).await;
    client.set("hostile", a, 30, Mode::Set).await.unwrap();
    client.set("hostile", b, 5, Mode::Set).await.unwrap();
    check(&mut client, &[(a, Some(30)), (b, Some(5))]).await;
    assert!(client.remove("hostile", b).await.unwrap());
    check(&mut client, &[(a, Some(30)), (b, None)]).await;
    client.set("hostile", b, 40, Mode::Set).await.unwrap();

    drop(client);
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    check(&mut client, &[(a, Some(30)), (b, Some(40))]).await;
    client.set("hostile", a, 50, Mode::Set).await.unwrap();
    check(&mut client, &[(a, Some(50)), (b, Some(40))]).await;
}
