//! The decision flow (deny cache → lease → store → fallback) without Redis: against the
//! local store ([`LocalStore`]), and against a scripted store that fails as Redis can
//! (unavailable, one key's error, a bypassed route). The tests against a real Redis
//! (`tests/`) stay the proof of the Redis store itself.

use super::*;
use crate::admission::{InFlight, InFlightLimits};
use crate::algorithm::Outcome;
use crate::decision::Source;
use crate::lease::{Granted, Request};
use crate::store::local::LocalStore;
use crate::store::StoreError;
use fred::error::{Error, ErrorKind};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A token bucket of capacity 4 refilling 1 unit per 1000 s (nothing refills within a
/// test), local share 4 ÷ 2 hosts = 2.
const RULES: &str = "[redis]\nmode = \"standalone\"\nnodes = [\"127.0.0.1:1\"]\n\
    [fallback]\nhosts = 2\n\
    [[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\ncapacity = 4\nrefill_rate = 0.001\n\
    [[rule]]\nname = \"open\"\nalgorithm = \"token_bucket\"\ncapacity = 4\nrefill_rate = 0.001\non_redis_failure = \"allow\"\n\
    [[rule]]\nname = \"leased\"\nalgorithm = \"token_bucket\"\ncapacity = 4\nrefill_rate = 0.001\nlease = \"auto\"\n";

fn config() -> Config {
    Config::parse(RULES, "test").expect("the test rules parse")
}

fn peer() -> Peer {
    Peer::unbounded(1000, 1000)
}

/// Decides one request; a store call is awaited.
async fn check<S: Store>(
    limiter: &Arc<Limiter<S>>,
    rule: &str,
    key: &str,
    peer: &Peer,
) -> Decision {
    let mut clock = BatchClock::default();
    match limiter.check(rule.as_bytes(), key.as_bytes(), 1, &mut clock, peer) {
        Check::Ready(r) => r.expect("a decision").decision,
        Check::Redis(call) => call.await.decision,
    }
}

#[tokio::test]
async fn the_store_decides_and_a_deny_is_then_answered_from_the_cache() {
    let limiter = Arc::new(Limiter::new(
        &config(),
        Some(Arc::new(LocalStore::new(100))),
    ));
    let peer = peer();
    for remaining in (0..4).rev() {
        let d = check(&limiter, "api", "k", &peer).await;
        assert!(d.allowed && d.source == Source::Redis, "{d:?}");
        assert_eq!((d.limit, d.remaining), (4, remaining));
    }
    let d = check(&limiter, "api", "k", &peer).await;
    assert!(
        !d.allowed && d.source == Source::Redis && d.wait_ms > 0,
        "{d:?}"
    );
    let d = check(&limiter, "api", "k", &peer).await;
    assert!(!d.allowed && d.source == Source::Cache, "{d:?}");
    // Another key is its own.
    let d = check(&limiter, "api", "other", &peer).await;
    assert!(d.allowed && d.remaining == 3, "{d:?}");
}

#[tokio::test]
async fn a_leased_rule_with_no_lease_granted_is_decided_by_the_store_every_time() {
    let limiter = Arc::new(Limiter::new(
        &config(),
        Some(Arc::new(LocalStore::new(100))),
    ));
    let peer = peer();
    let admitted = {
        let mut n = 0;
        for _ in 0..10 {
            let d = check(&limiter, "leased", "k", &peer).await;
            assert!(
                d.source == Source::Redis || d.source == Source::Lease,
                "{d:?}"
            );
            n += u64::from(d.allowed);
        }
        n
    };
    assert_eq!(admitted, 4, "exactly the capacity, nothing refills");
}

/// How the scripted store answers.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    /// Every call: Redis cannot decide (the route's health hears it).
    Unavailable,
    /// Every call: an error of this key alone (a foreign key's `WRONGTYPE`).
    KeyError,
    /// No route: the key's primary is bypassed; no call is made.
    Bypassed,
}

/// A store that fails as scripted, counting the calls that reach it.
struct Scripted {
    script: Script,
    calls: AtomicUsize,
}

impl Scripted {
    fn new(script: Script) -> Arc<Self> {
        Arc::new(Scripted {
            script,
            calls: AtomicUsize::new(0),
        })
    }

    fn answer<T>(&self) -> Result<T, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Err(match self.script {
            Script::KeyError => StoreError::Key(Error::new(ErrorKind::Unknown, "WRONGTYPE")),
            _ => StoreError::timeout("no answer within redis.timeout_ms = 25".into()),
        })
    }
}

impl Store for Scripted {
    type Key = String;
    type Route = ();

    fn key(&self, tag: &str, _params: &crate::algorithm::Params) -> String {
        tag.to_string()
    }

    fn key_text(key: &String) -> &str {
        key
    }

    fn route(&self, _key: &String) -> Option<()> {
        (self.script != Script::Bypassed).then_some(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(25)
    }

    fn decide<H: Send + 'static>(
        self: &Arc<Self>,
        _route: (),
        _key: String,
        _params: crate::algorithm::Params,
        _cost: u32,
        _peek: bool,
        _hold: H,
    ) -> impl Future<Output = Result<Outcome, StoreError>> + Send {
        std::future::ready(self.answer())
    }

