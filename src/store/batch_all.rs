//! All-or-nothing groups and give-backs for one primary sent together (`CHECKALL`,
//! composite rules; `REFUND`, the undo of a reservation). A group is the keys of one
//! request on one slot, decided all or nothing (on a standalone Redis, every key of the
//! request; in Redis Cluster, the keys of one slot, or one key: a *reservation*); a
//! give-back, units given back to keys of one slot. Each alone would be one EVALSHA of
//! the all-or-nothing script or of the give-back script, which pays for the whole script
//! (the prelude, every algorithm, the give-backs) on every call; the groups and
//! give-backs waiting for a primary when its sender task runs go instead in one EVALSHA
//! of the all-or-nothing batch script (`lua/all_batch.lua`), which decides each group
//! all or nothing on its own, and gives back each give-back as the give-back script
//! does (`lua/give_back_keys.lua`), in turn.
//!
//! The queue is the single decisions' kind ([`super::queue`]): nothing waits to fill a
//! batch (a group that finds fewer than [`super::queue::MAX_IN_FLIGHT`] batches in
//! flight goes at once, with the all-or-nothing script of one group when nothing else
//! waits), none waits long behind a slow Redis, each group keeps its own reply,
//! `redis.timeout_ms` and report to the primary's breaker (the batch's send time:
//! [`CallSent`]), an error of one group is its own and an error of the whole call is
//! every group's.
//!
//! Redis Cluster: a group one of whose keys Redis refuses as not the node's own is
//! answered [`GroupAnswer::Alone`] (the script gave back what its other keys took
//! first: the group took nothing; a give-back reads every key before it writes one: it
//! gave nothing back) and its caller sends it on its own; its slot is held in doubt
//! ([`super::redis::unsettled`]). A batch whose routing key is redirected sends every
//! group alone.
//!
//! Not batched: a group or a give-back with a sliding window log's key
//! ([`super::batch::batchable`]: a log's give-back reads its entries too).

use super::batch;
use super::batch_reply;
use super::health::CallSent;
use super::queue::{Queue, Queued};
use super::redis::RedisStore;
use super::topology::Primary;
use super::{multi, StoreKey};
use fred::error::{Error, ErrorKind};
use fred::types::{Key, Value};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// At most this many keys per EVALSHA, over all its groups and give-backs (a group
/// weighs its keys, [`GroupJob::weight`]): a key of a group costs Redis about what a
/// single decision does (80,000 instructions against 70,000 when allowed,
/// `benches/script_instructions.sh`), so one script holds Redis about as long as a
/// full batch of single decisions ([`batch::MAX_BATCH`]). A group of more keys than
/// this still goes, alone.
pub const MAX_KEYS: usize = batch::MAX_BATCH;

/// What a batch did with one group.
pub(super) enum GroupAnswer {
    /// Decided (or failed) as its own EVALSHA would have been: eight integers per key
    /// ([`multi::taken`]); for a give-back, seven ([`multi::given_back`]).
    Replied(Result<Vec<i64>, Error>),
    /// Not decided, nothing taken or given back (Redis Cluster): one of its keys may
    /// not be this primary's now; the caller sends the group on its own.
    Alone,
}

/// What a group asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum GroupCall {
    /// Its keys decided all or nothing ([`multi::all_args`]).
    Together,
    /// Units given back to its keys ([`multi::give_back_args`]).
    GiveBack,
}

/// One group waiting to be sent.
pub(super) struct GroupJob {
    pub call: GroupCall,
    pub keys: Vec<StoreKey>,
    /// Its keys' items.
    pub args: Vec<Value>,
    /// When its caller started waiting.
    pub since: Instant,
    /// Stamped when the call carrying it goes out (the breaker counts a call once).
    pub sent: Arc<CallSent>,
    pub reply: oneshot::Sender<GroupAnswer>,
}

impl Queued for GroupJob {
    fn since(&self) -> Instant {
        self.since
    }

    /// Its keys: one-key groups (a Redis Cluster's reservations) fill a batch as
    /// single decisions do, groups of eight weigh eight.
    fn weight(&self) -> usize {
        self.keys.len().max(1)
    }
}

/// The queue of one primary's groups and give-backs, and its sender task.
pub(super) type GroupBatcher = Queue<GroupJob>;

