//! One connection's standing: which role its `auth` earned, how many
//! `auth`s failed, and whether an op may run. Plain logic, so the rules are
//! unit-tested without a socket.

use std::sync::Arc;

use rankd_client::OpKind;

use super::tokens::{Role, Tokens};

/// Failed `auth`s a connection may make: the last is answered, then the
/// connection closes, so a client cannot guess tokens without end.
pub const MAX_AUTH_FAILURES: u32 = 3;

/// What an `auth` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthOutcome {
    /// Accepted: answer `true` (no roles on this server, or none needed).
    Accepted,
    /// Accepted: answer `{"role": ...}`.
    AcceptedAs(Role),
    /// Refused; `close` once the connection has used up its attempts.
    Refused {
        /// Close the connection after answering.
        close: bool,
    },
}

/// Why an op may not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No successful `auth` yet.
    NotAuthenticated,
    /// The token's role does not allow the op.
    ReadOnly,
}

/// A connection's standing.
#[derive(Debug)]
pub struct Access {
    tokens: Arc<Tokens>,
    /// The role earned, or every right when the server needs no token.
    role: Option<Role>,
    failures: u32,
}

impl Access {
    /// A new connection: unauthenticated when the server needs a token.
    pub fn new(tokens: Arc<Tokens>) -> Self {
        let role = (!tokens.required()).then_some(Role::Write);
        Self { tokens, role, failures: 0 }
    }

    /// Takes an `auth` with `candidate`. A failure leaves an earlier
    /// success in place (a client's typo does not lock it out) but counts.
    pub fn auth(&mut self, candidate: &str) -> AuthOutcome {
        if !self.tokens.required() {
            return AuthOutcome::Accepted;
        }
        match self.tokens.role_of(candidate) {
            Some(role) => {
                self.role = Some(role);
                if self.tokens.has_roles() {
                    AuthOutcome::AcceptedAs(role)
                } else {
                    AuthOutcome::Accepted
                }
            }
            None => {
                self.failures += 1;
                AuthOutcome::Refused { close: self.failures >= MAX_AUTH_FAILURES }
            }
        }
    }

    /// Whether `op` may run now (`auth` itself goes through [`Access::auth`]).
    pub fn permits(&self, op: OpKind) -> Result<(), Denied> {
        match (op, self.role) {
            (OpKind::Ping | OpKind::Auth, _) | (_, Some(Role::Write)) => Ok(()),
            (_, None) => Err(Denied::NotAuthenticated),
            (op, Some(Role::Read)) if op.needs_write_role() => Err(Denied::ReadOnly),
            (_, Some(Role::Read)) => Ok(()),
        }
    }
}

impl Access {
    /// Whether a request of `op` (`None`: unreadable) counts as the
    /// client's activity for the idle timeout. Before `auth` only `auth`
    /// does, so a client without a token cannot hold a connection, one of
    /// `--max-connections`, open with pings.
    pub fn keeps_alive(&self, op: Option<OpKind>) -> bool {
        self.role.is_some() || op == Some(OpKind::Auth)
    }

