//! Closed-loop gRPC load generator for the Envoy Rate Limit Service
//! (`ShouldRateLimit`), the counterpart of `loadgen` for the line protocol.
//!
//! `--conns` HTTP/2 connections carry `--concurrency` calls in flight each (as Envoy
//! multiplexes its calls on a few connections); every call is one descriptor
//! `[(generic_key, <key>), (user_id, <n>)]` in `--domain`, `n` uniform over `--keys`
//! values (0: a new value per call). Calls that start during `--warmup` or end after
//! the measured window are not counted. Prints one human-readable line and one JSON
//! line (decisions/s, p50/p99/p999 in µs, OK / OVER_LIMIT / errors).
//!
//! ```text
//! cargo run --release -p ratelimitd-tools --bin rls_loadgen -- --addr 127.0.0.1:8081 \
//!     --conns 2 --concurrency 25 --domain bench --key api --keys 1000000 --duration 5s
//! ```
//! Run bare, it runs its self-test (`cargo test` runs it too).

mod common;

use clap::Parser;
use common::splitmix64;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::Endpoint;

#[derive(Parser, Debug)]
struct Args {
    /// `host:port` of the RLS.
    #[arg(long)]
    addr: String,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    conns: usize,
    /// Calls in flight per connection.
    #[arg(long, default_value_t = 25)]
    concurrency: usize,
    /// Domain of every call.
    #[arg(long, default_value = "bench")]
    domain: String,
    /// Value of the `generic_key` entry.
    #[arg(long, default_value = "api")]
    key: String,
    /// Distinct `user_id` values (0: a new one per call).
    #[arg(long, default_value_t = 0)]
    keys: u64,
    /// Measured time (`5s`, `500ms`).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    duration: Duration,
    /// Unmeasured time first.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    warmup: Duration,
    /// Runtime worker threads of the generator.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Name in the output.
    #[arg(long, default_value = "rls")]
    label: String,
}

/// What one task measured.
#[derive(Default)]
struct Tally {
    micros: Vec<u32>,
    ok: u64,
    over: u64,
    errors: u64,
    first_error: Option<String>,
}

/// The `q` quantile (0..=1) of sorted samples.
fn quantile(sorted: &[u32], q: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

async fn run(args: Args) -> Result<(), String> {
    let start = Instant::now();
    let (from, to) = (start + args.warmup, start + args.warmup + args.duration);
    let counter = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.conns {
        let ch = Endpoint::from_shared(format!("http://{}", args.addr))
            .map_err(|e| e.to_string())?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("{}: {e}", args.addr))?;
        for _ in 0..args.concurrency {
            let mut client = RateLimitServiceClient::new(ch.clone());
            let (domain, key, keys, counter) = (
                args.domain.clone(),
                args.key.clone(),
                args.keys,
                Arc::clone(&counter),
            );
            tasks.push(tokio::spawn(async move {
                let mut t = Tally::default();
                loop {
                    let n = counter.fetch_add(1, Ordering::Relaxed);
                    let n = if keys > 0 { splitmix64(n) % keys } else { n };
                    let req = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![
                                Entry {
                                    key: "generic_key".into(),
                                    value: key.clone(),
                                },
                                Entry {
                                    key: "user_id".into(),
                                    value: n.to_string(),
                                },
                            ],
                            ..Default::default()
                        }],
                        hits_addend: 0,
                    };
                    let began = Instant::now();
                    if began >= to {
                        return t;
                    }
                    let r = client.should_rate_limit(req).await;
                    let ended = Instant::now();
                    if began < from || ended > to {
                        continue;
                    }
                    t.micros.push(
                        ended
                            .duration_since(began)
                            .as_micros()
                            .min(u32::MAX as u128) as u32,
                    );
                    match r {
                        Ok(r) if r.get_ref().overall_code == 1 => t.ok += 1,
                        Ok(_) => t.over += 1,
                        Err(e) => {
                            t.errors += 1;
                            t.first_error.get_or_insert(e.to_string());
                        }
                    }
                }
            }));
        }
    }
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.map_err(|e| e.to_string())?;
        all.micros.extend(t.micros);
        (all.ok, all.over, all.errors) = (all.ok + t.ok, all.over + t.over, all.errors + t.errors);
        if all.first_error.is_none() {
            all.first_error = t.first_error;
        }
    }
    all.micros.sort_unstable();
    let n = all.micros.len();
    let rate = n as f64 / args.duration.as_secs_f64();
    let (p50, p99, p999) = (
        quantile(&all.micros, 0.5),
        quantile(&all.micros, 0.99),
        quantile(&all.micros, 0.999),
    );
    println!(
        "{}: {rate:.0} decisions/s, p50 {p50} us, p99 {p99} us, p99.9 {p999} us ({} conns x {} in flight; ok {}, over_limit {}, errors {}{})",
        args.label, args.conns, args.concurrency, all.ok, all.over, all.errors,
        all.first_error.map(|e| format!(": {e}")).unwrap_or_default()
    );
    println!(
        "{{\"label\":\"{}\",\"requests\":{n},\"seconds\":{},\"rps\":{rate:.1},\"p50_us\":{p50},\"p99_us\":{p99},\"p999_us\":{p999},\"ok\":{},\"over_limit\":{},\"errors\":{}}}",
        args.label, args.duration.as_secs_f64(), all.ok, all.over, all.errors
    );
    Ok(())
}

fn self_test() {
    let s: Vec<u32> = (1..=100).collect();
    assert_eq!(
        (quantile(&s, 0.5), quantile(&s, 0.99), quantile(&s, 1.0)),
        (50, 99, 100)
    );
    assert_eq!(quantile(&[], 0.5), 0);
    assert_ne!(splitmix64(1), splitmix64(2));
}

fn main() {
    if std::env::args().len() == 1 {
        self_test();
        println!("rls_loadgen self-test ok");
        return;
    }
    let args = Args::parse();
    let rt = common::runtime(args.threads);
    if let Err(e) = rt.block_on(run(args)) {
        eprintln!("rls_loadgen: {e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn self_test() {
        super::self_test();
    }
}
