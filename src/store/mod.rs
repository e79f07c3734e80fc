//! Where shared state lives: the one interface the limiter decides through ([`Store`]),
//! and the one error type every store call returns.
//!
//! * [`redis`]: the Redis client (connection set-up, EVALSHA, probes);
//! * `batch`, `batch_all`: a primary's decisions and lease calls, and its
//!   all-or-nothing groups and give-backs, sent several to an EVALSHA
//!   ([`batch_script`] the scripts' text; `gate`: a lease call goes out only while its
//!   caller waits);
//! * [`scripts`]: what is sent to Redis per algorithm (script, key, arguments, reply);
//! * [`topology`]: one connection per primary and the slot map;
//! * [`health`]: whether a primary may be asked (its breaker; the daemon-wide view);
//! * [`lateness`]: whether this process itself was late (event-loop lag);
//! * [`lease`]: the lease call (`lease = "auto"`);
//! * [`hosts`]: the daemons alive, for `fallback.hosts = "auto"` (a heartbeat);
//! * [`expiry_walk`], [`walk_election`]: after a reload that makes a rule keep its
//!   state longer, one daemon lengthens the expiry of the rule's keys in Redis.
//!
//! The limiter sees [`Store`] and [`StoreError`] only: it never names the client
//! library, a primary, a breaker or a slot. Routing a key to its primary, per-primary
//! health, the time bound (with this process's own lateness excused), batching and
//! `NOSCRIPT` all live behind [`Store::route`], [`Store::decide`] and [`Store::lease`].
//! [`RedisStore`] is the production store; [`local::LocalStore`] answers the same
//! interface from local buckets (the limiter's flow is unit-tested against it, and
//! against a scripted store for the failures).

mod batch;
mod batch_all;
mod batch_reply;
pub mod batch_script;
pub mod connect;
pub mod connection_errors;
pub mod credentials;
pub mod expiry_walk;
mod gate;
pub mod health;
pub mod hosts;
pub mod lateness;
pub mod lease;
pub mod local;
pub mod multi;
mod queue;
pub mod redis;
pub mod scripts;
mod slot_map;
pub mod slots;
pub mod tls;
pub mod topology;
mod until_done;
pub mod walk_election;

pub use self::redis::RedisStore;
pub use self::slots::{SlotOp, SlotReply};
pub use self::until_done::UntilDone;

use crate::algorithm::{Outcome, Params};
use crate::lease::{Granted, Request};
use fred::error::{Error, ErrorKind};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// A call whose caller stopped waiting (its `redis.timeout_ms` ran out, or its
/// connection closed) keeps what it holds until the store answers it (the Redis client
/// gives up on a command after `max(1 s, 2 × timeout)`); this is only a backstop in
/// case it never does.
pub const HELD_AT_MOST: Duration = Duration::from_secs(10);

