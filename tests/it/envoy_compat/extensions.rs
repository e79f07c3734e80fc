//! What ratelimitd adds to envoyproxy/ratelimit's configuration: a TOML `[[rule]]`
//! deciding a descriptor with any algorithm (`[[envoy.descriptor]]`), and the IETF
//! `RateLimit-Policy` / `RateLimit` headers.

use super::{ask, data_dir, dir_with, limit_of, load, service, MINUTE, OK, OVER};
use ratelimitd::admission::Peer;
use ratelimitd::envoy::service::Rls;
use ratelimitd::limiter::Limiter;
use std::sync::Arc;

#[test]
fn toml_rules_decide_descriptors_with_any_algorithm() {
    let dir = dir_with(
        "d.yaml",
        "domain: rides\ndescriptors:\n  - key: generic_key\n    value: checkout\n",
    );
    let toml = format!(
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"{}\"\n\n[[envoy.descriptor]]\ndomain = \"rides\"\nentries = [\"generic_key=checkout\", \"user_id\"]\nrule = \"checkout\"\n\n[[rule]]\nname = \"checkout\"\nalgorithm = \"token_bucket\"\ncapacity = 3\nrefill_rate = 0.001\n",
        dir.path().display()
    );
    let config = load(&toml).unwrap();
    let limiter = Arc::new(Limiter::local(&config));
    let rls = Rls::new(
        limiter,
        ratelimitd::envoy::load::limits_for(&config)
            .unwrap()
            .unwrap(),
        Peer::unbounded(0, 0),
    );
    let d = [("generic_key", "checkout"), ("user_id", "42")];
    let r = ask(&rls, "rides", &[&d], 3);
    // Its policy window (capacity ÷ refill rate = 50 min) reported in the longest unit
    // that fits: minutes.
    assert_eq!(
        (r.overall_code, limit_of(&r.statuses[0])),
        (OK, Some((3, MINUTE)))
    );
    assert_eq!(ask(&rls, "rides", &[&d], 1).overall_code, OVER);
    let other = [("generic_key", "checkout"), ("user_id", "43")];
    assert_eq!(ask(&rls, "rides", &[&other], 1).overall_code, OK);

    // Unknown rule, and a descriptor the YAML already limits.
    let e = load(&toml.replace("rule = \"checkout\"", "rule = \"nope\"")).unwrap_err();
    assert!(
        e.contains("envoy.descriptor[0].rule") && e.contains("no [[rule]] is named 'nope'"),
        "{e}"
    );
    let dir = dir_with("d.yaml", "domain: rides\ndescriptors:\n  - key: generic_key\n    value: checkout\n    descriptors:\n      - key: user_id\n        rate_limit: {unit: second, requests_per_unit: 1}\n");
    let toml2 = format!(
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"{}\"\n{}",
        dir.path().display(),
        &toml[toml.find("\n\n[[envoy").unwrap()..]
    );
    let e = load(&toml2).unwrap_err();
    assert!(
        e.contains("envoy.descriptor[0]")
            && e.contains("already has a limit")
            && e.contains("d.yaml:7"),
        "{e}"
    );
}

#[test]
fn ietf_headers_name_the_descriptor_closest_to_its_limit() {
    let config = load(&format!(
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"{}\"\nietf_headers = true\n",
        data_dir()
    ))
    .unwrap();
    let limiter = Arc::new(Limiter::local(&config));
    let rls = Rls::new(
        limiter,
        ratelimitd::envoy::load::limits_for(&config)
            .unwrap()
            .unwrap(),
        Peer::unbounded(0, 0),
    );
    let both: [&[(&str, &str)]; 2] = [
        &[("message_type", "marketing"), ("to_number", "2063333333")],
        &[("to_number", "2063333333")],
    ];
    let r = ask(&rls, "messaging", &both, 2);
    let headers: Vec<(String, String)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    assert_eq!(
        headers[0],
        ("RateLimit-Policy".into(), "\"default\";q=5;w=86400".into())
    );
    assert_eq!(headers[1].0, "RateLimit");
    assert!(
        headers[1].1.starts_with("\"default\";r=3;t="),
        "{headers:?}"
    );
    // No limit matched: no headers; off by default.
    assert!(ask(&rls, "nope", &[&[("a", "b")]], 1)
        .response_headers_to_add
        .is_empty());
    let plain = service(&data_dir());
    assert!(ask(&plain, "messaging", &both, 1)
        .response_headers_to_add
        .is_empty());
}
