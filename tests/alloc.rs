//! No allocation per request on the local decision path, counted rather than claimed:
//! this test binary's global allocator counts every allocation while N pipelined `CHECK`s
//! go through the real connection code (read → decode in place → limiter → local bucket
//! → encode → one write per batch) over a Unix socket pair, client included.
//!
//! The workloads: keys already held (spread over 1,000), and a new key every request
//! with `fallback.max_keys` full (each request evicts a key and inserts one).

use ratelimitd::admission::Peer;
use ratelimitd::config::Config;
use ratelimitd::limiter::Limiter;
use ratelimitd::server::connection::serve;
use ratelimitd::server::ConnectionLimits;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

/// The system allocator, counting the allocations (and reallocations) of a thread while
/// its `COUNTING` is set (tests run on threads of their own; each serves its connection
/// on a current-thread runtime, so everything it does is on its thread).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: allocations while the thread is being torn down are not counted.
    if COUNTING.try_with(Cell::get).unwrap_or(false) {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Requests per batch (pipeline depth).
const DEPTH: usize = 16;
/// Batches sent before counting: keys created, buffers grown, and, with a new key every
/// request, the map full and its tables at their steady size (they grow by doubling:
/// a few allocations spread over the first tens of thousands of new keys).
const WARMUP_BATCHES: usize = 3000;
/// Batches counted.
const BATCHES: usize = 1000;

/// The client: sends batches of `DEPTH` `CHECK api <key>` lines, the key of request `i`
/// made by `key(i)` into a buffer reused (so the client allocates nothing either), and
/// reads all replies of a batch before the next. Counts allocations of the last
/// `BATCHES` batches; checks every reply is a local ALLOW.
async fn client(mut s: UnixStream, key: impl Fn(u64) -> u64) -> u64 {
    let mut req: Vec<u8> = Vec::with_capacity(DEPTH * 64);
    let mut buf = vec![0u8; 64 * 1024];
    let mut num = itoa::Buffer::new();
    let mut i = 0u64;
    for batch in 0..WARMUP_BATCHES + BATCHES {
        if batch == WARMUP_BATCHES {
            ALLOCATIONS.set(0);
            COUNTING.set(true);
        }
        req.clear();
        for _ in 0..DEPTH {
            req.extend_from_slice(b"CHECK api k");
            req.extend_from_slice(num.format(key(i)).as_bytes());
            req.push(b'\n');
            i += 1;
        }
        s.write_all(&req).await.unwrap();
        let (mut lines, mut have) = (0, 0);
        while lines < DEPTH {
            let n = s.read(&mut buf[have..]).await.unwrap();
            assert!(n > 0, "the daemon closed the connection");
            lines += buf[have..have + n].iter().filter(|&&b| b == b'\n').count();
            have += n;
        }
        assert!(
            buf[..have]
                .split(|&b| b == b'\n')
                .filter(|l| !l.is_empty())
                .all(|l| l.starts_with(b"ALLOW ") && l.windows(7).any(|w| w == b" local ")),
            "{}",
            String::from_utf8_lossy(&buf[..have])
        );
    }
    COUNTING.set(false);
    ALLOCATIONS.get()
}

/// Allocations while `BATCHES × DEPTH` requests are served, keys by `key`.
fn allocations(max_keys: u64, key: impl Fn(u64) -> u64) -> u64 {
    let config = Config::parse(
        &format!(
            "[server]\nsocket = \"/unused\"\n[redis]\nmode = \"none\"\n\
             [fallback]\nmax_keys = {max_keys}\n\
             [[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\n\
             capacity = 1000000\nrefill_rate = 1000.0\n"
        ),
        "alloc.rs",
    )
    .unwrap();
    let limiter = Arc::new(Limiter::local(&config));
    let limits = ConnectionLimits::from(&config.server);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // SAFETY: getuid/getgid cannot fail.
        let peer = Peer::unbounded(unsafe { libc::getuid() }, unsafe { libc::getgid() });
        let shutdown = CancellationToken::new();
        let server = serve(theirs, limiter, &limits, peer, shutdown);
        let (served, n) = tokio::join!(server, client(ours, key));
        served.unwrap();
        n
    })
}

#[test]
fn keys_already_held_allocate_nothing() {
    let n = allocations(1_000_000, |i| i % 1000);
    assert_eq!(n, 0, "{n} allocations for {} requests", BATCHES * DEPTH);
}

#[test]
fn a_new_key_every_request_at_max_keys_allocates_nothing() {
    // 1,000 keys held at most: the warm-up fills the map, then each request evicts one.
    let n = allocations(1000, |i| i);
    assert_eq!(n, 0, "{n} allocations for {} requests", BATCHES * DEPTH);
}
