//! One call's item of a batch script's reply (`lua/batch.lua`, `lua/all_batch.lua`)
//! read as its own script's reply would be: its integers, or its error classified as a
//! lone call's error is ([`super::StoreError::from_redis`]), or a key Redis Cluster
//! refused as not the node's own. Apart from the batches' sending ([`super::batch`]),
//! which both kinds of batch share it with.

use fred::error::{Error, ErrorKind};
use fred::types::Value;

/// What a call's own script replied, or its error.
pub type Reply = Result<Vec<i64>, Error>;

/// One call's part of a batch script's reply: its script's integers, or the text
/// of its error; `None` for a key Redis refused as not the node's own (`ALONE …`).
pub(in crate::store) fn item_reply(item: Value) -> Option<Reply> {
    let text = match item {
        Value::Array(values) => {
            return Some(
                values
                    .into_iter()
                    .map(|v| match v {
                        Value::Integer(i) => Ok(i),
                        other => Err(Error::new(
                            ErrorKind::Parse,
                            format!("script returned {other:?} where an integer was expected"),
                        )),
                    })
                    .collect(),
            )
        }
        Value::String(text) => text.to_string(),
        Value::Bytes(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        other => {
            return Some(Err(Error::new(
                ErrorKind::Parse,
                format!("batch script returned {other:?} for one call"),
            )))
        }
    };
    match text.starts_with("ALONE ") {
        true => None,
        false => Some(Err(item_error(&text))),
    }
}

/// The error a call's own EVALSHA would have got for the error text `text` (the
/// kinds fred gives the error replies a decision script can meet), so that it is
/// classified as without batching ([`super::StoreError::from_redis`]).
fn item_error(text: &str) -> Error {
    let kind = match text.split_whitespace().next() {
        Some("WRONGTYPE") => ErrorKind::InvalidArgument,
        Some("NOAUTH" | "WRONGPASS") => ErrorKind::Auth,
        Some("MOVED" | "ASK" | "CLUSTERDOWN") => ErrorKind::Cluster,
        _ => ErrorKind::Unknown,
    };
    Error::new(kind, text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;

    #[test]
    fn an_item_reads_as_its_own_script_reply() {
        let ok = Value::Array(vec![1.into(), 4.into(), 1000.into(), 0.into()]);
        assert_eq!(
            item_reply(ok).and_then(Result::ok),
            Some(vec![1, 4, 1000, 0])
        );
        let bad = Value::Array(vec![1.into(), Value::from("x")]);
        assert!(matches!(item_reply(bad), Some(Err(_))));
        let refused =
            Value::from("ALONE ERR Script attempted to access a non local key in a cluster node");
        assert!(item_reply(refused).is_none());
    }

    #[test]
    fn item_errors_are_classified_as_a_lone_call_s() {
        let key = |text: &str| {
            let e = item_reply(Value::from(text))
                .and_then(Result::err)
                .map(StoreError::from_redis);
            matches!(e, Some(StoreError::Key(_)))
        };
        // The key's own problem: decided without Redis, Redis stays in use.
        assert!(key(
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        ));
        assert!(key("ERR user_script:3: attempt to index a nil value"));
        // Redis cannot decide: the breaker hears it.
        assert!(!key(
            "OOM command not allowed when used memory > 'maxmemory'."
        ));
        assert!(!key(
            "ERR The user executing the script can't run this command"
        ));
        assert!(!key(
            "ERR ACL failure in script: User ratelimitd has no permissions to run the 'pexpire' command"
        ));
        // Redis 5 and 6 raise a script's Redis error as text: the batch script keeps it
        // behind "ERR", as those versions' own EVAL error does.
        assert!(!key(
            "ERR @user_script: 3: -OOM command not allowed when used memory > 'maxmemory'."
        ));
    }
}
