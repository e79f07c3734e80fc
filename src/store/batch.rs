//! Decisions and lease calls for one primary sent together. Every EVALSHA costs Redis
//! a command, a script call and a `TIME`, and costs the daemon a call through fred (its
//! command, frame and futures). The calls waiting for a primary when its sender task
//! runs go in one EVALSHA of the batch script (`lua/batch.lua`), which runs each call's
//! own script as a function, in order, on its own key: a decision's algorithm script,
//! or a lease call's lease script (`lease = "auto"`: [`super::lease`]). Nothing waits
//! to fill a batch ([`super::queue`]): a call that finds fewer than
//! [`super::queue::MAX_IN_FLIGHT`] batches in flight goes at once (alone, with its own
//! script, when nothing else waits); the others queue and
//! leave together when a batch comes back, or as soon as a full batch waits
//! ([`MAX_BATCH`], a lease call counting [`LEASE_CALL_WEIGHT`]), or once the first of
//! them has waited an eighth of `redis.timeout_ms` ([`QUEUED_AT_MOST`]).
//! So a call waits in this queue for at most one batch's round trip, never while a
//! full batch could go, and never long behind a slow Redis: a Redis answering in
//! somewhat less than `redis.timeout_ms` answers its calls in time, batched or not,
//! where waiting for a batch's round trip and then for its own would take two.
//!
//! Each call keeps its own key and arguments, its reply, its `redis.timeout_ms`
//! (the caller bounds its wait for the batch's answer, the time queued here included)
//! and its report to the primary's breaker, which hears a batch as the one call it is:
//! every call carries the batch's send time ([`CallSent`]). A call's Redis error (a
//! foreign key's `WRONGTYPE`, `OOM`) is its own reply; an error of the whole call (the
//! connection, `NOSCRIPT` after the reloads) is every call's. The probes of an open
//! breaker do not queue here: they measure Redis. A lease call goes out only while its
//! caller waits for it ([`super::gate`]): a batch leaves out the lease calls whose
//! callers gave up, and holds the others' gates until it is on the connection, so that
//! a holder's calls of one key reach Redis in the order it made them.
//!
//! Redis Cluster: each primary has its own queue, and a batch holds keys of any of its
//! slots (the cluster batch script, [`batch_script::cluster_batch_lua`]: one key declared to
//! route the call, the others in `ARGV`). Redis refuses, per key, a key it cannot vouch
//! for as the node's own and not moved away (another node's slot, a migrating slot's
//! absent key, an importing slot's key): such a call is answered [`Answer::Alone`]
//! and its caller sends it on its own, where `ASK` and `MOVED` are followed, and its slot
//! is held in doubt for a while ([`super::redis::unsettled`]): its keys skip the batches.
//! A batch whose routing key itself is redirected sends every call alone.
//!
//! Not batched: the sliding window log (its decision reads up to `limit` entries: a
//! batch would hold all of its decisions as long as the slowest), which takes no leases.

use super::batch_reply::item_reply;
use super::batch_script;
use super::gate::{self, Gate};
use super::health::CallSent;
use super::queue::{Queue, Queued};
use super::redis::RedisStore;
use super::scripts::Scripts;
use super::topology::Primary;
use super::StoreKey;
use crate::algorithm::Kind;
use fred::error::{Error, ErrorKind};
use fred::types::scripts::Script;
use fred::types::{Key, Value};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// At most this many decisions per EVALSHA (a lease call counts [`LEASE_CALL_WEIGHT`]).
/// It bounds how long one script holds Redis (about 7–10 µs per token-bucket decision
/// under `redis-benchmark`: under 1 ms for a full batch) and the size of one reply.
pub const MAX_BATCH: usize = 64;

/// What a lease call counts for in a batch's [`MAX_BATCH`]: it costs Redis up to about
/// three decisions' work (`benches/script_instructions.sh`, callgrind: 173,993
/// instructions per batched lease call that takes a lease, 132,193 for a cold key's
/// that asks for nothing, 70,029 per batched token-bucket decision; 64 lease calls in
/// one EVALSHA took 2.4 ms where 64 decisions took 0.85 ms), so a batch holds at most
/// 21 of them.
pub const LEASE_CALL_WEIGHT: usize = 3;

