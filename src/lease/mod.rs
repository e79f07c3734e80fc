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
//!   what is left ÷ the hosts asking for the key); requests arriving meanwhile wait for
//!   that call and are answered from its lease (source `lease`), so one call serves
//!   many decisions;
//! * **saturated** (Redis granted less than asked, with less than that left): the next
//!   call, at once, asks with a pace of [`PACE_US`]. A bucket grants a *slice*: the
//!   host's share of the capacity and of the refill rate (hosts asking lately share
//!   equally), which this host refills itself until the deadline (its [`SLICE_LIFETIME_US`]
//!   less the margins) while Redis refills the key slower by as much; a request the
//!   slice cannot pay for yet is a DENY from the lease, without a call, and one finding
//!   it short within [`SLICE_RENEW_US`] of its deadline renews it (or sooner, when the
//!   slice was sized by a demand that has since doubled: `State::outgrown`). A fixed window grants
//!   what the host is still due of the window (its share, kept back from the other
//!   hosts' grants until it asks); a sliding window counter a *window slice*, its due
//!   share of the window so far and its share of the rate the previous window's weight
//!   gives room back at, accrued the same way until the window's end (not renewed: the
//!   next window's is taken then). A host that gets nothing asks again when Redis's
//!   `wait_ms` says, counted from the reply (at least [`PACE_US`] after its call, at
//!   most [`LIFETIME_US`] after the reply), answering DENY from the lease meanwhile;
//! * **overridden** (a reply said Redis decided the key under a run-time override, and
//!   so granted nothing): every `CHECK` is one script call, as a cold key's, neither
//!   paid from a lease nor paced, until a reply without the override; the lease held
//!   is given back at once.
//!
//! A lease is spent only before its deadline: this host's [`crate::clock::boottime_us`] when it
//! *sent* the call, plus the lifetime Redis granted, minus [`DRIFT_MARGIN_US`]. Redis's
//! own deadline started later (when the call arrived), so it always ends after ours; and
//! a lease ends in Redis only once a daemon's own monotonic clock has counted its
//! lifetime since it read the grant (its witness, `lua/lease.lua`), so a forward jump of
//! Redis's clock does not end it early (a window's lease is counted in each window it may
//! be spent in until then: `lua/lease_window.lua`). A window's lease cut at its window's
//! end is spent until [`WINDOW_SPARE_US`] before that. Each call sends this host's clock and
//! the key's last grant number it read ([`Request::mono_us`], [`Request::seen`]). A call that gives a lease back ends it at
//! once, before it is sent. A key idle for [`IDLE_RETURN_US`], or whose lump lease ends
//! within [`RENEW_AHEAD_US`], gives back what it holds ([`Book::sweep`]).
//!
//! A grant whose reply was read is never forgotten before Redis acknowledged its end: a
//! call that gives it back and fails, a reload ([`Book::retire`]), a sweep, or its
//! deadline passing only stop it being spent; the next call (or the sweep) names it
//! again with its unspent units, which are final. Redis gives back only the unspent
//! units of the grant a call names; any other grant lapses as spent.

mod book;
mod call;
mod granted;
mod state;

pub use book::{new_holder_id, Book, Sizes};
pub use call::{Granted, Reported, Request};

