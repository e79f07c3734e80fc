//! Which daemon walks a rule's keys after a reload ([`super::expiry_walk`]): one, elected
//! through a record in Redis (`lua/walk_lock.lua`), so a fleet reloaded together pays
//! for one walk, not one per daemon.
//!
//! The record is per rule and parameters (`<prefix>:{walk}:<rule>:<parameters>`): the
//! daemons that reloaded the same rule share one walk. Its lock lives
//! [`LOCK_LIFETIME`] and the walker renews it every [`RENEW_EVERY`]: a walker that
//! crashed or was cut off frees it within a lock's lifetime, and a waiting daemon takes
//! it then. A daemon is done when a walk that started after its new rule was in force
//! has finished (its own or another's): the keys it wrote under the earlier rule existed
//! when that walk began.

use super::redis::RedisStore;
use super::{StoreError, StoreKey};
use crate::algorithm::{Algorithm, Per};
use fred::types::scripts::Script;
use fred::types::Value;
use std::time::Duration;

/// How long the walker's lock lasts without a renewal.
pub const LOCK_LIFETIME: Duration = Duration::from_secs(10);

/// How often the walker renews its lock, and a waiting daemon asks again.
pub const RENEW_EVERY: Duration = Duration::from_secs(2);

/// The delay between taking the lock and starting the walk: daemons whose reload
/// reaches Redis within it are covered by this walk.
pub const GRACE: Duration = Duration::from_millis(200);

/// How long the record of the latest walk finished is kept.
const KEEP: Duration = Duration::from_secs(3600);

/// What the election said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// This daemon walks, after [`GRACE`].
    Mine,
    /// Another daemon holds the lock: ask again later.
    Held,
    /// A walk that started after this daemon's rule was in force has finished.
    Covered,
}

/// One daemon's place in the election of one rule's walk.
pub struct Election {
    script: Script,
    key: StoreKey,
    holder: String,
    /// When this daemon's new rule was in force, µs on Redis's clock (learnt from the
    /// first call).
    since: Option<i64>,
}

impl Election {
    /// The election of `rule`'s walk under `algorithm`, for the daemon `holder`.
    pub fn new(prefix: &str, rule: &str, algorithm: &Algorithm, holder: &str) -> Self {
        let key = format!("{prefix}:{{walk}}:{rule}:{}", parameters(algorithm));
        Election {
            script: Script::from_lua(include_str!("../../lua/walk_lock.lua")),
            key: StoreKey(fred::types::Key::from(key)),
            holder: holder.to_owned(),
            since: None,
        }
    }

    /// Takes (or renews) the lock, or says who walks.
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed reply.
    pub async fn take(&mut self, store: &RedisStore) -> Result<Turn, StoreError> {
        let since = self.since.map_or_else(String::new, |s| s.to_string());
        let reply = self
            .call(
                store,
                "take",
                vec![
                    Value::from(since),
                    Value::Integer(LOCK_LIFETIME.as_micros() as i64),
                    Value::Integer(GRACE.as_micros() as i64),
                ],
            )
            .await?;
        let Value::Array(items) = reply else {
            return Err(malformed(&reply));
        };
        let numbers: Vec<i64> = items.iter().filter_map(Value::as_i64).collect();
        match numbers[..] {
            [state, since, _start] => {
                self.since = Some(since);
                Ok(match state {
                    0 => Turn::Mine,
                    1 => Turn::Held,
                    _ => Turn::Covered,
                })
            }
            _ => Err(malformed(&Value::Array(items))),
        }
    }

    /// Records that this daemon's walk finished and releases the lock. False if the
    /// lock had passed to another daemon (this walk is then not recorded).
    ///
    /// # Errors
    /// What Redis or the connection reports.
    pub async fn finish(&self, store: &RedisStore) -> Result<bool, StoreError> {
        let reply = self.call(store, "done", Vec::new()).await?;
        Ok(reply.as_i64() == Some(1))
    }

    /// Releases the lock without recording a walk (cancelled or incomplete).
    ///
    /// # Errors
    /// What Redis or the connection reports.
    pub async fn release(&self, store: &RedisStore) -> Result<(), StoreError> {
        self.call(store, "drop", Vec::new()).await.map(drop)
    }

    async fn call(
        &self,
        store: &RedisStore,
        op: &'static str,
        take: Vec<Value>,
    ) -> Result<Value, StoreError> {
        let mut args = vec![Value::from(op), Value::from(self.holder.as_str())];
        if take.is_empty() {
            args.extend([Value::from(""), Value::Integer(0), Value::Integer(0)]);
        } else {
            args.extend(take);
        }
        args.push(Value::Integer(KEEP.as_millis() as i64));
        let primary = store
            .owner(&self.key)
            .ok_or_else(|| StoreError::timeout("no primary owns the walk record's slot".into()))?;
        self.script
            .evalsha_with_reload(&primary.client, self.key.0.clone(), args)
            .await
            .map_err(StoreError::from_redis)
    }
}

/// A rule's parameters as text, for the record's key: the algorithm's key suffix, the
/// capacity or limit, and the rate (units/s) or the window (`<n>ms`).
pub fn parameters(algorithm: &Algorithm) -> String {
    let suffix = algorithm.kind.spec().suffix;
    match algorithm.per {
        Per::Rate(rate) => format!("{suffix}:{}:{rate}", algorithm.limit),
        Per::WindowMs(ms) => format!("{suffix}:{}:{ms}ms", algorithm.limit),
    }
}

fn malformed(reply: &Value) -> StoreError {
    StoreError::Key(fred::error::Error::new(
        fred::error::ErrorKind::Parse,
        format!("walk election returned {reply:?}"),
    ))
}
