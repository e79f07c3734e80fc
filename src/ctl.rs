//! `ratelimitd ctl`: the operator verbs (docs/PROTOCOL.md "Operator verbs") from a
//! shell. It connects to the daemon's socket (`--socket`, else the `server.socket` of
//! `--config`, else of /etc/ratelimitd/ratelimitd.toml when it exists, else the default
//! socket), sends one request, and prints the reply: readable by default, the
//! daemon's own JSON (or `INSPECT`'s fields as a JSON object) with `--json`.
//!
//! Blocking std I/O: one request, one reply, no runtime needed. Exit status: 0 done, 1
//! the daemon refused (`ERR …`, printed on stderr) or could not be reached, 2 a bad
//! argument or configuration.

use clap::{Args, Subcommand};
use ratelimitd::config::{Config, ServerConfig};
use serde_json::{Map, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

/// The configuration read when neither `--socket` nor `--config` is given.
const DEFAULT_CONFIG: &str = "/etc/ratelimitd/ratelimitd.toml";
/// How long a reply may take (a Redis call is bounded by `redis.timeout_ms`, far less).
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// `ratelimitd ctl`: ask a running daemon (operators only: `server.admin_uids`).
#[derive(Args, Debug)]
pub struct Ctl {
    /// The daemon's socket (default: server.socket of --config).
    #[arg(long, global = true, value_name = "PATH", value_hint = clap::ValueHint::FilePath)]
    socket: Option<PathBuf>,
    /// Configuration whose server.socket to use (default: /etc/ratelimitd/ratelimitd.toml).
    #[arg(long, short = 'c', global = true, value_name = "PATH", value_hint = clap::ValueHint::FilePath)]
    config: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    verb: Verb,
}

/// The operator verbs.
#[derive(Subcommand, Debug)]
enum Verb {
    /// A key's state (a CHECK of cost 0, nothing taken), the rule's parameters, and
    /// what this daemon holds for the key.
    Inspect {
        /// Rule name.
        rule: String,
        /// Key, as applications send it (printable ASCII, no space).
        key: String,
    },
    /// Delete a key's state: in Redis, in this daemon's deny cache and local buckets.
    Reset {
        /// Rule name.
        rule: String,
        /// Key, as applications send it.
        key: String,
    },
    /// Give a key other parameters of its rule's algorithm at run time, on every
    /// daemon (stored in Redis beside the key), or clear them.
    Override {
        /// Rule name.
        rule: String,
        /// Key, as applications send it.
        key: String,
        /// `param=value` pairs (capacity, refill_rate, leak_rate, limit, window) and an
        /// optional `ttl=<duration>`; or `clear`.
        #[arg(required = true, num_args = 1..)]
        params: Vec<String>,
    },
    /// Every rule and its parameters.
    Rules,
    /// This daemon's hottest keys of a rule over the last minute.
    Top {
        /// Rule name.
        rule: String,
        /// How many keys (1-1000; at most 128 come back).
        #[arg(default_value_t = 10)]
        n: u32,
    },
}

/// Runs `ctl`; prints the reply or the error.
pub fn run(ctl: Ctl) -> ExitCode {
    let line = match ctl.verb.request() {
        Ok(line) => line,
        Err(e) => return fail(2, &e),
    };
    let socket = match socket_of(ctl.socket, ctl.config) {
        Ok(s) => s,
        Err(e) => return fail(2, &e),
    };
    let reply = match ask(&socket, &line) {
        Ok(reply) => reply,
        Err(e) => return fail(1, &format!("{}: {e}", socket.display())),
    };
    if reply.starts_with("ERR ") {
        return fail(1, &reply);
    }
    let out = if ctl.json {
        ctl.verb.json(&reply)
    } else {
        ctl.verb.text(&reply)
    };
    match out {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(1, &format!("unexpected reply ({e}): {reply}")),
    }
}

fn fail(code: u8, message: &str) -> ExitCode {
    eprintln!("ratelimitd ctl: {message}");
    ExitCode::from(code)
}

/// Where to connect: `socket`, else `server.socket` of `config` (or of the default
/// configuration when it exists), else the default socket.
fn socket_of(socket: Option<PathBuf>, config: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(socket) = socket {
        return Ok(socket);
    }
    let config = match config {
        Some(c) => c,
        None if Path::new(DEFAULT_CONFIG).exists() => PathBuf::from(DEFAULT_CONFIG),
        None => return Ok(ServerConfig::default().socket),
    };
    Config::load(&config)
        .map(|c| c.server.socket)
        .map_err(|e| e.to_string())
}

/// Sends `line` and reads its one-line reply.
fn ask(socket: &Path, line: &str) -> std::io::Result<String> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
    stream.write_all(format!("{line}\n").as_bytes())?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    if reply.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the daemon closed the connection without a reply",
        ));
    }
    Ok(reply.trim_end().to_owned())
}

/// A rule name or key as the protocol takes it: 1 to 256 printable ASCII bytes, no
/// space (anything else would split the request line).
fn field<'a>(what: &str, value: &'a str) -> Result<&'a str, String> {
    if value.is_empty() || value.len() > 256 || !value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
        return Err(format!(
            "the {what} must be 1 to 256 printable ASCII bytes without spaces (percent-encode the rest, as applications do)"
        ));
    }
    Ok(value)
}

