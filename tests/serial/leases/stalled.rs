//! A client that stops reading its replies holds up no other client: a hot key's lease
//! call runs in a task of its own (never inside one connection's requests), requests
//! waiting for it are not queued on its lock and hold no Redis in-flight permit, and
//! every request is answered by `redis.timeout_ms` after it arrived.

use super::common::*;
use super::migration::owner_of;
use crate::ONE_AT_A_TIME;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 250;

/// One client floods CHECKs of a hot key and never reads a reply (its connection's
/// task ends up blocked writing them, with requests of that key pending, while the
/// key's primary holds writes for 100 ms at a time so that its lease calls are slow);
/// another
/// client's CHECKs of the same key, one every 50 ms for 2 s, are each answered from the
/// lease or Redis (never decided locally, never `ERR BUSY`) within `redis.timeout_ms`
/// + 5 ms.
#[test]
fn a_client_that_never_reads_holds_up_no_other_client_of_its_key() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let cluster = RedisCluster::start();
    let daemon = Daemon::start(&format!(
        "[server]\nidle_timeout_ms = 60000\n\n[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = {TIMEOUT_MS}\nprefix = \"rl\"\n\n[[rule]]\nname = \"hot\"\nalgorithm = \"token_bucket\"\ncapacity = 1000000\nrefill_rate = 1000.0\nlease = \"auto\"\n",
        toml_str_array(&cluster.addrs())
    ));
    // The key's primary holds writes for 80 ms out of every 150 (`CLIENT PAUSE WRITE`,
    // well within the timeout) while the flood goes on: the key's lease calls take long,
    // so when the flooding connection's task blocks writing its replies, it is likely to
    // have one in flight or queued.
    let key = "rl:{hot:k}:tb";
    let slot: u16 = cluster
        .cli(&cluster.primary_addrs()[0], &["CLUSTER", "KEYSLOT", key])
        .parse()
        .expect("slot");
    let (primary, _) = owner_of(&cluster, slot);
    let pauser = {
        let primary = primary.clone();
        thread::spawn(move || {
            let pausing = Instant::now();
            while pausing.elapsed() < Duration::from_millis(2500) {
                redis_cli(&primary, &["CLIENT", "PAUSE", "80", "WRITE"]);
                thread::sleep(Duration::from_millis(150));
            }
        })
    };
    let socket = daemon.socket.clone();
    let stalled = thread::spawn(move || {
        let mut s = UnixStream::connect(&socket).expect("connect");
        s.set_write_timeout(Some(Duration::from_secs(2)))
            .expect("write timeout");
        let chunk = "CHECK hot k\n".repeat(1000);
        let mut sent = 0usize;
        // Until the daemon stops taking lines: its replies fill the socket unread.
        while s.write_all(chunk.as_bytes()).is_ok() {
            sent += 1000;
        }
        (s, sent)
    });
    // Past the point where the flood's writes block (2 s write timeout).
    let (stream, sent) = stalled.join().expect("flooding client");
    pauser.join().expect("pausing thread");
    let mut c = daemon.connect();
    let mut worst = Duration::ZERO;
    let mut sources = std::collections::BTreeMap::<String, u64>::new();
    let mut late = Vec::new();
    for _ in 0..40 {
        let asked = Instant::now();
        let reply = c.request("CHECK hot k");
        let took = asked.elapsed();
        // `ERR BUSY` (no Redis permit left for this uid) has no source.
        let source = try_parse_reply(&reply).map_or_else(String::new, |r| r.source);
        *sources.entry(source.clone()).or_default() += 1;
        worst = worst.max(took);
        let answered = ["lease", "redis"].contains(&source.as_str());
        if took > Duration::from_millis(TIMEOUT_MS + 5) || !answered {
            late.push((took, reply));
        }
        thread::sleep(Duration::from_millis(50));
    }
    println!(
        "a client that never reads ({sent} CHECKs written before its writes blocked): another client's 40 CHECKs of the key by source {sources:?}, slowest {worst:?} (bound {} ms)",
        TIMEOUT_MS + 5
    );
    drop(stream);
    assert!(
        late.is_empty(),
        "late or not from the lease/Redis: {late:?}"
    );
}