/// The longest the first call waiting for a batch in flight to come back waits, as a
/// share of `redis.timeout_ms` (÷ 8: 12.5 ms of the default 100): past it, the calls
/// waiting go in a batch of their own. A healthy Redis answers a batch in well
/// under a millisecond, so only a slow one meets it.
pub const QUEUED_AT_MOST: u32 = 8;

pub use super::batch_reply::Reply;

/// A batch's EVALSHA once on its connection: its answer to come.
type OnTheWire<'a> = Pin<Box<dyn Future<Output = Result<Value, Error>> + Send + 'a>>;

/// What a batch did with one call.
pub(super) enum Answer {
    /// Decided (or failed) as its own EVALSHA would have been.
    Replied(Reply),
    /// Not decided (Redis Cluster): its key may not be this primary's now; the caller
    /// sends it on its own.
    Alone,
}

/// True when decisions and lease calls of `kind` may go in a batch: all but the
/// sliding window log's and a concurrency rule's (its slots are taken and given back by
/// their own script, `lua/concurrency.lua`; a dry run of one, `INSPECT`'s, goes alone).
pub fn batchable(kind: Kind) -> bool {
    !matches!(kind, Kind::SlidingWindowLog | Kind::Concurrency)
}

/// Which script a job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Call {
    /// A decision: its algorithm's script ([`super::scripts::args`] or
    /// [`super::scripts::peek_args`]).
    Decide(Kind),
    /// A lease call (`lease = "auto"`): its algorithm's lease script
    /// ([`super::scripts::lease_args`]).
    Lease(Kind),
}

impl Call {
    /// Its own script, which it runs alone.
    pub fn script(self, scripts: &Scripts) -> &Script {
        match self {
            Call::Decide(kind) => scripts.of(kind),
            Call::Lease(kind) => scripts.lease_of(kind),
        }
    }

    /// Its function's index in the batch script ([`batch_script::batch_args`]).
    pub fn index(self) -> usize {
        match self {
            Call::Decide(kind) => kind as usize,
            Call::Lease(kind) => batch_script::lease_index(kind),
        }
    }
}

/// One call waiting to be sent: a decision or a lease call.
pub(super) struct Job {
    pub key: StoreKey,
    pub call: Call,
    /// Its own script's arguments.
    pub args: Vec<Value>,
    /// When its caller started waiting (an `ASK` followed gets what is left of
    /// `redis.timeout_ms`).
    pub since: Instant,
    /// Stamped when the call carrying it goes out (the breaker counts a call once).
    pub sent: Arc<CallSent>,
    /// A lease call's: sent only while its caller waits ([`super::gate`]).
    pub gate: Option<Arc<Gate>>,
    pub reply: oneshot::Sender<Answer>,
}

impl Queued for Job {
    fn since(&self) -> Instant {
        self.since
    }

    fn weight(&self) -> usize {
        match self.call {
            Call::Decide(_) => 1,
            Call::Lease(_) => LEASE_CALL_WEIGHT,
        }
    }
}

/// The queue of one primary's decisions and lease calls, and its sender task.
pub(super) type Batcher = Queue<Job>;

impl Queue<Job> {
    /// Starts the sender task for `primary` (once; later calls do nothing), for
    /// calls bounded by `timeout` (`redis.timeout_ms`): batches of at most
    /// [`MAX_BATCH`] decisions' weight, the first call queued at most `timeout` ÷
    /// [`QUEUED_AT_MOST`].
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
    /// Queues `job` for `primary`'s batches and waits for its answer on `answer` (the
    /// other end of its `reply`): `Some` its reply, `None` when the caller must send it
    /// on its own (Redis Cluster refused its key, or the sender task is gone).
    pub(super) async fn batched(
        &self,
        primary: &Primary,
        job: Job,
        answer: oneshot::Receiver<Answer>,
    ) -> Option<Reply> {
        primary.batch.submit(job).ok()?;
        // Only a bug of this process drops a job unanswered: the key's problem (an
        // `ERR`), decided without Redis, not a failure of Redis.
        match answer.await {
            Ok(Answer::Replied(reply)) => Some(reply),
            Ok(Answer::Alone) => None,
            Err(_) => Some(Err(Error::new(
                ErrorKind::Unknown,
                "ERR the batch sender stopped",
            ))),
        }
    }

