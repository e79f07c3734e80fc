//! Where every decision of a rule is counted: the decision counters (metrics) and the
//! rule's hottest keys ([`crate::hot_keys`]). One place, so that no path of the flow
//! (local, cache, Redis, lease, fallback) counts differently.
//!
//! A rule with `shadow = true` is answered here too: its would-be DENY is counted as
//! `shadow_deny`, logged at most once a minute per rule (never with the key), and
//! answered ALLOW with the source that decided it.
//!
//! A decision made at once is counted whole ([`ActiveRule::decided_now`]); one that
//! waits on the store is counted as a decision on its key when it is sent
//! ([`ActiveRule::sent`], the key's bytes are at hand then) and by its verdict when it
//! comes back ([`ActiveRule::came_back`]).

use super::{ActiveRule, Decided};
use crate::decision::Decision;
use crate::hot_keys::RuleKeys;
use crate::key::KeyHash;
use std::time::Duration;

/// A shadow rule's would-be DENYs are logged at most this often.
pub(super) const SHADOW_LOG_INTERVAL: Duration = Duration::from_secs(60);

impl ActiveRule {
    /// A decision on `key` (`hash`: its tag's hash) made now, at `now_us` (µs, the
    /// local clock): counted, and returned with the rule's window.
    pub(super) fn decided_now(
        &self,
        hash: KeyHash,
        key: &[u8],
        decision: Decision,
        now_us: f64,
    ) -> Decided {
        if let Some(hot) = self.hot_keys() {
            hot.record(hash, key, !decision.allowed, now_us);
        }
        self.decided(decision)
    }

    /// A decision on `key` sent to the store at `now_us`: counted as a decision on the
    /// key (its verdict is counted by [`ActiveRule::came_back`]).
    pub(super) fn sent(&self, hash: KeyHash, key: &[u8], now_us: f64) {
        if let Some(hot) = self.hot_keys() {
            hot.record(hash, key, false, now_us);
        }
    }

    /// The decision on a key [`ActiveRule::sent`] to the store, now known: counted.
    pub(super) fn came_back(&self, hash: KeyHash, decision: Decision) -> Decided {
        if !decision.allowed {
            if let Some(hot) = self.hot_keys() {
                hot.denied(hash);
            }
        }
        self.decided(decision)
    }

    /// The rule's hot keys (`None` for a detached rule).
    pub(super) fn hot_keys(&self) -> Option<&RuleKeys> {
        self.hot.as_deref()
    }

    /// `decision` counted, with the rule's policy window; a shadow rule's DENY turned
    /// into the ALLOW it answers (`wait_ms` 0: nothing to wait for).
    fn decided(&self, decision: Decision) -> Decided {
        let decision = if self.rule.shadow && !decision.allowed {
            self.counters.record_shadow_deny(&decision);
            if let Some(suppressed) = self.shadow_log.admit() {
                tracing::info!(
                    rule = %self.rule.name,
                    source = decision.source.as_str(),
                    suppressed,
                    "shadow rule would have denied a request (answered ALLOW; counted as verdict=\"shadow_deny\"; logged at most once a minute per rule)"
                );
            }
            Decision {
                allowed: true,
                wait_ms: 0,
                ..decision
            }
        } else {
            self.counters.record(&decision);
            decision
        };
        Decided {
            decision,
            window_ms: self.rule.window_ms,
        }
    }
}
