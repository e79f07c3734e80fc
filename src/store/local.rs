//! The store interface answered in this process, from local buckets at the rules' full
//! limits: one host's shared state. It is what the limiter's flow is unit-tested against
//! without Redis (`redis.mode = "none"` decides through the local buckets directly, with
//! no call to await). It grants no leases: a lease call decides the request alone.

use super::{Store, StoreError};
use crate::algorithm::{Outcome, Params};
use crate::clock::local_clock_us;
use crate::fallback::LocalBuckets;
use crate::lease::{Granted, Request};
use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

/// Shared state kept by this process alone, at most `max_keys` keys.
pub struct LocalStore {
    buckets: LocalBuckets,
}

/// The eviction sketch's tag of every key here: the store's key text already names the
/// rule, and one tag is enough for a stand-in.
const SKETCH_TAG: u8 = 1;

impl LocalStore {
    /// Room for `max_keys` keys (evicted as the local buckets evict).
    pub fn new(max_keys: u64) -> Self {
        LocalStore {
            buckets: LocalBuckets::new(max_keys),
        }
    }

    fn hash(key: &str) -> u64 {
        let mut h = DefaultHasher::new();
        key.hash(&mut h);
        h.finish()
    }

    fn outcome(&self, key: &str, params: &Params, cost: u32) -> Outcome {
        let d = self.buckets.decide(
            Self::hash(key),
            0,
            params,
            SKETCH_TAG,
            cost,
            local_clock_us(),
        );
        Outcome {
            allowed: d.allowed,
            remaining: d.remaining,
            reset_ms: d.reset_ms,
            wait_ms: d.wait_ms,
            tier: None,
        }
    }
}

impl Store for LocalStore {
    /// `"<rule>:<key>:<suffix>"`: a key under another algorithm is another key.
    type Key = Arc<str>;
    /// Always reachable.
    type Route = ();

    fn key(&self, tag: &str, params: &Params) -> Arc<str> {
        format!("{tag}:{}", params.kind().spec().suffix).into()
    }

    fn key_text(key: &Arc<str>) -> &str {
        key
    }

    fn route(&self, _key: &Arc<str>) -> Option<()> {
        Some(())
    }

    fn timeout(&self) -> Duration {
        Duration::ZERO
    }

    fn decide<H: Send + 'static>(
        self: &Arc<Self>,
        _route: (),
        key: Arc<str>,
        params: Params,
        cost: u32,
        peek: bool,
        _hold: H,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        let outcome = self.outcome(&key, &params, if peek { 0 } else { cost });
        let outcome = match peek {
            // A dry run answers as the request would be answered, taking nothing.
            true => Outcome {
                allowed: outcome.remaining >= u64::from(cost),
                ..outcome
            },
            false => outcome,
        };
        std::future::ready(Ok(outcome))
    }

    fn lease<H: Send + 'static>(
        self: &Arc<Self>,
        _route: (),
        key: Arc<str>,
        params: Params,
        cost: u32,
        _request: Request,
        _hold: H,
    ) -> impl Future<Output = Result<(Outcome, Granted), StoreError>> + Send {
        let outcome = self.outcome(&key, &params, cost);
        let none = Granted::default();
        std::future::ready(Ok((outcome, none)))
    }

    fn delete<H: Send + 'static>(
        self: &Arc<Self>,
        _route: (),
        key: Arc<str>,
        _hold: H,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.buckets.forget(Self::hash(&key));
        std::future::ready(Ok(()))
    }
}
