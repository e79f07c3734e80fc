//! A decision's call to its primary: alone (EVALSHA of its algorithm's script) or in
//! the primary's batch, bounded or not by `redis.timeout_ms`, with the scripts
//! re-loaded on `NOSCRIPT` (one caller for all the decisions in flight) before one
//! retry. Apart from the client's set-up in `mod.rs`, so each file reads at once.

use super::ask;
use super::RedisStore;
use crate::algorithm::{Outcome, Params};
use crate::store::batch::{batchable, Call, Job};
use crate::store::gate::{self, Gate};
use crate::store::health::CallSent;
use crate::store::scripts;
use crate::store::topology::Primary;
use crate::store::StoreKey;
use fred::prelude::*;
use fred::types::scripts::Script;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

impl RedisStore {
    /// Decides `cost` units for `key` on `primary` (its owner, [`RedisStore::owner`])
    /// with EVALSHA of `params`' script, unbounded; [`RedisStore::bounded`] bounds it.
    /// Re-loads the scripts on `NOSCRIPT` (one caller for all) and retries. With `peek`,
    /// a dry run ([`scripts::peek_args`]): the same reply, nothing taken or written.
    /// The call goes with the others waiting for the primary, in one EVALSHA
    /// ([`crate::store::batch`]), unless it is a sliding window log's (its decision reads up to
    /// `limit` entries, and a batch holds each of its decisions as long as the slowest)
    /// or its slot is in doubt ([`super::unsettled`]); a decision a cluster batch refused goes
    /// again on its own. `sent` is stamped when the call carrying it goes out (the
    /// batch's, or its own).
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed script reply.
    pub(in crate::store) async fn decide_unbounded(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
        peek: bool,
        sent: Arc<CallSent>,
    ) -> Result<Outcome, Error> {
        let since = Instant::now();
        let batched = batchable(params.kind())
            && primary.batch.started()
            && !(self.clustered && self.unsettled.holds(key.0.as_bytes()));
        if batched {
            let (reply, answer) = oneshot::channel();
            let job = Job {
                key: key.clone(),
                call: Call::Decide(params.kind()),
                args: decision_args(params, cost, peek),
                since,
                sent: Arc::clone(&sent),
                gate: None,
                reply,
            };
            if let Some(reply) = self.batched(primary, job, answer).await {
                return scripts::outcome(&reply?);
            }
        }
        sent.mark();
        self.decide_alone_since(primary, key, params, cost, peek, since)
            .await
    }

    /// [`RedisStore::decide_unbounded`] with the decision's own script, in an EVALSHA of its own
    /// (the probes use it: they measure Redis, not the batches queued before them).
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed script reply.
    pub(in crate::store) async fn decide_alone(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
        peek: bool,
    ) -> Result<Outcome, Error> {
        self.decide_alone_since(primary, key, params, cost, peek, Instant::now())
            .await
    }

    /// [`RedisStore::decide_alone`] for a caller waiting since `since`.
    async fn decide_alone_since(
        &self,
        primary: &Primary,
        key: &StoreKey,
        params: &Params,
        cost: u32,
        peek: bool,
        since: Instant,
    ) -> Result<Outcome, Error> {
        let script = self.scripts.of(params.kind());
        let args = || decision_args(params, cost, peek);
        // Boxed: fred's call future is several kB, and inline it would make every
        // decision's future (batched ones included) as large.
        let reply =
            Box::pin(self.run_script_since(primary, script, key, args, since, None)).await?;
        scripts::outcome(&reply)
    }

