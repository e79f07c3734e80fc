//! The lease call (`lease = "auto"`, docs/DESIGN.md "Leases"): one EVALSHA of the rule's
//! lease script that decides a request, gives back the holder's lease and takes a new
//! one. Bounded, classified and heard by the primary's breaker like any decision
//! ([`RedisStore::bounded`]).

use super::redis::RedisStore;
use super::scripts;
use super::topology::Primary;
use super::StoreKey;
use crate::algorithm::{Outcome, Params};
use crate::lease::{Ask, Granted};
use fred::prelude::*;
use std::sync::atomic::Ordering;

impl RedisStore {
    /// The per-decision bound, `redis.timeout_ms`.
    pub fn timeout(&self) -> std::time::Duration {
        self.timeout
    }

    /// Decides `cost` units for `key` on `primary` with `params`' lease script and
    /// settles `ask`; unbounded ([`RedisStore::bounded`] bounds it). Re-loads the
    /// scripts on `NOSCRIPT` and retries, as [`RedisStore::decide`].
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed script reply.
    pub async fn lease(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
        ask: &Ask,
    ) -> Result<(Outcome, Granted), Error> {
        let mut generation = primary.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let script = self.scripts.lease_of(params.kind());
            let args = scripts::lease_args(params, cost, ask);
            let reply: Result<Vec<i64>, Error> =
                script.evalsha(&primary.client, key.0.clone(), args).await;
            match reply {
                Err(e) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    self.reload_scripts(primary, generation).await?;
                    generation = primary.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                reply => return scripts::lease_reply(&reply?),
            }
        }
    }
}
