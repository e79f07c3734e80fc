//! Following a redirection: an `ASK` while a slot migrates between primaries, a `MOVED`
//! once it has moved and before the slot map says so.
//!
//! During a reshard (`CLUSTER SETSLOT … MIGRATING/IMPORTING`, then `MIGRATE` key by key)
//! the slot's old owner still answers for the keys it holds and answers
//! `ASK <slot> <host:port>` for those already moved. The script must then run on the new
//! owner right after an `ASKING` on the same connection, or the new owner answers
//! `MOVED` back (the slot is not yet its own). Both go as one fred pipeline, written
//! back to back on that primary's connection, so no other command comes between them.
//! The slot map does not change for it: the old owner keeps the slot until the
//! migration ends with `MOVED`, which refreshes the map. A `MOVED` is followed once to
//! the owner it names when that is a primary of the map (the new owner checks the key
//! itself: a wrong guess is its own `MOVED`, decided locally as before).

use super::RedisStore;
use crate::store::gate::{self, Gate};
use crate::store::StoreKey;
use fred::error::Error;
use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};
use std::time::Duration;

/// The `host:port` an `ASK` error sends the command to.
pub(super) fn ask_target(e: &Error) -> Option<&str> {
    let mut words = e.details().strip_prefix("ASK ")?.split_whitespace();
    let _slot = words.next()?;
    words.next()
}

/// The `host:port` an `ASK` or `MOVED` error sends the command to, and whether it is an
/// `ASK` (the call there needs an `ASKING` first).
pub(super) fn redirect_target(e: &Error) -> Option<(&str, bool)> {
    if let Some(target) = ask_target(e) {
        return Some((target, true));
    }
    let mut words = e.details().strip_prefix("MOVED ")?.split_whitespace();
    let _slot = words.next()?;
    words.next().map(|t| (t, false))
}

/// Where a redirection sends a call.
pub(super) struct Redirect<'a> {
    /// `host:port`.
    pub target: &'a str,
    /// An `ASK`: `ASKING` first.
    pub asking: bool,
    /// The primary that redirected it.
    pub from: &'a str,
    /// A lease call's gate: it goes only while its caller waits
    /// ([`crate::store::gate`]).
    pub gate: Option<&'a Gate>,
}

impl RedisStore {
    /// [`RedisStore::evalsha_asking`] for an `ASK`; for a `MOVED`, the same without the
    /// `ASKING`, and only to a primary of the slot map other than the one that answered
    /// (else `redirect` as it is: decided locally, the map refreshed).
    ///
    /// # Errors
    /// As [`RedisStore::evalsha_asking`].
    pub(super) async fn evalsha_redirected(
        &self,
        to: Redirect<'_>,
        script: &Script,
        key: &StoreKey,
        args: Vec<Value>,
        redirect: Error,
        budget: Duration,
    ) -> Result<Vec<i64>, Error> {
        if to.asking {
            return self
                .evalsha_asking(to, script, key, args, redirect, budget)
                .await;
        }
        let Some(primary) = self.topology.load().find(to.target).cloned() else {
            return Err(redirect);
        };
        if to.target == to.from || primary.health.is_open() || !primary.client.is_connected() {
            return Err(redirect);
        }
        let call = gate::send(to.gate, || {
            script.evalsha::<Vec<i64>, _, _, _>(&primary.client, key.0.clone(), args)
        });
        let followed = |why: &str| {
            let details = format!("{} (followed to {}: {why})", redirect.details(), to.target);
            Error::new(redirect.kind().clone(), details)
        };
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(followed(e.details())),
            Err(_) => Err(followed("no answer within redis.timeout_ms")),
        }
    }

    /// EVALSHA of `script` for `key` with `args` on the primary `to` names (an `ASK`
    /// redirection's), after an `ASKING`, within `budget` (what is left of the
    /// decision's `redis.timeout_ms`, so that this call, not the old owner, is what ran
    /// out of time); its integer reply.
    ///
    /// # Errors
    /// `redirect` (the redirection itself) when `target` is not a primary of the slot
    /// map (a node that announces a hostname, or a new node that owns no slot yet), its
    /// breaker is open or it is not connected; or when the call there fails or takes
    /// longer than `budget` (e.g. an ACL without `+asking`), then with what failed
    /// appended. The caller handles it as the redirection it was (decided locally, the
    /// slot map refreshed, one warning naming the cause), and the old owner's breaker
    /// hears nothing of the new owner's failure.
    async fn evalsha_asking(
        &self,
        to: Redirect<'_>,
        script: &Script,
        key: &StoreKey,
        args: Vec<Value>,
        redirect: Error,
        budget: Duration,
    ) -> Result<Vec<i64>, Error> {
        let target = to.target;
        let followed = |why: &str| {
            let details = format!("{} (followed to {target}: {why})", redirect.details());
            Error::new(redirect.kind().clone(), details)
        };
        let Some(primary) = self.topology.load().find(target).cloned() else {
            return Err(redirect);
        };
        if primary.health.is_open() || !primary.client.is_connected() {
            return Err(followed("that primary is down"));
        }
        let call = gate::send(to.gate, || {
            Self::asking_then_evalsha(&primary.client, script, key, args)
        });
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(e)) => Err(followed(e.details())),
            Err(_) => Err(followed("no answer within redis.timeout_ms")),
        }
    }

    /// `ASKING` then EVALSHA of `script`, back to back on `client`'s connection; the
    /// first error of the two (a refused `ASKING` would make the EVALSHA's a `MOVED`).
    async fn asking_then_evalsha(
        client: &Client,
        script: &Script,
        key: &StoreKey,
        args: Vec<Value>,
    ) -> Result<Vec<i64>, Error> {
        // EVALSHA as a custom command: fred's pipelines have no Lua interface.
        let pipeline = client.pipeline();
        let asking = CustomCommand::new_static("ASKING", ClusterHash::Random, false);
        let () = pipeline.custom(asking, Vec::<Value>::new()).await?;
        let evalsha = CustomCommand::new_static("EVALSHA", ClusterHash::Random, false);
        let mut call: Vec<Value> = Vec::with_capacity(3 + args.len());
        call.push(Value::from(script.sha1().clone()));
        call.push(Value::from(1));
        call.push(Value::from(key.0.clone()));
        call.extend(args);
        let () = pipeline.custom(evalsha, call).await?;
        let mut replies = pipeline.try_all::<Value>().await.into_iter();
        match (replies.next(), replies.next()) {
            (Some(Ok(_)), Some(reply)) => reply?.convert(),
            (Some(Err(e)), _) => Err(e),
            _ => Err(Error::new(
                fred::error::ErrorKind::Protocol,
                "no reply to ASKING and EVALSHA",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fred::error::ErrorKind;

    #[test]
    fn reads_the_target_of_an_ask() {
        let ask = Error::new(ErrorKind::Unknown, "ASK 3999 127.0.0.1:7002");
        assert_eq!(ask_target(&ask), Some("127.0.0.1:7002"));
        let moved = Error::new(ErrorKind::Unknown, "MOVED 3999 127.0.0.1:7002");
        assert_eq!(ask_target(&moved), None);
        assert_eq!(redirect_target(&moved), Some(("127.0.0.1:7002", false)));
        assert_eq!(redirect_target(&ask), Some(("127.0.0.1:7002", true)));
        assert_eq!(ask_target(&Error::new(ErrorKind::Unknown, "ASK")), None);
    }
}
