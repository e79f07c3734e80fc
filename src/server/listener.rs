//! The accept loop: admits a connection (peer credentials, then one of
//! `server.max_connections` slots and one of its uid's `server.max_connections_per_uid`),
//! serves it on its own task, and on shutdown stops accepting and waits for every
//! connection to answer what it received.

use super::{connection, ConnectionLimits, PeerAccess};
use crate::admission::{InFlight, Peer, UidConnection};
use crate::limiter::Limiter;
use crate::log_every::LogEvery;
use crate::protocol::{ErrorCode, ProtoError, Reply};
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Refusals of one kind are logged at most this often.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The rate-limited log lines of refused connections, one per kind.
struct Refusals {
    perm: LogEvery,
    busy: LogEvery,
    busy_uid: LogEvery,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            perm: LogEvery::new(REFUSAL_LOG_INTERVAL),
            busy: LogEvery::new(REFUSAL_LOG_INTERVAL),
            busy_uid: LogEvery::new(REFUSAL_LOG_INTERVAL),
        }
    }
}

/// Serves `listener` until `shutdown` is cancelled, then stops accepting and waits for
/// every connection to answer what it has already received.
pub async fn serve(
    listener: UnixListener,
    limiter: Arc<Limiter>,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    let limits = Arc::new(limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let in_flight = InFlight::new(limits.redis_in_flight);
    let refusals = Refusals::default();
    let open = crate::metrics::connections();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Some((slots_held, peer)) = admit(&stream, &limits, &slots, &refusals, &in_flight) else {
                        continue;
                    };
                    let limiter = Arc::clone(&limiter);
                    let limits = Arc::clone(&limits);
                    let shutdown = shutdown.clone();
                    let open = open.clone();
                    open.increment(1.0);
                    tracker.spawn(async move {
                        if let Err(e) = connection::serve(stream, limiter, &limits, peer, shutdown).await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        open.decrement(1.0);
                        drop(slots_held);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// Checks a new connection against `allow_uids`/`allow_gids`, then takes one of the
/// `max_connections` slots and one of its uid's `max_connections_per_uid`. A refused
/// connection is told why (`ERR PERM` or `ERR BUSY`, written without waiting: its send
/// buffer is empty), logged, and closed on drop. An admitted one gets its slots (held
/// until it closes) and its [`Peer`] (its uid's share of the Redis slots).
fn admit(
    stream: &UnixStream,
    limits: &ConnectionLimits,
    slots: &Arc<Semaphore>,
    refusals: &Refusals,
    in_flight: &Arc<InFlight>,
) -> Option<((OwnedSemaphorePermit, UidConnection), Peer)> {
    let refuse = |code, message: &str| {
        crate::metrics::error_reply(code);
        let mut line = BytesMut::new();
        Reply::Error(ProtoError::new(code, message)).encode(&mut line);
        let _ = stream.try_write(&line);
    };
    let (uid, gid) = match check_peer(stream, &limits.access) {
        Ok(ids) => ids,
        Err(message) => {
            refuse(ErrorCode::Perm, &message);
            if let Some(suppressed) = refusals.perm.admit() {
                tracing::warn!(suppressed, "refused a connection: {message}");
            }
            return None;
        }
    };
    let Ok(slot) = Arc::clone(slots).try_acquire_owned() else {
        refuse(
            ErrorCode::Busy,
            &format!(
                "too many connections (server.max_connections = {}); retry later",
                limits.max_connections
            ),
        );
        if let Some(suppressed) = refusals.busy.admit() {
            tracing::warn!(
                suppressed,
                "refused a connection: server.max_connections = {} reached",
                limits.max_connections
            );
        }
        return None;
    };
    let peer = in_flight.peer(uid, gid).with_admins(&limits.admins);
    let per_uid = limits.max_connections_per_uid;
    let Some(uid_slot) = peer.connection_slot(per_uid) else {
        refuse(
            ErrorCode::Busy,
            &format!(
                "too many connections from uid {uid} (server.max_connections_per_uid = {per_uid}); retry later"
            ),
        );
        if let Some(suppressed) = refusals.busy_uid.admit() {
            tracing::warn!(
                suppressed,
                "refused a connection: uid {uid} holds server.max_connections_per_uid = {per_uid} connections"
            );
        }
        return None;
    };
    Some(((slot, uid_slot), peer))
}

/// The peer's uid and gid, or `Err(message for the peer and the log)` if `access` does
/// not let it in. Credentials that cannot be read are "no id" (`u32::MAX`): refused by
/// any list, served where nothing is listed.
fn check_peer(stream: &UnixStream, access: &PeerAccess) -> Result<(u32, u32), String> {
    let cred = match stream.peer_cred() {
        Ok(cred) => cred,
        Err(_) if access.is_open() => return Ok((u32::MAX, u32::MAX)),
        Err(e) => return Err(format!("cannot read the peer's credentials: {e}")),
    };
    if access.allows(cred.uid(), cred.gid()) {
        return Ok((cred.uid(), cred.gid()));
    }
    let pid = cred.pid().map_or_else(|| "?".into(), |p| p.to_string());
    Err(format!(
        "peer pid {pid} uid {} gid {} is not in server.allow_uids / server.allow_gids",
        cred.uid(),
        cred.gid()
    ))
}
