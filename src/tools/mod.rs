//! The `rankd` command line beyond `serve`: client subcommands, bulk
//! import and export through a running server, online backups, and the offline check of a
//! stopped server's data dir.

pub mod backup;
pub mod check;
pub mod cli;
pub mod client_commands;
pub mod import;
pub mod transfer;
