//! The daemon's HTTP endpoint (`[http] listen`): Prometheus text at `/metrics`, the
//! live dashboard at `/` with its event stream, and the rule lab at `/lab` when
//! `[http] lab = true`. Kept small on purpose so it can never take resources from the
//! socket's clients. HTTP/1.1 is spoken by hyper; this module keeps the limits and says
//! what each request gets ([`route`]).
//!
//! * At most `http.max_connections` connections at once: the listener accepts only
//!   when a slot is free, so extra connections wait in the kernel's listen queue and hold
//!   no file descriptor of the daemon. At most [`crate::config::HttpConfig::max_streams`]
//!   of them may be event streams (beyond: `503`), so a scrape always finds a slot.
//! * Each connection gets [`REQUEST_TIMEOUT`] to send its request head (at most
//!   [`MAX_HEAD`] bytes, else `431`) and take the reply, then it is closed
//!   (`Connection: close`): an idle or slow client frees its slot within that time. An
//!   event stream lives at most [`STREAM_MAX`] (the browser's `EventSource` reconnects).
//! * `GET`/`HEAD` of an unknown path answers `404`; another method `405`. Every asset is
//!   compiled into the binary ([`assets`]); the pages load nothing from another origin.

pub mod assets;
pub mod dashboard;
pub mod lab;
mod sse;

use crate::config::HttpConfig;
use crate::limiter::Limiter;
use crate::store::RedisStore;
use bytes::Bytes;
use http_body_util::{Channel, Either, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use metrics_exporter_prometheus::PrometheusHandle;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;

/// How long one connection may take to send its request and take the reply.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest life of one event stream (the longest lab run, `http.lab_max_seconds` ≤ 600,
/// with room to connect); the dashboard's browser reconnects after it.
pub const STREAM_MAX: Duration = Duration::from_secs(660);
/// Longest request head read, bytes (hyper's smallest read buffer, 8 KiB).
pub const MAX_HEAD: usize = 8 * 1024;
/// Connections the kernel may hold for the endpoint before it accepts them.
const BACKLOG: u32 = 128;
/// The Prometheus text format's content type.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A response's body: a whole text at once, or an event stream fed by a task.
pub type Body = Either<Full<Bytes>, Channel<Bytes>>;

/// What the endpoint serves from: the metrics recorder and the daemon's parts.
pub struct State {
    /// The Prometheus recorder's handle.
    pub metrics: PrometheusHandle,
    /// The decision path (rules in force, lease figures).
    pub limiter: Arc<Limiter>,
    /// The Redis store (per-primary health); `None` with `redis.mode = "none"`.
    pub redis: Option<Arc<RedisStore>>,
    /// The lab, when `[http] lab = true`.
    pub lab: Option<lab::Lab>,
    /// Event streams that may still open.
    streams: Arc<Semaphore>,
}

impl State {
    /// The state of an endpoint configured by `http`; `lab` is built by the caller when
    /// `http.lab` is set.
    pub fn new(
        http: &HttpConfig,
        metrics: PrometheusHandle,
        limiter: Arc<Limiter>,
        redis: Option<Arc<RedisStore>>,
        lab: Option<lab::Lab>,
    ) -> Self {
        State {
            metrics,
            limiter,
            redis,
            lab,
            streams: Arc::new(Semaphore::new(http.max_streams())),
        }
    }
}

/// Binds `listen` (a loopback address unless configured otherwise), with `SO_REUSEADDR`.
pub fn bind(listen: SocketAddr) -> io::Result<TcpListener> {
    let socket = if listen.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(listen)?;
    socket.listen(BACKLOG)
}

/// Serves `state` on `listener` forever, `max_connections` at a time.
pub async fn serve(listener: TcpListener, state: Arc<State>, max_connections: usize) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let errors = crate::log_every::LogEvery::new(Duration::from_secs(10));
    loop {
        // A slot first, then accept: beyond the cap nothing is accepted.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let state = Arc::clone(&state);
                tokio::spawn(async move {
                    answer(stream, state).await;
                    drop(slot);
                });
            }
            Err(e) => {
                if let Some(suppressed) = errors.admit() {
                    tracing::warn!(error = %e, suppressed, "http endpoint: accept failed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers one request on `stream`, then closes it (keep-alive off: hyper answers
/// `Connection: close`). Bounded by [`REQUEST_TIMEOUT`], or by [`STREAM_MAX`] once the
/// request turned out to open an event stream.
async fn answer(stream: TcpStream, state: Arc<State>) {
    let streaming = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&streaming);
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let response = route(&req, &state);
        if matches!(response.body(), Either::Right(_)) {
            flag.store(true, Ordering::Relaxed);
        }
        async move { Ok::<_, Infallible>(response) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(REQUEST_TIMEOUT)
        .keep_alive(false)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        _ = &mut connection => return,
        () = tokio::time::sleep(REQUEST_TIMEOUT) => {}
    }
    if streaming.load(Ordering::Relaxed) {
        let _ = tokio::time::timeout(STREAM_MAX, connection).await;
    }
}

/// What a request gets: one arm per route. hyper leaves the body out of a `HEAD`'s
/// answer itself.
pub fn route<B>(req: &Request<B>, state: &Arc<State>) -> Response<Body> {
    let method = req.method();
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "");
    }
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    match path {
        "/metrics" => text(StatusCode::OK, PROMETHEUS_TEXT, state.metrics.render()),
        "/events" => match Arc::clone(&state.streams).try_acquire_owned() {
            Ok(permit) => dashboard::stream(state, permit),
            Err(_) => busy(),
        },
        "/lab" | "/lab/events" | "/lab/config" if state.lab.is_none() => not_found(),
        "/lab/config" => state.lab.as_ref().map_or_else(not_found, lab::config),
        "/lab/events" => match Arc::clone(&state.streams).try_acquire_owned() {
            Ok(permit) => lab::stream(state, query, permit),
            Err(_) => busy(),
        },
        _ => match assets::find(path) {
            Some(asset) => asset.response(),
            None => not_found(),
        },
    }
}

/// `404`.
fn not_found() -> Response<Body> {
    text(
        StatusCode::NOT_FOUND,
        "text/plain; charset=utf-8",
        "not found\n",
    )
}

/// `503`: every event-stream slot is taken.
fn busy() -> Response<Body> {
    let mut r = text(
        StatusCode::SERVICE_UNAVAILABLE,
        "text/plain; charset=utf-8",
        "too many event streams open (http.max_connections / 2); retry\n",
    );
    r.headers_mut()
        .insert(hyper::header::RETRY_AFTER, HeaderValue::from_static("2"));
    r
}

/// A response of `status` with `body` of `content_type`.
pub(crate) fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Either::Left(Full::new(body.into())));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests;
