//! The store interface ([`Store`]) on Redis: a key is routed to the primary owning its
//! slot unless that primary is bypassed, and each call is one EVALSHA (or a place in a
//! batch), bounded by `redis.timeout_ms`, heard by the primary's breaker, and finished
//! on its own when its caller stops waiting.

use super::{tier, RedisStore};
use crate::algorithm::{Outcome, Params};
use crate::clock::mono_us;
use crate::lease::{Granted, Request};
use crate::store::gate::{CloseOnDrop, Gate};
use crate::store::health::CallSent;
use crate::store::scripts;
use crate::store::topology::Primary;
use crate::store::{
    SlotOp, SlotReply, Store, StoreError, StoreKey, TierRecord, UntilDone, HELD_AT_MOST,
};
use fred::error::Error;
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Key, Value};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

impl Store for RedisStore {
    type Key = StoreKey;
    type Route = Arc<Primary>;

    /// `<prefix>:{<rule>:<key>}:<suffix>` ([`scripts::key`]).
    fn key(&self, tag: &str, params: &Params) -> StoreKey {
        StoreKey(Key::from(scripts::key(&self.prefix, tag, params)))
    }

    fn key_text(key: &StoreKey) -> &str {
        key.as_str()
    }

    /// The primary owning `key`'s slot, unless it is unknown or bypassed: its breaker
    /// is open, and so the daemon-wide view (only the keys of the primaries that fail
    /// are decided without Redis; the others keep going to Redis).
    fn route(&self, key: &StoreKey) -> Option<Arc<Primary>> {
        self.owner(key)
            .filter(|p| !(self.circuit.is_open() && p.health.is_open()))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn decide<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        key: StoreKey,
        params: Params,
        cost: u32,
        peek: bool,
        hold: H,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        let store = Arc::clone(self);
        let on = Arc::clone(&primary);
        // Stamped when the decision goes out, alone or in a batch.
        let sent = Arc::new(CallSent::default());
        let stamp = Arc::clone(&sent);
        self.held_sent(primary, hold, sent, async move {
            store
                .decide_unbounded(&on, &key, &params, cost, peek, stamp)
                .await
        })
    }

    fn lease<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        key: StoreKey,
        params: Params,
        cost: u32,
        request: Request,
        hold: H,
    ) -> impl Future<Output = Result<(Outcome, Granted), StoreError>> + Send {
        let store = Arc::clone(self);
        let on = Arc::clone(&primary);
        // Stamped when the call goes out, alone or in a batch.
        let sent = Arc::new(CallSent::default());
        let stamp = Arc::clone(&sent);
        // Open while this future waits: none of the call's sends goes out after.
        let gate = Gate::new();
        let closes = CloseOnDrop(Arc::clone(&gate));
        let call = self.held_sent(primary, hold, sent, async move {
            store
                .lease_call(&on, &key, &params, cost, &request, stamp, &gate)
                .await
        });
        async move {
            let _closes = closes;
            call.await
        }
    }

    fn shard(&self, key: &StoreKey) -> u16 {
        if self.clustered {
            fred::util::redis_keyslot(key.0.as_bytes())
        } else {
            0
        }
    }

    fn decide_together<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        items: Vec<(StoreKey, Params, u32)>,
        hold: H,
    ) -> impl Future<Output = Result<Vec<crate::store::multi::Taken>, StoreError>> + Send {
        let store = Arc::clone(self);
        let on = Arc::clone(&primary);
        // Stamped when the group goes out, alone or in a batch.
        let sent = Arc::new(CallSent::default());
        let stamp = Arc::clone(&sent);
        self.held_sent(primary, hold, sent, async move {
            store.together_unbounded(&on, &items, stamp).await
        })
    }

    fn give_back<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        items: Vec<(StoreKey, Params, u32, Option<i64>)>,
        hold: H,
    ) -> impl Future<Output = Result<Vec<Outcome>, StoreError>> + Send {
        let store = Arc::clone(self);
        let on = Arc::clone(&primary);
        // Stamped when the give-back goes out, alone or in a batch.
        let sent = Arc::new(CallSent::default());
        let stamp = Arc::clone(&sent);
        self.held_sent(primary, hold, sent, async move {
            store.give_back_unbounded(&on, &items, stamp).await
        })
    }

    fn slots<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        key: StoreKey,
        params: Params,
        op: SlotOp,
        hold: H,
    ) -> impl Future<Output = Result<SlotReply, StoreError>> + Send {
        let store = Arc::clone(self);
        let on = Arc::clone(&primary);
        self.held(primary, hold, async move {
            store.slots_unbounded(&on, &key, &params, &op).await
        })
    }

    /// The key's hash slot (as Redis Cluster computes it from the hash tag; a
    /// standalone Redis has no slots but the figure is the same) and its primary.
    fn locate(&self, key: &StoreKey) -> (Option<u16>, Option<String>) {
        let slot = fred::util::redis_keyslot(key.0.as_bytes());
        let primary = self.owner(key).map(|p| p.name().to_owned());
        (Some(slot), primary)
    }

    /// One EVAL on the key's primary: its state and any leases recorded in it
    /// deleted, its run-time override kept ([`tier`]).
    fn delete<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        key: StoreKey,
        hold: H,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let client = primary.client.clone();
        let args = tier::reset_args(&key);
        let eval = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
        self.held(primary, hold, async move {
            client.custom::<Value, _>(eval, args).await.map(drop)
        })
    }

    /// One EVAL on the key's primary ([`tier`]): the override replaced (or deleted),
    /// with its ttl, and the key's TTL kept at least as long.
    fn set_tier<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        key: StoreKey,
        tier: Option<TierRecord>,
        hold: H,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let client = primary.client.clone();
        let args = tier::write_args(&key, tier);
        let eval = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
        self.held(primary, hold, async move {
            client.custom::<Value, _>(eval, args).await.map(drop)
        })
    }

    /// The key's override as written and the ms it has left, in one EVAL ([`tier`]).
    fn read_tier<H: Send + 'static>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        key: StoreKey,
        hold: H,
    ) -> impl Future<Output = Result<Option<(String, Option<u64>)>, StoreError>> + Send {
        let client = primary.client.clone();
        let args = tier::read_args(&key);
        let eval = CustomCommand::new_static("EVAL", ClusterHash::Offset(2), false);
        self.held(primary, hold, async move {
            let reply = client.custom::<Value, _>(eval, args).await?;
            Ok(match reply {
                Value::Array(v) => match v.as_slice() {
                    [text, ttl] => text.as_string().map(|text| {
                        let ttl = ttl.as_i64().filter(|ms| *ms >= 0).map(|ms| ms as u64);
                        (text, ttl)
                    }),
                    _ => None,
                },
                _ => None,
            })
        })
    }
}