    fn lease<H: Send + 'static>(
        self: &Arc<Self>,
        _route: (),
        _key: String,
        _params: crate::algorithm::Params,
        _cost: u32,
        _request: Request,
        _hold: H,
    ) -> impl Future<Output = Result<(Outcome, Granted), StoreError>> + Send {
        std::future::ready(self.answer())
    }
}

/// Decides `n` requests of `rule`/`key` against a store scripted to `script`: the
/// sources seen, the units admitted, and the calls that reached the store.
async fn against(script: Script, rule: &str, n: usize) -> (Vec<Source>, u64, usize) {
    let store = Scripted::new(script);
    let limiter = Arc::new(Limiter::new(&config(), Some(Arc::clone(&store))));
    let peer = peer();
    let (mut sources, mut admitted) = (Vec::new(), 0);
    for _ in 0..n {
        let d = check(&limiter, rule, "k", &peer).await;
        sources.push(d.source);
        admitted += u64::from(d.allowed);
    }
    (sources, admitted, store.calls.load(Ordering::Relaxed))
}

#[tokio::test]
async fn an_unavailable_store_leaves_the_local_share_per_on_redis_failure() {
    let (sources, admitted, calls) = against(Script::Unavailable, "api", 6).await;
    assert!(sources.iter().all(|s| *s == Source::Local), "{sources:?}");
    assert_eq!(admitted, 2, "capacity 4 ÷ 2 hosts");
    assert_eq!(calls, 6, "each request asked the store, which failed");
    let (sources, admitted, _) = against(Script::Unavailable, "open", 6).await;
    assert!(sources.iter().all(|s| *s == Source::FailOpen) && admitted == 6);
}

#[tokio::test]
async fn one_keys_error_is_decided_without_the_store() {
    let (sources, admitted, calls) = against(Script::KeyError, "api", 5).await;
    assert!(sources.iter().all(|s| *s == Source::Local), "{sources:?}");
    assert_eq!((admitted, calls), (2, 5));
}

#[tokio::test]
async fn a_bypassed_route_is_decided_locally_without_a_call() {
    for rule in ["api", "leased"] {
        let (sources, admitted, calls) = against(Script::Bypassed, rule, 5).await;
        assert!(
            sources.iter().all(|s| *s == Source::Local),
            "{rule}: {sources:?}"
        );
        assert_eq!((admitted, calls), (2, 0), "{rule}");
    }
}

#[tokio::test]
async fn a_leased_rule_whose_call_fails_falls_back_to_the_local_share() {
    let (sources, admitted, calls) = against(Script::Unavailable, "leased", 5).await;
    assert!(sources.iter().all(|s| *s == Source::Local), "{sources:?}");
    assert_eq!((admitted, calls), (2, 5));
}

#[tokio::test]
async fn a_peer_at_its_share_of_calls_in_flight_is_told_busy() {
    let limiter = Arc::new(Limiter::new(
        &config(),
        Some(Arc::new(LocalStore::new(100))),
    ));
    let in_flight = InFlight::new(InFlightLimits {
        total: 1,
        per_uid: 1,
    });
    let peer = in_flight.peer(7, 7);
    let held = peer.call_permit().expect("the one slot");
    let mut clock = BatchClock::default();
    match limiter.check(b"api", b"k", 1, &mut clock, &peer) {
        Check::Ready(Err(CheckError::Busy { uid: 7, .. })) => {}
        _ => panic!("expected ERR BUSY while the uid holds its share"),
    }
    drop(held);
    assert!(check(&limiter, "api", "k", &peer).await.allowed);
}

#[tokio::test]
async fn every_path_counts_its_key_in_the_hot_keys_and_a_reload_keeps_them() {
    let limiter = Arc::new(Limiter::new(
        &config(),
        Some(Arc::new(LocalStore::new(100))),
    ));
    let peer = peer();
    // Capacity 4: four ALLOWs and a DENY from the store, then a DENY from the cache.
    for _ in 0..6 {
        check(&limiter, "api", "hot", &peer).await;
    }
    check(&limiter, "api", "cold", &peer).await;
    // A leased rule: from the store, then from the lease.
    for _ in 0..5 {
        check(&limiter, "leased", "l", &peer).await;
    }
    let top = limiter.top_keys("api", 10).expect("a rule");
    let counts: Vec<(&str, u64, u64)> = top
        .iter()
        .map(|k| (k.key.as_str(), k.decisions, k.denies))
        .collect();
    assert_eq!(counts, [("hot", 6, 2), ("cold", 1, 0)]);
    let leased = limiter.top_keys("leased", 10).unwrap();
    assert_eq!(
        (leased[0].decisions, leased[0].denies),
        (5, 1),
        "{leased:?}"
    );
    assert!(limiter.top_keys("nope", 10).is_none());
    limiter.replace_rules(config().rules);
    assert_eq!(limiter.top_keys("api", 1).unwrap()[0].decisions, 6);
}
