//! `[http]`: the daemon's HTTP endpoint (Prometheus metrics, the live dashboard, the
//! opt-in rule lab), and `[metrics]`, the older name of its address, still accepted.
//!
//! Kept apart from [`super::settings`] because the endpoint has its own budget (the lab
//! may load the configured Redis only within `lab_max_rps`, `lab_max_seconds`,
//! `lab_max_keys`) and one rule across two tables: a listen address in `[metrics]`
//! stands for `[http] listen`, never both at once.

use super::de::ranged;
use super::settings::MetricsConfig;
use super::{ConfigError, Locator};
use serde::{Deserialize, Deserializer};
use std::net::SocketAddr;

/// `[http]`: where the endpoint listens and what it serves.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// `ip:port` of the HTTP listener (e.g. `"127.0.0.1:9090"`), or a port alone (`9090`
    /// or `"9090"`) for `127.0.0.1:<port>`; absent: no endpoint (no metrics, no
    /// dashboard). Unauthenticated: keep it on loopback (another address is logged as a
    /// warning at start).
    #[serde(deserialize_with = "super::de::de_listen")]
    pub listen: Option<SocketAddr>,
    /// Connections served at once (1..=1024); more wait in the kernel's listen queue,
    /// holding no file descriptor of the daemon. At most half of them (at least 1) may be
    /// event streams (dashboard, lab), so a scrape always finds a slot.
    #[serde(deserialize_with = "de_http_connections")]
    pub max_connections: usize,
    /// Serve the rule lab at `/lab` (default off: `/lab` answers 404).
    pub lab: bool,
    /// Decisions per second one lab run may ask at most, all its simulated clients
    /// together (1..=100000).
    #[serde(deserialize_with = "de_lab_rps")]
    pub lab_max_rps: u32,
    /// Longest lab run, seconds (1..=600).
    #[serde(deserialize_with = "de_lab_seconds")]
    pub lab_max_seconds: u32,
    /// Most keys (simulated clients) of one lab run (1..=10000).
    #[serde(deserialize_with = "de_lab_keys")]
    pub lab_max_keys: u32,
}

/// `http.max_connections` when `[http] listen` is set (`[metrics] listen` keeps its own
/// default, 4, as before).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16;

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            lab: false,
            lab_max_rps: 500,
            lab_max_seconds: 60,
            lab_max_keys: 100,
        }
    }
}

impl HttpConfig {
    /// Event streams served at once: half the connections, at least 1.
    pub fn max_streams(&self) -> usize {
        (self.max_connections / 2).max(1)
    }

    /// The endpoint in force: `[http]` as written, or, when only `[metrics] listen` is
    /// set, that address with `metrics.max_connections`.
    ///
    /// # Errors
    /// Both `[http] listen` and `[metrics] listen` are set (`text` locates the field).
    pub(super) fn merged(
        mut self,
        metrics: &MetricsConfig,
        at: &Locator,
        text: &str,
    ) -> Result<HttpConfig, ConfigError> {
        match (self.listen, metrics.listen) {
            (Some(_), Some(_)) => {
                let start = text.find("[metrics]").unwrap_or(0);
                Err(at.invalid(
                    start..start,
                    "metrics.listen",
                    "set [http] listen only: [metrics] listen is its older name, and both are set",
                ))
            }
            (None, Some(listen)) => {
                self.listen = Some(listen);
                self.max_connections = metrics.max_connections;
                Ok(self)
            }
            _ => Ok(self),
        }
    }
}

fn de_http_connections<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    ranged(d, "http.max_connections", 1, 1024).map(|v| v as usize)
}

fn de_lab_rps<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "http.lab_max_rps", 1, 100_000).map(|v| v as u32)
}

fn de_lab_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "http.lab_max_seconds", 1, 600).map(|v| v as u32)
}

fn de_lab_keys<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "http.lab_max_keys", 1, 10_000).map(|v| v as u32)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const BASE: &str = "[redis]\nmode = \"none\"\n";

    #[test]
    fn metrics_listen_stands_for_http_listen_and_both_at_once_are_refused() {
        let c = Config::parse(&format!("{BASE}[metrics]\nlisten = 9100\n"), "t").unwrap();
        assert_eq!(c.http.listen, Some(([127, 0, 0, 1], 9100).into()));
        assert_eq!(c.http.max_connections, 4);
        assert!(!c.http.lab);
        let c = Config::parse(&format!("{BASE}[http]\nlisten = 9100\nlab = true\n"), "t").unwrap();
        assert_eq!(c.http.max_connections, 16);
        assert!(c.http.lab);
        assert_eq!(c.http.lab_max_rps, 500);
        let both = format!("{BASE}[http]\nlisten = 9100\n[metrics]\nlisten = 9101\n");
        let e = Config::parse(&both, "t").unwrap_err().to_string();
        assert!(
            e.contains("metrics.listen") && e.contains("[http] listen"),
            "{e}"
        );
        let e = Config::parse(&format!("{BASE}[http]\nlab_max_rps = 0\n"), "t").unwrap_err();
        assert!(e.to_string().contains("http.lab_max_rps"), "{e}");
    }
}
