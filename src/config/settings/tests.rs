//! The settings' unit tests: the production `[redis]` fields, the connections per uid,
//! and each `[redis]` mistake named with its field.

use crate::config::Config;

fn redis(table: &str) -> Result<Config, String> {
    Config::parse(&format!("[redis]\n{table}\n"), "t.toml").map_err(|e| e.to_string())
}

#[test]
fn production_redis_fields_parse() {
    let c = redis(
        "mode = \"cluster\"\nnodes = [\"a:1\"]\nusername = \"rl\"\n\
             password_file = \"/p\"\ntls = true\ntls_ca_file = \"/ca\"\n\
             tls_cert_file = \"/c\"\ntls_key_file = \"/k\"\ntls_server_name = \"redis.internal\"",
    )
    .unwrap();
    assert_eq!(c.redis.username.as_deref(), Some("rl"));
    assert!(c.redis.tls);
    let s = redis(
        "mode = \"sentinel\"\nsentinels = [\"s:26379\"]\nservice_name = \"mymaster\"\n\
             sentinel_password_file = \"/sp\"",
    )
    .unwrap();
    assert_eq!(s.redis.service_name.as_deref(), Some("mymaster"));
}

#[test]
fn connections_per_uid_default_to_half_and_stay_within_the_total() {
    let server = |t: &str| Config::parse(&format!("[server]\n{t}\n"), "t.toml");
    assert_eq!(server("").unwrap().server.max_connections_per_uid(), 500);
    let c = server("max_connections = 7").unwrap();
    assert_eq!(c.server.max_connections_per_uid(), 3);
    assert_eq!(
        server("max_connections = 1")
            .unwrap()
            .server
            .max_connections_per_uid(),
        1
    );
    let c = server("max_connections = 7\nmax_connections_per_uid = 7").unwrap();
    assert_eq!(c.server.max_connections_per_uid(), 7);
    let e = server("max_connections = 7\nmax_connections_per_uid = 8")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "t.toml:3: server.max_connections_per_uid: 8 is above server.max_connections = 7"
        ),
        "{e}"
    );
    let e = server("max_connections_per_uid = 0")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 2")
            && e.contains("server.max_connections_per_uid must be an integer from 1"),
        "{e}"
    );
}

#[test]
fn each_mistake_names_its_field() {
    for (table, field, says) in [
        ("password = \"x\"", "redis.password", "password_file"),
        (
            "tls_ca_file = \"/ca\"",
            "redis.tls_ca_file",
            "redis.tls = true",
        ),
        (
            "tls = true\ntls_cert_file = \"/c\"",
            "redis.tls_cert_file",
            "neither",
        ),
        ("mode = \"sentinel\"", "redis.sentinels", "at least one"),
        (
            "mode = \"sentinel\"\nsentinels = [\"nope\"]",
            "redis.sentinels",
            "host:port",
        ),
        (
            "mode = \"sentinel\"\nsentinels = [\"s:1\"]",
            "redis.service_name",
            "name the",
        ),
        ("sentinels = [\"s:1\"]", "redis.sentinels", "only with"),
        ("username = \"a b\"", "redis.username", "without spaces"),
    ] {
        let e = redis(table).unwrap_err();
        assert!(e.contains(field) && e.contains(says), "{table}: {e}");
        assert!(!e.contains("\"x\""), "the password value was echoed: {e}");
    }
}
