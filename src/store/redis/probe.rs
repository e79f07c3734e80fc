//! The health check of one primary whose breaker is open: probe it until it answers,
//! then close the breaker. Apart from the decision path so that the store's main file
//! stays about connecting and deciding.

use super::RedisStore;
use crate::algorithm::{token_bucket, Params};
use crate::store::connection_errors::is_refusal;
use crate::store::health::PROBE_INTERVAL;
use crate::store::topology::Primary;
use crate::store::Store;
use crate::store::StoreError;
use fred::error::{Error, ErrorKind};
use fred::prelude::*;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl RedisStore {
    /// One health check of `primary`: load the scripts, then take one token from its
    /// probe bucket (a key in its own slots). That last step writes (so a primary
    /// refusing writes, e.g. out of memory, fails the probe) and must answer within
    /// `redis.timeout_ms` (so one too slow for decisions fails it too). Not sent at all
    /// while its connection is down (nothing queues in the client); bounded by the probe
    /// timeout.
    ///
    /// # Errors
    /// Not connected, no answer in time, or what Redis answered.
    pub async fn probe(&self, primary: &Primary) -> Result<(), StoreError> {
        if !primary.client.is_connected() {
            return Err(StoreError::timeout(format!(
                "not connected to {}",
                primary.name()
            )));
        }
        let check = async {
            self.load_scripts(&primary.client).await?;
            let params = Params::TokenBucket(token_bucket::Params::shared(1000, 1000.0, 1));
            let key = self.key(&primary.probe_tag, &params);
            // A real decision, not a dry run: a write refused (a replica, an ACL) shows.
            let decision = self.decide_alone(primary, &key, &params, 1, false);
            match tokio::time::timeout(self.timeout, decision).await {
                Ok(result) => result.map(drop),
                Err(_) => Err(Error::new(
                    ErrorKind::Timeout,
                    format!("probe slower than redis.timeout_ms ({:?})", self.timeout),
                )),
            }
        };
        match tokio::time::timeout(self.probe_timeout, check).await {
            Ok(result) => result.map_err(StoreError::from_redis),
            Err(_) => Err(StoreError::timeout(format!(
                "no answer within {:?}",
                self.probe_timeout
            ))),
        }
    }

    /// Forever (until `primary` is retired): whenever its breaker is open, probe it
    /// every [`PROBE_INTERVAL`], one probe at a time, and close the breaker when one
    /// answers. A failure is logged (at debug level) when it differs from the last.
    pub(super) async fn prober(&self, primary: Arc<Primary>) {
        // A primary that starts open (start-up) is probed at once, once connected.
        let mut wait = Duration::from_millis(20);
        loop {
            primary.health.wait_open().await;
            let mut last_error = String::new();
            while primary.health.is_open() {
                tokio::time::sleep(wait).await;
                wait = PROBE_INTERVAL;
                if primary.retired.load(Ordering::Relaxed) {
                    return;
                }
                match self.probe(&primary).await {
                    Ok(()) => primary.health.close(),
                    Err(e) => {
                        // A refusal (an ACL user without a command the scripts need, a
                        // password changed under an open connection) is said once, as
                        // a connection that fails is.
                        if let StoreError::Unavailable { source, .. } = &e {
                            if is_refusal(source) {
                                self.connection_errors.record(source, primary.name());
                            }
                        }
                        let e = e.to_string();
                        if e != last_error {
                            tracing::debug!(primary = primary.name(), error = %e, "Redis probe failed");
                            last_error = e;
                        }
                    }
                }
            }
            if primary.retired.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}
