//! Which primary owns which key: one Redis client per primary and the slot map.
//!
//! Each primary gets its own connection (a fred "centralized" client), so a primary
//! that is frozen, killed or out of memory stalls only its own connection: one fred
//! client for the whole cluster re-syncs every connection when one fails, and cannot
//! finish while one node is unreachable, which took healthy primaries down with it.
//! The slot map comes from `CLUSTER SLOTS` (parsed by fred's `ClusterRouting`), asked of
//! a primary that answers; standalone Redis is one primary owning every slot.

use super::batch::Batcher;
use super::batch_all::GroupBatcher;
use super::health::{Circuit, PrimaryHealth};
use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

/// Hash slots of Redis Cluster.
pub const SLOTS: usize = 16_384;

/// No primary known for a slot.
const NONE: u16 = u16::MAX;

/// One primary: its connection, its breaker, and its script reloads.
pub struct Primary {
    /// The connection to this primary only.
    pub client: Client,
    /// Its breaker.
    pub health: PrimaryHealth,
    /// A tag (`__probe__:<n>`) whose hash slot this primary owns: its probe key.
    pub probe_tag: String,
    /// Script reloads after `NOSCRIPT` on this primary, and the lock that makes one
    /// caller do it.
    pub reloads: AtomicU64,
    pub reload_lock: tokio::sync::Mutex<()>,
    /// No longer owns a slot: its prober ends.
    pub retired: AtomicBool,
    /// Its decisions waiting to go together ([`super::batch`]).
    pub(super) batch: Batcher,
    /// Its all-or-nothing groups waiting to go together ([`super::batch_all`]).
    pub(super) batch_all: GroupBatcher,
}

impl Primary {
    /// `host:port`.
    pub fn name(&self) -> &str {
        self.health.name()
    }
}

/// The primaries and the slot → primary table, swapped whole when the map changes.
pub struct Topology {
    /// Every primary that owns a slot.
    pub primaries: Vec<Arc<Primary>>,
    /// Index into `primaries` per slot ([`NONE`]: no owner known).
    slots: Box<[u16]>,
    /// The slot ranges and their owners this was built from (cluster mode).
    ranges: Vec<(u16, u16, String)>,
}

impl Topology {
    /// No primary known (before the first `CLUSTER SLOTS`).
    pub fn empty() -> Self {
        Topology {
            primaries: Vec::new(),
            slots: vec![NONE; SLOTS].into_boxed_slice(),
            ranges: Vec::new(),
        }
    }

    /// One primary owning every slot (standalone Redis).
    pub fn single(primary: Arc<Primary>) -> Self {
        Topology {
            primaries: vec![primary],
            slots: vec![0; SLOTS].into_boxed_slice(),
            ranges: Vec::new(),
        }
    }

    /// The primary owning `key`'s slot, if known.
    pub fn owner(&self, key: &[u8]) -> Option<&Arc<Primary>> {
        let slot = fred::util::redis_keyslot(key);
        let i = *self.slots.get(usize::from(slot))?;
        self.primaries.get(usize::from(i))
    }

    /// The primary named `name`, if it owns slots.
    pub fn find(&self, name: &str) -> Option<&Arc<Primary>> {
        self.primaries.iter().find(|p| p.name() == name)
    }

    /// The slot ranges this was built from.
    pub fn ranges(&self) -> Vec<(u16, u16, String)> {
        self.ranges.clone()
    }

    /// Slot ranges and their owners (`host:port`), to tell whether a new map differs.
    pub fn signature(routing: &ClusterRouting) -> Vec<(u16, u16, String)> {
        routing
            .slots()
            .iter()
            .map(|r| (r.start, r.end, r.primary.to_string()))
            .collect()
    }

    /// The topology of `routing`, reusing the primaries of `self` that still own slots
    /// and making the others with `make(host, port, first_slot, last_slot)` (one range
    /// it owns).
    pub fn rebuild(
        &self,
        routing: &ClusterRouting,
        mut make: impl FnMut(&str, u16, u16, u16) -> Arc<Primary>,
    ) -> Topology {
        let mut primaries: Vec<Arc<Primary>> = Vec::new();
        let mut slots = vec![NONE; SLOTS].into_boxed_slice();
        for range in routing.slots() {
            let name = range.primary.to_string();
            let index = match primaries.iter().position(|p| p.name() == name) {
                Some(i) => i,
                None => {
                    let primary = match self.find(&name) {
                        Some(p) => Arc::clone(p),
                        None => make(
                            &range.primary.host,
                            range.primary.port,
                            range.start,
                            range.end,
                        ),
                    };
                    primaries.push(primary);
                    primaries.len() - 1
                }
            };
            let index = u16::try_from(index).unwrap_or(NONE);
            for slot in range.start..=range.end.min(SLOTS as u16 - 1) {
                slots[usize::from(slot)] = index;
            }
        }
        Topology {
            primaries,
            slots,
            ranges: Topology::signature(routing),
        }
    }
}

/// A probe tag (`__probe__:<n>`): the first `n` whose probe key
/// (`<prefix>:{__probe__:<n>}:<suffix>`) lands in a slot `owns` accepts. With ranges of
/// hundreds of slots this takes a few hundred CRCs; `None` if no `n` below 2^20 does.
pub fn probe_tag_for(prefix: &str, suffix: &str, owns: impl Fn(u16) -> bool) -> Option<String> {
    (0..1u32 << 20).find_map(|n| {
        let tag = format!("__probe__:{n}");
        let key = format!("{prefix}:{{{tag}}}:{suffix}");
        owns(fred::util::redis_keyslot(key.as_bytes())).then_some(tag)
    })
}

/// A new primary `host:port` on `client`; `open`: its breaker open until a probe
/// answered (at start-up, so the scripts are loaded before the first decision).
pub fn primary(
    client: Client,
    name: String,
    probe_tag: String,
    open: bool,
    window: Duration,
    circuit: &Arc<Circuit>,
) -> Primary {
    Primary {
        client,
        health: PrimaryHealth::new(name, open, window, Arc::clone(circuit)),
        probe_tag,
        reloads: AtomicU64::new(0),
        reload_lock: tokio::sync::Mutex::new(()),
        retired: AtomicBool::new(false),
        batch: Batcher::new(),
        batch_all: GroupBatcher::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_tag_lands_in_the_primary_s_own_slots() {
        for (first, last) in [(0, 5460), (5461, 10922), (10923, 16383), (700, 700)] {
            let tag = probe_tag_for("rl", "tb", |s| first <= s && s <= last).expect("a tag");
            let slot = fred::util::redis_keyslot(format!("rl:{{{tag}}}:tb").as_bytes());
            assert!((first..=last).contains(&slot), "{tag} -> {slot}");
        }
    }

    #[test]
    fn an_unknown_map_owns_nothing() {
        assert!(Topology::empty().owner(b"rl:{a:b}:tb").is_none());
    }
}
