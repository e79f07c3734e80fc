//! The tagged key of a request: `"<rule>:<key>"`, and the 64-bit hash of it that the
//! deny cache and the local buckets store.
//!
//! The hash is taken from the tag's parts, so a local decision or a cache hit never
//! builds the tag; a Redis call builds it once on the stack, and the store its Redis
//! key from it (`<prefix>:{<tag>}:<suffix>`).

/// The hasher of every in-process map keyed by a tag or a rule name: foldhash (seeded
/// per process), several times cheaper than SipHash on short keys.
pub type Hasher = foldhash::quality::RandomState;

/// Longest `"<rule>:<key>"`: a 64-byte rule name, `:`, a 256-byte key.
pub const TAG_MAX: usize = 64 + 1 + 256;

/// Whether `"<rule>:<key>"` fits in [`TAG_MAX`] bytes (else the key is longer than the
/// protocol allows).
pub fn fits(rule: &[u8], key: &[u8]) -> bool {
    rule.len() + 1 + key.len() <= TAG_MAX
}

/// Writes `"<rule>:<key>"` into `buf` and returns it, or `None` if it does not [`fits`]
/// or is not UTF-8 (keys are printable ASCII).
pub fn tag_in<'b>(buf: &'b mut [u8; TAG_MAX], rule: &str, key: &[u8]) -> Option<&'b str> {
    if !fits(rule.as_bytes(), key) {
        return None;
    }
    let len = rule.len() + 1 + key.len();
    let out = &mut buf[..len];
    out[..rule.len()].copy_from_slice(rule.as_bytes());
    out[rule.len()] = b':';
    out[rule.len() + 1..].copy_from_slice(key);
    std::str::from_utf8(out).ok()
}

/// The key the deny cache and the local buckets store for a tag ([`TagKey::of`]).
pub type KeyHash = u64;

/// Turns a `"<rule>:<key>"` tag into the 64-bit key the caches store: foldhash, seeded
/// per process. A fixed 8-byte key instead of the string saves an allocation and ~40
/// bytes per entry, and the maps need no hashing of their own ([`Prehashed`]). Two tags
/// share an entry only if their hashes collide: with seeds an attacker does not know,
/// some pair among n keys does with probability about n²/2⁶⁵ (3·10⁻⁸ for 10⁶ keys,
/// 3·10⁻⁶ for 10⁷); even then those two keys share one budget: fewer admissions, never
/// more than a limit.
#[derive(Default)]
pub struct TagKey {
    hasher: Hasher,
}

impl TagKey {
    /// The cache key of the tag `"<rule>:<key>"`, hashed from its parts (the tag itself
    /// is only built for a Redis call).
    pub fn of(&self, rule: &[u8], key: &[u8]) -> KeyHash {
        use std::hash::{BuildHasher, Hasher};
        let mut h = self.hasher.build_hasher();
        h.write(rule);
        h.write_u8(b':');
        h.write(key);
        h.finish()
    }
}

/// The hasher of maps keyed by a [`KeyHash`]: the key is already a well-mixed hash, so
/// it is its own hash (no second hashing per lookup).
#[derive(Debug, Default, Clone, Copy)]
pub struct Prehashed;

impl std::hash::BuildHasher for Prehashed {
    type Hasher = PrehashedHasher;

    fn build_hasher(&self) -> PrehashedHasher {
        PrehashedHasher(0)
    }
}

/// The [`std::hash::Hasher`] of [`Prehashed`]: a `u64` written first is the hash; a
/// later `u64` is mixed in (moka hashes its per-key lock table by `(key, TypeId)`), and
/// bytes are folded in with FNV-1a, so that every input still hashes.
#[derive(Debug, Default, Clone, Copy)]
pub struct PrehashedHasher(u64);

impl std::hash::Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, n: u64) {
        // From the initial 0: n itself.
        self.0 = self.0.rotate_left(5) ^ n;
    }
}

/// The hash that log lines show instead of a client key (keys are user data, never
/// logged at `info` or `warn`): FNV-1a 64 of `key` as 16 hex digits. Stable across runs
/// and hosts, so an operator who knows a key can find its lines
/// (`ratelimitd::key::log_hash`), while the log alone does not reveal it.
pub fn log_hash(key: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_is_rule_colon_key_and_bounded() {
        let mut buf = [0u8; TAG_MAX];
        assert_eq!(tag_in(&mut buf, "r", b"k:1"), Some("r:k:1"));
        let long = [b'k'; TAG_MAX];
        assert_eq!(tag_in(&mut buf, "r", &long), None);
    }

    #[test]
    fn a_prehashed_key_is_its_own_hash() {
        use std::hash::BuildHasher;
        assert_eq!(
            Prehashed.hash_one(0x1234_5678_9abc_def0u64),
            0x1234_5678_9abc_def0
        );
        // A key followed by more input (moka's lock table: the key, then a TypeId) still
        // hashes by the key.
        let lock_hash = |k: u64| Prehashed.hash_one((k, std::any::TypeId::of::<u64>()));
        assert_ne!(lock_hash(1), lock_hash(2));
        let keys = TagKey::default();
        assert_eq!(keys.of(b"r", b"k"), keys.of(b"r", b"k"));
        assert_ne!(keys.of(b"r", b"k"), keys.of(b"r", b"j"));
    }

    #[test]
    fn log_hash_is_fnv1a_64() {
        assert_eq!(log_hash(""), "cbf29ce484222325");
        assert_eq!(log_hash("a"), "af63dc4c8601ec8c");
    }
}
