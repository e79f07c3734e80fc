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

/// The batch script of a standalone Redis: several decisions, of any algorithms, in one
/// EVALSHA (`lua/batch.lua` says how it is called and what it returns), each key
/// declared in `KEYS`. Built from the algorithms' own files: the prelude and their
/// shared parts once, then each algorithm's script as a function of its `ARGV`, in the
/// order of [`Kind::ALL`] (the index [`batch_args`] sends). The loop sets the
/// decision's key as `KEYS[1]` of a table the functions and the prelude's helpers
/// share.
pub fn batch_lua() -> String {
    batch_lua_from(DECLARED)
}

/// The batch script of Redis Cluster: [`batch_lua`] for keys of several slots of one
/// primary. A script's declared keys must share a slot, so one key is declared (to
/// route the call: [`cluster_batch_call`]) and every decision's key goes in `ARGV`,
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
/// Each decision's [`batch_args`] follow.
pub fn cluster_batch_call(
    keys: &[fred::types::Key],
    into: &mut Vec<Value>,
) -> Vec<fred::types::Key> {
    into.push(Value::Integer(keys.len() as i64));
    into.extend(keys.iter().cloned().map(Value::from));
    keys.first().cloned().into_iter().collect()
}

/// The batch script with `head` (where the keys come from, and `at`, the index of the
/// first decision's item in `ARGV`) in front.
fn batch_lua_from(first: &str) -> String {
    let mut lua = head(first);
    lua.push_str(include_str!("../../lua/batch.lua"));
    lua
}

/// One decision's share of the batch script's `ARGV`: its algorithm's index, the count
/// of its arguments, then `args` (what its own script would take:
/// [`super::scripts::args`] or [`super::scripts::peek_args`]).
pub fn batch_args(kind: Kind, args: &[Value], into: &mut Vec<Value>) {
    into.push(Value::Integer(kind as i64));
    into.push(Value::Integer(args.len() as i64));
    into.extend(args.iter().cloned());
}
