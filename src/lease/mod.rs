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
//! *sent* the call, plus the lifetime Redis granted, minus [`DRIFT_MARGIN_US`] (and, for
//! a bucket, minus [`CLOCK_JUMP_US`]). Redis's own deadline started later (when the call
//! arrived), so it always ends after ours. A call that gives a lease back ends it at
//! once, before it is sent. A key idle for [`IDLE_RETURN_US`], or whose lease ends within
//! [`RENEW_AHEAD_US`], gives back what it holds ([`Book::sweep`]).
//!
//! A grant whose reply was read is never forgotten before Redis acknowledged its end: a
//! call that gives it back and fails, a reload ([`Book::retire`]), a sweep, or its
//! deadline passing only stop it being spent; the next call (or the sweep) names it
//! again with its unspent units, which are final. Redis gives back only the unspent
//! units of the grant a call names; any other grant lapses as spent.

mod book;

pub use book::{new_holder_id, Book, Sizes};

use book::Counts;
use std::sync::atomic::Ordering;
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
/// A bucket's lease is spent for this much less than the lifetime Redis granted, µs:
/// Redis's clock may jump ahead (or a failover land on a node whose clock is ahead) by
/// this much without ending, in Redis, a lease its holder may still spend. A window's
/// lease ends with its window, which such a jump moves too (docs/DESIGN.md "Leases").
pub const CLOCK_JUMP_US: u64 = 500_000;
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
    /// The book's reload generation when the call started (not sent: a lease granted
    /// to a call started before a reload is not spent).
    pub generation: u64,
}

impl Request {
    /// A call that gives nothing back and asks for nothing (a cold key's decision).
    pub fn cold(holder: &Arc<str>) -> Request {
        Request {
            holder: Arc::clone(holder),
            given_back: 0,
            unspent: 0,
            want: 0,
            lifetime_us: LIFETIME_US,
            pace_us: 0,
            generation: 0,
        }
    }
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
    /// Units of the grant the call named that went back to the key's budget, whole units
    /// of the rule (the rest of its unspent units lapsed).
    pub returned: u64,
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
///
/// `grant` is the last grant read whose end Redis has not acknowledged (0: none), with
/// `units` of it unspent; it may be spent only while `now < deadline_us` (0: not at all,
/// it is only reported).
#[derive(Debug, Default)]
struct State {
    units: u64,
    /// Our clock (µs) after which the lease is not spent; 0: not spent.
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

