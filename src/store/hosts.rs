//! How many daemons share the limits, for `fallback.hosts = "auto"`: each daemon
//! registers itself in Redis with a heartbeat every [`HEARTBEAT_EVERY`] (one EVALSHA of
//! `lua/hosts.lua` on `<prefix>:{hosts}`, a sorted set scored by Redis `TIME` and
//! pruned of heartbeats older than [`ALIVE_FOR`]) and learns how many are alive. While
//! Redis is unreachable, the count last seen stays in force (the fallback reads it).

use super::redis::RedisStore;
use super::{StoreError, StoreKey};
use fred::types::scripts::Script;
use fred::types::Value;
use std::time::Duration;

/// How often a daemon says it is alive.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);

/// How long a heartbeat counts: a daemon silent this long (stopped, crashed, cut off
/// from Redis) no longer shares the limits.
pub const ALIVE_FOR: Duration = Duration::from_secs(5);

/// This daemon's heartbeat: the script, the key, and the daemon's id.
pub struct Heartbeat {
    script: Script,
    key: String,
    id: String,
}

impl Heartbeat {
    /// The heartbeat of this process under `prefix`: its id is the host name, the pid
    /// and the start time (µs), unique across restarts.
    pub fn new(prefix: &str) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let id = format!(
            "{host}:{}:{:.0}",
            std::process::id(),
            crate::clock::wall_clock_us()
        );
        Heartbeat {
            script: Script::from_lua(include_str!("../../lua/hosts.lua")),
            key: format!("{prefix}:{{hosts}}"),
            id,
        }
    }

    /// This daemon's id in the set.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl RedisStore {
    /// Beats once: registers this daemon as alive and returns how many are (at least 1).
    ///
    /// # Errors
    /// Whatever Redis or the connection reports.
    pub async fn heartbeat(&self, beat: &Heartbeat) -> Result<u32, StoreError> {
        let args = vec![
            Value::from(beat.id.as_str()),
            Value::Integer(ALIVE_FOR.as_micros() as i64),
        ];
        let key = StoreKey(fred::types::Key::from(beat.key.as_str()));
        let primary = self
            .owner(&key)
            .ok_or_else(|| StoreError::timeout("no primary owns the heartbeat's slot".into()))?;
        let alive: i64 = beat
            .script
            .evalsha_with_reload(&primary.client, key.0, args)
            .await
            .map_err(StoreError::from_redis)?;
        Ok(alive.clamp(1, i64::from(u32::MAX)) as u32)
    }
}
