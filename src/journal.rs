//! Where the daemon's log goes. Under systemd, stderr is a stream the journal reads
//! line by line at priority `info`, so `journalctl -p warning` would never show a Redis
//! outage. When `JOURNAL_STREAM` says stderr is the journal, events are sent with the
//! journal's native protocol instead: the level as `PRIORITY`, every field of the event
//! as a journal field (`RULE=`, `REASON=`, `ERROR=`…), and a `MESSAGE` that still reads
//! like the text log. Anywhere else: text on stderr, as before.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The journal's socket for native messages.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Installs the global subscriber: the journal when stderr is the journal and its
/// socket takes a datagram, else text on stderr. `RUST_LOG` filters both (default
/// `info,fred=error`).
pub fn init() {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,fred=error"));
    if let Some(journal) = JournalLayer::connect() {
        tracing_subscriber::registry()
            .with(journal.with_filter(filter()))
            .init();
        return;
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Whether stderr is the stream systemd connected to the journal: `JOURNAL_STREAM` is
/// `<device>:<inode>` of that stream, and a wrapper may have redirected stderr since.
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = value.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// Writes an error straight to stderr. When stderr is the journal every line gets the
/// `<3>` prefix (sd-daemon(3)), so the whole message, a TOML error's excerpt included,
/// is recorded at priority err.
pub fn eprint_error(text: &str) {
    let prefix = if stderr_is_journal() { "<3>" } else { "" };
    let mut out = String::with_capacity(text.len() + 16);
    for line in text.lines() {
        let _ = writeln!(out, "{prefix}{line}");
    }
    let _ = std::io::stderr().write_all(out.as_bytes());
}

/// A `tracing` layer writing each event to the journal as one native-protocol datagram.
struct JournalLayer {
    socket: UnixDatagram,
}

impl JournalLayer {
    fn connect() -> Option<Self> {
        if !stderr_is_journal() {
            return None;
        }
        let socket = UnixDatagram::unbound().ok()?;
        socket.connect(JOURNAL_SOCKET).ok()?;
        Some(JournalLayer { socket })
    }
}

/// syslog priorities (sd-daemon(3)): error 3, warning 4, info 6, debug and trace 7.
fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// A journal field name from a tracing field name: upper case, `[A-Z0-9_]`, not
/// starting with `_` or a digit (those are the journal's own).
fn field_name(name: &str) -> String {
    let mut out: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' => c.to_ascii_uppercase(),
            'A'..='Z' | '0'..='9' => c,
            _ => '_',
        })
        .collect();
    if out.is_empty() || !out.starts_with(|c: char| c.is_ascii_uppercase()) {
        out.insert(0, 'F');
    }
    out
}

/// Appends `NAME=value\n`, or the binary form when the value spans lines.
fn append_field(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.extend_from_slice(name.as_bytes());
    if value.contains('\n') {
        buf.push(b'\n');
        buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        buf.push(b'=');
    }
    buf.extend_from_slice(value.as_bytes());
    buf.push(b'\n');
}

/// The event's message and its other fields, as text.
#[derive(Default)]
struct Fields {
    message: String,
    others: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.others.push((field.name(), value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.others.push((field.name(), format!("{value:?}")));
        }
    }
}

impl<S: Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        // MESSAGE reads like the text log: the message, then key=value.
        let mut message = fields.message.clone();
        for (name, value) in &fields.others {
            let _ = write!(message, " {name}={value}");
        }
        let mut buf = Vec::with_capacity(256);
        append_field(&mut buf, "PRIORITY", &priority(meta.level()).to_string());
        append_field(&mut buf, "SYSLOG_IDENTIFIER", "ratelimitd");
        append_field(&mut buf, "MESSAGE", &message);
        append_field(&mut buf, "TARGET", meta.target());
        for (name, value) in &fields.others {
            append_field(&mut buf, &field_name(name), value);
        }
        if self.socket.send(&buf).is_err() {
            // Too large for a datagram, or the journal is gone: the stream still works,
            // and `<N>` tells it the priority (sd-daemon(3)).
            let line = format!("<{}>{message}\n", priority(meta.level()));
            let _ = std::io::stderr().write_all(line.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_are_journal_names() {
        assert_eq!(field_name("rule"), "RULE");
        assert_eq!(field_name("error.kind"), "ERROR_KIND");
        assert_eq!(field_name("_private"), "F_PRIVATE");
        assert_eq!(field_name("2x"), "F2X");
    }

    #[test]
    fn multi_line_values_use_the_binary_form() {
        let mut buf = Vec::new();
        append_field(&mut buf, "MESSAGE", "a\nb");
        let mut want = b"MESSAGE\n".to_vec();
        want.extend_from_slice(&3u64.to_le_bytes());
        want.extend_from_slice(b"a\nb\n");
        assert_eq!(buf, want);
        buf.clear();
        append_field(&mut buf, "RULE", "api");
        assert_eq!(buf, b"RULE=api\n");
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        assert_eq!(priority(&Level::ERROR), 3);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
        assert_eq!(priority(&Level::TRACE), 7);
    }
}
