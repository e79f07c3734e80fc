//! The lease call (`lease = "auto"`, docs/DESIGN.md "Leases"): one EVALSHA of the rule's
//! lease script that decides a request, gives back the holder's lease and takes a new
//! one. Bounded, classified and heard by the primary's breaker like any decision
//! ([`RedisStore::bounded`]).

use super::redis::RedisStore;
use super::scripts;
use super::topology::Primary;
use super::StoreKey;
use crate::algorithm::{Outcome, Params};
use crate::lease::{Granted, Request};
use fred::prelude::*;

impl RedisStore {
    /// Decides `cost` units for `key` on `primary` with `params`' lease script and
    /// settles `request`; unbounded ([`RedisStore::bounded`] bounds it). Re-loads the
    /// scripts on `NOSCRIPT` and retries, as [`RedisStore::decide_unbounded`].
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed script reply.
    pub(super) async fn lease_unbounded(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
        request: &Request,
    ) -> Result<(Outcome, Granted), Error> {
        let script = self.scripts.lease_of(params.kind());
        let reply = self
            .run_script(primary, script, key, || {
                scripts::lease_args(params, cost, request)
            })
            .await?;
        scripts::lease_reply(params, &reply)
    }
}
