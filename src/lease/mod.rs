//! Token leases (`lease = "auto"`, docs/DESIGN.md "Leases"): this daemon's book of the
//! batches of units it holds per hot key, and the per-key state machine that decides
//! when to ask Redis for one. No I/O here: the limiter runs the calls
//! (`src/limiter/lease.rs`), the store sends them (`src/store/lease.rs`), the Lua
//! scripts (`lua/lease*.lua`) keep the budget exact.
//!
//! Per key, per host:
//! * **cold** (fewer than [`HOT_UNITS`] units asked in a [`SLOT_US`] slot, nothing held,
//!   nothing queued): every `CHECK` is one script call, as without leases;
//! * **hot** (the key is busy, or a request found a call for it in flight): the next call
//!   also takes a lease of about [`TAKE_US`] of this host's demand (Redis caps it at
//!   what is left ÷ the hosts holding leases on the key); requests arriving meanwhile
//!   wait for that call and are answered from its lease (source `lease`), so one call
//!   serves many decisions;
//! * **saturated** (Redis granted less than asked, with less than that left): the next
//!   call waits until [`PACE_US`] after the last one, and asks for that long of demand;
//!   meanwhile a request the lease cannot pay for is a DENY from the lease, without a
//!   call. With less than two paces of refill left, Redis grants each such host at most
//!   `PACE_US × refill rate ÷ holders`: hosts asking equally get equal shares, and one
//!   that stops asking stops counting when its lease ends.
//!
//! A lease is spent only before its deadline: this host's [`crate::clock::boottime_us`] when it
//! *sent* the call, plus the lifetime Redis granted, minus [`DRIFT_MARGIN_US`]. Redis's
//! own deadline started later (when the call arrived), so it always ends after ours. A
//! call that gives a lease back ends it at once, before it is sent. A key idle for
//! [`IDLE_RETURN_US`], or whose lease ends within [`RENEW_AHEAD_US`], gives back what it
//! holds ([`Book::sweep`]).

use crate::key::{KeyHash, Prehashed};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How long a lease is asked for, µs (windows: at most to the window's end).
pub const LIFETIME_US: u64 = 1_000_000;
/// A hot key's lease is about this much of this host's demand, µs.
pub const TAKE_US: u64 = 50_000;
/// A saturated key asks Redis at most this often, and for this much demand, µs.
pub const PACE_US: u64 = 200_000;
/// Demand is counted in slots of this length, µs.
pub const SLOT_US: u64 = 100_000;
/// A key with at least this many units asked in the current or the previous slot is hot.
pub const HOT_UNITS: u64 = 8;
/// A lease ends this much before its lifetime on our clock (the two clocks' rates may
/// differ by a little: 1 ms plus 0.1 % of the lifetime), µs.
pub const DRIFT_MARGIN_US: u64 = 1000 + LIFETIME_US / 1000;
/// A key not asked for this long gives its lease back, µs.
pub const IDLE_RETURN_US: u64 = 200_000;
/// A lease this close to its deadline is given back by the sweep (the next request takes
/// a new one), µs.
pub const RENEW_AHEAD_US: u64 = 150_000;
/// A key holding nothing and idle this long is forgotten, µs.
pub const FORGET_US: u64 = 10_000_000;
/// The book is walked for such keys at most this often, µs.
pub const FORGET_EVERY_US: u64 = 1_000_000;

/// What one lease call asks of Redis (besides the request it decides).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// This daemon's holder id (random per process).
    pub holder: Arc<str>,
    /// The grant given back (0: none).
    pub given_back: i64,
    /// Units of that grant not spent, whole units of the rule.
    pub unspent: u64,
    /// Units wanted in a new lease (0: none), whole units of the rule.
    pub want: u64,
    /// Lifetime asked, µs.
    pub lifetime_us: u64,
    /// 0, or (saturated) how often this host asks, µs: Redis grants a bucket's holder at
    /// most its share of the refill over that time.
    pub pace_us: u64,
}

/// What Redis granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Granted {
    /// Units, whole units of the rule (0: none).
    pub units: u64,
    /// Lifetime granted, µs (counted on the holder's clock from when it sent the call).
    pub lifetime_us: u64,
    /// The grant's number, to give it back with.
    pub grant: i64,
}

/// What a request gets from the key's lease state before any call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// Paid from the lease: ALLOW with these fields.
    Taken {
        /// Units the key could still take (what Redis reported at the grant plus what
        /// this host holds).
        remaining: u64,
        /// `reset_ms` Redis reported at the grant.
        reset_ms: u64,
    },
    /// Saturated and paced: DENY without a call.
    Paced {
        /// ms until this host asks Redis again.
        wait_ms: u64,
        /// `reset_ms` Redis reported last.
        reset_ms: u64,
    },
    /// Ask Redis; `hot`: take a lease in the same call (one call at a time per key).
    Call {
        /// The key is hot.
        hot: bool,
    },
}

