//! Composite rules (`all_of`): `CHECK api k` is the `CHECKALL` of its members with the
//! same key and cost, decided by one script in one round trip on a standalone Redis;
//! when its burst denies, its daily quota is untouched; its members keep their own
//! state.

use crate::common;

use common::*;

const RULES: &str = r#"
[[rule]]
name = "api"
all_of = ["api_burst", "api_daily"]

[[rule]]
name = "api_burst"
algorithm = "token_bucket"
capacity = 3
refill_rate = 0.000001

[[rule]]
name = "api_daily"
algorithm = "fixed_window"
limit = 100
window = "1d"
"#;

#[test]
fn a_composite_burst_denies_and_its_daily_quota_is_untouched() {
    let redis = RedisStandalone::start();
    let d = Daemon::start(&format!(
        "[redis]\nmode = \"standalone\"\nnodes = [\"{}\"]\ntimeout_ms = 200\n[cache]\nttl_ms = 0\n{RULES}",
        redis.addr()
    ));
    let mut c = d.connect();
    assert!(wait_until(std::time::Duration::from_secs(10), || {
        parse_reply(&c.request("CHECK api_burst __ready 0")).source == "redis"
    }));
    let before = evalsha_calls(&redis.addr());
    let replies: Vec<String> = (0..5).map(|_| c.request("CHECK api k")).collect();
    let calls = evalsha_calls(&redis.addr()) - before;
    eprintln!("5 CHECKs of a composite of two members: {calls} EVALSHA");
    assert_eq!(calls, 5, "one round trip per decision: {replies:?}");
    for (i, r) in replies.iter().enumerate() {
        let f: Vec<&str> = r.split(' ').collect();
        assert_eq!(f.len(), 8, "{r}");
        assert_eq!(f[7], "api_burst", "the burst binds: {r}");
        assert_eq!(parse_reply(r).source, "redis");
        assert_eq!(r.starts_with("ALLOW"), i < 3, "{r}");
    }
    assert!(replies[0].starts_with("ALLOW 3 2 "));
    // The daily quota paid only for the three admitted.
    let daily = parse_reply(&c.request("CHECK api_daily k 0"));
    assert_eq!(daily.remaining, 97);
    // A member decided on its own sees what the composite took.
    assert!(c.request("CHECK api_burst k").starts_with("DENY 3 0 "));
    // The daily quota taken first and the burst denying after it, in one script: the
    // daily unit goes back before the script ends.
    assert!(c.request("CHECK api_burst m 3").starts_with("ALLOW 3 0 "));
    let r = c.request("CHECKALL api_daily m 1 api_burst m 1");
    assert!(
        r.starts_with("DENY 3 0 ") && r.ends_with(" api_burst"),
        "{r}"
    );
    assert_eq!(
        parse_reply(&c.request("CHECK api_daily m 0")).remaining,
        100
    );
    // And a composite may stand among CHECKALL's triples.
    let r = c.request("CHECKALL api j 1 api_daily j 1");
    assert!(
        r.starts_with("ALLOW 3 2 ") && r.ends_with(" api_burst"),
        "{r}"
    );
    assert_eq!(parse_reply(&c.request("CHECK api_daily j 0")).remaining, 98);
}
