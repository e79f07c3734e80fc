//! Where the daemon's log goes. Under systemd, stderr is a stream the journal reads
//! line by line at priority `info`, so `journalctl -p warning` would never show a Redis
//! outage. When `JOURNAL_STREAM` says stderr is the journal, events are sent with the
//! journal's native protocol instead (`tracing-journald`: one datagram per entry to
//! journald's socket, not connected, so a restarted journald gets the next one; a memfd
//! for an entry too large for a datagram): the level as `PRIORITY`, every field of the
//! event as a journal field (`RULE=`, `REASON=`, `ERROR=`…), and a `MESSAGE` that still
//! reads like the text log ([`FieldsInMessage`]). Anywhere else: text on stderr.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::MetadataExt;
use tracing::field::{Field, Value, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_journald::{Priority, PriorityMappings};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The journal's `SYSLOG_IDENTIFIER` (`journalctl -t ratelimitd`).
const SYSLOG_IDENTIFIER: &str = "ratelimitd";

/// Installs the global subscriber: the journal when stderr is the journal and its
/// socket takes a datagram, else text on stderr. `RUST_LOG` filters both (default
/// `info,fred=error`).
pub fn init() {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,fred=error"));
    if let Some(journal) = journal_layer() {
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

/// The journal's layer, when stderr is the journal and its socket takes a datagram.
fn journal_layer() -> Option<FieldsInMessage<tracing_journald::Layer>> {
    if !stderr_is_journal() {
        return None;
    }
    let layer = tracing_journald::layer()
        .ok()?
        .with_syslog_identifier(SYSLOG_IDENTIFIER.to_owned())
        // Fields keep their own names (`RULE=`, not `F_RULE=`).
        .with_field_prefix(None)
        .with_priority_mappings(priorities());
    Some(FieldsInMessage(layer))
}

/// syslog priorities (sd-daemon(3)): error 3, warning 4, info 6, debug and trace 7.
fn priorities() -> PriorityMappings {
    PriorityMappings {
        error: Priority::Error,
        warn: Priority::Warning,
        info: Priority::Informational,
        debug: Priority::Debug,
        trace: Priority::Debug,
    }
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

/// A layer that hands each event on to `L` with its other fields appended to its
/// message as ` name=value` (as the text log shows them), so that `journalctl`'s default
/// view, which shows only `MESSAGE`, still shows why; the fields stay fields too. Spans
/// are passed on as they are. An event without a message is passed on unchanged.
pub struct FieldsInMessage<L>(pub L);

impl<S, L> Layer<S> for FieldsInMessage<L>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    L: Layer<S>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        self.0.on_new_span(attrs, id, ctx);
    }

    fn on_record(&self, span: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        self.0.on_record(span, values, ctx);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let meta = event.metadata();
        let fields = meta.fields();
        let Some(message_field) = fields.field("message") else {
            return self.0.on_event(event, ctx);
        };
        let mut texts = Texts::default();
        event.record(&mut texts);
        let mut message = String::new();
        let mut others = String::new();
        for (field, text) in &texts.0 {
            if *field == message_field {
                message.push_str(text);
            } else {
                let _ = write!(others, " {}={text}", field.name());
            }
        }
        message.push_str(&others);
        // The same fields, in their order, as text: the message replaced.
        let values: Vec<Option<&dyn Value>> = fields
            .iter()
            .map(|field| {
                if field == message_field {
                    return Some(&message as &dyn Value);
                }
                texts
                    .0
                    .iter()
                    .find(|(f, _)| *f == field)
                    .map(|(_, text)| text as &dyn Value)
            })
            .collect();
        let values = fields.value_set_all(&values);
        let rewritten = if event.is_contextual() {
            Event::new(meta, &values)
        } else {
            Event::new_child_of(event.parent().cloned(), meta, &values)
        };
        self.0.on_event(&rewritten, ctx);
    }
}

/// An event's fields as text, in the order recorded: strings as they are, anything else
/// as its `Debug` (a `%value` field's `Display`).
#[derive(Default)]
struct Texts(Vec<(Field, String)>);

impl Visit for Texts {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.clone(), value.to_owned()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.clone(), format!("{value:?}")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// An event's fields as (name, text).
    type Fields = Vec<(String, String)>;

    /// Records each event's fields as text.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Fields>>>);

    impl<S: Subscriber> Layer<S> for Capture {
        fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
            let mut texts = Texts::default();
            event.record(&mut texts);
            let fields = texts
                .0
                .into_iter()
                .map(|(f, t)| (f.name().to_owned(), t))
                .collect();
            self.0.lock().unwrap().push(fields);
        }
    }

    fn captured(log: impl FnOnce()) -> Vec<Fields> {
        let capture = Capture::default();
        let subscriber = tracing_subscriber::registry().with(FieldsInMessage(capture.clone()));
        tracing::subscriber::with_default(subscriber, log);
        let events = capture.0.lock().unwrap().clone();
        events
    }

    fn pairs(items: &[(&str, &str)]) -> Fields {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_message_carries_the_fields_and_the_fields_stay() {
        let error = std::io::Error::other("boom");
        let events = captured(|| {
            tracing::warn!(rule = "api", error = %error, suppressed = 3u64, "Redis failed: {}", "now");
            let span = tracing::info_span!("in_a_span", id = 7);
            let _entered = span.enter();
            tracing::info!("plain");
            tracing::error!(reason = "a\nb", "");
        });
        assert_eq!(
            events,
            vec![
                pairs(&[
                    (
                        "message",
                        "Redis failed: now rule=api error=boom suppressed=3"
                    ),
                    ("rule", "api"),
                    ("error", "boom"),
                    ("suppressed", "3"),
                ]),
                pairs(&[("message", "plain")]),
                pairs(&[("message", " reason=a\nb"), ("reason", "a\nb")]),
            ]
        );
    }

    #[test]
    fn an_event_without_a_message_is_passed_on_unchanged() {
        let events = captured(|| tracing::info!(rule = "api"));
        assert_eq!(events, vec![pairs(&[("rule", "api")])]);
    }

    #[test]
    fn levels_map_to_syslog_priorities() {
        let p = priorities();
        assert_eq!(
            [p.error, p.warn, p.info, p.debug, p.trace].map(|p| p as u8),
            [b'3', b'4', b'6', b'7', b'7']
        );
    }
}
