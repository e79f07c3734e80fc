//! All-or-nothing groups for one primary sent together (`CHECKALL`, composite rules).
//! A group is the keys of one request on one slot, decided all or nothing (on a
//! standalone Redis, every key of the request; in Redis Cluster, the keys of one slot,
//! or one key: a *reservation*). Each group alone would be one EVALSHA of the
//! all-or-nothing script, which pays for the whole script (the prelude, every algorithm,
//! the give-backs) on every call; the groups waiting for a primary when its sender task
//! runs go instead in one EVALSHA of the all-or-nothing batch script
//! (`lua/all_batch.lua`), which decides each group all or nothing on its own, in turn.
//!
//! The queue works as the single decisions' ([`super::batch`]): nothing waits to fill a
//! batch (a group that finds fewer than [`MAX_IN_FLIGHT`] batches in flight goes at
//! once, with the all-or-nothing script of one group when nothing else waits), each
//! group keeps its own reply, `redis.timeout_ms` and report to the primary's breaker,
//! an error of one group is its own and an error of the whole call is every group's.
//!
//! Redis Cluster: a group one of whose keys Redis refuses as not the node's own is
//! answered [`GroupAnswer::Alone`] (the script gave back what its other keys took
//! first: the group took nothing) and its caller sends it on its own; its slot is held
//! in doubt ([`super::redis::unsettled`]). A batch whose routing key is redirected
//! sends every group alone.
//!
//! Not batched: a group with a sliding window log's key ([`super::batch::batchable`]).

use super::batch::{self, MAX_IN_FLIGHT};
use super::redis::RedisStore;
use super::topology::Primary;
use super::{multi, StoreKey};
use fred::error::{Error, ErrorKind};
use fred::types::{Key, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// At most this many groups per EVALSHA (each of at most 8 keys: a `CHECKALL`'s
/// triples), so one script holds Redis about as long as a full batch of single
/// decisions ([`batch::MAX_BATCH`]) when groups have two keys.
pub const MAX_GROUPS: usize = 32;

/// What a batch did with one group.
pub(super) enum GroupAnswer {
    /// Decided (or failed) as its own all-or-nothing EVALSHA would have been: eight
    /// integers per key ([`multi::taken`]).
    Replied(Result<Vec<i64>, Error>),
    /// Not decided, nothing taken (Redis Cluster): one of its keys may not be this
    /// primary's now; the caller sends the group on its own.
    Alone,
}

/// One group waiting to be sent.
pub(super) struct GroupJob {
    pub keys: Vec<StoreKey>,
    /// Its keys' items ([`multi::all_args`]).
    pub args: Vec<Value>,
    pub reply: oneshot::Sender<GroupAnswer>,
}

/// The queue of one primary's groups and its sender task.
pub(super) struct GroupBatcher {
    tx: mpsc::UnboundedSender<GroupJob>,
    /// Taken by [`GroupBatcher::start`].
    rx: Mutex<Option<mpsc::UnboundedReceiver<GroupJob>>>,
    started: AtomicBool,
}

impl GroupBatcher {
    /// A queue whose sender task is not running yet.
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        GroupBatcher {
            tx,
            rx: Mutex::new(Some(rx)),
            started: AtomicBool::new(false),
        }
    }

    /// True once [`GroupBatcher::start`] ran: groups are sent.
    pub fn started(&self) -> bool {
        self.started.load(Ordering::Relaxed)
    }

    /// Queues `job`; gives it back if the sender task is gone.
    pub fn submit(&self, job: GroupJob) -> Result<(), GroupJob> {
        self.tx.send(job).map_err(|e| e.0)
    }

    /// Starts the sender task for `primary` (once), as [`batch::Batcher::start`] does.
    pub fn start(&self, store: Weak<RedisStore>, primary: Weak<Primary>) {
        let Some(mut rx) = self.rx.lock().ok().and_then(|mut rx| rx.take()) else {
            return;
        };
        self.started.store(true, Ordering::Relaxed);
        let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
        tokio::spawn(async move {
            let mut jobs = Vec::with_capacity(MAX_GROUPS);
            loop {
                if jobs.is_empty() && rx.recv_many(&mut jobs, MAX_GROUPS).await == 0 {
                    return;
                }
                let room = MAX_GROUPS.saturating_sub(jobs.len());
                let permit = match Arc::clone(&in_flight).try_acquire_owned() {
                    Ok(permit) => Some(permit),
                    Err(_) if jobs.len() >= MAX_GROUPS => None,
                    Err(_) => tokio::select! {
                        permit = Arc::clone(&in_flight).acquire_owned() => permit.ok(),
                        more = rx.recv_many(&mut jobs, room) => {
                            if more > 0 {
                                continue;
                            }
                            None
                        }
                    },
                };
                let (Some(store), Some(primary)) = (store.upgrade(), primary.upgrade()) else {
                    return;
                };
                let groups = std::mem::replace(&mut jobs, Vec::with_capacity(MAX_GROUPS));
                tokio::spawn(async move {
                    store.send_groups(&primary, groups).await;
                    drop(permit);
                });
            }
        });
    }
}

impl RedisStore {
    /// Sends `groups` to `primary` and answers each: one group with the all-or-nothing
    /// script of one group, more with the batch script, re-loaded on `NOSCRIPT`.
    async fn send_groups(&self, primary: &Primary, mut groups: Vec<GroupJob>) {
        if groups.len() == 1 {
            if let Some(job) = groups.pop() {
                let keys: Vec<Key> = job.keys.iter().map(|k| k.0.clone()).collect();
                let script = self.scripts.together();
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
        let mut args = Vec::with_capacity(
            groups.iter().map(|g| g.args.len() + 1).sum::<usize>() + keys.len() + 1,
        );
        let declared = match cluster {
            true => super::scripts::cluster_batch_call(&keys, &mut args),
            false => keys.clone(),
        };
        for g in &groups {
            multi::all_batch_args(g.keys.len(), &g.args, &mut args);
        }
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
        for (g, item) in groups.into_iter().zip(replies) {
            let answer = match batch::item_reply(item) {
                Some(reply) => GroupAnswer::Replied(reply),
                None => {
                    for k in &g.keys {
                        self.unsettled.mark(k.0.as_bytes());
                    }
                    GroupAnswer::Alone
                }
            };
            drop(g.reply.send(answer));
        }
    }
}

/// True for a redirection of a whole call (`MOVED`, `ASK`).
fn is_redirect(e: &Error) -> bool {
    let d = e.details();
    d.starts_with("MOVED ") || d.starts_with("ASK ")
}

/// Gives every group of `groups` the error `e` of the whole call.
fn answer_all(groups: Vec<GroupJob>, e: &Error) {
    for g in groups {
        drop(g.reply.send(GroupAnswer::Replied(Err(e.clone()))));
    }
}