impl Verb {
    /// The request line.
    fn request(&self) -> Result<String, String> {
        Ok(match self {
            Verb::Inspect { rule, key } => {
                format!("INSPECT {} {}", field("rule", rule)?, field("key", key)?)
            }
            Verb::Reset { rule, key } => {
                format!("RESET {} {}", field("rule", rule)?, field("key", key)?)
            }
            Verb::Override { rule, key, params } => {
                let mut line = format!("OVERRIDE {} {}", field("rule", rule)?, field("key", key)?);
                for p in params {
                    line.push(' ');
                    line.push_str(field("parameter", p)?);
                }
                line
            }
            Verb::Rules => "RULES".into(),
            Verb::Top { rule, n } => format!("TOP {} {n}", field("rule", rule)?),
        })
    }

    /// The reply as JSON: the daemon's own for `RULES` and `TOP`; `INSPECT`'s fields
    /// as an object (numbers as numbers); `{"ok":true}` for `RESET`.
    fn json(&self, reply: &str) -> Result<String, String> {
        Ok(match self {
            Verb::Inspect { .. } => {
                let mut m = Map::new();
                for (name, value) in inspect_fields(reply)? {
                    let v = value
                        .parse::<u64>()
                        .map(Value::from)
                        .unwrap_or(Value::from(value));
                    m.insert(name.to_owned(), v);
                }
                Value::Object(m).to_string()
            }
            Verb::Reset { .. } | Verb::Override { .. } => r#"{"ok":true}"#.into(),
            Verb::Rules | Verb::Top { .. } => {
                let v: Value = serde_json::from_str(reply).map_err(|e| e.to_string())?;
                v.to_string()
            }
        })
    }

    /// The reply for a reader.
    fn text(&self, reply: &str) -> Result<String, String> {
        match self {
            Verb::Inspect { .. } => {
                let fields = inspect_fields(reply)?;
                let width = fields.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
                Ok(fields
                    .iter()
                    .map(|(n, v)| format!("{n:width$}  {v}"))
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
            Verb::Reset { rule, key } if reply == "OK" => Ok(format!(
                "reset: {key} under {rule} starts afresh (other daemons' cached DENYs end within their cache.ttl_ms)"
            )),
            Verb::Reset { .. } => Err("expected OK".into()),
            Verb::Override { rule, key, params } if reply == "OK" => Ok(format!(
                "override: {key} under {rule}: {} (every daemon's next decision of the key applies it)",
                params.join(" ")
            )),
            Verb::Override { .. } => Err("expected OK".into()),
            Verb::Rules => rules_text(reply),
            Verb::Top { .. } => top_text(reply),
        }
    }
}

/// `INSPECT`'s `name=value` fields, in order.
fn inspect_fields(reply: &str) -> Result<Vec<(&str, &str)>, String> {
    reply
        .split(' ')
        .map(|f| f.split_once('=').ok_or_else(|| format!("field '{f}'")))
        .collect()
}

/// One line per rule: its name, then its parameters as `name=value`.
fn rules_text(reply: &str) -> Result<String, String> {
    let v: Value = serde_json::from_str(reply).map_err(|e| e.to_string())?;
    let rules = v["rules"].as_array().ok_or("no \"rules\" list")?;
    let width = rules
        .iter()
        .filter_map(|r| r["name"].as_str())
        .map(str::len)
        .max()
        .unwrap_or(0);
    let lines: Vec<String> = rules
        .iter()
        .map(|r| {
            let name = r["name"].as_str().unwrap_or("?");
            let params: Vec<String> = r
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| k.as_str() != "name")
                .map(|(k, v)| format!("{k}={}", plain(v)))
                .collect();
            format!("{name:width$}  {}", params.join(" "))
        })
        .collect();
    Ok(if lines.is_empty() {
        "no rules".into()
    } else {
        lines.join("\n")
    })
}

/// A header, then one line per key: decisions, denies, key.
fn top_text(reply: &str) -> Result<String, String> {
    let v: Value = serde_json::from_str(reply).map_err(|e| e.to_string())?;
    let keys = v["keys"].as_array().ok_or("no \"keys\" list")?;
    let mut out = vec![
        format!(
            "rule {}: hottest keys on this daemon over the last {} s (decisions at most {} above the truth)",
            plain(&v["rule"]),
            plain(&v["window_s"]),
            plain(&v["max_error"])
        ),
        format!("{:>10} {:>10}  key", "decisions", "denies"),
    ];
    for k in keys {
        out.push(format!(
            "{:>10} {:>10}  {}",
            plain(&k["decisions"]),
            plain(&k["denies"]),
            plain(&k["key"])
        ));
    }
    if keys.is_empty() {
        out.push("(no decisions in that time)".into());
    }
    Ok(out.join("\n"))
}

/// A JSON value for a reader: strings without quotes, lists comma-separated.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "-".into(),
        Value::Array(a) => a.iter().map(plain).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}
