//! The rule lab (`/lab`, `[http] lab = true`): a page asks for a run (an algorithm, its
//! parameters, a traffic profile, a duration, simulated clients); the run is decided by
//! the daemon's own decision path, a [`Limiter`] over the configured Redis with the
//! same scripts, but under the key prefix `<redis.prefix>:lab` (so its keys are
//! `<prefix>:lab:{<run>:<client>}:<suffix>`, never a configured rule's), and every
//! decision streams back over Server-Sent Events ([`run`]).
//!
//! A run is bounded before it starts ([`plan`]: `http.lab_max_rps`, `lab_max_seconds`,
//! `lab_max_keys`), and one run at a time: a second gets an error event. Its rule is
//! counted nowhere (no metrics series, not on the dashboard). The lab's own Redis
//! connections are opened at its first run.

pub mod plan;
mod run;
mod slots;

use super::{sse, Body, State};
use crate::config::{Config, HttpConfig, RedisMode};
use crate::limiter::Limiter;
use crate::store::health::Circuit;
use crate::store::RedisStore;
use hyper::Response;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{OnceCell, OwnedSemaphorePermit, Semaphore};

/// How long the lab's first run waits for its Redis connections (as the daemon does at
/// start).
const CONNECT_WAIT: Duration = Duration::from_millis(1500);

/// The lab: its budget, its limiter (built at the first run) and its one run slot.
pub struct Lab {
    /// The daemon's configuration with `redis.prefix` = `<prefix>:lab` and no rules.
    config: Config,
    /// The budget of a run (`http.lab_max_*`).
    budget: HttpConfig,
    limiter: OnceCell<Arc<Limiter>>,
    /// One run at a time.
    running: Arc<Semaphore>,
}

impl Lab {
    /// The lab of a daemon configured by `config`.
    pub fn new(config: &Config) -> Self {
        let mut config = config.clone();
        config.redis.prefix = format!("{}:lab", config.redis.prefix);
        config.rules.clear();
        Lab {
            budget: config.http.clone(),
            config,
            limiter: OnceCell::new(),
            running: Arc::new(Semaphore::new(1)),
        }
    }

    /// The key prefix of every key the lab writes: `<redis.prefix>:lab:`.
    pub fn prefix(&self) -> String {
        format!("{}:", self.config.redis.prefix)
    }

    /// The lab's limiter: its own Redis store under the lab prefix (connected at the
    /// first call, waiting at most [`CONNECT_WAIT`]), or local buckets with
    /// `redis.mode = "none"`.
    async fn limiter(&self) -> Result<Arc<Limiter>, String> {
        self.limiter
            .get_or_try_init(|| async {
                if self.config.redis.mode == RedisMode::None {
                    return Ok(Arc::new(Limiter::local(&self.config)));
                }
                let circuit = Arc::new(Circuit::new(true));
                let store = RedisStore::new(&self.config.redis, Arc::clone(&circuit))
                    .map_err(|e| format!("redis: {e}"))?;
                let store = Arc::new(store);
                store.start();
                let deadline = Instant::now() + CONNECT_WAIT;
                while circuit.is_open() && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(Arc::new(Limiter::new(&self.config, Some(store))))
            })
            .await
            .cloned()
    }
}

/// `/lab/events?<run>`: runs the plan the query describes and streams its decisions;
/// `permit` is the stream's slot.
pub fn stream(state: &Arc<State>, query: &str, permit: OwnedSemaphorePermit) -> Response<Body> {
    let (response, mut tx) = sse::response();
    let state = Arc::clone(state);
    let query = query.to_owned();
    tokio::spawn(async move {
        let _permit = permit;
        let Some(lab) = &state.lab else { return };
        let fail = |message: String| {
            let json = serde_json::json!({ "message": message }).to_string();
            sse::event(Some("failed"), &json)
        };
        // Not reconnected by the browser: the page closes the stream at `done`.
        let _ = tx.send_data(sse::retry(3_600_000)).await;
        let Ok(_running) = Arc::clone(&lab.running).try_acquire_owned() else {
            let _ = tx
                .send_data(fail(
                    "another lab run is in progress; wait for it to end".into(),
                ))
                .await;
            return;
        };
        let started_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let name = format!("run{started_ms}");
        let plan = match plan::Plan::parse(&query, &lab.budget, &name) {
            Ok(plan) => plan,
            Err(e) => {
                let _ = tx.send_data(fail(e)).await;
                return;
            }
        };
        let limiter = match lab.limiter().await {
            Ok(l) => l,
            Err(e) => {
                let _ = tx.send_data(fail(e)).await;
                return;
            }
        };
        run::run(&limiter, &plan, &lab.prefix(), started_ms, tx).await;
    });
    response
}

/// `/lab/config`: the lab's budget and key prefix, for the page to state.
pub fn config(lab: &Lab) -> Response<Body> {
    let b = &lab.budget;
    let json = serde_json::json!({
        "max_rps": b.lab_max_rps,
        "max_seconds": b.lab_max_seconds,
        "max_keys": b.lab_max_keys,
        "prefix": lab.prefix(),
    });
    super::text(hyper::StatusCode::OK, "application/json", json.to_string())
}