use book::Counts;
use state::State;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// How long a lease is asked for, µs (windows: at most to the window's end).
pub const LIFETIME_US: u64 = 1_000_000;
/// How long a slice is asked for, µs: spent for [`SLICE_SPARE_US`] less, so a
/// saturated key costs each holder about one call every 1.5 s.
pub const SLICE_LIFETIME_US: u64 = 2_000_000;
/// A hot key's lease is about this much of this host's demand, µs.
pub const TAKE_US: u64 = 50_000;
/// A saturated key without a slice asks Redis at most this often (at most
/// [`LIFETIME_US`] apart, as Redis's `wait_ms` says), µs; and a slice is sized for this
/// much demand.
pub const PACE_US: u64 = 200_000;
/// Demand is counted in slots of this length, µs.
pub const SLOT_US: u64 = 100_000;
/// The current slot's count is a rate over its age, but over at least this long, µs: a
/// key that just became hot is asked at the rate of its first milliseconds, not at a
/// tenth of it, and a burst of a few units in a slot's first microseconds does not
/// read as a rate of millions.
pub const RATE_SPAN_US: u64 = 25_000;
/// A slice sized by a demand that has since doubled is renewed no sooner than this after
/// its grant, µs: long enough for the demand counted since to be a rate
/// ([`RATE_SPAN_US`]), short next to a slice's life.
pub const OUTGROWN_US: u64 = 50_000;
/// A key with at least this many units asked in the current or the previous slot is hot.
pub const HOT_UNITS: u64 = 8;
/// A lease ends this much before its lifetime on our clock (the two clocks' rates may
/// differ by a little: 1 ms plus 0.1 % of the lifetime), µs.
pub const DRIFT_MARGIN_US: u64 = 1000 + LIFETIME_US / 1000;
/// A slice is spent for this much less than the lifetime Redis granted, µs, and so
/// renewed that long before its deadline in Redis. Not needed for exactness (a forward
/// jump of Redis's clock ends no lease early: its witness times it); measured without
/// it, the buckets that refill in 20 ms or less used about a tenth less of the rule
/// (`tests/serial/leases/shapes.rs`).
pub const SLICE_SPARE_US: u64 = 500_000;
/// A window's lease cut at its window's end is spent for this much less (at most half
/// its life), µs, so that its holder names it back before the window ends in Redis: a
/// lease still stored when the next window starts is counted in that one too, whole
/// (its holder might be spending it past a forward jump of Redis's clock).
pub const WINDOW_SPARE_US: u64 = 25_000;
/// A witness that could end another holder's lease calls the key this long after it
/// could, if no call of its own came first, µs. A saturated witness renews its slice
/// sooner, and that call ends the lease; calling at once instead cost ten daemons
/// sharing a key their equal shares (`tests/serial/leases/fairness.rs`).
pub const WITNESS_GRACE_US: u64 = 2_000_000;
/// A key not asked for this long gives its lease back, µs.
pub const IDLE_RETURN_US: u64 = 200_000;
/// A lump lease this close to its deadline is given back by the sweep (the next request
/// takes a new one), µs.
pub const RENEW_AHEAD_US: u64 = 150_000;
/// A slice this close to its deadline is renewed by the next request that finds it
/// short (one call gives it back and takes the next), µs.
pub const SLICE_RENEW_US: u64 = 50_000;
/// A key holding nothing and idle this long is forgotten, µs.
pub const FORGET_US: u64 = 10_000_000;
/// The book is walked for such keys at most this often, µs.
pub const FORGET_EVERY_US: u64 = 1_000_000;
/// µ-units per unit of a rule: a lease's units are counted in µ-units on the holder (a
/// slice refills by fractions of a unit).
pub const UNIT: u64 = 1_000_000;

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
    /// Saturated and paced, or a slice short of the cost: DENY without a call.
    Paced {
        /// ms until this host asks Redis again (a slice: until it holds the cost).
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

/// A key's entry in the book: its lease state, the lock its lease calls take (one at a
/// time: requests behind it wait and are paid from its lease), and `H`, what the caller
/// needs to reach Redis for it (the sweep gives leases back with it).
pub struct LeasedKey<H> {
    state: Mutex<State>,
    counts: Arc<Counts>,
    /// Held for the whole of a lease call (by the task running it, never by a
    /// connection's); waited on by the requests behind it.
    pub call: Arc<tokio::sync::Mutex<()>>,
    /// Woken when a call ends (its turn given up), for the requests waiting on it.
    pub ended: tokio::sync::Notify,
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
        // Under a run-time override Redis grants nothing: every request asks it, as a
        // cold key's does, neither paid from a lease nor paced.
        if s.overridden {
            return Local::Call { hot: false };
        }
        let need = cost.saturating_mul(UNIT);
        if s.holds(now) {
            s.accrue(now);
            if s.units >= need {
                s.units -= need;
                return Local::Taken {
                    remaining: s.remaining + s.units / UNIT,
                    reset_ms: s.reset_ms,
                };
            }
            // A slice short of the cost: it refills; renewed near its deadline, or once
            // the demand has outgrown the slice it asked for.
            let renew = s.renews
                && s.in_flight == 0
                && (s.deadline_us - now <= SLICE_RENEW_US || s.outgrown(now));
            if s.rate > 0 && need <= s.cap && !renew {
                // DENY until it holds the cost, or until it is renewed.
                let short = u128::from(need - s.units) * 1_000_000;
                let us = short.div_ceil(u128::from(s.rate));
                let ahead = if s.renews { SLICE_RENEW_US } else { 0 };
                let until = now
                    .saturating_add(u64::try_from(us).unwrap_or(u64::MAX))
                    .min(s.deadline_us - ahead.min(s.deadline_us - now));
                return Local::Paced {
                    wait_ms: until.saturating_sub(now).div_ceil(1000).max(1),
                    reset_ms: s.reset_ms,
                };
            }
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

    /// Starts a call at `now` for a request of `cost` units (`hot`: with a lease; the
    /// caller holds [`LeasedKey::call`]). Stops spending the lease held and names it (it
    /// is given back in this call) and says what to ask: about [`TAKE_US`] of demand
    /// ([`PACE_US`] when saturated, and then a slice), at least `cost`, at most `limit`
    /// units. The call counts as in flight until the [`Flight`] is dropped.
    pub fn begin(
        self: &Arc<Self>,
        cost: u64,
        limit: u64,
        hot: bool,
        now: u64,
        holder: &Arc<str>,
    ) -> (Request, Flight<H>) {
        let mut s = self.state();
        let flight = self.fly(&mut s);
        let mut ask = Request::cold(holder);
        (ask.mono_us, ask.seen, ask.seen_at) = (now, s.seen, s.seen_at);
        if !hot {
            return (ask, flight);
        }
        s.report(now, &mut ask);
        if s.overridden {
            // Redis would grant nothing: the lease is given back, nothing asked.
            return (ask, flight);
        }
        let span = if s.saturated { PACE_US } else { TAKE_US };
        let want = ((s.rate(now) * span as f64 / 1e6).ceil() as u64)
            .max(cost)
            .max(1);
        // A slice is sized by the demand's rate, which may be many times the capacity;
        // a lump lease is at most the capacity.
        let want = if s.saturated { want } else { want.min(limit) };
        ask.want = want.min(u64::MAX / UNIT).saturating_mul(UNIT);
        if s.saturated {
            ask.pace_us = PACE_US;
            ask.lifetime_us = SLICE_LIFETIME_US;
        }
        ask.generation = self.counts.generation.load(Ordering::Relaxed);
        (ask, flight)
    }

    /// For the sweep: `Some(ask)` (the lease given back, nothing wanted) when the key
    /// holds a grant it should give back at `now`: one it no longer spends (a reload, a
    /// call that failed, its deadline passed), or one idle for [`IDLE_RETURN_US`], or a
    /// lump lease within [`RENEW_AHEAD_US`] of its deadline; else a call that gives
    /// nothing back when this host, another lease's witness, could end it now
    /// ([`Granted::witness_due`]). The caller holds [`LeasedKey::call`].
    pub fn give_back(
        self: &Arc<Self>,
        now: u64,
        holder: &Arc<str>,
    ) -> Option<(Request, Flight<H>)> {
        let mut s = self.state();
        let mut ask = Request::cold(holder);
        (ask.mono_us, ask.seen, ask.seen_at) = (now, s.seen, s.seen_at);
        let witness = s.witness_due != 0 && now >= s.witness_due;
        if s.grant == 0 {
            return witness.then(|| {
                s.witness_due = 0;
                (ask, self.fly(&mut s))
            });
        }
        if s.holds(now) {
            let idle = now.saturating_sub(s.last_use) >= IDLE_RETURN_US;
            let ahead = if s.rate > 0 { 0 } else { RENEW_AHEAD_US };
            if !idle && s.deadline_us - now > ahead {
                // A witness's call ends no lease of this host (it gives nothing back).
                return witness.then(|| {
                    s.witness_due = 0;
                    (ask, self.fly(&mut s))
                });
            }
        }
        s.report(now, &mut ask);
        Some((ask, self.fly(&mut s)))
    }

    /// Stops spending the lease held: it is reported at the next call (a reload).
    fn retire(&self) {
        let mut s = self.state();
        s.deadline_us = 0;
        if s.grant == 0 {
            s.units = 0;
        }
    }

    /// True when the key holds nothing and was not asked for [`FORGET_US`].
    fn forgettable(&self, now: u64) -> bool {
        let s = self.state();
        s.grant == 0 && s.in_flight == 0 && now.saturating_sub(s.last_use) >= FORGET_US
    }

    /// Its grant not yet ended in Redis: (1, its unspent whole units), or (0, 0).
    fn held(&self) -> (u64, u64) {
        let s = self.state();
        if s.grant == 0 {
            (0, 0)
        } else {
            (1, s.units / UNIT)
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_override;
#[cfg(test)]
mod tests_slices;
