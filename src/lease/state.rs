//! One key's lease state on this host (no I/O, no lock: [`super::LeasedKey`] holds it
//! in a mutex): the grant it holds and may spend until its deadline, a slice's refill,
//! and the demand counted in slots that makes a key hot.

use super::{HOT_UNITS, OUTGROWN_US, RATE_SPAN_US, SLOT_US, UNIT};

/// One key's lease state on this host.
///
/// `grant` is the last grant read whose end Redis has not acknowledged (0: none), with
/// `units` µ-units of it unspent; it may be spent only while `now < deadline_us` (0: not
/// at all, it is only reported). A slice (`rate > 0`) refills `units` at `rate` µ-units/s
/// up to `cap`, from `accrued_at` until the deadline.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) units: u64,
    /// Our clock (µs) after which the lease is not spent; 0: not spent.
    pub(super) deadline_us: u64,
    pub(super) grant: i64,
    pub(super) cap: u64,
    pub(super) rate: u64,
    /// A slice renewed when short within `SLICE_RENEW_US` of its deadline (a bucket's;
    /// a window's slice ends with its window).
    pub(super) renews: bool,
    /// Our clock (µs) up to which the slice's refill is in `units`.
    pub(super) accrued_at: u64,
    /// The grant's call: our clock when it was sent and its reply read, and how much
    /// before its lifetime we stop spending it, µs (sent back with it: `Request`).
    pub(super) grant_sent: u64,
    pub(super) grant_got: u64,
    pub(super) spare: u64,
    /// The refill rate the grant's call asked for (µ-units/s: its demand over its pace;
    /// 0: it asked for no slice).
    pub(super) asked_rate: u64,
    pub(super) slot_start: u64,
    pub(super) slot_units: u64,
    pub(super) prev_units: u64,
    /// A request found a call in flight in this slot or the previous one.
    pub(super) contended: u8,
    pub(super) last_use: u64,
    /// Saturated: no call before this (our clock, µs).
    pub(super) paced_until: u64,
    /// Saturated at the last grant.
    pub(super) saturated: bool,
    pub(super) remaining: u64,
    pub(super) reset_ms: u64,
    pub(super) in_flight: u32,
    /// The key's highest grant number read in a reply, and when (our clock, µs).
    pub(super) seen: i64,
    pub(super) seen_at: u64,
    /// 0, or when (our clock, µs) this host, another lease's witness, calls the key.
    pub(super) witness_due: u64,
    /// Under a run-time override, as last told: decided per request, no lease.
    pub(super) overridden: bool,
    /// When the call (or `OVERRIDE`) that last told `overridden` was sent (our clock,
    /// µs): an answer to a call sent earlier does not undo it.
    pub(super) told_at: u64,
}

impl State {
    /// True when the sweep looks at the key: it holds a grant, or a witness's call is due.
    pub(super) fn swept(&self) -> bool {
        self.grant != 0 || self.witness_due != 0
    }

    pub(super) fn holds(&self, now: u64) -> bool {
        self.grant != 0 && now < self.deadline_us
    }

    /// Adds a slice's refill up to `now` (never past its deadline) to `units`.
    pub(super) fn accrue(&mut self, now: u64) {
        let until = now.min(self.deadline_us);
        if self.rate == 0 || until <= self.accrued_at {
            return;
        }
        let add = u128::from(self.rate) * u128::from(until - self.accrued_at) / 1_000_000;
        self.units = self
            .units
            .saturating_add(u64::try_from(add).unwrap_or(u64::MAX))
            .min(self.cap);
        self.accrued_at = until;
    }

    /// Counts `units` (whole) asked at `now` in the demand slots.
    pub(super) fn count(&mut self, units: u64, now: u64) {
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

    /// Units per second asked lately, at `now`: the previous slot's count over its
    /// length, or the current one's over its age (at least [`RATE_SPAN_US`]), whichever
    /// is higher.
    pub(super) fn rate(&self, now: u64) -> f64 {
        let age = now
            .saturating_sub(self.slot_start)
            .clamp(RATE_SPAN_US, SLOT_US);
        let current = self.slot_units as f64 * 1e6 / age as f64;
        current.max(self.prev_units as f64 * 1e6 / SLOT_US as f64)
    }

    /// True when the slice held was sized by the demand its call reported, not by its
    /// share (its refill rate is at least the rate asked: Redis caps a slice at the
    /// demand over the bucket's fill time), and the demand counted since is over twice
    /// that rate, [`OUTGROWN_US`] or more after the grant: renewed now, it asks for the
    /// demand of now. A key's first slice is asked with the demand of the slots that made
    /// the key hot, often a small part of what follows; kept for its whole life it would
    /// hold the host at that rate for 1.5 s.
    pub(super) fn outgrown(&self, now: u64) -> bool {
        self.asked_rate > 0
            && self.rate >= self.asked_rate
            && now.saturating_sub(self.grant_got) >= OUTGROWN_US
            && self.rate(now) * UNIT as f64 >= 2.0 * self.rate as f64
    }

    pub(super) fn hot(&self) -> bool {
        self.slot_units.max(self.prev_units) >= HOT_UNITS
            || self.contended != 0
            || self.in_flight > 0
            || self.grant != 0
    }

    /// Takes `overridden` from what a call sent at `at` (our clock) was told, unless a
    /// call sent later told it first.
    pub(super) fn tell(&mut self, overridden: bool, at: u64) {
        if at >= self.told_at {
            (self.overridden, self.told_at) = (overridden, at);
        }
    }

    /// Under a run-time override: the lease held is no longer spent (still named, its
    /// unspent units final, by the sweep's give-back or the next call), and the key is
    /// neither saturated nor paced, so each request asks Redis.
    pub(super) fn per_request(&mut self) {
        self.deadline_us = 0;
        if self.grant == 0 {
            self.units = 0;
        }
        self.saturated = false;
        self.paced_until = 0;
    }

    /// Stops spending the lease at `now` (its unspent units, a slice's refill until now
    /// included, are final) and names it back in `ask`: its grant (0: none), unspent
    /// µ-units, and when its call was sent and answered and how early it stopped.
    pub(super) fn report(&mut self, now: u64, ask: &mut super::Request) {
        self.accrue(now);
        self.deadline_us = 0;
        if self.grant == 0 {
            self.units = 0;
        }
        (ask.given_back, ask.unspent) = (self.grant, self.units);
        if self.grant != 0 {
            (ask.grant_sent_us, ask.grant_got_us) = (self.grant_sent, self.grant_got);
            ask.spare_us = self.spare;
        }
    }
}
