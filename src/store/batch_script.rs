//! The text of the scripts that run several calls of one primary in one EVALSHA, and
//! their arguments: the batch script (`lua/batch.lua`, [`super::batch`]) and the head
//! it shares with the all-or-nothing scripts ([`super::multi`]). Apart from
//! [`super::scripts`] (one algorithm's script, key, arguments and reply), which it
//! builds on: a script of several calls is assembled from the algorithms' own files, so
//! that each call runs exactly the operations of its own script.

use crate::algorithm::Kind;
use fred::types::Value;

/// The prelude, the shared parts and every algorithm as `decide_<index>(ARGV)` listed
/// in `algorithms`, for a loop over several keys, after `first` (where the keys come
/// from: [`DECLARED`] or [`CLUSTER_HEAD`]).
pub(super) fn head(first: &str) -> String {
    let mut lua = String::from(first);
    lua.push_str(include_str!("../../lua/prelude.lua"));
    let mut parts: Vec<&str> = Vec::new();
    for part in Kind::ALL.iter().flat_map(|k| k.spec().parts) {
        if !parts.contains(part) {
            parts.push(part);
            lua.push_str(part);
        }
    }
    let mut names = Vec::new();
    for kind in Kind::ALL {
        let name = format!("decide_{}", *kind as usize);
        lua.push_str(&format!("local function {name}(ARGV)\n"));
        lua.push_str(kind.spec().body);
        lua.push_str("\nend\n");
        names.push(name);
    }
    lua.push_str(&format!("local algorithms = {{{}}}\n", names.join(", ")));
    lua
}

/// The head of a script on several keys declared in `KEYS` (a standalone Redis):
/// `items` is `ARGV`, `keys` the declared keys, `at` 1; `ARGV` and `KEYS` emptied for
/// the algorithms.
pub(super) const DECLARED: &str =
    "local items, ARGV, keys, KEYS = ARGV, {}, KEYS, {}\nlocal at = 1\n";

/// The batch script of a standalone Redis: several decisions and lease calls, of any
/// algorithms, in one EVALSHA (`lua/batch.lua` says how it is called and what it
/// returns), each key declared in `KEYS`. Built from the algorithms' own files: the
/// prelude and their shared parts once, then each algorithm's script as a function of
/// its `ARGV`, in the order of [`Kind::ALL`], then each lease script so (the index
/// [`batch_args`] sends). The loop sets the call's key as `KEYS[1]` of a table the
/// functions and the prelude's helpers share.
pub fn batch_lua() -> String {
    batch_lua_from(DECLARED)
}

/// The batch script of Redis Cluster: [`batch_lua`] for keys of several slots of one
/// primary. A script's declared keys must share a slot, so one key is declared (to
/// route the call: [`cluster_batch_call`]) and every call's key goes in `ARGV`,
/// which Redis 7 and Valkey 8 allow with the `allow-cross-slot-keys` flag as long as
/// every key is the node's own. Redis checks each command the script runs as it checks
/// a command of a client: a key of a slot another node owns, a key absent from a slot
/// this node is migrating (it may have moved), and a key of a slot it is importing
/// raise an error before the command runs; the loop (`lua/batch.lua`) returns those as
/// `ALONE …`, to be sent on their own.
pub fn cluster_batch_lua() -> String {
    batch_lua_from(CLUSTER_HEAD)
}

/// The head of a Redis Cluster script on keys of several slots ([`cluster_batch_lua`]):
/// `keys` read from `ARGV` ([`cluster_batch_call`]), `at` the index of the first item
/// after them.
pub const CLUSTER_HEAD: &str = "#!lua flags=allow-cross-slot-keys\n\
     local items, ARGV, KEYS = ARGV, {}, {}\n\
     local keys, at = {}, tonumber(items[1]) + 2\n\
     for i = 1, at - 2 do\n  keys[i] = items[i + 1]\nend\n";

/// The cluster batch script's `KEYS` and the head of its `ARGV` for `keys`: the first
/// key declared (the call goes where it lives), then the count of keys and the keys.
/// Each call's [`batch_args`] follow.
pub fn cluster_batch_call(
    keys: &[fred::types::Key],
    into: &mut Vec<Value>,
) -> Vec<fred::types::Key> {
    into.push(Value::Integer(keys.len() as i64));
    into.extend(keys.iter().cloned().map(Value::from));
    keys.first().cloned().into_iter().collect()
}