    /// Whether a request that could not be read may be told what is wrong
    /// with it (`op`: its op, if that much could be read). Before `auth`
    /// it may not, whatever its op, so a client without a token learns
    /// nothing of the ops and their fields; nor may a write of a read-only
    /// token.
    pub fn explains_unreadable(&self, op: Option<OpKind>) -> Result<(), Denied> {
        match op {
            Some(op) => self.permits(op),
            None if self.role.is_none() => Err(Denied::NotAuthenticated),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::tokens::{Secret, TokenEntry};

    fn roles() -> Arc<Tokens> {
        Arc::new(Tokens::new(
            None,
            vec![
                TokenEntry { role: Role::Read, token: Secret("r".into()) },
                TokenEntry { role: Role::Write, token: Secret("w".into()) },
            ],
        ))
    }

    #[test]
    fn an_open_server_permits_everything() {
        let mut access = Access::new(Arc::new(Tokens::default()));
        assert!(OpKind::ALL.iter().all(|op| access.permits(*op).is_ok()));
        assert_eq!(access.auth("anything"), AuthOutcome::Accepted);
    }

    #[test]
    fn only_ping_and_auth_before_auth() {
        let access = Access::new(roles());
        for op in OpKind::ALL {
            let want = if matches!(op, OpKind::Ping | OpKind::Auth) { Ok(()) } else { Err(Denied::NotAuthenticated) };
            assert_eq!(access.permits(*op), want, "{op:?}");
        }
    }

    #[test]
    fn an_unreadable_request_is_explained_only_as_far_as_the_standing_allows() {
        let mut access = Access::new(roles());
        for op in [None, Some(OpKind::Set), Some(OpKind::Count)] {
            assert_eq!(access.explains_unreadable(op), Err(Denied::NotAuthenticated), "{op:?} before auth");
        }
        assert_eq!(access.explains_unreadable(Some(OpKind::Auth)), Ok(()), "a malformed auth is explained");
        assert_eq!(access.explains_unreadable(Some(OpKind::Ping)), Ok(()));
        access.auth("r");
        assert_eq!(access.explains_unreadable(Some(OpKind::Set)), Err(Denied::ReadOnly));
        assert_eq!(access.explains_unreadable(Some(OpKind::Count)), Ok(()));
        assert_eq!(access.explains_unreadable(None), Ok(()), "an unknown op, once authenticated");
        let open = Access::new(Arc::new(Tokens::default()));
        assert_eq!(open.explains_unreadable(None), Ok(()), "a server that needs no token explains all");
    }

    #[test]
    fn before_auth_only_auth_keeps_a_connection_alive() {
        let mut access = Access::new(roles());
        assert!(!access.keeps_alive(Some(OpKind::Ping)) && !access.keeps_alive(None));
        assert!(access.keeps_alive(Some(OpKind::Auth)));
        access.auth("r");
        assert!(access.keeps_alive(Some(OpKind::Ping)) && access.keeps_alive(None));
        assert!(Access::new(Arc::new(Tokens::default())).keeps_alive(Some(OpKind::Ping)), "no token needed");
    }

    #[test]
    fn a_read_token_reads_and_cannot_write() {
        let mut access = Access::new(roles());
        assert_eq!(access.auth("r"), AuthOutcome::AcceptedAs(Role::Read));
        for op in OpKind::ALL {
            let want = if op.needs_write_role() { Err(Denied::ReadOnly) } else { Ok(()) };
            assert_eq!(access.permits(*op), want, "{op:?}");
        }
        assert_eq!(access.permits(OpKind::Backup), Err(Denied::ReadOnly), "a backup copies everything");
        assert_eq!(access.auth("w"), AuthOutcome::AcceptedAs(Role::Write), "a later auth changes the role");
        assert!(OpKind::ALL.iter().all(|op| access.permits(*op).is_ok()));
    }

    #[test]
    fn the_third_failure_closes() {
        let mut access = Access::new(roles());
        assert_eq!(access.auth("x"), AuthOutcome::Refused { close: false });
        assert_eq!(access.auth("w"), AuthOutcome::AcceptedAs(Role::Write));
        assert_eq!(access.auth("y"), AuthOutcome::Refused { close: false }, "a failure keeps the role earned");
        assert!(access.permits(OpKind::Set).is_ok());
        assert_eq!(
            access.auth("z"),
            AuthOutcome::Refused { close: true },
            "failures count, successes do not reset them"
        );
    }

    #[test]
    fn a_plain_token_answers_true() {
        let mut access = Access::new(Arc::new(Tokens::new(Some(Secret("p".into())), Vec::new())));
        assert_eq!(access.permits(OpKind::Get), Err(Denied::NotAuthenticated));
        assert_eq!(access.auth("p"), AuthOutcome::Accepted);
        assert!(access.permits(OpKind::Set).is_ok());
    }
}
