//! The store interface ([`Store`]) on Redis: a key is routed to the primary owning its
//! slot unless that primary is bypassed, and each call is one EVALSHA (or a place in a
//! batch), bounded by `redis.timeout_ms`, heard by the primary's breaker, and finished
//! on its own when its caller stops waiting.

use super::RedisStore;
use crate::algorithm::{Outcome, Params};
use crate::lease::{Granted, Request};
use crate::store::scripts;
use crate::store::topology::Primary;
use crate::store::{Store, StoreError, StoreKey, UntilDone, HELD_AT_MOST};
use fred::types::Key;
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
        self.held(primary, hold, async move {
            store.decide_unbounded(&on, &key, &params, cost, peek).await
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
        self.held(primary, hold, async move {
            store
                .lease_unbounded(&on, &key, &params, cost, &request)
                .await
        })
    }
}

impl RedisStore {
    /// Runs `call` on `primary` holding `hold` until Redis is done with it, and waits for
    /// it at most `redis.timeout_ms` ([`RedisStore::bounded`]).
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
        let mut call = UntilDone::new(
            async move {
                let answer = call.await;
                drop(hold);
                answer
            },
            HELD_AT_MOST,
        );
        self.bounded(&primary, &mut call).await
    }
}
