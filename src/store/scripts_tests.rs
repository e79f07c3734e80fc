//! The scripts' unit tests: comment lines blanked without losing a line or any code,
//! keys with their tag and suffix, arguments' types, a reply's and a lease reply's tier
//! under an override, and a batched decision reading its key before any write.

use super::*;
use crate::algorithm::{token_bucket, WindowParams};

#[test]
fn blanked_comment_lines_keep_every_line_and_all_the_code() {
    let lua = "-- a comment\nlocal x = 1 -- kept\n  -- indented\nreturn x";
    assert_eq!(uncommented(lua), "\nlocal x = 1 -- kept\n\nreturn x");
    let scripts = Scripts::new(true);
    let texts = [batch_lua(), super::super::multi::all_batch_lua(false)];
    for text in texts
        .iter()
        .map(String::as_str)
        .chain(Kind::ALL.iter().map(|k| k.spec().lua))
    {
        // No long string or long comment, whose lines a blanked line could be.
        assert!(
            !text.contains("[[") && !text.contains("[="),
            "a long bracket"
        );
        assert_eq!(uncommented(text).lines().count(), text.lines().count());
    }
    assert_eq!(scripts.all().len(), 2 * Kind::ALL.len() + 4);
}

#[test]
fn keys_carry_the_tag_and_the_suffix() {
    let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.0, 1));
    assert_eq!(key("rl", "r:k", &tb), "rl:{r:k}:tb");
    let fw = Params::FixedWindow(WindowParams::shared(3, 1000, 1));
    assert_eq!(key("rl", "r:a}b", &fw), "rl:{r:a b}:fw");
}

#[test]
fn a_reply_under_an_override_carries_its_tier() {
    assert_eq!(outcome(&[1, 2, 3, 4]).unwrap().tier, None);
    let bits = 0.5f64.to_bits();
    let o = outcome(&[
        1,
        2,
        3,
        4,
        7,
        (bits >> 32) as i64,
        (bits & 0xffff_ffff) as i64,
    ]);
    let tier = o.unwrap().tier.unwrap();
    assert_eq!((tier.limit, tier.per_bits), (7, bits));
    assert!(outcome(&[1, 2, 3, 4, 5]).is_err());
}

#[test]
fn a_lease_reply_under_an_override_carries_its_tier_and_no_grant() {
    let tb = Params::TokenBucket(token_bucket::Params::shared(20, 10.0, 1));
    let mut reply = vec![1, 4, 300, 0, 0, 0, 0, 2_000_000, 0, 0, 9, 0];
    let (o, g) = lease_reply(&tb, &reply).unwrap();
    assert_eq!((o.tier, g.returned, g.last_grant), (None, 2_000_000, 9));
    let bits = 2.5f64.to_bits();
    reply.extend([5, (bits >> 32) as i64, (bits & 0xffff_ffff) as i64]);
    let (o, g) = lease_reply(&tb, &reply).unwrap();
    let tier = o.tier.unwrap();
    assert_eq!((tier.limit, tier.per_bits, o.remaining), (5, bits, 4));
    assert_eq!((g.units, g.grant, g.returned), (0, 0, 2_000_000));
    assert!(lease_reply(&tb, &reply[..13]).is_err());
}

#[test]
fn counts_go_as_integers_rates_as_doubles() {
    let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.5, 1));
    assert_eq!(
        args(&tb, 1),
        vec![
            Value::Integer(2_000_000),
            Value::Double(1.5),
            Value::Integer(1_000_000)
        ]
    );
    let shared = Params::FixedWindow(WindowParams::shared(10, 1000, 4));
    assert_eq!(args(&shared, 2)[0], Value::Double(2.5));
}

/// A cluster batch decides a key only once Redis has checked it as the node's own
/// (`lua/batch.lua`): that check comes at the decision's first command on its key,
/// which for every batched algorithm must be a read, so a key refused there was
/// never written (the prelude's and the shared parts' writes come after it).
#[test]
fn a_batched_decision_reads_its_key_before_any_write() {
    let calls = |lua: &str| {
        lua.match_indices("redis.call('")
            .map(|(at, m)| {
                let rest = &lua[at + m.len()..];
                rest[..rest.find('\'').unwrap_or(0)].to_owned()
            })
            .collect::<Vec<_>>()
    };
    for kind in Kind::ALL
        .iter()
        .filter(|k| crate::store::batch::batchable(**k))
    {
        let spec = kind.spec();
        for part in spec.parts {
            assert!(
                calls(part).is_empty(),
                "{}: a shared part calls Redis",
                spec.name
            );
        }
        let first = calls(spec.body);
        assert_eq!(
            first.first().map(String::as_str),
            Some("HMGET"),
            "{}: first command on its key",
            spec.name
        );
    }
    assert!(cluster_batch_lua().starts_with("#!lua flags=allow-cross-slot-keys\n"));
}
