//! How the daemon connects to Redis, from `[redis]`: which servers (seeds, the one node,
//! or the sentinels), the TLS files, the credentials, and fred's connection settings.
//!
//! Built once at start-up; a reload re-reads only the secret files' contents (see
//! [`secrets_fingerprint`]). Kept apart from [`super::redis`], which owns what is sent
//! over these connections.

use super::credentials::Credentials;
use super::tls::TlsFiles;
use super::StoreError;
use crate::config::{parse_node, RedisConfig, RedisMode};
use fred::prelude::*;
use fred::types::config::UnresponsiveConfig;
use std::time::Duration;

/// The commands fred may hold for one primary (they only wait there while it is
/// reachable: see the module comment).
pub const COMMAND_BUFFER: usize = 16_384;

/// The fred server settings of `cfg`: seed nodes (cluster), the one node (standalone)
/// or the sentinels (sentinel). With `tls_server_name`, the seeds' certificates are
/// checked against that name (nodes learnt later get it from [`Tls::fred_config`](super::tls::Tls::fred_config)).
pub(super) fn servers(
    cfg: &RedisConfig,
    tls_name: Option<&str>,
) -> Result<ServerConfig, StoreError> {
    let parse = |field: &str, nodes: &[String]| {
        nodes
            .iter()
            .map(|node| {
                let (host, port) = parse_node(node)
                    .ok_or_else(|| StoreError::Config(format!("{field}: bad node '{node}'")))?;
                let mut server = Server::new(host, port);
                server.tls_server_name = tls_name.map(Into::into);
                Ok(server)
            })
            .collect::<Result<Vec<_>, StoreError>>()
    };
    let mut hosts = parse("redis.nodes", cfg.nodes.get_ref())?;
    match cfg.mode {
        RedisMode::Cluster => Ok(ServerConfig::Clustered {
            hosts,
            policy: Default::default(),
        }),
        RedisMode::Standalone if hosts.len() == 1 => Ok(ServerConfig::Centralized {
            server: hosts.remove(0),
        }),
        RedisMode::Sentinel => Ok(ServerConfig::Sentinel {
            hosts: parse("redis.sentinels", &cfg.sentinels)?,
            service_name: cfg.service_name.clone().unwrap_or_default(),
        }),
        _ => Err(StoreError::Config(
            "redis.mode needs one node (standalone), seed nodes (cluster) or sentinels".into(),
        )),
    }
}

/// A hash of the contents of every secret file `cfg` names (password files, CA, client
/// certificate and key); an unreadable file hashes as empty. Never logged.
pub(super) fn secrets_fingerprint(cfg: &RedisConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let password = Credentials::resolve_password_file(cfg.password_file.as_deref());
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for path in [
        &password,
        &cfg.sentinel_password_file,
        &cfg.tls_ca_file,
        &cfg.tls_cert_file,
        &cfg.tls_key_file,
    ]
    .into_iter()
    .flatten()
    {
        std::fs::read(path).unwrap_or_default().hash(&mut hasher);
    }
    hasher.finish()
}

/// The TLS files and name of `cfg`.
pub(super) fn tls_files(cfg: &RedisConfig) -> TlsFiles {
    TlsFiles {
        ca: cfg.tls_ca_file.clone(),
        cert: cfg.tls_cert_file.clone(),
        key: cfg.tls_key_file.clone(),
        server_name: cfg.tls_server_name.clone(),
    }
}

/// The credentials of `cfg`, the password file resolved (config, then the systemd
/// credential), read once so that a missing file is reported now.
pub(super) fn credentials(cfg: &RedisConfig) -> Result<Credentials, StoreError> {
    let credentials = credentials_of(cfg);
    credentials.check().map_err(StoreError::Config)?;
    Ok(credentials)
}

/// The credentials `cfg` names, nothing read yet.
fn credentials_of(cfg: &RedisConfig) -> Credentials {
    let sentinels = cfg
        .sentinels
        .iter()
        .filter_map(|n| parse_node(n).map(|(h, p)| (h.to_owned(), p)))
        .collect();
    Credentials {
        username: cfg.username.clone(),
        password_file: Credentials::resolve_password_file(cfg.password_file.as_deref()),
        sentinel_username: cfg.sentinel_username.clone(),
        sentinel_password_file: cfg.sentinel_password_file.clone(),
        sentinels,
    }
}

/// How fred's connections behave, for a decision bound of `timeout`.
pub(super) fn connection_settings(conn: &mut ConnectionConfig, timeout: Duration) {
    conn.connection_timeout = Duration::from_millis(500);
    conn.internal_command_timeout = Duration::from_millis(500).max(timeout);
    // Never replay a decision on a new connection: it may have run already (its caller
    // has long been answered locally).
    conn.max_command_attempts = 1;
    // A frozen server (SIGSTOP, a long script) accepts bytes but never answers: drop
    // such connections and reconnect.
    conn.unresponsive = UnresponsiveConfig {
        max_timeout: Some(Duration::from_secs(2)),
        interval: Duration::from_millis(100),
    };
    // Bound what may queue in the client (a backpressure error beyond it).
    conn.max_command_buffer_len = COMMAND_BUFFER;
}

/// What `ratelimitd --check` verifies of `cfg` beyond its syntax: the password files
/// can be read (and are not readable by everyone) and, with TLS, the CA and client
/// certificate files load. Returns the warnings to print.
///
/// # Errors
/// A message naming the field and the file that cannot be used.
pub fn check_files(cfg: &RedisConfig) -> Result<Vec<String>, String> {
    let warnings = credentials_of(cfg).check()?;
    if cfg.tls {
        super::tls::Tls::new(&tls_files(cfg))?;
    }
    Ok(warnings)
}
