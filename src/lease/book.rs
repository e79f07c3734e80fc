//! This daemon's book of leased keys: one [`LeasedKey`] per key asked under a leased
//! rule, bounded in size, the keys the sweep looks at, and the counts the metrics report
//! (leases held, units out, grants, give-backs, lapsed units, calls in flight).

use super::{LeasedKey, State, FORGET_EVERY_US};
use crate::key::{KeyHash, Prehashed};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Counts shared by the book and its keys.
#[derive(Debug, Default)]
pub(super) struct Counts {
    /// Lease calls in flight (begun, not yet dropped).
    pub(super) in_flight: AtomicU64,
    /// Bumped by each reload: a lease granted to a call begun before it is not spent.
    pub(super) generation: AtomicU64,
    grants: AtomicU64,
    granted_units: AtomicU64,
    given_back: AtomicU64,
    returned_units: AtomicU64,
    lapsed_units: AtomicU64,
}

impl Counts {
    /// A grant of `units` read.
    pub(super) fn granted(&self, units: u64) {
        self.grants.fetch_add(1, Ordering::Relaxed);
        self.granted_units.fetch_add(units, Ordering::Relaxed);
    }

    /// A grant ended in Redis with `unspent` units, of which `returned` went back to the
    /// key's budget (the rest lapsed).
    pub(super) fn ended(&self, unspent: u64, returned: u64) {
        self.given_back.fetch_add(1, Ordering::Relaxed);
        self.returned_units.fetch_add(returned, Ordering::Relaxed);
        self.lapsed_units
            .fetch_add(unspent.saturating_sub(returned), Ordering::Relaxed);
    }
}

/// The book's figures, for the metrics (`ratelimitd_lease_*`, docs/METRICS.md).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// Keys in the book.
    pub keys: u64,
    /// Grants read whose end Redis has not acknowledged yet.
    pub held: u64,
    /// Their unspent units, whole units of their rules.
    pub units: u64,
    /// Lease calls in flight.
    pub in_flight: u64,
    /// Grants read, since start.
    pub grants: u64,
    /// Units in them.
    pub granted_units: u64,
    /// Grants whose end Redis acknowledged (given back, or named after they lapsed).
    pub given_back: u64,
    /// Unspent units those gave back to their keys' budgets.
    pub returned_units: u64,
    /// Unspent units that lapsed instead (reported after Redis's deadline, or never
    /// matched).
    pub lapsed_units: u64,
}

/// This daemon's leases, by key (`"<rule>:<key>"` hashed, as the deny cache keys it).
pub struct Book<H> {
    /// This daemon's holder id in Redis.
    pub holder: Arc<str>,
    keys: Mutex<HashMap<KeyHash, Arc<LeasedKey<H>>, Prehashed>>,
    /// The entries that kept a lease lately (what the sweep looks at).
    holding: Mutex<HashMap<KeyHash, Arc<LeasedKey<H>>, Prehashed>>,
    /// When idle keys were last forgotten (our clock, µs).
    forgotten_at: AtomicU64,
    /// At most this many keys (`fallback.max_keys`); a key past it is decided without a
    /// lease.
    max_keys: usize,
    counts: Arc<Counts>,
}

impl<H> Book<H> {
    /// An empty book for holder `holder`, of at most `max_keys` keys.
    pub fn new(holder: Arc<str>, max_keys: u64) -> Self {
        Book {
            holder,
            keys: Mutex::new(HashMap::default()),
            holding: Mutex::new(HashMap::default()),
            forgotten_at: AtomicU64::new(0),
            max_keys: usize::try_from(max_keys).unwrap_or(usize::MAX).max(1),
            counts: Arc::default(),
        }
    }

