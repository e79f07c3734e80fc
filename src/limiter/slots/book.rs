//! This daemon's book of the concurrency slots its clients hold: which connection holds
//! which token, the slots held locally (Redis unreachable, or `mode = "none"`), and the
//! counts behind `ratelimitd_slots_*`.
//!
//! The book is what makes a slot impossible to leak: a connection's slots are found
//! here when it closes, a slot past its `max_hold` leaves here, and only the slots
//! listed here are renewed in Redis (a daemon that dies renews nothing, so its slots
//! lapse within the holder lease). No I/O here: the calls are the flow's
//! (`limiter/slots/mod.rs`).

use super::super::ActiveRule;
use crate::algorithm::concurrency::{self, State};
use crate::key::KeyHash;
use crate::metrics;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// The connection number of slots taken outside any connection (`dispatch::handle`):
/// given back only by `RELEASE` or `max_hold`.
pub const NO_CONNECTION: u64 = 0;

/// One slot held by a client of this daemon.
pub(in crate::limiter) struct Held<K> {
    /// The connection that took it.
    pub conn: u64,
    /// Its rule (for the counts, the parameters and `on_redis_failure`).
    pub entry: Arc<ActiveRule>,
    /// The key of the local slots (`"<rule>:<key>"` hashed).
    pub key: KeyHash,
    /// Its key in the store (`None` without a store).
    pub store_key: Option<K>,
    /// Its number in the local slots ([`concurrency::Slot::id`]).
    pub id: u64,
    /// Held in this process only (taken while Redis could not be asked): handed back
    /// to Redis when it answers again.
    pub local: bool,
    /// When its `max_hold` ends, on this process's monotonic clock.
    pub until: Instant,
}

/// Why a slot was given back (the `cause` label of `ratelimitd_slot_releases_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// `RELEASE`.
    Release,
    /// The connection that took it closed.
    ConnectionClosed,
    /// Its `max_hold` ended.
    MaxHold,
    /// Redis no longer held it when this daemon renewed it (not renewed in time: Redis
    /// or its primary was unreachable for longer than the holder lease; or given back
    /// by a `RELEASE` on another host).
    HolderLost,
    /// An operator's `RESET` of its key deleted it.
    Reset,
}

impl Cause {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Release => "release",
            Cause::ConnectionClosed => "connection_closed",
            Cause::MaxHold => "max_hold",
            Cause::HolderLost => "holder_lost",
            Cause::Reset => "reset",
        }
    }
}

/// The slots held, and the connections open.
pub(in crate::limiter) struct Book<K> {
    /// Token → its slot.
    pub held: HashMap<String, Held<K>>,
    /// The slots held locally, per key.
    pub local: HashMap<KeyHash, State>,
    /// Connections open that may take slots.
    open: HashSet<u64>,
    /// The tokens each connection holds (a close finds its own without a walk).
    by_conn: HashMap<u64, Vec<String>>,
}

/// The book behind its lock, with the daemon's part of every token it hands out.
pub(in crate::limiter) struct Holdings<K> {
    book: Mutex<Book<K>>,
    /// This daemon's part of its tokens: random, so that two daemons (or two runs of
    /// one) never hand out the same token.
    daemon: String,
    next_id: AtomicU64,
    next_conn: AtomicU64,
}

impl<K> Holdings<K> {
    /// An empty book.
    pub fn new() -> Self {
        Holdings {
            book: Mutex::new(Book {
                held: HashMap::new(),
                local: HashMap::new(),
                open: HashSet::new(),
                by_conn: HashMap::new(),
            }),
            daemon: daemon_part(),
            next_id: AtomicU64::new(1),
            next_conn: AtomicU64::new(NO_CONNECTION + 1),
        }
    }

    /// The book, locked (never held across an await).
    pub fn lock(&self) -> MutexGuard<'_, Book<K>> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new slot number and the token's holder part, `"<daemon>.<n>"`.
    pub fn next(&self) -> (u64, String) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        (id, format!("{}.{id}", self.daemon))
    }

    /// A new connection, open until [`Book::close`].
    pub fn open(&self) -> u64 {
        let conn = self.next_conn.fetch_add(1, Ordering::Relaxed);
        self.lock().open.insert(conn);
        conn
    }
}

impl<K> Book<K> {
    /// Whether `conn` is still open (slots taken outside a connection always are).
    pub fn is_open(&self, conn: u64) -> bool {
        conn == NO_CONNECTION || self.open.contains(&conn)
    }

