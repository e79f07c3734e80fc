//! Who may use what (the operator verbs included: `server.admin_uids` / `admin_gids`),
//! and how much of Redis and of the daemon one application may hold:
//! the peer of a connection (uid and gid from `SO_PEERCRED`), the uid/gid lists of
//! `[server]` and of each rule, the daemon-wide cap on requests in flight to Redis with
//! its share per uid, and each uid's share of the connections
//! (`server.max_connections_per_uid`).
//!
//! Why a cap: every `CHECK` that goes to Redis queues in Redis behind the ones already
//! sent. Without a bound, one application pipelining on many connections fills that
//! queue, every other application's decisions wait behind it (or time out and trip the
//! circuit for everyone). With `server.redis_max_in_flight` for the whole daemon and
//! `server.redis_max_in_flight_per_uid` per peer uid, one uid can hold at most its share
//! and the rest stays for the others; a request beyond either bound is answered
//! `ERR BUSY` at once, without touching Redis.
//!
//! A slot is held until Redis has answered (or the Redis client gave up on the command),
//! not merely until the caller's `redis.timeout_ms` ran out: a decision that timed out
//! still sits in Redis' queue, so it still counts.
//!
//! Connections are shared the same way: `server.max_connections` for the daemon, and
//! `server.max_connections_per_uid` (default half of it) per peer uid, so one
//! application opening connections in a loop leaves the rest for the others.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

pub use crate::config::PeerAccess;

/// The bounds on requests in flight to Redis (`[server]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightLimits {
    /// For the whole daemon (`server.redis_max_in_flight`).
    pub total: usize,
    /// Per peer uid (`server.redis_max_in_flight_per_uid`).
    pub per_uid: usize,
}

impl InFlightLimits {
    /// No practical bound (tests, benchmarks of the limiter alone).
    pub const UNBOUNDED: InFlightLimits = InFlightLimits {
        total: usize::MAX / 2,
        per_uid: usize::MAX / 2,
    };
}

/// The daemon-wide count of requests in flight to Redis, and one count per peer uid
/// with a connection open.
#[derive(Debug)]
pub struct InFlight {
    limits: InFlightLimits,
    total: AtomicUsize,
    /// The counts of each uid with a connection open (an entry goes when its last
    /// connection and its last request in flight are gone).
    uids: Mutex<HashMap<u32, Weak<UidShare>>>,
}

/// What one peer uid holds: requests in flight to Redis, connections open.
#[derive(Debug, Default)]
struct UidShare {
    in_flight: AtomicUsize,
    connections: AtomicUsize,
}

impl InFlight {
    /// Counts for `limits`.
    pub fn new(limits: InFlightLimits) -> Arc<Self> {
        Arc::new(InFlight {
            limits,
            total: AtomicUsize::new(0),
            uids: Mutex::new(HashMap::new()),
        })
    }

    /// The bounds.
    pub fn limits(&self) -> InFlightLimits {
        self.limits
    }

    /// Requests in flight to Redis now, for the whole daemon.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// The peer of a new connection, sharing its uid's count with the uid's other
    /// connections.
    pub fn peer(self: &Arc<Self>, uid: u32, gid: u32) -> Peer {
        let mut uids = self.uids.lock().unwrap_or_else(|e| e.into_inner());
        let share = match uids.get(&uid).and_then(Weak::upgrade) {
            Some(share) => share,
            None => {
                // Drop the entries of uids that are gone before adding one: the map
                // stays as large as the uids with a connection open.
                uids.retain(|_, w| w.strong_count() > 0);
                let share = Arc::new(UidShare::default());
                uids.insert(uid, Arc::downgrade(&share));
                share
            }
        };
        Peer {
            uid,
            gid,
            admin: false,
            share,
            in_flight: Arc::clone(self),
        }
    }
}

/// Takes one unit of `counter` if it stays within `max`.
fn take(counter: &AtomicUsize, max: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        })
        .is_ok()
}

/// The peer of one connection: who it is, and its uid's share of the Redis slots.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Peer uid (`SO_PEERCRED`).
    pub uid: u32,
    /// Peer effective gid.
    pub gid: u32,
    /// May use the operator verbs ([`Peer::with_admins`]).
    admin: bool,
    share: Arc<UidShare>,
    in_flight: Arc<InFlight>,
}

