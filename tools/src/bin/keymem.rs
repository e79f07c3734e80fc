//! Bytes of resident memory per tracked key, and what a new key costs when the map is
//! full (eviction), for the local buckets and the deny cache, measured apart in one
//! process each: `benches/memory.sh --structures` runs it once per case.
//!
//! ```text
//! cargo build --release -p ratelimitd-tools     # target/release/keymem
//! target/release/keymem local token_bucket 1000000
//! target/release/keymem deny - 1000000
//! target/release/keymem map quick_cache 1000000   # a candidate map alone
//! ```
//!
//! `map` measures the candidates for the local buckets with a 32-byte value (the size of
//! a local state), key = a 64-bit hash, the same fill-then-churn run: `moka` (TinyLFU),
//! `moka_lru`, `quick_cache` (its own sharded `sync::Cache`, a copy out per read),
//! `state_map` (ours: 16 shards of a set-associative table, updated in place) and
//! `std_sharded` (16 `Mutex<std HashMap>`, i.e. hashbrown: no eviction at all, the floor
//! of what a hash map costs; its churn phase just grows it).
//!
//! It fills a map sized for KEYS with KEYS distinct keys (one decision or one cached
//! DENY each), reads `VmRSS` before and after (`/proc/self/status`), then sends KEYS more
//! new keys, each evicting one, and times them. Output: one JSON line. Run bare (and
//! under `cargo test`), it measures 10,000 keys of each kind.

use ratelimitd::algorithm::{Algorithm, Kind, Per};
use ratelimitd::cache::DenyCache;
use ratelimitd::decision::{Decision, Source};
use ratelimitd::fallback::LocalBuckets;
use ratelimitd::key::TagKey;
use std::time::Instant;

/// Resident set now, bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The `"api:k<i>"` key of request `i`, hashed as the daemon does.
fn key(keys: &TagKey, i: u64) -> u64 {
    let mut buf = itoa::Buffer::new();
    let mut key = [0u8; 24];
    let digits = buf.format(i).as_bytes();
    key[0] = b'k';
    key[1..1 + digits.len()].copy_from_slice(digits);
    keys.of(b"api", &key[..1 + digits.len()])
}

fn measure(what: &str, algorithm: &str, n: u64) {
    let keys = TagKey::default();
    let now = 1.7e15;
    let before = rss();
    let (held, fill_s, evict_s);
    match what {
        "local" => {
            let kind = Kind::from_name(algorithm).expect("an algorithm name");
            let per = match kind {
                Kind::TokenBucket | Kind::LeakyBucket => Per::Rate(10.0),
                _ => Per::WindowMs(60_000),
            };
            let params = Algorithm {
                kind,
                limit: 100,
                per,
            }
            .params(1);
            let local = LocalBuckets::new(n);
            let t = Instant::now();
            for i in 0..n {
                local.decide(key(&keys, i), 100, &params, 1, 1, now);
            }
            fill_s = t.elapsed().as_secs_f64();
            held = local.len();
            let t = Instant::now();
            for i in n..2 * n {
                local.decide(key(&keys, i), 100, &params, 1, 1, now);
            }
            evict_s = t.elapsed().as_secs_f64();
            report(
                what,
                algorithm,
                n,
                held,
                before,
                fill_s,
                evict_s,
                local.len(),
            );
        }
        "deny" => {
            let cache = DenyCache::new(60_000, n, 50);
            let deny = Decision {
                allowed: false,
                limit: 100,
                remaining: 0,
                reset_ms: 60_000,
                wait_ms: 60_000,
                source: Source::Redis,
            };
            let t = Instant::now();
            for i in 0..n {
                cache.remember(key(&keys, i), 1, &deny, now, 0, false);
            }
            fill_s = t.elapsed().as_secs_f64();
            held = cache.len();
            let t = Instant::now();
            for i in n..2 * n {
                cache.remember(key(&keys, i), 1, &deny, now, 0, false);
            }
            evict_s = t.elapsed().as_secs_f64();
            report(what, "-", n, held, before, fill_s, evict_s, cache.len());
        }
        "map" => measure_map(algorithm, n),
        other => panic!("keymem: unknown structure {other:?} (local, deny or map)"),
    }
}

/// A local state's size: what each candidate map stores per key.
type Value = [u64; 4];