    /// The entry of `key`, made with `home()` if new; `None` when the book is full (the
    /// key is decided without a lease).
    pub fn slot(&self, key: KeyHash, home: impl FnOnce() -> H) -> Option<Arc<LeasedKey<H>>> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        let full = keys.len() >= self.max_keys;
        match keys.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => Some(Arc::clone(e.get())),
            std::collections::hash_map::Entry::Vacant(_) if full => None,
            std::collections::hash_map::Entry::Vacant(e) => {
                Some(Arc::clone(e.insert(Arc::new(LeasedKey {
                    state: Mutex::new(State::default()),
                    counts: Arc::clone(&self.counts),
                    call: Arc::new(tokio::sync::Mutex::new(())),
                    ended: tokio::sync::Notify::new(),
                    home: home(),
                }))))
            }
        }
    }

    /// Forgets idle keys holding nothing; returns the entries holding a grant (the
    /// caller gives back those [`LeasedKey::give_back`] names).
    /// Only the keys [`Book::kept`] named are looked at; the whole book is walked for
    /// idle keys at most every [`FORGET_EVERY_US`].
    pub fn sweep(&self, now: u64) -> Vec<Arc<LeasedKey<H>>> {
        // Keys whose grant ended leave the holding list first, so that they can be
        // forgotten in the same walk.
        self.holding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, s| s.state().swept());
        let last = self.forgotten_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= FORGET_EVERY_US {
            self.forgotten_at.store(now, Ordering::Relaxed);
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            // An entry a request took from [`Book::slot`] (under this lock) and has not
            // spent from yet is still idle by its clock: kept while anyone holds it, or
            // that request would go on with an entry the book no longer knows, and a
            // second entry for the key would name its grant as unknown to Redis.
            keys.retain(|_, slot| Arc::strong_count(slot) > 1 || !slot.forgettable(now));
        }
        let holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
        holding.values().cloned().collect()
    }

    /// Notes that `key`'s entry may hold a grant now (after a call kept one), or have a
    /// witness's call due, for the sweep.
    pub fn kept(&self, key: KeyHash, slot: &Arc<LeasedKey<H>>) {
        if slot.state().swept() {
            let mut holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
            holding.entry(key).or_insert_with(|| Arc::clone(slot));
        }
    }

    /// A run-time override set (`on`) or cleared on `key` by this daemon at `at` (our
    /// clock, µs): [`LeasedKey::told`] of its entry, if the book has one.
    pub fn told(&self, key: KeyHash, on: bool, at: u64) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = keys.get(&key) {
            k.told(on, at);
        }
    }

    /// The grants `key`'s entry holds and their unspent units (for operators:
    /// `INSPECT`); `(0, 0)` for a key not in the book.
    pub fn held_by(&self, key: KeyHash) -> (u64, u64) {
        let keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        keys.get(&key).map_or((0, 0), |k| k.held())
    }

    /// A reload: no lease taken under the old rules is spent under the new ones. Every
    /// lease held stops being spent at once (as does one granted to a call in flight);
    /// each is still remembered and given back, its unspent units final, by the next
    /// call or the sweep.
    pub fn retire(&self) {
        self.counts.generation.fetch_add(1, Ordering::Relaxed);
        // Every key that kept a grant is in `holding` (a grant still being asked for
        // is caught by the generation).
        let holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
        holding.values().for_each(|k| k.retire());
    }

    /// Keys in the book.
    pub fn len(&self) -> usize {
        self.keys.lock().map_or(0, |k| k.len())
    }

    /// True when the book is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The book's figures now (walks the keys holding a grant).
    pub fn sizes(&self) -> Sizes {
        let (mut held, mut units) = (0, 0);
        {
            let holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
            for k in holding.values() {
                let (h, u) = k.held();
                held += h;
                units += u;
            }
        }
        let c = &self.counts;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Sizes {
            keys: self.len() as u64,
            held,
            units,
            in_flight: get(&c.in_flight),
            grants: get(&c.grants),
            granted_units: get(&c.granted_units),
            given_back: get(&c.given_back),
            returned_units: get(&c.returned_units),
            lapsed_units: get(&c.lapsed_units),
        }
    }
}

/// A holder id for this process: random enough that two daemons (or one restarted)
/// never share one.
pub fn new_holder_id() -> Arc<str> {
    use std::hash::{BuildHasher, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(crate::clock::boottime_us());
    format!("{:016x}", h.finish()).into()
}
