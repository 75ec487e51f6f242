//! The tokens a server accepts, each with a role. Secrets are compared in
//! constant time and never printed, not even by `Debug`.

use serde::{Deserialize, Serialize};

/// A secret setting: never printed, not even in `Debug` output.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// Compares with `candidate` in time that depends only on the lengths,
    /// never on where the first difference is.
    pub fn matches(&self, candidate: &str) -> bool {
        let (a, b) = (self.0.as_bytes(), candidate.as_bytes());
        let mut diff = a.len() ^ b.len();
        for i in 0..a.len().max(b.len()) {
            diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
        }
        diff == 0
    }
}

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Every read op, `boards`, `watch` and `unwatch`: for web frontends.
    Read,
    /// Everything: for game servers.
    Write,
}

impl Role {
    /// The wider of two roles (a secret listed twice grants the wider).
    fn max_with(self, other: Role) -> Role {
        if self == Role::Write || other == Role::Write {
            Role::Write
        } else {
            Role::Read
        }
    }
}

/// One token with its role: an entry of `[[tokens]]` in the config file or
/// the tokens file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// What the token allows.
    pub role: Role,
    /// The secret itself.
    pub token: Secret,
}

/// Every token the server accepts.
#[derive(Debug, Default)]
pub struct Tokens {
    /// The one plain token (`RANKD_AUTH_TOKEN`): full access, and `auth`
    /// answers `true` as in protocol 1 when it is the only kind.
    plain: Option<Secret>,
    /// Tokens with roles: `auth` answers the role.
    roles: Vec<TokenEntry>,
}

impl Tokens {
    /// The accepted tokens; empty secrets are dropped (`RANKD_AUTH_TOKEN=`
    /// turns auth off).
    pub fn new(plain: Option<Secret>, roles: Vec<TokenEntry>) -> Self {
        Self {
            plain: plain.filter(|secret| !secret.0.is_empty()),
            roles: roles.into_iter().filter(|entry| !entry.token.0.is_empty()).collect(),
        }
    }

    /// Whether clients must `auth` before anything but `ping`.
    pub fn required(&self) -> bool {
        self.plain.is_some() || !self.roles.is_empty()
    }

    /// Whether `auth` answers a role (`{"role": ...}`) instead of `true`.
    pub fn has_roles(&self) -> bool {
        !self.roles.is_empty()
    }

    /// The role `candidate` grants, if any. Every token is compared, so the
    /// time taken does not say which one (if any) came close.
    pub fn role_of(&self, candidate: &str) -> Option<Role> {
        let mut granted = None;
        if self.plain.as_ref().is_some_and(|secret| secret.matches(candidate)) {
            granted = Some(Role::Write);
        }
        for entry in &self.roles {
            if entry.token.matches(candidate) {
                granted = Some(granted.map_or(entry.role, |role: Role| role.max_with(entry.role)));
            }
        }
        granted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(role: Role, token: &str) -> TokenEntry {
        TokenEntry { role, token: Secret(token.into()) }
    }

    #[test]
    fn secrets_compare_exactly_and_never_print() {
        let secret = Secret("abc".into());
        assert!(secret.matches("abc"));
        assert!(!secret.matches("abd") && !secret.matches("ab") && !secret.matches("abcd") && !secret.matches(""));
        assert!(!format!("{:?}", entry(Role::Read, "abc")).contains("abc"));
        let tokens = Tokens::new(Some(Secret("plain-s3cret".into())), vec![entry(Role::Read, "r-s3cret")]);
        assert!(!format!("{tokens:?}").contains("s3cret"));
    }

    #[test]
    fn each_token_grants_its_role() {
        let tokens = Tokens::new(None, vec![entry(Role::Read, "r"), entry(Role::Write, "w")]);
        assert!(tokens.required() && tokens.has_roles());
        assert_eq!(tokens.role_of("r"), Some(Role::Read));
        assert_eq!(tokens.role_of("w"), Some(Role::Write));
        assert_eq!(tokens.role_of("x"), None);
        assert_eq!(tokens.role_of(""), None);
    }

    #[test]
    fn a_plain_token_writes_and_keeps_protocol_1_answers() {
        let tokens = Tokens::new(Some(Secret("p".into())), Vec::new());
        assert!(tokens.required() && !tokens.has_roles());
        assert_eq!(tokens.role_of("p"), Some(Role::Write));
        let both = Tokens::new(Some(Secret("p".into())), vec![entry(Role::Read, "r")]);
        assert!(both.has_roles());
        assert_eq!(both.role_of("p"), Some(Role::Write));
    }

    #[test]
    fn empty_secrets_are_no_tokens() {
        let tokens = Tokens::new(Some(Secret(String::new())), vec![entry(Role::Read, "")]);
        assert!(!tokens.required());
        assert_eq!(tokens.role_of(""), None);
    }

    #[test]
    fn a_secret_listed_twice_grants_the_wider_role() {
        let tokens = Tokens::new(None, vec![entry(Role::Write, "t"), entry(Role::Read, "t")]);
        assert_eq!(tokens.role_of("t"), Some(Role::Write));
    }
}
