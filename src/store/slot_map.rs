//! The cluster's slot map: asked of a primary that answers (`CLUSTER SLOTS`) every
//! second, every probe interval while a primary is down, and at once on a redirection;
//! a changed map gets its new primaries connected and probed and its old ones retired.
//!
//! A second `impl` block of [`RedisStore`], apart from the decision path in
//! [`super::redis`].

use super::health::PROBE_INTERVAL;
use super::redis::{RedisStore, SLOT_MAP_INTERVAL, SLOT_MAP_TIMEOUT};
use super::topology::{self, Primary, Topology};
use super::StoreError;
use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

impl RedisStore {
    /// Forever: refresh the slot map every [`SLOT_MAP_INTERVAL`], every
    /// [`PROBE_INTERVAL`] while a primary is open or none is known, and at once when a
    /// decision met a redirection.
    pub(super) async fn refresher(self: Arc<Self>) {
        loop {
            if let Err(e) = self.refresh_slot_map().await {
                tracing::debug!(error = %e, "Redis Cluster slot map not refreshed");
            }
            let wait = if self.topology.load().primaries.is_empty() {
                // Start-up: the seeds are still connecting.
                Duration::from_millis(20)
            } else if self.circuit.open_primaries() > 0 {
                PROBE_INTERVAL
            } else {
                SLOT_MAP_INTERVAL
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.slot_map_wanted.notified() => {}
            }
        }
    }

    /// Asks a primary that answers (else a seed) for the slot map and puts it in force
    /// if it changed: new primaries get a connection and a prober, primaries that own
    /// no slot any more are retired.
    ///
    /// # Errors
    /// No node answered `CLUSTER SLOTS` in time.
    pub async fn refresh_slot_map(self: &Arc<Self>) -> Result<(), StoreError> {
        let _one_at_a_time = self.slot_map_lock.lock().await;
        let current = self.topology.load_full();
        let mut askers: Vec<(String, Client)> = current
            .primaries
            .iter()
            .filter(|p| !p.health.is_open() && p.client.is_connected())
            .map(|p| (host_of(p.name()), p.client.clone()))
            .collect();
        askers.extend(
            self.seeds
                .iter()
                .filter(|(_, c)| c.is_connected())
                .map(|(h, c)| (h.clone(), c.clone())),
        );
        let mut last = StoreError::timeout("no Redis node connected".into());
        for (host, client) in askers {
            let slots = tokio::time::timeout(SLOT_MAP_TIMEOUT, client.cluster_slots::<Value>());
            let routing = match slots.await {
                Ok(Ok(value)) => ClusterRouting::from_cluster_slots(value, host.as_str()),
                Ok(Err(e)) => Err(e),
                Err(_) => {
                    last = StoreError::timeout(format!(
                        "CLUSTER SLOTS: no answer within {SLOT_MAP_TIMEOUT:?}"
                    ));
                    continue;
                }
            };
            match routing {
                Ok(r) if r.slots().is_empty() => {}
                Ok(routing) => return self.put_in_force(&current, &routing),
                Err(e) => last = StoreError::from_redis(e),
            }
        }
        Err(last)
    }

    /// Puts `routing` in force if it differs from `current`.
    fn put_in_force(
        self: &Arc<Self>,
        current: &Topology,
        routing: &ClusterRouting,
    ) -> Result<(), StoreError> {
        let new_map = Topology::signature(routing);
        let old_map: Vec<(u16, u16, String)> = current.ranges();
        if new_map == old_map {
            return Ok(());
        }
        // The first map's primaries are probed before use (scripts loaded); later ones
        // start closed (a failover's promoted replica takes decisions at once, and
        // `NOSCRIPT` loads the scripts there).
        let first = current.primaries.is_empty();
        let mut made = Vec::new();
        let mut error = None;
        let next = current.rebuild(routing, |host, port, a, b| {
            match self.primary(host, port, a, b, first) {
                Ok(p) => {
                    made.push(Arc::clone(&p));
                    p
                }
                Err(e) => {
                    error.get_or_insert(e);
                    // Unreachable in practice (same settings as the seeds'); keep going
                    // with a primary that is never connected: its keys go local.
                    Arc::new(topology::primary(
                        Client::default(),
                        format!("{host}:{port}"),
                        String::new(),
                        true,
                        self.timeout,
                        &self.circuit,
                    ))
                }
            }
        });
        let retired: Vec<Arc<Primary>> = current
            .primaries
            .iter()
            .filter(|p| next.find(p.name()).is_none())
            .cloned()
            .collect();
        tracing::info!(
            primaries = %next.primaries.iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
            "Redis Cluster slot map in force"
        );
        self.topology.store(Arc::new(next));
        for p in &made {
            self.run_primary(p);
        }
        for p in retired {
            p.retired.store(true, Ordering::Relaxed);
            p.health.retire();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(Duration::from_secs(1), p.client.quit()).await;
            });
        }
        error.map_or(Ok(()), Err)
    }
}

/// The host part of `host:port`.
pub(super) fn host_of(name: &str) -> String {
    name.rsplit_once(':').map_or(name, |(h, _)| h).to_owned()
}