    /// Stops spending the lease (its unspent units are final) and says how to name it
    /// back: (grant, unspent), (0, 0) for none.
    fn report(&mut self) -> (i64, u64) {
        self.deadline_us = 0;
        if self.grant == 0 {
            self.units = 0;
        }
        (self.grant, self.units)
    }
}

/// A key's entry in the book: its lease state, the lock its lease calls take (one at a
/// time: requests behind it wait and are paid from its lease), and `H`, what the caller
/// needs to reach Redis for it (the sweep gives leases back with it).
pub struct LeasedKey<H> {
    state: Mutex<State>,
    /// µs of a granted lifetime not spent ([`CLOCK_JUMP_US`] for buckets, else 0).
    spare_us: u64,
    counts: Arc<Counts>,
    /// Held for the whole of a lease call; waited on by the requests behind it.
    pub call: tokio::sync::Mutex<()>,
    /// The caller's handle for the key (its Redis key and rule).
    pub home: H,
}

/// A lease call in flight for a key: counted from [`LeasedKey::begin`] (or
/// [`LeasedKey::give_back`]) until dropped, whether the call was answered, failed, or
/// abandoned (its client went away and the call's future was dropped).
pub struct Flight<H> {
    key: Arc<LeasedKey<H>>,
}

impl<H> Drop for Flight<H> {
    fn drop(&mut self) {
        let mut s = self.key.state();
        s.in_flight = s.in_flight.saturating_sub(1);
        self.key.counts.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
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

    fn fly(self: &Arc<Self>, s: &mut State) -> Flight<H> {
        s.in_flight += 1;
        self.counts.in_flight.fetch_add(1, Ordering::Relaxed);
        Flight {
            key: Arc::clone(self),
        }
    }

    /// Starts a call for a request of `cost` units (`hot`: with a lease; the caller holds
    /// [`LeasedKey::call`]). Stops spending the lease held and names it (it is given back
    /// in this call) and says what to ask: about [`TAKE_US`] of demand ([`PACE_US`] when
    /// saturated), at least `cost`, at most `limit`. The call counts as in flight until
    /// the [`Flight`] is dropped.
    pub fn begin(
        self: &Arc<Self>,
        cost: u64,
        limit: u64,
        hot: bool,
        holder: &Arc<str>,
    ) -> (Request, Flight<H>) {
        let mut s = self.state();
        let flight = self.fly(&mut s);
        let mut ask = Request::cold(holder);
        if !hot {
            return (ask, flight);
        }
        (ask.given_back, ask.unspent) = s.report();
        let span = if s.saturated { PACE_US } else { TAKE_US };
        let want = (s.rate() * span as f64 / 1e6).ceil() as u64;
        ask.want = want.max(cost).max(1).min(limit);
        ask.pace_us = if s.saturated { PACE_US } else { 0 };
        ask.generation = self.counts.generation.load(Ordering::Relaxed);
        (ask, flight)
    }

    /// The call started at `sent_us` (our clock) with `ask` answered: the grant it named
    /// has ended in Redis; keep its new lease, with `remaining`/`reset_ms` as Redis
    /// reported them.
    pub fn granted(&self, sent_us: u64, ask: &Request, g: Granted, remaining: u64, reset_ms: u64) {
        let mut s = self.state();
        s.remaining = remaining;
        s.reset_ms = reset_ms;
        if ask.want == 0 && ask.given_back == 0 {
            return;
        }
        if ask.given_back != 0 && s.grant == ask.given_back {
            self.counts.ended(ask.unspent, g.returned);
            s.grant = 0;
            s.units = 0;
            s.deadline_us = 0;
        }
        if g.units > 0 && g.grant != 0 {
            self.counts.granted(g.units);
            if s.grant != 0 {
                // Not possible with one call at a time; the older grant lapses in Redis.
                self.counts.ended(s.units, 0);
            }
            s.units = g.units;
            s.grant = g.grant;
            let life = g
                .lifetime_us
                .saturating_sub(DRIFT_MARGIN_US + self.spare_us);
            let current = ask.generation == self.counts.generation.load(Ordering::Relaxed);
            // A lease granted to a call started before a reload is reported, not spent.
            s.deadline_us = if life > 0 && current {
                sent_us + life
            } else {
                0
            };
        }
        // Saturated: Redis had less than asked, and not enough left for another such
        // lease.
        s.saturated = ask.want > 0 && g.units < ask.want && remaining < ask.want;
        s.paced_until = if s.saturated { sent_us + PACE_US } else { 0 };
    }

    /// For the sweep: `Some(ask)` (the lease given back, nothing wanted) when the key
    /// holds a grant it should give back at `now`: one it no longer spends (a reload, a
    /// call that failed, its deadline passed), or one idle for [`IDLE_RETURN_US`], or
    /// within [`RENEW_AHEAD_US`] of its deadline. The caller holds [`LeasedKey::call`].
    pub fn give_back(
        self: &Arc<Self>,
        now: u64,
        holder: &Arc<str>,
    ) -> Option<(Request, Flight<H>)> {
        let mut s = self.state();
        if s.grant == 0 {
            return None;
        }
        if s.holds(now) {
            let idle = now.saturating_sub(s.last_use) >= IDLE_RETURN_US;
            if !idle && s.deadline_us - now > RENEW_AHEAD_US {
                return None;
            }
        }
        let mut ask = Request::cold(holder);
        (ask.given_back, ask.unspent) = s.report();
        Some((ask, self.fly(&mut s)))
    }

    /// Stops spending the lease held: it is reported at the next call (a reload).
    fn retire(&self) {
        self.state().report();
    }

    /// True when the key holds nothing and was not asked for [`FORGET_US`].
    fn forgettable(&self, now: u64) -> bool {
        let s = self.state();
        s.grant == 0 && s.in_flight == 0 && now.saturating_sub(s.last_use) >= FORGET_US
    }

    /// Its grant not yet ended in Redis: (1, its unspent units), or (0, 0).
    fn held(&self) -> (u64, u64) {
        let s = self.state();
        if s.grant == 0 {
            (0, 0)
        } else {
            (1, s.units)
        }
    }
}

#[cfg(test)]
mod tests;
