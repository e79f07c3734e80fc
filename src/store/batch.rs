//! Decisions for one primary sent together. Every EVALSHA costs Redis a command, a
//! script call and a `TIME`, and costs the daemon a call through fred (its command,
//! frame and futures). The decisions waiting for a primary when its sender task runs go
//! in one EVALSHA of the batch script (`lua/batch.lua`), which runs each decision's own
//! algorithm script as a function, in order, on its own key. Nothing waits to fill a
//! batch ([`super::queue`]): a decision that finds fewer than
//! [`super::queue::MAX_IN_FLIGHT`] batches in flight goes at once (alone, with its own
//! script, when nothing else waits); the others queue and
//! leave together when a batch comes back, or as soon as [`MAX_BATCH`] of them wait, or
//! once the first of them has waited an eighth of `redis.timeout_ms` ([`QUEUED_AT_MOST`]).
//! So a decision waits in this queue for at most one batch's round trip, never while a
//! full batch could go, and never long behind a slow Redis: a Redis answering in
//! somewhat less than `redis.timeout_ms` answers its decisions in time, batched or not,
//! where waiting for a batch's round trip and then for its own would take two.
//!
//! Each decision keeps its own key and arguments, its reply, its `redis.timeout_ms`
//! (the caller bounds its wait for the batch's answer, the time queued here included)
//! and its report to the primary's breaker, which hears a batch as the one call it is:
//! every decision carries the batch's send time ([`CallSent`]). A decision's Redis error (a foreign key's
//! `WRONGTYPE`, `OOM`) is its own reply; an error of the whole call (the connection,
//! `NOSCRIPT` after the reloads) is every decision's. The probes of an open breaker do
//! not queue here: they measure Redis.
//!
//! Redis Cluster: each primary has its own queue, and a batch holds keys of any of its
//! slots (the cluster batch script, [`batch_script::cluster_batch_lua`]: one key declared to
//! route the call, the others in `ARGV`). Redis refuses, per key, a key it cannot vouch
//! for as the node's own and not moved away (another node's slot, a migrating slot's
//! absent key, an importing slot's key): such a decision is answered [`Answer::Alone`]
//! and its caller sends it on its own, where `ASK` and `MOVED` are followed, and its slot
//! is held in doubt for a while ([`super::redis::unsettled`]): its keys skip the batches.
//! A batch whose routing key itself is redirected sends every decision alone.
//!
//! Not batched: the sliding window log (its decision reads up to `limit` entries: a
//! batch would hold all of its decisions as long as the slowest), and lease calls.

use super::batch_script;
use super::health::CallSent;
use super::queue::{Queue, Queued};
use super::redis::RedisStore;
use super::topology::Primary;
use super::StoreKey;
use crate::algorithm::Kind;
use fred::error::{Error, ErrorKind};
use fred::types::scripts::Script;
use fred::types::{Key, Value};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// At most this many decisions per EVALSHA. It bounds how long one script holds Redis
/// (about 7–10 µs per token-bucket decision under `redis-benchmark`: under 1 ms for a
/// full batch) and the size of one reply.
pub const MAX_BATCH: usize = 64;

/// The longest the first decision waiting for a batch in flight to come back waits, as
/// a share of `redis.timeout_ms` (÷ 8: 12.5 ms of the default 100): past it, the
/// decisions waiting go in a batch of their own. A healthy Redis answers a batch in well
/// under a millisecond, so only a slow one meets it.
pub const QUEUED_AT_MOST: u32 = 8;

/// What a decision's own script replied, or its error.
pub type Reply = Result<Vec<i64>, Error>;

/// What a batch did with one decision.
pub(super) enum Answer {
    /// Decided (or failed) as its own EVALSHA would have been.
    Replied(Reply),
    /// Not decided (Redis Cluster): its key may not be this primary's now; the caller
    /// sends it on its own.
    Alone,
}

/// True when decisions of `kind` may go in a batch: all but the sliding window log's
/// and a concurrency rule's (its slots are taken and given back by their own script,
/// `lua/concurrency.lua`; a dry run of one, `INSPECT`'s, goes alone).
pub fn batchable(kind: Kind) -> bool {
    !matches!(kind, Kind::SlidingWindowLog | Kind::Concurrency)
}