impl Peer {
    /// A peer with no bound on its Redis requests (tests, benchmarks).
    pub fn unbounded(uid: u32, gid: u32) -> Peer {
        InFlight::new(InFlightLimits::UNBOUNDED).peer(uid, gid)
    }

    /// This peer, marked as an operator if `admins` (`server.admin_uids` /
    /// `admin_gids`) lists its uid or gid; empty lists name nobody.
    pub fn with_admins(mut self, admins: &PeerAccess) -> Peer {
        self.admin = admins.lists(self.uid, self.gid);
        self
    }

    /// True if this peer may use the operator verbs (`INSPECT`, `RESET`, `RULES`, `TOP`);
    /// others get `ERR PERM` for them, and their `CHECK`s are unaffected.
    pub fn is_admin(&self) -> bool {
        self.admin
    }

    /// True if `access` lets this peer in.
    pub fn may(&self, access: &PeerAccess) -> bool {
        access.allows(self.uid, self.gid)
    }

    /// One slot for a request to Redis, or `None` if this peer's uid holds its share or
    /// the daemon is at its cap (the request is then answered `ERR BUSY`).
    pub fn call_permit(&self) -> Option<CallPermit> {
        let limits = self.in_flight.limits;
        if !take(&self.share.in_flight, limits.per_uid) {
            return None;
        }
        if !take(&self.in_flight.total, limits.total) {
            self.share.in_flight.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(CallPermit {
            share: Some(Arc::clone(&self.share)),
            in_flight: Arc::clone(&self.in_flight),
        })
    }

    /// One slot of the daemon's cap only, for a call to Redis that no client waits for
    /// (the deny cache's refresh): it does not count against the uid's share, which
    /// bounds what a client itself has waiting. `None` when the daemon is at its cap.
    pub fn background_permit(&self) -> Option<CallPermit> {
        if !take(&self.in_flight.total, self.in_flight.limits.total) {
            return None;
        }
        Some(CallPermit {
            share: None,
            in_flight: Arc::clone(&self.in_flight),
        })
    }

    /// The bounds of the requests in flight to Redis.
    pub fn in_flight_limits(&self) -> InFlightLimits {
        self.in_flight.limits
    }

    /// Requests of this peer's uid in flight to Redis now.
    pub fn uid_in_flight(&self) -> usize {
        self.share.in_flight.load(Ordering::Relaxed)
    }

    /// One of its uid's connections, if the uid holds fewer than `max`
    /// (`server.max_connections_per_uid`); given back when the [`UidConnection`] drops.
    pub fn connection_slot(&self, max: usize) -> Option<UidConnection> {
        take(&self.share.connections, max).then(|| UidConnection(Arc::clone(&self.share)))
    }

    /// Connections of this peer's uid open now (admitted ones).
    pub fn uid_connections(&self) -> usize {
        self.share.connections.load(Ordering::Relaxed)
    }
}

/// One connection counted in its uid's share; given back on drop.
#[derive(Debug)]
pub struct UidConnection(Arc<UidShare>);

impl Drop for UidConnection {
    fn drop(&mut self) {
        self.0.connections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One request in flight to Redis; the slot is given back on drop.
#[derive(Debug)]
pub struct CallPermit {
    /// The uid's share it counts in (`None`: a background call, the daemon's cap only).
    share: Option<Arc<UidShare>>,
    in_flight: Arc<InFlight>,
}

impl Drop for CallPermit {
    fn drop(&mut self) {
        if let Some(share) = &self.share {
            share.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.in_flight.total.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::UntilDone;
    use std::time::Duration;

    #[test]
    fn access_lists() {
        let open = PeerAccess::default();
        assert!(open.allows(1, 1) && open.is_open());
        let a = PeerAccess {
            uids: vec![10],
            gids: vec![20],
        };
        assert!(a.allows(10, 0) && a.allows(0, 20) && !a.allows(11, 21));
    }

    #[test]
    fn operators_are_listed_ones_only() {
        let f = InFlight::new(InFlightLimits::UNBOUNDED);
        let root_only = PeerAccess {
            uids: vec![0],
            gids: vec![],
        };
        assert!(f.peer(0, 0).with_admins(&root_only).is_admin());
        assert!(!f.peer(1000, 0).with_admins(&root_only).is_admin());
        assert!(!f.peer(0, 0).is_admin(), "not an operator unless marked");
        let group = PeerAccess {
            uids: vec![],
            gids: vec![4],
        };
        assert!(f.peer(1000, 4).with_admins(&group).is_admin());
        // Empty lists name nobody (unlike the allow-lists, where they let all in).
        assert!(!f.peer(0, 0).with_admins(&PeerAccess::default()).is_admin());
    }

    #[test]
    fn a_background_slot_counts_in_the_total_only() {
        let f = InFlight::new(InFlightLimits {
            total: 2,
            per_uid: 1,
        });
        let a = f.peer(1, 1);
        let bg = a.background_permit().expect("a background slot");
        assert_eq!(a.uid_in_flight(), 0, "not in the uid's share");
        let held = a.call_permit().expect("the uid's own slot");
        assert!(
            a.background_permit().is_none(),
            "the daemon is at its total"
        );
        drop(bg);
        assert!(a.background_permit().is_some());
        drop(held);
        assert_eq!(a.uid_in_flight(), 0);
    }

    #[test]
    fn a_uid_holds_at_most_its_share_and_the_daemon_its_total() {
        let f = InFlight::new(InFlightLimits {
            total: 5,
            per_uid: 3,
        });
        let (a1, a2, b) = (f.peer(1, 1), f.peer(1, 1), f.peer(2, 2));
        let mut held: Vec<CallPermit> = (0..3).map(|_| a1.call_permit().unwrap()).collect();
        // The uid's second connection shares its count.
        assert!(a2.call_permit().is_none() && a1.call_permit().is_none());
        assert_eq!(a2.uid_in_flight(), 3);
        held.push(b.call_permit().unwrap());
        held.push(b.call_permit().unwrap());
        // The daemon is at its total: uid 2 is below its share but refused.
        assert!(b.call_permit().is_none());
        assert_eq!(b.uid_in_flight(), 2);
        assert_eq!(f.total(), 5);
        held.truncate(1);
        assert_eq!(f.total(), 1);
        assert!(a2.call_permit().is_some());
    }

    #[tokio::test]
    async fn a_call_dropped_unfinished_keeps_its_slot_until_it_ends() {
        let f = InFlight::new(InFlightLimits {
            total: 1,
            per_uid: 1,
        });
        let peer = f.peer(1, 1);
        let slot = peer.call_permit().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let mut call = UntilDone::new(
            async move {
                let _ = rx.await;
                drop(slot);
            },
            Duration::from_secs(10),
        );
        // The caller gives up (a timeout), then drops the call.
        assert!(tokio::time::timeout(Duration::from_millis(10), &mut call)
            .await
            .is_err());
        drop(call);
        assert_eq!(f.total(), 1, "still in flight");
        assert!(peer.call_permit().is_none());
        tx.send(()).unwrap();
        for _ in 0..100 {
            if f.total() == 0 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(f.total(), 0, "freed once the call ended");
        assert!(peer.call_permit().is_some());
    }

    #[test]
    fn a_uid_holds_at_most_its_connections() {
        let f = InFlight::new(InFlightLimits::UNBOUNDED);
        let (a1, a2, b) = (f.peer(1, 1), f.peer(1, 1), f.peer(2, 2));
        let mut held: Vec<UidConnection> = (0..2).map(|_| a1.connection_slot(2).unwrap()).collect();
        // The uid's second peer shares its count; another uid has its own.
        assert!(a2.connection_slot(2).is_none());
        assert_eq!(a2.uid_connections(), 2);
        held.push(b.connection_slot(2).unwrap());
        assert_eq!(b.uid_connections(), 1);
        held.remove(0);
        assert_eq!(a1.uid_connections(), 1);
        assert!(a2.connection_slot(2).is_some());
    }

    #[test]
    fn uids_without_connections_leave_the_map() {
        let f = InFlight::new(InFlightLimits::UNBOUNDED);
        for uid in 0..100 {
            drop(f.peer(uid, 0));
        }
        let _p = f.peer(1000, 0);
        assert_eq!(f.uids.lock().unwrap().len(), 1);
    }
}