    /// Sends `batch` to `primary` and answers each job: one job with its own script
    /// (as without batching), more with the batch script, re-loaded on `NOSCRIPT` and
    /// retried as [`RedisStore::run_script_since`] does.
    async fn send_batch(&self, primary: &Primary, mut batch: Vec<Job>) {
        if batch.len() == 1 {
            if let Some(job) = batch.pop() {
                job.sent.mark();
                let script = job.call.script(&self.scripts);
                let args = || job.args.clone();
                let gate = job.gate.as_deref();
                let reply = self
                    .run_script_since(primary, script, &job.key, args, job.since, gate)
                    .await;
                // The caller may have stopped waiting (its timeout): nothing to do.
                drop(job.reply.send(Answer::Replied(reply)));
            }
            return;
        }
        let mut generation = primary.reloads.load(Ordering::Acquire);
        let mut reloads = 0;
        let answer = loop {
            let Some(call) = self.put_on_wire(primary, &mut batch) else {
                return;
            };
            match call.await {
                Err(e) if reloads < 2 && e.details().starts_with("NOSCRIPT") => {
                    if let Err(e) = self.reload_scripts(primary, generation).await {
                        answer_all(batch, &e);
                        return;
                    }
                    generation = primary.reloads.load(Ordering::Acquire);
                    reloads += 1;
                }
                answer => break answer,
            }
        };
        let cluster = self.clustered;
        let replies = match answer {
            Ok(Value::Array(items)) if items.len() == batch.len() => items,
            // The routing key's slot is migrating or has moved: that says nothing of the
            // others, each goes on its own.
            Err(e) if cluster && is_redirect(&e) => {
                self.unsettled.mark(batch[0].key.0.as_bytes());
                tracing::debug!(
                    primary = primary.name(),
                    alone = batch.len(),
                    "a batch was redirected: its calls go on their own"
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

    /// Puts the EVALSHA of `batch` on `primary`'s connection and returns its answer to
    /// come; `None` when nothing is left to send. The lease calls whose callers stopped
    /// waiting are taken out of `batch` first (answered [`gate::not_sent`]), and every
    /// other lease call's gate is held until the command is on the connection
    /// ([`super::gate`]): none goes out after its caller gave up.
    fn put_on_wire<'a>(
        &'a self,
        primary: &'a Primary,
        batch: &mut Vec<Job>,
    ) -> Option<OnTheWire<'a>> {
        let gates: Vec<Option<Arc<Gate>>> = batch.iter().map(|j| j.gate.clone()).collect();
        let held: Vec<Option<_>> = gates.iter().map(|g| g.as_deref().map(Gate::open)).collect();
        let mut kept = Vec::with_capacity(batch.len());
        for (job, open) in batch.drain(..).zip(&held) {
            match open {
                Some(None) => drop(job.reply.send(Answer::Replied(Err(gate::not_sent())))),
                _ => kept.push(job),
            }
        }
        *batch = kept;
        if batch.is_empty() {
            return None;
        }
        let keys: Vec<Key> = batch.iter().map(|j| j.key.0.clone()).collect();
        let items: usize = batch.iter().map(|j| j.args.len() + 2).sum();
        let mut args = Vec::with_capacity(items + keys.len() + 1);
        let declared = match self.clustered {
            true => batch_script::cluster_batch_call(&keys, &mut args),
            false => keys,
        };
        for job in batch.iter() {
            job.sent.mark();
            batch_script::batch_args(job.call.index(), &job.args, &mut args);
        }
        let script = self.scripts.batch();
        let mut call = Box::pin(script.evalsha::<Value, _, _, _>(&primary.client, declared, args));
        let done = gate::poll_once(&mut call);
        drop(held);
        Some(match done {
            Some(answer) => Box::pin(std::future::ready(answer)),
            None => call,
        })
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