impl Queue<GroupJob> {
    /// Starts the sender task for `primary` (once), as [`batch::Batcher`]'s: batches of
    /// of at most [`MAX_KEYS`] keys, the first group queued at most `timeout` ÷
    /// [`batch::QUEUED_AT_MOST`].
    pub fn start(&self, store: Weak<RedisStore>, primary: Weak<Primary>, timeout: Duration) {
        let queued_at_most = timeout / batch::QUEUED_AT_MOST;
        self.run(
            store,
            primary,
            MAX_KEYS,
            queued_at_most,
            |store, primary, groups| async move {
                store.send_groups(&primary, groups).await;
            },
        );
    }
}

impl RedisStore {
    /// Sends `groups` to `primary` and answers each: one group with its own script (the
    /// all-or-nothing script of one group, or the give-back script), more with the
    /// batch script, re-loaded on `NOSCRIPT`.
    async fn send_groups(&self, primary: &Primary, mut groups: Vec<GroupJob>) {
        for g in &groups {
            g.sent.mark();
        }
        if groups.len() == 1 {
            if let Some(job) = groups.pop() {
                let keys: Vec<Key> = job.keys.iter().map(|k| k.0.clone()).collect();
                let script = match job.call {
                    GroupCall::Together => self.scripts.together(),
                    GroupCall::GiveBack => self.scripts.give_back(),
                };
                let reply = self.run_on_keys(primary, script, keys, job.args).await;
                drop(job.reply.send(GroupAnswer::Replied(reply)));
            }
            return;
        }
        let keys: Vec<Key> = groups
            .iter()
            .flat_map(|g| g.keys.iter().map(|k| k.0.clone()))
            .collect();
        let cluster = self.clustered;
        let (declared, args) = batch_call(cluster, &keys, &groups);
        let script = self.scripts.all_batch();
        let answer: Result<Value, Error> = self.run_on_keys(primary, script, declared, args).await;
        let replies = match answer {
            Ok(Value::Array(items)) if items.len() == groups.len() => items,
            Err(e) if cluster && is_redirect(&e) => {
                if let Some(k) = keys.first() {
                    self.unsettled.mark(k.as_bytes());
                }
                for g in groups {
                    drop(g.reply.send(GroupAnswer::Alone));
                }
                return;
            }
            Ok(other) => {
                let e = Error::new(
                    ErrorKind::Parse,
                    format!(
                        "all-or-nothing batch script returned {other:?}, expected {} replies",
                        groups.len()
                    ),
                );
                answer_all(groups, &e);
                return;
            }
            Err(e) => {
                answer_all(groups, &e);
                return;
            }
        };
        let mut alone = 0;
        for (g, item) in groups.into_iter().zip(replies) {
            let answer = match batch_reply::item_reply(item) {
                Some(reply) => GroupAnswer::Replied(reply),
                None => {
                    for k in &g.keys {
                        self.unsettled.mark(k.0.as_bytes());
                    }
                    alone += 1;
                    GroupAnswer::Alone
                }
            };
            drop(g.reply.send(answer));
        }
        if alone > 0 {
            // Counts only: keys are client data.
            tracing::debug!(
                primary = primary.name(),
                alone,
                "a batch refused groups with keys not provably this primary's: they go on their own"
            );
        }
    }
}

/// True for a redirection of a whole call (`MOVED`, `ASK`).
fn is_redirect(e: &Error) -> bool {
    let d = e.details();
    d.starts_with("MOVED ") || d.starts_with("ASK ")
}

/// Gives every group of `groups` the error `e` of the whole call.
/// The keys to declare and the arguments of the all-or-nothing batch script for
/// `groups` (`keys`: their keys, in order): on a standalone Redis every key is declared;
/// in Redis Cluster one routes the call and the others are arguments
/// ([`super::batch_script::cluster_batch_call`]).
fn batch_call(cluster: bool, keys: &[Key], groups: &[GroupJob]) -> (Vec<Key>, Vec<Value>) {
    let mut args =
        Vec::with_capacity(groups.iter().map(|g| g.args.len() + 1).sum::<usize>() + keys.len() + 1);
    let declared = match cluster {
        true => super::batch_script::cluster_batch_call(keys, &mut args),
        false => keys.to_vec(),
    };
    for g in groups {
        match g.call {
            GroupCall::Together => multi::all_batch_args(g.keys.len(), &g.args, &mut args),
            GroupCall::GiveBack => multi::give_back_batch_args(g.keys.len(), &g.args, &mut args),
        }
    }
    (declared, args)
}

fn answer_all(groups: Vec<GroupJob>, e: &Error) {
    for g in groups {
        drop(g.reply.send(GroupAnswer::Replied(Err(e.clone()))));
    }
}