/// One decision waiting to be sent.
pub(super) struct Job {
    pub key: StoreKey,
    pub kind: Kind,
    /// Its own script's arguments ([`super::scripts::args`] or [`super::scripts::peek_args`]).
    pub args: Vec<Value>,
    /// When its caller started waiting (an `ASK` followed gets what is left of
    /// `redis.timeout_ms`).
    pub since: Instant,
    /// Stamped when the call carrying it goes out (the breaker counts a call once).
    pub sent: Arc<CallSent>,
    pub reply: oneshot::Sender<Answer>,
}

impl Queued for Job {
    fn since(&self) -> Instant {
        self.since
    }
}

/// The queue of one primary's decisions and its sender task.
pub(super) type Batcher = Queue<Job>;

impl Queue<Job> {
    /// Starts the sender task for `primary` (once; later calls do nothing), for
    /// decisions bounded by `timeout` (`redis.timeout_ms`): batches of at most
    /// [`MAX_BATCH`], the first decision queued at most `timeout` ÷ [`QUEUED_AT_MOST`].
    pub fn start(&self, store: Weak<RedisStore>, primary: Weak<Primary>, timeout: Duration) {
        let queued_at_most = timeout / QUEUED_AT_MOST;
        self.run(
            store,
            primary,
            MAX_BATCH,
            queued_at_most,
            |store, primary, batch| async move {
                store.send_batch(&primary, batch).await;
            },
        );
    }
}

impl RedisStore {
    /// Sends `batch` to `primary` and answers each job: one job with its own script
    /// (as without batching), more with the batch script, re-loaded on `NOSCRIPT` and
    /// retried as [`RedisStore::run_script_since`] does.
    async fn send_batch(&self, primary: &Primary, mut batch: Vec<Job>) {
        for job in &batch {
            job.sent.mark();
        }
        if batch.len() == 1 {
            if let Some(job) = batch.pop() {
                let script = self.scripts.of(job.kind);
                let args = || job.args.clone();
                let reply = self
                    .run_script_since(primary, script, &job.key, args, job.since)
                    .await;
                // The caller may have stopped waiting (its timeout): nothing to do.
                drop(job.reply.send(Answer::Replied(reply)));
            }
            return;
        }
        let keys: Vec<Key> = batch.iter().map(|j| j.key.0.clone()).collect();
        let cluster = self.scripts.cluster_batch();
        let (script, declared) = match cluster {
            Some(script) => (script, vec![keys[0].clone()]),
            None => (self.scripts.batch(), keys.clone()),
        };
        let args = || {
            let items: usize = batch.iter().map(|j| j.args.len() + 2).sum();
            let mut args = Vec::with_capacity(items + keys.len() + 1);
            if cluster.is_some() {
                batch_script::cluster_batch_call(&keys, &mut args);
            }
            for job in &batch {
                batch_script::batch_args(job.kind, &job.args, &mut args);
            }
            args
        };
        let answer = self
            .evalsha_reloading(primary, script, &declared, args)
            .await;
        let replies = match answer {
            Ok(Value::Array(items)) if items.len() == batch.len() => items,
            // The routing key's slot is migrating or has moved: that says nothing of the
            // others, each goes on its own.
            Err(e) if cluster.is_some() && is_redirect(&e) => {
                self.unsettled.mark(keys[0].as_bytes());
                tracing::debug!(
                    primary = primary.name(),
                    alone = batch.len(),
                    "a batch was redirected: its decisions go on their own"
                );
                for job in batch {
                    drop(job.reply.send(Answer::Alone));
                }
                return;
            }
            Ok(other) => {
                let e = Error::new(
                    ErrorKind::Parse,
                    format!(
                        "batch script returned {other:?}, expected {} replies",
                        batch.len()
                    ),
                );
                answer_all(batch, &e);
                return;
            }
            Err(e) => {
                answer_all(batch, &e);
                return;
            }
        };
        self.answer_each(primary, batch, replies);
    }

