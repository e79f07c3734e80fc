//! Server-Sent Events: the `text/event-stream` response a task feeds, and the framing
//! of one event (the WHATWG HTML standard, "Server-sent events": `event:` and `data:`
//! lines, a blank line to end the event).

use super::Body;
use bytes::Bytes;
use http_body_util::{Channel, Either};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::Response;

/// Events a stream buffers before its task waits for the client to read.
const BUFFER: usize = 64;

/// The sending half of an event stream; sending fails once the client is gone.
pub type Sender = http_body_util::channel::Sender<Bytes>;

/// A `200 text/event-stream` response and the sender that feeds it.
pub fn response() -> (Response<Body>, Sender) {
    let (tx, body) = Channel::new(BUFFER);
    let mut response = Response::new(Either::Right(body));
    let h = response.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (response, tx)
}

/// One event named `name` (`None`: the default `message`) carrying `data`, which must
/// not contain a newline (JSON as serde_json writes it never does).
pub fn event(name: Option<&str>, data: &str) -> Bytes {
    let mut out = String::with_capacity(data.len() + 32);
    if let Some(name) = name {
        out.push_str("event: ");
        out.push_str(name);
        out.push('\n');
    }
    out.push_str("data: ");
    out.push_str(data);
    out.push_str("\n\n");
    Bytes::from(out)
}

/// How long the browser waits before reconnecting a stream that ended, ms.
pub fn retry(ms: u32) -> Bytes {
    Bytes::from(format!("retry: {ms}\n\n"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_event_is_its_name_then_its_data_then_a_blank_line() {
        assert_eq!(
            &super::event(Some("done"), "{}")[..],
            b"event: done\ndata: {}\n\n"
        );
        assert_eq!(&super::event(None, "[1]")[..], b"data: [1]\n\n");
    }
}
