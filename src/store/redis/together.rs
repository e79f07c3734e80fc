//! Calls on several keys of one slot: the all-or-nothing script (`CHECKALL`, composite
//! rules) and the give-back script (`REFUND`, the undo of a reservation). Those waiting
//! for one primary go together ([`crate::store::batch_all`]); alone, one EVALSHA each,
//! with `NOSCRIPT` reloaded as for a single decision.
//!
//! A redirection (`ASK` while the slot migrates, `MOVED` once it has moved) of a group,
//! or of a give-back to several keys, is not followed: the call fails as its keys'
//! error and the caller decides without Redis, as for any key error (a give-back then
//! leaves its units taken: fewer admissions, never more). A give-back to one key (a
//! `REFUND`) follows it as a decision does ([`RedisStore::run_script_since`]).

use super::RedisStore;
use crate::algorithm::{Kind, Outcome, Params};
use crate::store::batch::batchable;
use crate::store::batch_all::{GroupAnswer, GroupCall, GroupJob};
use crate::store::health::CallSent;
use crate::store::multi::{self, Taken};
use crate::store::topology::Primary;
use crate::store::StoreKey;
use fred::error::{Error, ErrorKind};
use fred::types::scripts::Script;
use fred::types::{FromValue, Key, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::oneshot;
use tokio::time::Instant;

impl RedisStore {
    /// Decides `items` (keys of one slot on `primary`) all or nothing, unbounded: with
    /// the other groups waiting for `primary` ([`crate::store::batch_all`]) unless a key
    /// is a sliding window log's or (Redis Cluster) its slot is in doubt; a group the
    /// batch refused goes again on its own. `sent` is stamped when the call carrying it
    /// goes out.
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed reply.
    pub(super) async fn together_unbounded(
        &self,
        primary: &Primary,
        items: &[(StoreKey, Params, u32)],
        sent: Arc<CallSent>,
    ) -> Result<Vec<Taken>, Error> {
        let shapes: Vec<(Params, u32)> = items.iter().map(|(_, p, c)| (*p, *c)).collect();
        let args = multi::all_args(&shapes);
        let keys: Vec<(&StoreKey, Kind)> = items.iter().map(|(k, p, _)| (k, p.kind())).collect();
        let call = GroupCall::Together;
        if let Some(reply) = self.grouped(primary, call, &keys, &args, &sent).await {
            return multi::taken(&reply?, items.len());
        }
        sent.mark();
        let keys: Vec<Key> = items.iter().map(|(k, _, _)| k.0.clone()).collect();
        let script = self.scripts.together();
        let reply: Vec<i64> = Box::pin(self.run_on_keys(primary, script, keys, args)).await?;
        multi::taken(&reply, items.len())
    }

    /// Gives units back to `items` (keys of one slot on `primary`), unbounded: with the
    /// groups waiting for `primary` as [`RedisStore::together_unbounded`], else (and
    /// when a cluster batch refused a key) alone. `sent` is stamped when the call
    /// carrying it goes out.
    ///
    /// # Errors
    /// What Redis or the connection reports, or a malformed reply.
    pub(super) async fn give_back_unbounded(
        &self,
        primary: &Primary,
        items: &[(StoreKey, Params, u32, Option<i64>)],
        sent: Arc<CallSent>,
    ) -> Result<Vec<Outcome>, Error> {
        let since = Instant::now();
        let shapes: Vec<(Params, u32, Option<i64>)> =
            items.iter().map(|(_, p, u, at)| (*p, *u, *at)).collect();
        let args = multi::give_back_args(&shapes);
        let keys: Vec<(&StoreKey, Kind)> = items.iter().map(|(k, p, ..)| (k, p.kind())).collect();
        let call = GroupCall::GiveBack;
        if let Some(reply) = self.grouped(primary, call, &keys, &args, &sent).await {
            return multi::given_back(&reply?, items.len());
        }
        sent.mark();
        let script = self.scripts.give_back();
        let reply: Vec<i64> = match items {
            // One key (a REFUND; in Redis Cluster, a reservation's undo): a redirection is
            // followed as for a decision.
            [(key, ..)] => {
                let one = self.run_script_since(primary, script, key, || args.clone(), since, None);
                Box::pin(one).await?
            }
            _ => {
                let keys: Vec<Key> = items.iter().map(|(k, ..)| k.0.clone()).collect();
                Box::pin(self.run_on_keys(primary, script, keys, args)).await?
            }
        };
        multi::given_back(&reply, items.len())
    }

    /// Queues the group `call` on `keys` (with their algorithms) for `primary`'s
    /// batches of groups and waits for its answer: `None` when it goes alone (a key
    /// whose algorithm is not batched or, Redis Cluster, whose slot is in doubt; a key
    /// the batch refused; the sender task gone).
    async fn grouped(
        &self,
        primary: &Primary,
        call: GroupCall,
        keys: &[(&StoreKey, Kind)],
        args: &[Value],
        sent: &Arc<CallSent>,
    ) -> Option<Result<Vec<i64>, Error>> {
        let batched = primary.batch_all.started()
            && keys.iter().all(|(key, kind)| {
                batchable(*kind) && !(self.clustered && self.unsettled.holds(key.0.as_bytes()))
            });
        if !batched {
            return None;
        }
        let (reply, answer) = oneshot::channel();
        let job = GroupJob {
            call,
            keys: keys.iter().map(|(k, _)| (*k).clone()).collect(),
            args: args.to_vec(),
            since: Instant::now(),
            sent: Arc::clone(sent),
            reply,
        };
        primary.batch_all.submit(job).ok()?;
        match answer.await {
            Ok(GroupAnswer::Replied(reply)) => Some(reply),
            Ok(GroupAnswer::Alone) => None,
            // Only a bug of this process drops a group unanswered: the keys' problem,
            // decided without Redis.
            Err(_) => Some(Err(Error::new(
                ErrorKind::Unknown,
                "ERR the all-or-nothing batch sender stopped",
            ))),
        }
    }

    /// EVALSHA of `script` on `keys` (one slot, or the routing key of a cluster batch)
    /// with `args`; on `NOSCRIPT` the scripts are re-loaded (one caller for all) and the
    /// call retried, at most twice.
    pub(in crate::store) async fn run_on_keys<R: FromValue>(
        &self,
        primary: &Primary,
        script: &Script,
        keys: Vec<Key>,
        args: Vec<Value>,
    ) -> Result<R, Error> {
        let mut generation = primary.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let reply: Result<R, Error> = script
                .evalsha(&primary.client, keys.clone(), args.clone())
                .await;
            match reply {
                Err(e) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    self.reload_scripts(primary, generation).await?;
                    generation = primary.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                reply => return reply,
            }
        }
    }
}