    /// EVALSHA of `script` on `primary` with `declared` keys and `args()`, the scripts
    /// re-loaded on `NOSCRIPT` (one caller for all) and the call retried, twice at most.
    async fn evalsha_reloading(
        &self,
        primary: &Primary,
        script: &Script,
        declared: &[Key],
        args: impl Fn() -> Vec<Value>,
    ) -> Result<Value, Error> {
        let mut generation = primary.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        loop {
            let reply: Result<Value, Error> = script
                .evalsha(&primary.client, declared.to_vec(), args())
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

    /// Hands each job its item of a batch's reply; a key Redis refused as not provably
    /// this primary's is answered [`Answer::Alone`] and its slot held in doubt.
    fn answer_each(&self, primary: &Primary, batch: Vec<Job>, replies: Vec<Value>) {
        let mut alone = 0;
        for (job, item) in batch.into_iter().zip(replies) {
            let answer = match item_reply(item) {
                Some(reply) => Answer::Replied(reply),
                None => {
                    self.unsettled.mark(job.key.0.as_bytes());
                    alone += 1;
                    Answer::Alone
                }
            };
            drop(job.reply.send(answer));
        }
        if alone > 0 {
            // Counts only: keys are client data.
            tracing::debug!(
                primary = primary.name(),
                alone,
                "a batch refused keys not provably this primary's: they go on their own"
            );
        }
    }
}

/// True for a redirection of a whole call (`MOVED`, `ASK`).
fn is_redirect(e: &Error) -> bool {
    let d = e.details();
    d.starts_with("MOVED ") || d.starts_with("ASK ")
}

/// Gives every job of `batch` the error `e` of the whole call.
fn answer_all(batch: Vec<Job>, e: &Error) {
    for job in batch {
        drop(job.reply.send(Answer::Replied(Err(e.clone()))));
    }
}

/// One decision's part of the batch script's reply: its script's integers, or the text
/// of its error; `None` for a key Redis refused as not the node's own (`ALONE …`).
pub(super) fn item_reply(item: Value) -> Option<Reply> {
    let text = match item {
        Value::Array(values) => {
            return Some(
                values
                    .into_iter()
                    .map(|v| match v {
                        Value::Integer(i) => Ok(i),
                        other => Err(Error::new(
                            ErrorKind::Parse,
                            format!("script returned {other:?} where an integer was expected"),
                        )),
                    })
                    .collect(),
            )
        }
        Value::String(text) => text.to_string(),
        Value::Bytes(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        other => {
            return Some(Err(Error::new(
                ErrorKind::Parse,
                format!("batch script returned {other:?} for one decision"),
            )))
        }
    };
    match text.starts_with("ALONE ") {
        true => None,
        false => Some(Err(item_error(&text))),
    }
}

/// The error a decision's own EVALSHA would have got for the error text `text` (the
/// kinds fred gives the error replies a decision script can meet), so that it is
/// classified as without batching ([`super::StoreError::from_redis`]).
fn item_error(text: &str) -> Error {
    let kind = match text.split_whitespace().next() {
        Some("WRONGTYPE") => ErrorKind::InvalidArgument,
        Some("NOAUTH" | "WRONGPASS") => ErrorKind::Auth,
        Some("MOVED" | "ASK" | "CLUSTERDOWN") => ErrorKind::Cluster,
        _ => ErrorKind::Unknown,
    };
    Error::new(kind, text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn an_item_reads_as_its_own_script_reply() {
        let ok = Value::Array(vec![1.into(), 4.into(), 1000.into(), 0.into()]);
        assert_eq!(
            item_reply(ok).and_then(Result::ok),
            Some(vec![1, 4, 1000, 0])
        );
        let bad = Value::Array(vec![1.into(), Value::from("x")]);
        assert!(matches!(item_reply(bad), Some(Err(_))));
        let refused =
            Value::from("ALONE ERR Script attempted to access a non local key in a cluster node");
        assert!(item_reply(refused).is_none());
    }

    #[test]
    fn item_errors_are_classified_as_a_lone_call_s() {
        let key = |text: &str| {
            let e = item_reply(Value::from(text))
                .and_then(Result::err)
                .map(StoreError::from_redis);
            matches!(e, Some(StoreError::Key(_)))
        };
        // The key's own problem: decided without Redis, Redis stays in use.
        assert!(key(
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        ));
        assert!(key("ERR user_script:3: attempt to index a nil value"));
        // Redis cannot decide: the breaker hears it.
        assert!(!key(
            "OOM command not allowed when used memory > 'maxmemory'."
        ));
        assert!(!key(
            "ERR The user executing the script can't run this command"
        ));
        assert!(!key(
            "ERR ACL failure in script: User ratelimitd has no permissions to run the 'pexpire' command"
        ));
        // Redis 5 and 6 raise a script's Redis error as text: the batch script keeps it
        // behind "ERR", as those versions' own EVAL error does.
        assert!(!key(
            "ERR @user_script: 3: -OOM command not allowed when used memory > 'maxmemory'."
        ));
    }
}
