//! The tagged key of a request: `"<rule>:<key>"`, and the 128-bit hash of it that the
//! deny cache and the local buckets store.
//!
//! The tag is built once per request on the stack and hashed once; the Redis key is
//! built from the same tag by the store (`<prefix>:{<tag>}:<suffix>`).

/// The hasher of every in-process map keyed by a tag or a rule name: foldhash (seeded
/// per process), several times cheaper than SipHash on short keys.
pub type Hasher = foldhash::quality::RandomState;

/// Longest `"<rule>:<key>"`: a 64-byte rule name, `:`, a 256-byte key.
pub const TAG_MAX: usize = 64 + 1 + 256;

/// Writes `"<rule>:<key>"` into `buf` and returns it, or `None` if it does not fit (a
/// key longer than the protocol allows) or is not UTF-8 (keys are printable ASCII).
pub fn tag_in<'b>(buf: &'b mut [u8; TAG_MAX], rule: &str, key: &[u8]) -> Option<&'b str> {
    let len = rule.len() + 1 + key.len();
    let out = buf.get_mut(..len)?;
    out[..rule.len()].copy_from_slice(rule.as_bytes());
    out[rule.len()] = b':';
    out[rule.len() + 1..].copy_from_slice(key);
    std::str::from_utf8(out).ok()
}

/// Turns a `"<rule>:<key>"` tag into the 128-bit key the caches store: two independently
/// seeded 64-bit foldhash hashes. A fixed 16-byte key instead of the string saves an
/// allocation and ~40 bytes per entry. Two tags share an entry only if both hashes
/// collide (probability about n²/2¹²⁹, ~10⁻²⁷ for a million keys, with seeds an attacker
/// does not know); even then the keys would share one budget: fewer admissions, never
/// more than a limit.
#[derive(Default)]
pub struct TagKey {
    high: Hasher,
    low: Hasher,
}

impl TagKey {
    /// The cache key of `tag`.
    pub fn of(&self, tag: &str) -> u128 {
        use std::hash::BuildHasher;
        (u128::from(self.high.hash_one(tag)) << 64) | u128::from(self.low.hash_one(tag))
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
    fn log_hash_is_fnv1a_64() {
        assert_eq!(log_hash(""), "cbf29ce484222325");
        assert_eq!(log_hash("a"), "af63dc4c8601ec8c");
    }
}
