//! Criterion micro-benchmarks of the hot path's pieces, without I/O: the line decoder
//! and parser, reply encoding, each local algorithm twin, the deny cache and the local
//! buckets (moka). `cargo bench --bench micro`; `cargo test --all-targets` runs each
//! once as a smoke test. docs/perf-log.md quotes the figures.

use bytes::BytesMut;
use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ratelimitd::algorithm::{leaky_bucket, token_bucket, Params, State, WindowParams};
use ratelimitd::cache::DenyCache;
use ratelimitd::clock::wall_clock_us;
use ratelimitd::decision::{Decision, Source};
use ratelimitd::fallback::LocalBuckets;
use ratelimitd::key::TagKey;
use ratelimitd::protocol::{parse, LineDecoder, Reply};
use tokio_util::codec::Decoder;

fn protocol(c: &mut Criterion) {
    c.bench_function("parse CHECK", |b| {
        b.iter(|| parse(black_box(b"CHECK rides_request user:4242 1")).unwrap())
    });
    let batch: Vec<u8> = (0..16)
        .flat_map(|i| format!("CHECK rides_request user:{i}\n").into_bytes())
        .collect();
    c.bench_function("decode+parse 16 pipelined lines", |b| {
        let mut dec = LineDecoder::new(1024);
        b.iter(|| {
            let mut buf = BytesMut::from(&batch[..]);
            let mut n = 0;
            while let Some(frame) = dec.decode(&mut buf).unwrap() {
                black_box(frame);
                n += 1;
            }
            n
        })
    });
    let reply = Reply::Decision(
        Decision {
            allowed: true,
            limit: 20,
            remaining: 19,
            reset_ms: 100,
            wait_ms: 0,
            source: Source::Redis,
        },
        2000,
    );
    c.bench_function("encode reply", |b| {
        let mut out = BytesMut::with_capacity(64);
        b.iter(|| {
            out.clear();
            black_box(&reply).encode(&mut out);
        })
    });
}

fn algorithms(c: &mut Criterion) {
    let window = WindowParams::shared(100, 60_000, 1);
    let all = [
        (
            "token_bucket",
            Params::TokenBucket(token_bucket::Params::shared(100, 50.0, 1)),
        ),
        (
            "leaky_bucket",
            Params::LeakyBucket(leaky_bucket::Params::shared(100, 50.0, 1)),
        ),
        ("fixed_window", Params::FixedWindow(window)),
        ("sliding_window_log", Params::SlidingWindowLog(window)),
        (
            "sliding_window_counter",
            Params::SlidingWindowCounter(window),
        ),
    ];
    for (name, params) in all {
        // A key at its limit: the steady state of a hot key (the log holds 100 entries).
        let mut state: Option<State> = None;
        let t0 = 1_700_000_000_000_000.0;
        for i in 0..100 {
            params.decide(&mut state, t0 + f64::from(i), 1);
        }
        let mut now = t0 + 1000.0;
        c.bench_function(&format!("local {name}, key at its limit"), |b| {
            b.iter(|| {
                now += 1.0;
                params.decide(black_box(&mut state), now, 1)
            })
        });
    }
    c.bench_function("wall clock read", |b| b.iter(wall_clock_us));
}

fn caches(c: &mut Criterion) {
    let params = Params::TokenBucket(token_bucket::Params::shared(100, 50.0, 1));
    let keys = TagKey::default();
    let local = LocalBuckets::new(1_000_000);
    c.bench_function("local buckets: hot key", |b| {
        b.iter(|| {
            local.decide(
                keys.of(b"api", black_box(b"hot")),
                100,
                &params,
                1,
                1,
                wall_clock_us(),
            )
        })
    });
    let mut n = 0u64;
    let mut key = String::new();
    c.bench_function("local buckets: new key each time", |b| {
        b.iter(|| {
            n += 1;
            key.clear();
            key.push_str("user:");
            key.push_str(itoa::Buffer::new().format(n));
            local.decide(
                keys.of(b"api", key.as_bytes()),
                100,
                &params,
                1,
                1,
                wall_clock_us(),
            )
        })
    });
    let cache = DenyCache::new(500, 100_000, 50);
    let deny = Decision {
        allowed: false,
        limit: 100,
        remaining: 0,
        reset_ms: 1000,
        wait_ms: 100_000,
        source: Source::Redis,
    };
    cache.remember(keys.of(b"hot", b"k"), 1, &deny, wall_clock_us(), 0, false);
    c.bench_function("deny cache: hit", |b| {
        b.iter(|| cache.lookup(keys.of(b"hot", black_box(b"k")), 1, wall_clock_us()))
    });
    c.bench_function("deny cache: miss", |b| {
        b.iter(|| cache.lookup(keys.of(b"cold", black_box(b"k")), 1, wall_clock_us()))
    });
    // A claim: the entry is 501 ms old (past its 500 ms ttl, within the 50 ms grace).
    // Each iteration writes a new DENY first ("remember"), then claims it.
    let claimed = keys.of(b"claim", b"k");
    c.bench_function("deny cache: remember", |b| {
        b.iter(|| cache.remember(claimed, 1, &deny, wall_clock_us() - 501_000.0, 0, false))
    });
    c.bench_function("deny cache: remember, then claim its refresh", |b| {
        b.iter(|| {
            cache.remember(claimed, 1, &deny, wall_clock_us() - 501_000.0, 0, false);
            cache.lookup(claimed, 1, wall_clock_us())
        })
    });
}

criterion_group!(benches, protocol, algorithms, caches);
criterion_main!(benches);
