//! Who may talk to the server and how: tokens with roles, checked per
//! connection, and TLS on the client port (and optionally the metrics
//! endpoint), reloaded on SIGHUP.
//!
//! - [`tokens`]: the secrets, their roles, and the server's set of them;
//! - [`access`]: one connection's standing — its role, its failed `auth`s,
//!   and which ops it may run (plain logic, unit-tested);
//! - [`tls`]: the certificate files loaded into a rustls acceptor, swapped
//!   whole on reload;
//! - [`https`]: the metrics endpoint's TLS listener.

pub mod access;
pub mod https;
pub mod tls;
pub mod tokens;

pub use access::{Access, AuthOutcome};
pub use tls::{TlsError, TlsFiles, TlsReloader};
pub use tokens::{Role, Secret, TokenEntry, Tokens};
