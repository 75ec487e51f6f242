//! Metrics of who talks to the server: failed `auth`s, TLS handshakes that
//! failed (plaintext on a TLS port, unknown CAs, timeouts) and certificate
//! reloads.

use prometheus::{IntCounter, IntCounterVec, Opts};

use super::{Collectors, MetricsError};

/// The security counters.
pub struct SecurityMetrics {
    /// `auth` with a token the server does not hold.
    pub auth_failures: IntCounter,
    /// Handshakes that failed on the client port.
    pub client_handshake_failures: IntCounter,
    /// Handshakes that failed on the metrics endpoint.
    pub metrics_handshake_failures: IntCounter,
    /// Certificate reloads (SIGHUP) that took effect.
    pub reloads_ok: IntCounter,
    /// Certificate reloads that failed (the old certificate stays).
    pub reloads_failed: IntCounter,
}

impl SecurityMetrics {
    pub(super) fn new() -> Result<(Self, Collectors), MetricsError> {
        let auth_failures = IntCounter::new(
            "rankd_auth_failures_total",
            "`auth` requests with a token the server does not hold (the third on a connection closes it).",
        )?;
        let handshakes = IntCounterVec::new(
            Opts::new(
                "rankd_tls_handshake_failures_total",
                "TLS handshakes that failed or timed out (plaintext clients on a TLS port, untrusted client \
                 certificates), by endpoint.",
            ),
            &["endpoint"],
        )?;
        let reloads = IntCounterVec::new(
            Opts::new(
                "rankd_tls_reloads_total",
                "Certificate reloads on SIGHUP, by outcome (a failed one keeps the old).",
            ),
            &["outcome"],
        )?;
        let metrics = Self {
            auth_failures: auth_failures.clone(),
            client_handshake_failures: handshakes.with_label_values(&["client"]),
            metrics_handshake_failures: handshakes.with_label_values(&["metrics"]),
            reloads_ok: reloads.with_label_values(&["ok"]),
            reloads_failed: reloads.with_label_values(&["failed"]),
        };
        Ok((metrics, vec![Box::new(auth_failures), Box::new(handshakes), Box::new(reloads)]))
    }
}