/// One key's lease state on this host.
#[derive(Debug, Default)]
struct State {
    units: u64,
    /// Our clock (µs) after which the lease is not spent; 0: no lease.
    deadline_us: u64,
    grant: i64,
    slot_start: u64,
    slot_units: u64,
    prev_units: u64,
    /// A request found a call in flight in this slot or the previous one.
    contended: u8,
    last_use: u64,
    /// Saturated: no call before this (our clock, µs).
    paced_until: u64,
    /// Saturated at the last grant.
    saturated: bool,
    remaining: u64,
    reset_ms: u64,
    in_flight: u32,
}

impl State {
    fn holds(&self, now: u64) -> bool {
        self.grant != 0 && now < self.deadline_us
    }

    /// Counts `units` asked at `now` in the demand slots.
    fn count(&mut self, units: u64, now: u64) {
        let age = now.saturating_sub(self.slot_start);
        if age >= SLOT_US {
            self.prev_units = if age < 2 * SLOT_US {
                self.slot_units
            } else {
                0
            };
            self.slot_units = 0;
            self.slot_start = now;
            self.contended = (self.contended << 1) & 0b10;
        }
        self.slot_units += units;
        self.last_use = now;
    }

    /// Units per second asked lately.
    fn rate(&self) -> f64 {
        self.slot_units.max(self.prev_units) as f64 * 1e6 / SLOT_US as f64
    }

    fn hot(&self) -> bool {
        self.slot_units.max(self.prev_units) >= HOT_UNITS
            || self.contended != 0
            || self.in_flight > 0
            || self.grant != 0
    }
}

/// A key's entry in the book: its lease state, the lock its lease calls take (one at a
/// time: requests behind it wait and are paid from its lease), and `H`, what the caller
/// needs to reach Redis for it (the sweep gives leases back with it).
pub struct LeasedKey<H> {
    state: Mutex<State>,
    /// Held for the whole of a lease call; waited on by the requests behind it.
    pub call: tokio::sync::Mutex<()>,
    /// The caller's handle for the key (its Redis key and rule).
    pub home: H,
}

impl<H> LeasedKey<H> {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of `cost` units at `now` (our clock): paid from the lease, paced, or a
    /// call. `first`: the request's first look (counted as demand; later looks, after
    /// waiting for a call, are not).
    pub fn spend(&self, cost: u64, now: u64, first: bool) -> Local {
        let mut s = self.state();
        if first {
            s.count(cost, now);
        }
        if s.holds(now) && s.units >= cost {
            s.units -= cost;
            return Local::Taken {
                remaining: s.remaining + s.units,
                reset_ms: s.reset_ms,
            };
        }
        if now < s.paced_until {
            return Local::Paced {
                wait_ms: (s.paced_until - now).div_ceil(1000).max(1),
                reset_ms: s.reset_ms,
            };
        }
        if first && s.in_flight > 0 {
            s.contended |= 1;
        }
        Local::Call { hot: s.hot() }
    }

    /// Starts a call for a request of `cost` units (`hot`: with a lease; the caller holds
    /// [`LeasedKey::call`]). Ends the lease held (it is given back in this call) and says
    /// what to ask: about [`TAKE_US`] of demand ([`PACE_US`] when saturated), at least
    /// `cost`, at most `limit`.
    pub fn begin(&self, cost: u64, limit: u64, hot: bool, holder: &Arc<str>) -> Request {
        let mut s = self.state();
        s.in_flight += 1;
        if !hot {
            return Request {
                holder: Arc::clone(holder),
                given_back: 0,
                unspent: 0,
                want: 0,
                lifetime_us: LIFETIME_US,
                pace_us: 0,
            };
        }
        let (given_back, unspent) = (s.grant, s.units);
        s.grant = 0;
        s.units = 0;
        s.deadline_us = 0;
        let span = if s.saturated { PACE_US } else { TAKE_US };
        let want = (s.rate() * span as f64 / 1e6).ceil() as u64;
        Request {
            holder: Arc::clone(holder),
            given_back,
            unspent,
            want: want.max(cost).max(1).min(limit),
            lifetime_us: LIFETIME_US,
            pace_us: if s.saturated { PACE_US } else { 0 },
        }
    }