/// What the limiter asks of the shared state: one bounded question per decision or per
/// lease call, answered or classified as unavailable.
///
/// A call takes `hold` (the caller's place in the cap of calls in flight) and drops it
/// only when the store is done with the call, even if the caller stopped waiting: a
/// decision that timed out still sits in Redis's queue, so it still counts.
pub trait Store: Send + Sync + 'static {
    /// A key's name in the store, built once per request from its tag
    /// (`"<rule>:<key>"`) and algorithm.
    type Key: Clone + Send + Sync + 'static;
    /// Where a key's calls go while the store can be asked about it (Redis: the
    /// primary owning its slot).
    type Route: Clone + Send + Sync + 'static;

    /// The name of `tag` under `params`' algorithm.
    fn key(&self, tag: &str, params: &Params) -> Self::Key;

    /// `key` as text, for logs (hashed before it reaches a log line: it holds client
    /// data).
    fn key_text(key: &Self::Key) -> &str;

    /// Where to ask about `key` now; `None` when the store cannot be asked about it
    /// (Redis: its slot's owner unknown, or that primary bypassed while its breaker is
    /// open), and the caller decides without it.
    fn route(&self, key: &Self::Key) -> Option<Self::Route>;

    /// The bound of one call, `redis.timeout_ms`.
    fn timeout(&self) -> Duration;

    /// Decides `cost` units of `key` under `params` (with `peek`, a dry run: the same
    /// answer, nothing taken), within [`Store::timeout`].
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the store could not decide in time (the route's
    /// health has heard it), [`StoreError::Key`] for an error of this key alone.
    fn decide<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        key: Self::Key,
        params: Params,
        cost: u32,
        peek: bool,
        hold: H,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send;

    /// Decides `cost` units of `key` with `params`' lease script and settles `request`
    /// (a lease given back, another taken), within [`Store::timeout`].
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn lease<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        key: Self::Key,
        params: Params,
        cost: u32,
        request: Request,
        hold: H,
    ) -> impl Future<Output = Result<(Outcome, Granted), StoreError>> + Send;
    /// The shard of `key`: keys of one shard can be decided by one script (Redis
    /// Cluster: the key's hash slot; one Redis: every key is in shard 0).
    fn shard(&self, key: &Self::Key) -> u16 {
        let _ = key;
        0
    }

    /// Decides `items` (keys of one shard on `route`, each key once, with its
    /// parameters and cost) all or nothing: each is taken only if every one is allowed
    /// (`multi::Taken` per item: its outcome and the instant its units were taken at),
    /// within [`Store::timeout`]. A store that cannot (the default) answers
    /// [`StoreError::Config`], and the caller decides without it.
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn decide_together<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        items: Vec<(Self::Key, Params, u32)>,
        hold: H,
    ) -> impl Future<Output = Result<Vec<multi::Taken>, StoreError>> + Send {
        drop((route, items, hold));
        async {
            Err(StoreError::Config(
                "this store decides no keys together".into(),
            ))
        }
    }

    /// Gives units back to `items` (keys on `route`, each with its parameters, the units
    /// and, to undo a reservation, the instant it was taken at; `None` for a `REFUND`),
    /// never beyond the capacity or limit, never into another window than the current
    /// one (or the reservation's); answers each key's outcome for a cost of 0 after it,
    /// within [`Store::timeout`]. The default store answers [`StoreError::Config`].
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn give_back<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        items: Vec<(Self::Key, Params, u32, Option<i64>)>,
        hold: H,
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send {
        drop((route, items, hold));
        async { Err(StoreError::Config("this store gives nothing back".into())) }
    }

    /// Runs `op` on the slots of a concurrency rule's `key` ([`SlotOp`]), within
    /// [`Store::timeout`]. A store that keeps no slots answers unavailable, and the
    /// limiter holds them locally.
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn slots<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        key: Self::Key,
        params: Params,
        op: SlotOp,
        hold: H,
    ) -> impl Future<Output = Result<SlotReply, StoreError>> + Send {
        drop((route, key, params, op, hold));
        std::future::ready(Err(StoreError::Unavailable {
            kind: "unsupported",
            source: Error::new(ErrorKind::Unknown, "this store keeps no slots"),
        }))
    }

    /// Where `key` lives, for operators (`INSPECT`): its hash slot and the address
    /// (`host:port`) of the primary owning it, each when known. Default: neither.
    fn locate(&self, _key: &Self::Key) -> (Option<u16>, Option<String>) {
        (None, None)
    }

    /// Deletes `key`'s state (`RESET`), keeping its run-time override, within
    /// [`Store::timeout`]; `hold` as for [`Store::decide`]. Default: nothing is kept,
    /// nothing to delete.
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn delete<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        key: Self::Key,
        hold: H,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        drop((route, key, hold));
        std::future::ready(Ok(()))
    }

    /// Writes (`Some`) or deletes (`None`) the run-time override of `key`
    /// (`OVERRIDE`), stored with the key's state and read by its decision script,
    /// within [`Store::timeout`]; `hold` as for [`Store::decide`]. Default: a store
    /// whose decisions read no override keeps none (the limiter remembers it).
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn set_tier<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        key: Self::Key,
        tier: Option<TierRecord>,
        hold: H,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        drop((route, key, tier, hold));
        std::future::ready(Ok(()))
    }

    /// The run-time override of `key` as written (`param=value` text) and the ms it
    /// has left (`None`: no ttl), or `None` when it has none (`INSPECT`). Default: none.
    ///
    /// # Errors
    /// As [`Store::decide`].
    fn read_tier<H: Send + 'static>(
        self: &Arc<Self>,
        route: Self::Route,
        key: Self::Key,
        hold: H,
    ) -> impl Future<Output = Result<Option<(String, Option<u64>)>, StoreError>> + Send {
        drop((route, key, hold));
        std::future::ready(Ok(None))
    }
}

