//! The redis-cli style client subcommands: human output by default, the raw
//! result as JSON with `--json`.

use rmpv::Value;

use futures::StreamExt;
use rankd_client::cli::{show_push, WatchArgs};
use rankd_client::{Call, ClientError, OpKind, Score, WatchEvent, Watcher};

use crate::tools::cli::{ClientArgs, Command};

/// Runs a client subcommand against a running server; returns the exit code.
pub async fn run(command: Command) -> Result<(), ClientError> {
    let (args, call, show): (ClientArgs, Call, fn(&Value) -> String) = match command {
        Command::Serve(_) | Command::Import(_) | Command::Export(_) | Command::Backup(_) | Command::Check { .. } => {
            unreachable!("not a single-request client command")
        }
        Command::Watch { client, watch: spec } => return watch(client, spec).await,
        Command::Ping(args) => (args, Call::new(OpKind::Ping), plain),
        Command::CreateBoard { client, board, config } => {
            let call = config.spec().call(&board).map_err(|e| ClientError::Encode(e.to_string()))?;
            (client, call, plain)
        }
        Command::Set { client, board, player, score, mode, wid } => (
            client,
            Call::new(OpKind::Set)
                .with("board", board)
                .with("player", player)
                .with("score", score)
                .with("mode", mode)
                .with_opt("wid", wid),
            show_score,
        ),
        Command::Get { client, board, player } => {
            (client, Call::new(OpKind::Get).with("board", board).with("player", player), show_score)
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
    // Either kind of score: the board may have fields.
    let mut watcher = Watcher::connect_with(&args.server, &args.connect.options()?).await?.with_scores::<Score>();
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

/// A score: an integer, or a composite one as `trophies=5,retries=2` in
/// the board's field order (the server's).
fn show_score(value: &Value) -> String {
    let Some(fields) = value.as_map() else { return plain(value) };
    let pairs: Vec<String> = fields.iter().map(|(name, value)| format!("{}={value}", plain(name))).collect();
    pairs.join(",")
}

fn show_rank(value: &Value) -> String {
    if value.is_nil() {
        return "(nil)".to_string();
    }
    let rank = format!("rank {} of {} (score {})", value["rank"], value["count"], show_score(&value["score"]));
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
    // Composite scores are wider than 20 columns: the widest sets the width.
    let scores: Vec<String> = rows.iter().map(|row| show_score(&row["score"])).collect();
    let width = scores.iter().map(String::len).max().unwrap_or(0).max(20);
    let mut out = format!("{:>8}  {:>width$}  player", "rank", "score");
    for (row, score) in rows.iter().zip(&scores) {
        out.push_str(&format!("\n{:>8}  {score:>width$}  {}", row["rank"], plain(&row["player"])));
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
        if let Some(fields) = row["fields"].as_array() {
            let shown: Vec<String> = fields
                .iter()
                .map(|f| format!("{}:{}:{}:{}", plain(&f["name"]), plain(&f["order"]), f["min"], f["max"]))
                .collect();
            out.push_str(&format!("  fields {}", shown.join(" ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn composite(trophies: i64, retries: i64) -> Value {
        Value::Map(vec![("trophies".into(), trophies.into()), ("retries".into(), retries.into())])
    }

    #[test]
    fn composite_scores_print_in_the_servers_field_order() {
        assert_eq!(show_score(&composite(5, 2)), "trophies=5,retries=2");
        assert_eq!(show_score(&Value::from(-3)), "-3");
        assert_eq!(show_score(&Value::Nil), "(nil)");
        let rank =
            Value::Map(vec![("rank".into(), 1.into()), ("score".into(), composite(5, 2)), ("count".into(), 3.into())]);
        assert_eq!(show_rank(&rank), "rank 1 of 3 (score trophies=5,retries=2)");
        let row = Value::Map(vec![
            ("player".into(), "alice".into()),
            ("score".into(), composite(5, 2)),
            ("rank".into(), 1.into()),
        ]);
        assert!(show_entries(&Value::Array(vec![row])).ends_with("trophies=5,retries=2  alice"));
        let field = |name: &str, order: &str| {
            Value::Map(vec![
                ("name".into(), name.into()),
                ("order".into(), order.into()),
                ("min".into(), 0.into()),
                ("max".into(), 9.into()),
            ])
        };
        let board = Value::Map(vec![
            ("board".into(), "cup".into()),
            ("order".into(), "desc".into()),
            ("ties".into(), "competition".into()),
            ("count".into(), 0.into()),
            ("fields".into(), Value::Array(vec![field("trophies", "desc"), field("retries", "asc")])),
        ]);
        assert!(show_boards(&Value::Array(vec![board])).ends_with("fields trophies:desc:0:9 retries:asc:0:9"));
    }

    #[test]
    fn create_board_flags_make_a_spec() {
        use clap::Parser;
        let cli = crate::tools::cli::Cli::try_parse_from([
            "rankd",
            "create-board",
            "cup",
            "--ties",
            "dense",
            "--field",
            "trophies:desc:0:1000000",
            "--field",
            "retries:asc:1000",
        ])
        .unwrap();
        let Command::CreateBoard { config, board, .. } = cli.command else { panic!("create-board") };
        let spec = config.spec();
        assert_eq!((board.as_str(), spec.ties, spec.fields.len()), ("cup", Some(rankd_client::Ties::Dense), 2));
        assert_eq!(spec.fields[1], rankd_client::FieldSpec::asc("retries", 0, 1000));
        let set =
            crate::tools::cli::Cli::try_parse_from(["rankd", "set", "cup", "alice", "trophies=5,retries=2"]).unwrap();
        let Command::Set { score, .. } = set.command else { panic!("set") };
        assert_eq!(score, Score::Fields(rankd_client::FieldScores::from([("trophies", 5), ("retries", 2)])));
        assert!(crate::tools::cli::Cli::try_parse_from(["rankd", "create-board", "b", "--field", "t:up:5"]).is_err());
        assert!(crate::tools::cli::Cli::try_parse_from(["rankd", "set", "b", "p", "-5"]).is_ok());
    }
}
