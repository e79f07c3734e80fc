//! A forward jump of Redis's clock during a drain ends no lease while its holder may
//! still spend it (docs/DESIGN.md "Leases", "Deadlines on the holder").
//!
//! A bucket's lease lapses in Redis only once a daemon's own monotonic clock (its
//! witness) has counted the lease's lifetime since it read the grant, and its key lives
//! at least a day while leases are out: Redis's clock, which a jump moves, ends neither.
//! Before, a lease lapsed at its deadline on Redis's clock: a jump past it dropped the
//! lease (its capacity and its refill went back to the key's bucket) while its holder
//! went on spending it, and a jump past the key's TTL dropped the whole hash.
//!
//! Redis runs with a preload library that adds to its realtime clock an offset (µs) read
//! from a file the test writes; the jumps are real for Redis (`TIME`, the scripts, key
//! expiry). One plain Redis (a cluster's bus would take a jump for failed nodes). Three
//! daemons drain one key per jump; the bound is what one client deciding every request
//! in Redis could admit: `capacity + refill_rate × T`, plus one more `capacity` that the
//! jump itself refills (Redis's bucket sees the jump as time passed).

use super::common::clock_shim::{build_clock_shim, OFFSET_FROM_FILE};
use super::common::*;
use super::harness::*;
use std::io::Write as _;
use std::os::unix::fs::FileExt as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

const CAPACITY: f64 = 200.0;
const RATE: f64 = 1000.0;

/// Redis `TIME` of `addr`, µs.
fn redis_time_us(addr: &str) -> i64 {
    let t = redis_command(addr, &["TIME"])
        .expect("TIME")
        .into_strings()
        .expect("TIME reply");
    t[0].parse::<i64>().expect("s") * 1_000_000 + t[1].parse::<i64>().expect("µs")
}

/// The grant of each holder's lease (`l:<holder>` = "<units> <deadline> <grant> …") on
/// `key`.
fn grants(addr: &str, key: &str) -> std::collections::HashMap<String, u64> {
    let all = redis_command(addr, &["HGETALL", key])
        .expect("HGETALL")
        .into_strings()
        .expect("HGETALL reply");
    all.chunks(2)
        .filter_map(|kv| {
            let holder = kv[0].strip_prefix("l:")?;
            let grant = kv[1].split(' ').nth(2)?.parse().ok()?;
            Some((holder.to_string(), grant))
        })
        .collect()
}

#[test]
fn a_forward_jump_of_redis_clock_ends_no_lease_its_holder_may_spend() {
    let _one = crate::ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let dir = short_tempdir("rld-jump-");
    let lib = build_clock_shim(dir.path(), "clockjump", OFFSET_FROM_FILE);
    let offset_path = dir.path().join("offset");
    let mut f = std::fs::File::create(&offset_path).expect("offset file");
    f.write_all(&0i64.to_le_bytes()).expect("offset");
    let env = [
        ("LD_PRELOAD".to_string(), lib.display().to_string()),
        (
            "RLD_CLOCK_OFFSET_FILE".to_string(),
            offset_path.display().to_string(),
        ),
    ];
    let redis = RedisStandalone::start_with_env(&env);
    let config = format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 150\nprefix = \"rl\"\n\n\
         [[rule]]\nname = \"jump\"\nalgorithm = \"token_bucket\"\ncapacity = {CAPACITY}\n\
         refill_rate = {RATE}\nlease = \"auto\"\n",
        redis.addr()
    );
    let daemons: Vec<Daemon> = (0..3).map(|_| Daemon::start(&config)).collect();
    // A fourth daemon, idle: its one CHECK right after each jump is a cold call of the
    // lease script, which settles the key's leases on Redis's new clock.
    let bystander = Daemon::start(&config);
    sleep(Duration::from_millis(2500));

    let mut offset_us: i64 = 0;
    for (name, jump_us) in [
        ("500ms", 500_000i64),
        ("5s", 5_000_000),
        ("1h", 3_600_000_000),
    ] {
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Phase::default();
        let line = format!("CHECK jump {name}");
        let started = Instant::now();
        let handles: Vec<_> = daemons
            .iter()
            .map(|d| load(&d.socket, &line, 2, 20, Duration::ZERO, &stop, &phase))
            .collect();
        sleep(Duration::from_secs(2));
        // The jump, while the three daemons hold slices of the drained key.
        let key = format!("rl:{{jump:{name}}}:tb");
        let held = grants(&redis.addr(), &key);
        let before = redis_time_us(&redis.addr());
        offset_us += jump_us;
        f.write_all_at(&offset_us.to_le_bytes(), 0)
            .expect("writing the offset");
        let seen = redis_time_us(&redis.addr()) - before;
        assert!(
            seen >= jump_us && seen < jump_us + 1_000_000,
            "Redis's clock moved {seen} µs for a jump of {jump_us} µs"
        );
        phase.store(1, Ordering::Relaxed);
        // Every lease held before the jump is still in Redis after a call settled them on
        // the new clock (or its holder renewed it: a later grant).
        bystander.connect().request(&line);
        let after_jump = grants(&redis.addr(), &key);
        let ended: Vec<_> = held
            .iter()
            .filter(|(h, g)| after_jump.get(*h).is_none_or(|now| now < *g))
            .collect();
        eprintln!("jump {name}: leases before {held:?}, after {after_jump:?}");
        assert!(
            !held.is_empty() && ended.is_empty(),
            "jump {name}: leases ended in Redis by the jump: {ended:?} (before {held:?}, after {after_jump:?})"
        );
        sleep(Duration::from_millis(2500));
        phase.store(2, Ordering::Relaxed);
        let recovered = Instant::now();
        sleep(Duration::from_secs(2));
        let (_, all) = stop_and_join(&stop, handles);
        let late_s = recovered.elapsed().as_secs_f64();
        let t = started.elapsed().as_secs_f64();
        let bound = (2.0 * CAPACITY + RATE * t).floor() as u64;
        let after = all.allowed_in(2) as f64 / (RATE * late_s);
        eprintln!(
            "jump {name}: {} ALLOW of {} over {t:.2} s (bound {bound}); before the jump {}, \
             the 2.5 s after it {}, then {} ({:.0} % of the refill over {late_s:.2} s)",
            all.allowed(),
            all.total(),
            all.allowed_in(0),
            all.allowed_in(1),
            all.allowed_in(2),
            after * 100.0
        );
        assert!(
            all.allowed() <= bound,
            "jump {name}: {} admitted, bound {bound}",
            all.allowed()
        );
        assert!(
            after >= 0.85,
            "jump {name}: {:.0} % of the refill admitted after the jump",
            after * 100.0
        );
    }
}
