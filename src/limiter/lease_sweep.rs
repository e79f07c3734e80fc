//! The sweep of leased keys (`lease = "auto"`): a task, started with the first leased
//! call, that every [`SWEEP_EVERY`] gives back the leases of keys gone idle, near their
//! deadline or no longer spent, and makes the calls this host owes as another lease's
//! witness (docs/DESIGN.md "Leases"). One call each, outside any request.

use super::lease::{reported, TurnEnds};
use super::Limiter;
use crate::clock::boottime_us;
use crate::config::Rule;
use crate::store::Store;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often leases of idle keys are given back.
const SWEEP_EVERY: Duration = Duration::from_millis(50);

impl<S: Store> Limiter<S> {
    /// Starts, once, the task that gives back the leases of keys gone idle or near
    /// their deadline ([`crate::lease::Book::sweep`]); it ends with the limiter.
    pub(super) fn start_sweeper(self: &Arc<Self>) {
        if self.sweeper.set(()).is_err() {
            return;
        }
        let limiter = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(this) = Weak::upgrade(&limiter) else {
                    return;
                };
                this.sweep().await;
            }
        });
    }

    /// The parameters a give-back of a lease taken under `rule` is sent with: those of
    /// the rule of that name in force now (a reload may have changed its window: a call
    /// with the old one would roll the key's counts to the old windows), or `rule`'s if
    /// it is gone (nothing decides its keys any more).
    fn params_in_force(&self, rule: &Rule) -> crate::algorithm::Params {
        match self.rules.load().get(&rule.name) {
            Some(now) if now.rule.params.kind() == rule.params.kind() => now.rule.params,
            _ => rule.params,
        }
    }

    /// Gives back, one call each, the grants [`crate::lease::LeasedKey::give_back`]
    /// names. One whose call fails, or whose primary is not asked now, stays in the book
    /// and is named again at the next call or sweep.
    async fn sweep(self: &Arc<Self>) {
        let Some(redis) = &self.redis else {
            return;
        };
        let now = boottime_us();
        for slot in self.leases.sweep(now) {
            let Ok(turn) = Arc::clone(&slot.call).try_lock_owned() else {
                continue;
            };
            let _turn = TurnEnds {
                turn: Some(turn),
                key: Arc::clone(&slot),
            };
            let Some(route) = redis.route(&slot.home.key) else {
                continue;
            };
            let Some((request, _flight)) = slot.give_back(now, &self.leases.holder) else {
                continue;
            };
            let (key, params) = (slot.home.key.clone(), self.params_in_force(&slot.home.rule));
            if let Ok((o, g)) = redis
                .lease(route, key, params, 0, request.clone(), ())
                .await
            {
                slot.granted(now, boottime_us(), &request, g, reported(&o));
            }
        }
    }
}