/// The batch script with `head` (where the keys come from, and `at`, the index of the
/// first item in `ARGV`) in front: [`head`], then each lease script as a function
/// `lease_<index>(ARGV)` in `algorithms` after the decisions ([`lease_index`]), then the
/// loop.
fn batch_lua_from(first: &str) -> String {
    let mut lua = head(first);
    // An algorithm without a lease script: config validation never lets its rule take
    // leases, so only a bug sends one; its item fails, as the empty script would.
    lua.push_str("local function no_lease() error('ERR this algorithm takes no leases') end\n");
    for kind in Kind::ALL {
        let name = match lease_body(*kind) {
            Some(body) => {
                let name = format!("lease_{}", *kind as usize);
                lua.push_str(&format!("local function {name}(ARGV)\n"));
                lua.push_str(body);
                lua.push_str("\nend\n");
                name
            }
            None => "no_lease".to_owned(),
        };
        lua.push_str(&format!(
            "algorithms[{}] = {name}\n",
            lease_index(*kind) + 1
        ));
    }
    lua.push_str(include_str!("../../lua/batch.lua"));
    lua
}

/// A lease script's own text (`lua/lease.lua`, its parts, `lua/lease_<name>.lua`)
/// without the prelude, which a batch script holds once: the body of the lease call's
/// function there. `None` for an algorithm without leases.
pub fn lease_body(kind: Kind) -> Option<&'static str> {
    kind.spec()
        .lease?
        .strip_prefix(include_str!("../../lua/prelude.lua"))
}

/// The index of `kind`'s lease call in the batch script's `algorithms` (0-based, as
/// [`batch_args`] sends it): after every algorithm's decision.
pub fn lease_index(kind: Kind) -> usize {
    Kind::ALL.len() + kind as usize
}

/// One call's share of the batch script's `ARGV`: its function's index (an
/// algorithm's, for its decision: [`super::scripts::args`] or
/// [`super::scripts::peek_args`]; [`lease_index`] for its lease call:
/// [`super::scripts::lease_args`]), the count of its arguments, then `args`, what its
/// own script would take.
pub fn batch_args(index: usize, args: &[Value], into: &mut Vec<Value>) {
    into.push(Value::Integer(index as i64));
    into.push(Value::Integer(args.len() as i64));
    into.extend(args.iter().cloned());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_script_holds_each_lease_script_at_its_index() {
        let lua = batch_lua();
        for kind in Kind::ALL {
            let at = lease_index(*kind) + 1;
            match kind.spec().lease {
                Some(whole) => {
                    let body = lease_body(*kind).expect("the prelude in front");
                    assert_eq!(
                        format!("{}{body}", include_str!("../../lua/prelude.lua")),
                        whole
                    );
                    let f = format!(
                        "local function lease_{}(ARGV)\n{body}\nend\n",
                        *kind as usize
                    );
                    assert!(lua.contains(&f), "{}", kind.spec().name);
                    let listed = format!("algorithms[{at}] = lease_{}\n", *kind as usize);
                    assert!(lua.contains(&listed), "{listed}");
                }
                None => assert!(lua.contains(&format!("algorithms[{at}] = no_lease\n"))),
            }
        }
        assert!(cluster_batch_lua().contains("local function lease_0(ARGV)"));
    }

    /// A cluster batch runs a call only once Redis has checked its key as the node's
    /// own (`lua/batch.lua`), at the call's first command on its key: for a lease call,
    /// `read_state()`'s `HGETALL`, which each lease script runs before anything else,
    /// so a key refused there was never written.
    #[test]
    fn a_batched_lease_call_reads_its_key_before_any_write() {
        let lease = include_str!("../../lua/lease.lua");
        let first = lease
            .find("redis.call('")
            .map(|at| &lease[at + 12..])
            .and_then(|rest| rest.split('\'').next());
        assert_eq!(first, Some("HGETALL"), "lua/lease.lua's first command");
        let reads = "local fields, leases, asks = read_state(KEYS[1])";
        for kind in Kind::ALL {
            let Some(body) = lease_body(*kind) else {
                continue;
            };
            // The statements at the top level before it call nothing but tonumber():
            // every other line there is a comment, a function or its body.
            let mut read = false;
            for line in body.lines() {
                if line.starts_with(reads) {
                    read = true;
                    break;
                }
                let top = !line.starts_with([' ', '\t']) && !line.is_empty();
                if !top || line.starts_with("--") || line.starts_with("local function ") {
                    continue;
                }
                if line.starts_with("end") {
                    continue;
                }
                let bare = line.replace("tonumber(", "");
                assert!(!bare.contains('('), "{}: {line}", kind.spec().name);
            }
            assert!(read, "{}: starts with {reads}", kind.spec().name);
        }
    }
}
