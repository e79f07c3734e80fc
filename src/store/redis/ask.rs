//! Following an `ASK` redirection while a slot migrates between primaries.
//!
//! During a reshard (`CLUSTER SETSLOT … MIGRATING/IMPORTING`, then `MIGRATE` key by key)
//! the slot's old owner still answers for the keys it holds and answers
//! `ASK <slot> <host:port>` for those already moved. The script must then run on the new
//! owner right after an `ASKING` on the same connection, or the new owner answers
//! `MOVED` back (the slot is not yet its own). Both go as one fred pipeline, written
//! back to back on that primary's connection, so no other command comes between them.
//! The slot map does not change for it: the old owner keeps the slot until the
//! migration ends with `MOVED`, which refreshes the map.

use super::RedisStore;
use crate::store::StoreKey;
use fred::error::Error;
use fred::prelude::*;
use fred::types::scripts::Script;
use fred::types::{ClusterHash, CustomCommand};

/// The `host:port` an `ASK` error sends the command to.
pub(super) fn ask_target(e: &Error) -> Option<&str> {
    let mut words = e.details().strip_prefix("ASK ")?.split_whitespace();
    let _slot = words.next()?;
    words.next()
}

impl RedisStore {
    /// EVALSHA of `script` for `key` with `args` on the primary named `target` (an
    /// `ASK` redirection's), after an `ASKING`; its integer reply.
    ///
    /// # Errors
    /// `redirect` (the redirection itself) when `target` is not a primary of the slot
    /// map, or when the call there fails (e.g. an ACL without `+asking`), then with what
    /// failed appended: the caller handles it as the redirection it was (decided
    /// locally, the slot map refreshed, one warning naming the cause), and the old
    /// owner's breaker hears nothing of the new owner's failure.
    pub(super) async fn evalsha_asking(
        &self,
        target: &str,
        script: &Script,
        key: &StoreKey,
        args: Vec<Value>,
        redirect: Error,
    ) -> Result<Vec<i64>, Error> {
        let Some(primary) = self.topology.load().find(target).cloned() else {
            return Err(redirect);
        };
        Self::asking_then_evalsha(&primary.client, script, key, args)
            .await
            .map_err(|e| {
                let details = format!(
                    "{} (followed to {target}: {})",
                    redirect.details(),
                    e.details()
                );
                Error::new(redirect.kind().clone(), details)
            })
    }

    /// `ASKING` then EVALSHA of `script`, back to back on `client`'s connection.
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
        pipeline.last().await
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
        assert_eq!(ask_target(&Error::new(ErrorKind::Unknown, "ASK")), None);
    }
}