    /// The call started at `sent_us` (our clock) with `ask` answered: keep its lease,
    /// with `remaining`/`reset_ms` as Redis reported them.
    pub fn granted(&self, sent_us: u64, ask: &Request, g: Granted, remaining: u64, reset_ms: u64) {
        let mut s = self.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        s.remaining = remaining;
        s.reset_ms = reset_ms;
        if ask.want == 0 && ask.given_back == 0 {
            return;
        }
        if g.units > 0 && g.lifetime_us > DRIFT_MARGIN_US {
            s.units = g.units;
            s.grant = g.grant;
            s.deadline_us = sent_us + g.lifetime_us - DRIFT_MARGIN_US;
        }
        // Saturated: Redis had less than asked, and not enough left for another such
        // lease.
        s.saturated = ask.want > 0 && g.units < ask.want && remaining < ask.want;
        s.paced_until = if s.saturated { sent_us + PACE_US } else { 0 };
    }

    /// The call started by [`LeasedKey::begin`] got no answer: whatever it asked is lost to us
    /// (a lease granted meanwhile lapses in Redis at its deadline).
    pub fn failed(&self) {
        let mut s = self.state();
        s.in_flight = s.in_flight.saturating_sub(1);
    }

    /// For the sweep: `Some(ask)` (the lease given back, nothing wanted) when the key
    /// holds a lease it should give back at `now`: idle for [`IDLE_RETURN_US`], or within
    /// [`RENEW_AHEAD_US`] of its deadline. The caller holds [`LeasedKey::call`]. A lease
    /// already past its deadline is simply dropped (it lapses in Redis).
    pub fn give_back(&self, now: u64, holder: &Arc<str>) -> Option<Request> {
        let mut s = self.state();
        if s.grant == 0 {
            return None;
        }
        if now >= s.deadline_us {
            s.grant = 0;
            s.units = 0;
            return None;
        }
        let idle = now.saturating_sub(s.last_use) >= IDLE_RETURN_US;
        if !idle && s.deadline_us - now > RENEW_AHEAD_US {
            return None;
        }
        let ask = Request {
            holder: Arc::clone(holder),
            given_back: s.grant,
            unspent: s.units,
            want: 0,
            lifetime_us: LIFETIME_US,
            pace_us: 0,
        };
        s.grant = 0;
        s.units = 0;
        s.deadline_us = 0;
        s.in_flight += 1;
        Some(ask)
    }

    /// True when the key holds nothing and was not asked for [`FORGET_US`].
    fn forgettable(&self, now: u64) -> bool {
        let s = self.state();
        s.grant == 0 && s.in_flight == 0 && now.saturating_sub(s.last_use) >= FORGET_US
    }
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
}

impl<H> Book<H> {
    /// An empty book for holder `holder`.
    pub fn new(holder: Arc<str>) -> Self {
        Book {
            holder,
            keys: Mutex::new(HashMap::default()),
            holding: Mutex::new(HashMap::default()),
            forgotten_at: AtomicU64::new(0),
        }
    }

    /// The entry of `key`, made with `home()` if new.
    pub fn slot(&self, key: KeyHash, home: impl FnOnce() -> H) -> Arc<LeasedKey<H>> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(keys.entry(key).or_insert_with(|| {
            Arc::new(LeasedKey {
                state: Mutex::new(State::default()),
                call: tokio::sync::Mutex::new(()),
                home: home(),
            })
        }))
    }

    /// Forgets idle keys holding nothing; returns the entries holding a lease (the
    /// caller gives back those [`LeasedKey::give_back`] names).
    /// Only the keys [`Book::kept`] named are looked at; the whole book is walked for
    /// idle keys at most every [`FORGET_EVERY_US`].
    pub fn sweep(&self, now: u64) -> Vec<Arc<LeasedKey<H>>> {
        let last = self.forgotten_at.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= FORGET_EVERY_US {
            self.forgotten_at.store(now, Ordering::Relaxed);
            let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
            keys.retain(|_, slot| !slot.forgettable(now));
        }
        let mut holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
        holding.retain(|_, s| s.state().grant != 0);
        holding.values().cloned().collect()
    }

    /// Notes that `key`'s entry may hold a lease now (after a call kept one), for the
    /// sweep.
    pub fn kept(&self, key: KeyHash, slot: &Arc<LeasedKey<H>>) {
        if slot.state().grant != 0 {
            let mut holding = self.holding.lock().unwrap_or_else(|p| p.into_inner());
            holding.entry(key).or_insert_with(|| Arc::clone(slot));
        }
    }

    /// Forgets every key (a reload: a lease taken under the old rule is not spent under
    /// the new one; what it holds lapses in Redis at its deadline).
    pub fn clear(&self) {
        self.keys.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.holding
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Keys in the book.
    pub fn len(&self) -> usize {
        self.keys.lock().map_or(0, |k| k.len())
    }

    /// True when the book is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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

#[cfg(test)]
mod tests;
