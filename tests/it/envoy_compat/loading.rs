//! The Envoy limits as files: what envoyproxy/ratelimit's loader rejects, ours rejects
//! too, each error naming file, line and field; a domain in two files; the files that
//! are not read; a relative `config_dir` found beside the TOML file.

use super::{dir_with, load};
use ratelimitd::config::Config;
use std::path::Path;

fn load_dir(dir: &Path) -> Result<Config, String> {
    load(&format!(
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"{}\"\n",
        dir.display()
    ))
}

#[test]
fn bad_files_are_errors_naming_file_line_and_field() {
    for (yaml, line, says) in [
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      burst: 3\n", 7, "unknown field"),
        ("domain: d\ndescriptors:\n  - key: k\n    key: j\n", 4, "duplicate key 'key' (first at line 3)"),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n", 5, "invalid rate limit unit 'fortnight'"),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n", 6, "should not specify rate limit unit when unlimited"),
        ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", 4, "duplicate descriptor composite key 'd.k'"),
        ("domain: d\ndescriptors:\n  - value: v\n", 3, "descriptor has empty key"),
        ("descriptors: []\n", 1, "empty domain"),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      replaces:\n        - name: a\n      unit: second\n      requests_per_unit: 1\n", 5, "replaces should not contain name of same descriptor"),
        ("domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", 5, "share_threshold can only be used with wildcard"),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6, "expected an integer"),
        ("domain: d\ndescriptors: [\n", 3, ""),
    ] {
        let dir = dir_with("limits.yaml", yaml);
        let e = load_dir(dir.path()).unwrap_err();
        let file = dir.path().join("limits.yaml").display().to_string();
        assert!(e.contains(&format!("{file}:{line}:")) && e.contains(says), "want {file}:{line}: {says}\ngot {e}");
    }
    // A domain in two files.
    let dir = dir_with("a.yaml", "domain: d\n");
    std::fs::write(dir.path().join("b.yml"), "domain: d\n").unwrap();
    let e = load_dir(dir.path()).unwrap_err();
    assert!(
        e.contains("b.yml:1:") && e.contains("duplicate domain 'd'"),
        "{e}"
    );
    // Other files and hidden ones are not read.
    let dir = dir_with("notes.txt", "not yaml: [");
    std::fs::write(dir.path().join(".x.yaml"), "not yaml: [").unwrap();
    assert!(load_dir(dir.path()).is_ok());
}

#[test]
fn a_relative_config_dir_is_relative_to_the_toml_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("limits")).unwrap();
    std::fs::write(dir.path().join("limits/d.yaml"), "domain: d\n").unwrap();
    let path = dir.path().join("ratelimitd.toml");
    std::fs::write(
        &path,
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"limits\"\n",
    )
    .unwrap();
    let config = Config::load(&path).unwrap();
    let limits = ratelimitd::envoy::load::limits_for(&config).unwrap();
    assert!(limits.unwrap().domains.contains_key("d"));
    std::fs::write(
        &path,
        "[envoy]\nlisten = \"127.0.0.1:0\"\nconfig_dir = \"nope\"\n",
    )
    .unwrap();
    let config = Config::load(&path).unwrap();
    let e = ratelimitd::envoy::load::limits_for(&config)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("nope") && e.contains("envoy.config_dir: cannot read the directory"),
        "{e}"
    );
}
