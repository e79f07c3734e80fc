//! Prints the text of a script the daemon sends Redis, as the daemon builds it, for
//! tools that run it outside the daemon (`benches/script_instructions.sh`):
//!
//! ```text
//! cargo run -p ratelimitd-tools --bin script_text -- batch         # the batch script (lua/batch.lua)
//! cargo run -p ratelimitd-tools --bin script_text -- all_batch     # the all-or-nothing batch script (lua/all_batch.lua), standalone
//! cargo run -p ratelimitd-tools --bin script_text -- token_bucket  # an algorithm's own script
//! cargo run -p ratelimitd-tools --bin script_text -- lease_token_bucket  # its lease script
//! ```
//!
//! Run bare (and under `cargo test`), it checks that every algorithm has its
//! function in the batch script, and every lease script its own, and prints nothing.

use ratelimitd::algorithm::Kind;
use ratelimitd::store::multi::all_batch_lua;
use ratelimitd::store::scripts::batch_lua;
use std::process::ExitCode;

fn main() -> ExitCode {
    let wanted = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let Some(name) = wanted else {
        let missing = missing_in_batch();
        if missing.is_empty() {
            return ExitCode::SUCCESS;
        }
        eprintln!("script_text: the batch script lacks {missing:?}");
        return ExitCode::FAILURE;
    };
    if name == "batch" {
        print!("{}", batch_lua());
        return ExitCode::SUCCESS;
    }
    if name == "all_batch" {
        print!("{}", all_batch_lua(false));
        return ExitCode::SUCCESS;
    }
    let lease = name.strip_prefix("lease_").and_then(Kind::from_name);
    match (Kind::from_name(&name), lease.and_then(|k| k.spec().lease)) {
        (Some(kind), _) => {
            print!("{}", kind.spec().lua);
            ExitCode::SUCCESS
        }
        (None, Some(lua)) => {
            print!("{lua}");
            ExitCode::SUCCESS
        }
        (None, None) => {
            eprintln!(
                "script_text: no script named {name:?} (batch, all_batch, an algorithm's name, or lease_ and the name of one that takes leases)"
            );
            ExitCode::FAILURE
        }
    }
}

/// The algorithms whose decision's or lease call's function the batch script lacks
/// (none, when it is whole).
fn missing_in_batch() -> Vec<&'static str> {
    let batch = batch_lua();
    Kind::ALL
        .iter()
        .filter(|k| {
            let i = **k as usize;
            let leased = k.spec().lease.is_some();
            !batch.contains(&format!("local function decide_{i}("))
                || (leased && !batch.contains(&format!("local function lease_{i}(")))
        })
        .map(|k| k.spec().name)
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_batch_script_has_every_algorithm() {
        assert_eq!(super::missing_in_batch(), Vec::<&str>::new());
    }
}