    /// Records `token`'s slot.
    pub fn insert(&mut self, token: String, held: Held<K>) {
        if !held.entry.detached {
            metrics::slots_held(&held.entry.rule.name, 1.0);
        }
        self.by_conn
            .entry(held.conn)
            .or_default()
            .push(token.clone());
        self.held.insert(token, held);
    }

    /// Takes `token`'s slot out of the book for `cause`, and out of the local slots if
    /// it was held locally.
    pub fn remove(&mut self, token: &str, cause: Cause) -> Option<Held<K>> {
        let held = self.held.remove(token)?;
        if let Some(tokens) = self.by_conn.get_mut(&held.conn) {
            tokens.retain(|t| t != token);
            if tokens.is_empty() {
                self.by_conn.remove(&held.conn);
            }
        }
        self.forget(&held, cause);
        Some(held)
    }

    /// Counts `held` as given back for `cause` and frees its local slot if any.
    fn forget(&mut self, held: &Held<K>, cause: Cause) {
        if !held.entry.detached {
            metrics::slots_held(&held.entry.rule.name, -1.0);
            metrics::slot_released(&held.entry.rule.name, cause.as_str());
        }
        if held.local {
            self.release_local(held.key, held.id);
        }
    }

    /// Frees local slot `id` of `key`; the key's entry goes with its last slot.
    pub fn release_local(&mut self, key: KeyHash, id: u64) {
        if let Some(st) = self.local.get_mut(&key) {
            concurrency::release(st, crate::clock::local_clock_us(), id);
            if st.slots.is_empty() {
                self.local.remove(&key);
            }
        }
    }

    /// Connection `conn` closed: every slot it held leaves the book (counted as
    /// `connection_closed`). Returns those held in Redis, to give back there.
    pub fn close(&mut self, conn: u64) -> Vec<(String, Held<K>)> {
        self.open.remove(&conn);
        let tokens = self.by_conn.remove(&conn).unwrap_or_default();
        let mut in_redis = Vec::new();
        for token in tokens {
            if let Some(held) = self.remove(&token, Cause::ConnectionClosed) {
                if !held.local {
                    in_redis.push((token, held));
                }
            }
        }
        in_redis
    }

    /// Token `token`'s slot, taken for a connection that closed before the slot was
    /// in the book, leaves it at once; returned if held in Redis, to give back there.
    pub fn close_one(&mut self, token: &str) -> Vec<(String, Held<K>)> {
        self.remove(token, Cause::ConnectionClosed)
            .filter(|h| !h.local)
            .map(|h| vec![(token.to_owned(), h)])
            .unwrap_or_default()
    }

    /// Every slot of `key` leaves the book, its local slots too (an operator's `RESET`
    /// deleted them in Redis); returns how many.
    pub fn reset(&mut self, key: KeyHash) -> usize {
        let tokens: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.key == key)
            .map(|(t, _)| t.clone())
            .collect();
        for t in &tokens {
            self.remove(t, Cause::Reset);
        }
        self.local.remove(&key);
        tokens.len()
    }

    /// Slots of `key` in the book whose `max_hold` has not ended by `now`.
    pub fn held_of(&self, key: KeyHash, now: Instant) -> u64 {
        self.held
            .values()
            .filter(|h| h.key == key && h.until > now)
            .count() as u64
    }

    /// The slots whose `max_hold` ended by `now` leave the book (counted as
    /// `max_hold`; in Redis they lapse on their own).
    pub fn lapse(&mut self, now: Instant) {
        let ended: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.until <= now)
            .map(|(t, _)| t.clone())
            .collect();
        for token in ended {
            self.remove(&token, Cause::MaxHold);
        }
    }
}

/// Groups `(token, slot)` pairs by key: one call per key.
pub(in crate::limiter) fn by_key<K: Clone>(
    slots: impl IntoIterator<Item = (String, KeyHash, Arc<ActiveRule>, Option<K>)>,
) -> Vec<(Arc<ActiveRule>, K, Vec<String>)> {
    let mut groups: HashMap<KeyHash, (Arc<ActiveRule>, K, Vec<String>)> = HashMap::new();
    for (token, key, entry, store_key) in slots {
        let Some(store_key) = store_key else {
            continue;
        };
        groups
            .entry(key)
            .or_insert_with(|| (entry, store_key, Vec::new()))
            .2
            .push(token);
    }
    groups.into_values().collect()
}

/// 8 random base-36 characters.
fn daemon_part() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(crate::clock::wall_clock_us() as u64);
    h.write_u32(std::process::id());
    let mut n = h.finish();
    (0..8)
        .map(|_| {
            let c = b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize];
            n /= 36;
            c as char
        })
        .collect()
}
