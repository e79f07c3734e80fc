//! The lease call (`lease = "auto"`, docs/DESIGN.md "Leases"): the rule's lease script,
//! which decides a request, gives back the holder's lease and takes a new one. It goes
//! with the other calls waiting for the key's primary, in one EVALSHA of the batch
//! script ([`super::batch`]: the lease script runs there as a function, on its own key,
//! as it runs alone), or alone when its slot is in doubt or a cluster batch refused its
//! key. Bounded, classified and heard by the primary's breaker like any decision
//! ([`RedisStore::bounded`]); each of its sends goes out only while its caller waits
//! ([`super::gate`]), so a holder's calls of one key reach Redis in the order it made
//! them.

use super::batch::{batchable, Call, Job};
use super::gate::Gate;
use super::health::CallSent;
use super::redis::RedisStore;
use super::scripts;
use super::topology::Primary;
use super::StoreKey;
use crate::algorithm::{Outcome, Params};
use crate::lease::{Granted, Request};
use fred::prelude::*;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::time::Instant;

impl RedisStore {
    /// Decides `cost` units for `key` on `primary` with `params`' lease script and
    /// settles `request`; unbounded ([`RedisStore::bounded`] bounds it). In `primary`'s
    /// batch unless its slot is in doubt ([`super::redis::unsettled`]); alone otherwise,
    /// or again alone when a cluster batch refused its key. Re-loads the scripts on
    /// `NOSCRIPT` and retries, as [`RedisStore::decide_unbounded`]. `sent` is stamped
    /// when the call carrying it goes out; `gate`, closed once its caller stops waiting,
    /// keeps it from going out after that.
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed script reply.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn lease_call(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
        request: &Request,
        sent: Arc<CallSent>,
        gate: &Arc<Gate>,
    ) -> Result<(Outcome, Granted), Error> {
        let since = Instant::now();
        let args = scripts::lease_args(params, cost, request);
        let batched = batchable(params.kind())
            && primary.batch.started()
            && !(self.clustered && self.unsettled.holds(key.0.as_bytes()));
        if batched {
            let (reply, answer) = oneshot::channel();
            let job = Job {
                key: key.clone(),
                call: Call::Lease(params.kind()),
                args: args.clone(),
                since,
                sent: Arc::clone(&sent),
                gate: Some(Arc::clone(gate)),
                reply,
            };
            if let Some(reply) = self.batched(primary, job, answer).await {
                return scripts::lease_reply(params, &reply?);
            }
        }
        sent.mark();
        let script = self.scripts.lease_of(params.kind());
        let alone = self.run_script_since(primary, script, key, || args.clone(), since, Some(gate));
        // Boxed: fred's call future is several kB (see decide_alone_since).
        let reply = Box::pin(alone).await?;
        scripts::lease_reply(params, &reply)
    }

    /// [`RedisStore::lease_call`] in an EVALSHA of its own, for a caller with no call
    /// before it to keep in order (the expiry walk's calls, which give back nothing and
    /// ask for nothing).
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