impl RedisStore {
    /// Waits for `call` (a [`RedisStore::decide_unbounded`] on `primary`) at most
    /// `redis.timeout_ms`, and tells the primary's breaker how it went, as a failure of
    /// the Redis call sent at `sent` (one per batch, however many decisions it held; a
    /// decision still in this process's batch queue was sent by no one, and its timeout
    /// is not Redis's). A timeout caused by this process's own lateness waits once more
    /// (up to another `timeout_ms`) for Redis's answer and is not counted against the
    /// primary. On a timeout `call` is still running: its owner decides whether it runs
    /// to its end.
    ///
    /// # Errors
    /// What Redis or the connection reported, a timeout, a redirection (the slot moved:
    /// decided locally, the map is refreshed), or a malformed script reply.
    pub(super) async fn bounded<F, T>(
        &self,
        primary: &Primary,
        sent: &CallSent,
        call: &mut F,
    ) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, Error>> + Unpin,
    {
        let mut waited_from = mono_us();
        let mut excused = false;
        let answer = loop {
            match tokio::time::timeout(self.timeout, &mut *call).await {
                Ok(answer) => break Some(answer),
                // This process was late, not Redis: once, give Redis's answer (maybe
                // already in the socket) the time it would have had.
                Err(_) if !excused && self.lateness.excuses(waited_from, self.timeout) => {
                    excused = true;
                    tracing::debug!("a Redis call outlived redis.timeout_ms while this process was late: waiting for its answer");
                    waited_from = mono_us();
                }
                Err(_) => break None,
            }
        };
        match answer {
            Some(Ok(outcome)) => {
                primary.health.succeeded();
                Ok(outcome)
            }
            Some(Err(e)) if is_redirect(&e) => {
                self.slot_map_wanted.notify_one();
                Err(StoreError::Key(e))
            }
            Some(Err(e)) => {
                let e = StoreError::from_redis(e);
                if let StoreError::Unavailable { .. } = e {
                    primary.health.failed(sent.at().unwrap_or_else(mono_us), &e);
                }
                Err(e)
            }
            None => {
                let why = format!(
                    "no answer within redis.timeout_ms = {}",
                    self.timeout.as_millis()
                );
                match sent.at() {
                    Some(at) if !self.lateness.late_since(waited_from) => {
                        primary.health.failed(at, &why);
                    }
                    _ => {}
                }
                Err(StoreError::timeout(why))
            }
        }
    }

    /// Runs `call` (one Redis call, sent now) on `primary` holding `hold` until Redis is
    /// done with it, and waits for it at most `redis.timeout_ms`
    /// ([`RedisStore::bounded`]).
    async fn held<T, H, F>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        hold: H,
        call: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        H: Send + 'static,
        F: Future<Output = Result<T, fred::error::Error>> + Send + 'static,
    {
        self.held_sent(primary, hold, Arc::new(CallSent::now()), call)
            .await
    }

    /// [`RedisStore::held`] for a call whose sender stamps `sent` when it goes out.
    async fn held_sent<T, H, F>(
        self: &Arc<Self>,
        primary: Arc<Primary>,
        hold: H,
        sent: Arc<CallSent>,
        call: F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        H: Send + 'static,
        F: Future<Output = Result<T, fred::error::Error>> + Send + 'static,
    {
        let mut call = UntilDone::new(
            async move {
                let answer = call.await;
                drop(hold);
                answer
            },
            HELD_AT_MOST,
        );
        self.bounded(&primary, &sent, &mut call).await
    }
}

/// True for a cluster redirection (`MOVED`, `ASK`): the slot lives elsewhere now.
fn is_redirect(e: &Error) -> bool {
    let d = e.details();
    d.starts_with("MOVED ") || d.starts_with("ASK ") || d.contains("CLUSTERDOWN")
}
