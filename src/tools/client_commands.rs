//! The redis-cli style client subcommands: human output by default, the raw
//! result as JSON with `--json`.

use rmpv::Value;

use futures::StreamExt;
use rankd_client::cli::{show_push, WatchArgs};
use rankd_client::{Call, ClientError, OpKind, WatchEvent, Watcher};

use crate::tools::cli::{ClientArgs, Command};

/// Runs a client subcommand against a running server; returns the exit code.
pub async fn run(command: Command) -> Result<(), ClientError> {
    let (args, call, show): (ClientArgs, Call, fn(&Value) -> String) = match command {
        Command::Serve(_) | Command::Import(_) | Command::Export(_) | Command::Backup(_) | Command::Check { .. } => {
            unreachable!("not a single-request client command")
        }
        Command::Watch { client, watch: spec } => return watch(client, spec).await,
        Command::Ping(args) => (args, Call::new(OpKind::Ping), plain),
        Command::Set { client, board, player, score, mode, wid } => (
            client,
            Call::new(OpKind::Set)
                .with("board", board)
                .with("player", player)
                .with("score", score)
                .with("mode", mode)
                .with_opt("wid", wid),
            plain,
        ),
        Command::Get { client, board, player } => {
            (client, Call::new(OpKind::Get).with("board", board).with("player", player), plain)
        }
        Command::Rank { client, board, player, approx } => {
            let call = Call::new(OpKind::Rank).with("board", board).with("player", player);
            (client, if approx { call.with("approx", true) } else { call }, show_rank)
        }
        Command::RankOfScore { client, board, score, approx } => {
            let call = Call::new(OpKind::RankOfScore).with("board", board).with("score", score);
            (client, if approx { call.with("approx", true) } else { call }, show_rank_of_score)
        }
        Command::Top { client, board, limit, offset } => (
            client,
            Call::new(OpKind::Top).with("board", board).with("limit", limit).with("offset", offset),
            show_entries,
        ),
        Command::Around { client, board, player, before, after } => (
            client,
            Call::new(OpKind::Around)
                .with("board", board)
                .with("player", player)
                .with("before", before)
                .with("after", after),
            show_entries,
        ),
        Command::Ranks { client, board, players } => {
            (client, Call::new(OpKind::Ranks).with("board", board).with("players", players), show_entries)
        }
        Command::Count { client, board } => (client, Call::new(OpKind::Count).with("board", board), plain),
        Command::Boards { client, prefix, after, limit } => (
            client,
            Call::new(OpKind::Boards)
                .with_opt("prefix", Some(prefix).filter(|p| !p.is_empty()))
                .with_opt("after", after)
                .with("limit", limit),
            show_boards,
        ),
    };
    let mut client = args.connect().await?;
    let result: Value = client.call(call).await?;
    if args.json {
        let json = serde_json::to_string_pretty(&result).map_err(|e| ClientError::Protocol(e.to_string()))?;
        println!("{json}");
    } else {
        println!("{}", show(&result));
    }
    Ok(())
}

/// `rankd watch`: prints every push (a JSON line each with `--json`)
/// until the watch ends (its board was dropped) or the connection closes.
async fn watch(args: ClientArgs, spec: WatchArgs) -> Result<(), ClientError> {
    let mut watcher = Watcher::connect_with(&args.server, &args.connect.options()?).await?;
    watcher.watch(&spec.spec()).await?;
    while let Some(push) = watcher.next().await {
        let push = push?;
        if args.json {
            println!("{}", serde_json::to_string(&push).map_err(|e| ClientError::Protocol(e.to_string()))?);
        } else {
            println!("{}\n", show_push(&push));
        }
        if push.event == WatchEvent::Ended {
            break;
        }
    }
    Ok(())
}

fn plain(value: &Value) -> String {
    match value {
        Value::Nil => "(nil)".to_string(),
        Value::String(s) => s.as_str().unwrap_or_default().to_string(),
        other => other.to_string(),
    }
}

fn show_rank(value: &Value) -> String {
    if value.is_nil() {
        return "(nil)".to_string();
    }
    let rank = format!("rank {} of {} (score {})", value["rank"], value["count"], value["score"]);
    match value["error"].as_u64() {
        Some(error) => format!("{rank}, ± {error} (approximate)"),
        None => rank,
    }
}

/// `rank_of_score`: a bare rank, or an approximate one as a map.
fn show_rank_of_score(value: &Value) -> String {
    match value["error"].as_u64() {
        Some(error) => format!("rank {} ± {error} (approximate)", value["rank"]),
        None => format!("rank {}", plain(value)),
    }
}

fn show_entries(value: &Value) -> String {
    let Some(rows) = value.as_array() else { return plain(value) };
    if rows.is_empty() {
        return "(empty)".to_string();
    }
    let mut out = format!("{:>8}  {:>20}  player", "rank", "score");
    for row in rows {
        out.push_str(&format!("\n{:>8}  {:>20}  {}", row["rank"], row["score"], plain(&row["player"])));
    }
    out
}

fn show_boards(value: &Value) -> String {
    let Some(rows) = value.as_array() else { return plain(value) };
    if rows.is_empty() {
        return "(no boards)".to_string();
    }
    let mut out = format!("{:<32} {:<5} {:<12} {:>12}", "board", "order", "ties", "players");
    for row in rows {
        out.push_str(&format!(
            "\n{:<32} {:<5} {:<12} {:>12}",
            plain(&row["board"]),
            plain(&row["order"]),
            plain(&row["ties"]),
            row["count"]
        ));
    }
    out
}