/// One candidate map for the local buckets, fill then churn with `n` keys each.
fn measure_map(candidate: &str, n: u64) {
    use ratelimitd::key::Prehashed;
    use std::sync::Mutex;
    let keys = TagKey::default();
    let before = rss();
    let mut touch: Box<dyn FnMut(u64)> = match candidate {
        "moka" | "moka_lru" => {
            let mut b = moka::sync::Cache::builder().max_capacity(n);
            if candidate == "moka_lru" {
                b = b.eviction_policy(moka::policy::EvictionPolicy::lru());
            }
            let m: moka::sync::Cache<u64, Value, Prehashed> = b.build_with_hasher(Prehashed);
            Box::new(move |k| {
                let mut v = m.get(&k).unwrap_or_default();
                v[0] += 1;
                m.insert(k, v);
            })
        }
        "quick_cache" => {
            let m: quick_cache::sync::Cache<u64, Value, quick_cache::UnitWeighter, Prehashed> =
                quick_cache::sync::Cache::with(
                    n as usize,
                    n,
                    quick_cache::UnitWeighter,
                    Prehashed,
                    quick_cache::sync::DefaultLifecycle::default(),
                );
            Box::new(move |k| {
                let mut v = m.get(&k).unwrap_or_default();
                v[0] += 1;
                m.insert(k, v);
            })
        }
        "state_map" => {
            let m: ratelimitd::state_map::StateMap<Value> = ratelimitd::state_map::StateMap::new(n);
            Box::new(move |k| m.with(k, |v| v[0] += 1))
        }
        "std_sharded" => {
            let shards: Vec<Mutex<std::collections::HashMap<u64, Value, Prehashed>>> =
                (0..16).map(|_| Mutex::new(Default::default())).collect();
            Box::new(move |k| {
                let mut s = shards[((k >> 40) % 16) as usize].lock().unwrap();
                s.entry(k).or_default()[0] += 1;
            })
        }
        other => panic!("keymem: unknown map {other:?}"),
    };
    let t = Instant::now();
    for i in 0..n {
        touch(key(&keys, i));
    }
    let fill_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..n {
        // Hits: the first keys again (those still held).
        touch(key(&keys, i % (n / 2).max(1)));
    }
    let hit_s = t.elapsed().as_secs_f64();
    let full = rss().saturating_sub(before);
    let t = Instant::now();
    for i in n..2 * n {
        touch(key(&keys, i));
    }
    let evict_s = t.elapsed().as_secs_f64();
    let after = rss().saturating_sub(before);
    println!(
        "{{\"map\":\"{candidate}\",\"capacity\":{n},\"bytes_per_key_full\":{:.0},\
         \"bytes_per_key_after_churn\":{:.0},\"insert_ns\":{:.0},\"update_ns\":{:.0},\
         \"insert_evicting_ns\":{:.0}}}",
        full as f64 / n as f64,
        after as f64 / n as f64,
        fill_s * 1e9 / n as f64,
        hit_s * 1e9 / n as f64,
        evict_s * 1e9 / n as f64,
    );
}

#[allow(clippy::too_many_arguments)]
fn report(
    what: &str,
    algorithm: &str,
    n: u64,
    held: u64,
    before: u64,
    fill_s: f64,
    evict_s: f64,
    held_after: u64,
) {
    // RSS after the eviction phase: the steady state of a full map under churn.
    let after = rss();
    let per_key = after.saturating_sub(before) as f64 / held_after.max(1) as f64;
    println!(
        "{{\"structure\":\"{what}\",\"algorithm\":\"{algorithm}\",\"capacity\":{n},\"held_full\":{held},\
         \"held_after_churn\":{held_after},\"rss_mb\":{:.1},\"bytes_per_key\":{per_key:.0},\
         \"insert_ns\":{:.0},\"insert_evicting_ns\":{:.0}}}",
        after.saturating_sub(before) as f64 / 1e6,
        fill_s * 1e9 / n as f64,
        evict_s * 1e9 / n as f64,
    );
    // The local buckets are exact; moka (the deny cache) counts and evicts lazily.
    if what == "local" {
        assert!(held <= n && held_after <= n, "more than {n} held");
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    match args.as_slice() {
        [what, algorithm, n] => measure(what, algorithm, n.parse().expect("KEYS")),
        _ => bare_run(),
    }
}

/// The run with no arguments: 10,000 keys of each kind.
fn bare_run() {
    for kind in Kind::ALL {
        measure("local", kind.as_str(), 10_000);
    }
    measure("deny", "-", 10_000);
}

#[cfg(test)]
mod tests {
    #[test]
    fn bare_run() {
        super::bare_run();
    }
}