    /// [`RedisStore::run_script_since`] for a caller waiting from now on.
    ///
    /// # Errors
    /// As [`RedisStore::run_script_since`].
    pub(in crate::store) async fn run_script(
        &self,
        primary: &Primary,
        script: &Script,
        key: &StoreKey,
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Vec<i64>, Error> {
        self.run_script_since(primary, script, key, args, Instant::now(), None)
            .await
    }

    /// EVALSHA of `script` for `key` on `primary`, with the arguments `args` makes (once
    /// per attempt), and its integer reply. On `NOSCRIPT` (the node was flushed,
    /// restarted or failed over) the scripts are re-loaded, one caller for all, and the
    /// call retried; at most twice, as a flush may come right after someone else's
    /// reload. A redirection is followed once, within what is left of `redis.timeout_ms`
    /// for a caller waiting since `since`: an `ASK` (the slot is migrating and the key
    /// has moved) to the new owner after an `ASKING`, a `MOVED` (the slot has moved and
    /// the slot map has not caught up yet) to its owner if it is a primary of the map;
    /// either way the key's slot is held in doubt ([`super::unsettled`]). A lease call's
    /// `gate` lets each of those sends go out only while its caller waits
    /// ([`crate::store::gate`]).
    ///
    /// # Errors
    /// What Redis or the connection reports, the reload's included.
    pub(in crate::store) async fn run_script_since(
        &self,
        primary: &Primary,
        script: &Script,
        key: &StoreKey,
        args: impl Fn() -> Vec<Value>,
        since: Instant,
        gate: Option<&Gate>,
    ) -> Result<Vec<i64>, Error> {
        let mut generation = primary.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let reply: Result<Vec<i64>, Error> = gate::send(gate, || {
                script.evalsha(&primary.client, key.0.clone(), args())
            })
            .await;
            let redirect = match &reply {
                Err(e) => ask::redirect_target(e).map(|(to, asking)| (to.to_string(), asking)),
                Ok(_) => None,
            };
            match (reply, redirect) {
                (Err(e), Some((target, asking))) => {
                    self.unsettled.mark(key.0.as_bytes());
                    // Ends before `bounded` would time the decision out (2 ms ahead).
                    let budget = self
                        .timeout
                        .saturating_sub(since.elapsed())
                        .saturating_sub(Duration::from_millis(2));
                    let to = ask::Redirect {
                        target: &target,
                        asking,
                        from: primary.name(),
                        gate,
                    };
                    return self
                        .evalsha_redirected(to, script, key, args(), e, budget)
                        .await;
                }
                (Err(e), None) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    self.reload_scripts(primary, generation).await?;
                    generation = primary.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                (reply, _) => return reply,
            }
        }
    }

    /// Loads the scripts on `primary` again after a `NOSCRIPT`, unless another decision
    /// already did since `seen` (the reload generation it read before its EVALSHA).
    pub(in crate::store) async fn reload_scripts(
        &self,
        primary: &Primary,
        seen: u64,
    ) -> Result<(), Error> {
        let _one_at_a_time = primary.reload_lock.lock().await;
        if primary.reloads.load(Ordering::Acquire) == seen {
            self.load_scripts(&primary.client).await?;
            primary.reloads.fetch_add(1, Ordering::Release);
        }
        Ok(())
    }

    /// Loads on one node the scripts it lacks (`SCRIPT EXISTS` first), all at once (one
    /// round trip each way: a reload after `NOSCRIPT` holds decisions waiting within
    /// their `redis.timeout_ms`). Asking first keeps a probe small: the scripts are
    /// hundreds of KB, more than a slow link carries within a probe's timeout, and a
    /// load cut short by that timeout still completes on the node, so the next probe
    /// finds them there. A user without `SCRIPT EXISTS` (the least-privilege ACL of
    /// docs/PRODUCTION-REDIS.md) loads every script, as before.
    pub(super) async fn load_scripts(&self, client: &Client) -> Result<(), Error> {
        let all = self.scripts.all();
        let shas: Vec<String> = all.iter().map(|s| s.sha1().to_string()).collect();
        let present: Vec<bool> = client.script_exists(shas).await.unwrap_or_default();
        let loads = all
            .iter()
            .zip(present.into_iter().chain(std::iter::repeat(false)))
            .filter(|(_, present)| !present)
            .map(|(script, _)| script.load(client));
        futures::future::try_join_all(loads).await.map(drop)
    }
}

/// A decision's script arguments: a dry run's with `peek`.
fn decision_args(params: &Params, cost: u32, peek: bool) -> Vec<Value> {
    match peek {
        false => scripts::args(params, cost),
        true => scripts::peek_args(params, cost),
    }
}
