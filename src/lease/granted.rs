//! What the answer of a lease call does to a key's lease state on this host: the grant
//! it named ends, the new one is kept (its deadline on our clock), the key becomes
//! saturated and paced or not; and, when Redis decided the key under a run-time
//! override (`OVERRIDE`), the key leaves leasing for the per-request path until a reply
//! says the override is gone (docs/DESIGN.md "Leases", "Run-time overrides").

use super::{
    Granted, LeasedKey, Reported, Request, State, LIFETIME_US, PACE_US, SLICE_SPARE_US, UNIT,
    WINDOW_SPARE_US, WITNESS_GRACE_US,
};
use std::sync::atomic::Ordering;

impl<H> LeasedKey<H> {
    /// The call started at `sent_us` (our clock) with `ask` was answered at `got_us`:
    /// the grant it named has ended in Redis; keep its new lease (a slice refills from
    /// `got_us`, when Redis had already taken it), with what Redis `reported`. A reply
    /// under a run-time override puts the key on the per-request path
    /// ([`LeasedKey::told`]); one without, from a call sent after the last that said
    /// so, takes it off.
    pub fn granted(
        &self,
        sent_us: u64,
        got_us: u64,
        ask: &Request,
        g: Granted,
        reported: Reported,
    ) {
        let mut s = self.state();
        s.remaining = reported.remaining;
        s.reset_ms = reported.reset_ms;
        if g.last_grant > s.seen {
            (s.seen, s.seen_at) = (g.last_grant, got_us);
        }
        // Called again WITNESS_GRACE_US after it is due, unless a call of its own
        // comes first (at least PACE_US on: a lease not ended then, its deadline on
        // Redis's clock not passed, is looked at again that much later).
        s.witness_due = match g.witness_due {
            0 => 0,
            due if due + WITNESS_GRACE_US > got_us => due + WITNESS_GRACE_US,
            _ => got_us + PACE_US,
        };
        s.tell(reported.overridden, sent_us);
        if ask.want != 0 || ask.given_back != 0 {
            self.settle(&mut s, sent_us, got_us, ask, &g, reported);
        }
        if s.overridden {
            // A grant read in this reply (its call decided before the override) is
            // not spent either: given back by the sweep.
            s.per_request();
        }
    }

    /// A run-time override was set (`on`) or cleared on the key by this daemon, at `at`
    /// (our clock): the lease held stops being spent at once and each request is
    /// decided in Redis, or the key may take leases again. Other daemons learn it from
    /// their next reply of the key.
    pub fn told(&self, on: bool, at: u64) {
        let mut s = self.state();
        s.tell(on, at);
        if s.overridden {
            s.per_request();
        }
    }

    /// [`LeasedKey::granted`] of a call that gave a grant back or asked for one: the
    /// grant named ends, the new one is kept, and the key is saturated (paced) or not.
    fn settle(
        &self,
        s: &mut State,
        sent_us: u64,
        got_us: u64,
        ask: &Request,
        g: &Granted,
        reported: Reported,
    ) {
        // A window's slice given back with nothing asked (the sweep, its window over):
        // the key stays saturated, so that its next call asks for a slice again rather
        // than a lump of what other holders are due.
        let window_slice = s.rate > 0 && !s.renews;
        if ask.given_back != 0 && s.grant == ask.given_back {
            self.counts.ended(ask.unspent / UNIT, g.returned / UNIT);
            s.grant = 0;
            s.units = 0;
            s.deadline_us = 0;
            (s.cap, s.rate) = (0, 0);
        }
        if g.grant != 0 && (g.units > 0 || g.rate > 0) {
            self.keep(s, sent_us, got_us, ask, g);
        }
        let want = ask.want / UNIT;
        // Saturated: Redis had less than asked, and not enough left for another such
        // lease (a slice keeps the key saturated: its next lease is a slice too). Without
        // a lease, the next call waits for what Redis said (a window's end, the leases
        // that fill a bucket ending), at least PACE_US, at most a lifetime.
        s.saturated = if ask.want == 0 && window_slice {
            s.saturated
        } else {
            ask.want > 0 && (g.rate > 0 || (g.units / UNIT < want && reported.remaining < want))
        };
        // The call that finds a key saturated was not asking for a slice: the next one,
        // at once, does. Redis's wait counts from when it ran the call, between the send
        // and the reply: counted from the reply, the next call never comes before it.
        // (Counted from the send, a call paced to a window's end arrived in the full
        // window ending, by the call's latency, and the wait it got, clamped to PACE_US,
        // held the host back PACE_US into the next window.)
        s.paced_until = if s.saturated && g.rate == 0 && ask.pace_us > 0 {
            let wait = reported.wait_ms.saturating_mul(1000).min(LIFETIME_US);
            got_us.saturating_add(wait).max(sent_us + PACE_US)
        } else {
            0
        };
    }

    /// Keeps grant `g`, answered at `got_us` to the call started at `sent_us` with `ask`,
    /// as the key's lease: its units, cap and rate, and its deadline on our clock (none
    /// for a grant to a call started before a reload: reported, not spent).
    fn keep(&self, s: &mut State, sent_us: u64, got_us: u64, ask: &Request, g: &Granted) {
        self.counts.granted(g.units / UNIT);
        if s.grant != 0 {
            // Not possible with one call at a time; the older grant lapses in Redis.
            self.counts.ended(s.units / UNIT, 0);
        }
        s.units = g.units;
        s.grant = g.grant;
        s.cap = g.cap.max(g.units);
        s.rate = g.rate;
        s.accrued_at = got_us.max(sent_us);
        // The drift margin of the lifetime granted (DRIFT_MARGIN_US for LIFETIME_US).
        let drift = 1000 + g.lifetime_us / 1000;
        // A slice that lives the lifetime asked (a bucket's) is renewed before its end;
        // one cut short by its window's end is not (the next window's is taken when
        // it ends: renewing it would only bring the same share again).
        s.renews = g.rate > 0 && g.lifetime_us >= ask.lifetime_us;
        let spare = if s.renews {
            SLICE_SPARE_US
        } else if g.lifetime_us < ask.lifetime_us {
            // Cut at its window's end: named back before that end in Redis.
            WINDOW_SPARE_US.min(g.lifetime_us / 2)
        } else {
            0
        };
        let life = g.lifetime_us.saturating_sub(drift + spare);
        (s.grant_sent, s.grant_got, s.spare) = (sent_us, got_us, spare);
        s.asked_rate = match ask.pace_us {
            0 => 0,
            pace => u64::try_from(u128::from(ask.want) * 1_000_000 / u128::from(pace))
                .unwrap_or(u64::MAX),
        };
        let current = ask.generation == self.counts.generation.load(Ordering::Relaxed);
        // A lease granted to a call started before a reload is reported, not spent.
        s.deadline_us = if life > 0 && current {
            sent_us + life
        } else {
            0
        };
    }
}