/// A run-time override as the store keeps it (`lua/prelude.lua` override()): the
/// decision script's first two arguments under it, its limit, its rate or window as 64
/// bits ([`crate::algorithm::Tier`]), its `param=value` text, and its ttl (ms; `None`:
/// until cleared).
#[derive(Debug, Clone, PartialEq)]
pub struct TierRecord {
    /// The replacements of the script's `ARGV[1]` and `ARGV[2]`.
    pub args: [fred::types::Value; 2],
    /// The tier reported back with each decision.
    pub tier: crate::algorithm::Tier,
    /// `param=value` pairs, space-separated (`INSPECT` shows them).
    pub text: String,
    /// Lifetime, ms; `None` until cleared.
    pub ttl_ms: Option<u64>,
}

/// A Redis key built once per request (`<prefix>:{<rule>:<key>}:<suffix>`), ready to be
/// sent as is.
#[derive(Debug, Clone)]
pub struct StoreKey(pub(crate) fred::types::Key);

impl StoreKey {
    /// The key as text, for logs (`?` if it is not UTF-8, which protocol keys always are).
    pub fn as_str(&self) -> &str {
        self.0.as_str().unwrap_or("?")
    }
}

/// Why a store call failed, classified once, here, for everyone.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Redis cannot decide at all (down, unreachable, timing out, failing over, out of
    /// memory, loading, read-only, script cache gone): the circuit opens. `kind` is the
    /// short label of metrics (`io`, `timeout`, `cluster`, `oom`, …).
    #[error("{source}")]
    Unavailable {
        /// Metrics label of the failure.
        kind: &'static str,
        /// What the client reported.
        source: Error,
    },
    /// An error tied to one request or key (`WRONGTYPE` on a foreign key, a script
    /// runtime error, a malformed reply): that request is decided without Redis, the
    /// others keep going to Redis.
    #[error("{0}")]
    Key(Error),
    /// The `[redis]` settings cannot make a client.
    #[error("{0}")]
    Config(String),
}

impl StoreError {
    /// Classifies an error of the Redis client.
    pub fn from_redis(error: Error) -> Self {
        if is_unavailable(&error) {
            StoreError::Unavailable {
                kind: kind_label(&error),
                source: error,
            }
        } else {
            StoreError::Key(error)
        }
    }

    /// A call that got no answer within `what` (a timeout of ours, not the client's).
    pub fn timeout(what: String) -> Self {
        StoreError::Unavailable {
            kind: "timeout",
            source: Error::new(ErrorKind::Timeout, what),
        }
    }
}

impl From<Error> for StoreError {
    fn from(error: Error) -> Self {
        StoreError::from_redis(error)
    }
}

/// True when `error` means Redis cannot decide at all. Redis 5 and 6 wrap an error
/// raised inside a script as `ERR Error running script … -OOM …`: those are looked into.
fn is_unavailable(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::InvalidArgument | ErrorKind::Parse => false,
        ErrorKind::Unknown => {
            let details = error.details();
            !details.starts_with("ERR")
                || [
                    "-OOM",
                    "-READONLY",
                    "-LOADING",
                    "-MASTERDOWN",
                    "-CLUSTERDOWN",
                    "-BUSY",
                ]
                .iter()
                .any(|p| details.contains(p))
                // The ACL user may not run a command a script needs: every decision of
                // that script fails alike, so it is Redis', not the key's.
                || connection_errors::is_acl_refusal(details)
        }
        _ => true,
    }
}

/// A short label for the kind of an error that opens the circuit, for metrics (`io`,
/// `timeout`, `cluster`, `oom`, `busy`, `noscript`, `loading`, `readonly`, `redis`, …).
fn kind_label(error: &Error) -> &'static str {
    let details = error.details();
    match error.kind() {
        ErrorKind::IO => "io",
        ErrorKind::Timeout => "timeout",
        ErrorKind::Cluster => "cluster",
        ErrorKind::Canceled => "canceled",
        ErrorKind::Backpressure => "backpressure",
        ErrorKind::Routing => "routing",
        _ if details.starts_with("OOM") || details.contains("-OOM") => "oom",
        _ if details.starts_with("BUSY") => "busy",
        _ if details.starts_with("NOSCRIPT") => "noscript",
        _ if details.starts_with("LOADING") => "loading",
        _ if details.starts_with("READONLY") => "readonly",
        _ => "redis",
    }
}
