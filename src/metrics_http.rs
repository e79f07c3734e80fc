//! The HTTP endpoint that serves the Prometheus text (`[metrics] listen`), kept small
//! on purpose so it can never take resources from the socket's clients. HTTP/1.1 is
//! spoken by hyper; this module keeps the limits and says what each request gets
//! ([`route`]).
//!
//! * At most `metrics.max_connections` connections at once: the listener accepts only
//!   when a slot is free, so extra connections wait in the kernel's listen queue and hold
//!   no file descriptor of the daemon.
//! * Each connection gets [`REQUEST_TIMEOUT`] to send its request head (at most
//!   [`MAX_HEAD`] bytes, else `431`) and take the reply, then it is closed
//!   (`Connection: close`): an idle or slow client frees its slot within that time.
//! * Any `GET` (or `HEAD`) path answers the metrics, as Prometheus expects; another
//!   method gets `405`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use metrics_exporter_prometheus::PrometheusHandle;
use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;

/// How long one connection may take to send its request and take the reply.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read, bytes (hyper's smallest read buffer, 8 KiB).
pub const MAX_HEAD: usize = 8 * 1024;
/// Connections the kernel may hold for the endpoint before it accepts them.
const BACKLOG: u32 = 128;
/// The Prometheus text format's content type.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A response's body: the whole text at once.
pub type Body = Full<Bytes>;

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

/// Serves the metrics of `handle` on `listener` forever, `max_connections` at a time.
pub async fn serve(listener: TcpListener, handle: PrometheusHandle, max_connections: usize) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let handle = Arc::new(handle);
    let errors = crate::log_every::LogEvery::new(Duration::from_secs(10));
    loop {
        // A slot first, then accept: beyond the cap nothing is accepted.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let handle = Arc::clone(&handle);
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, handle)).await;
                    drop(slot);
                });
            }
            Err(e) => {
                if let Some(suppressed) = errors.admit() {
                    tracing::warn!(error = %e, suppressed, "metrics endpoint: accept failed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Answers one request on `stream`, then closes it (keep-alive off: hyper answers
/// `Connection: close`).
async fn answer(stream: TcpStream, handle: Arc<PrometheusHandle>) -> hyper::Result<()> {
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let response = route(&req, &handle);
        async move { Ok::<_, Infallible>(response) }
    });
    hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .max_buf_size(MAX_HEAD)
        .serve_connection(TokioIo::new(stream), service)
        .await
}

/// What a request gets: one arm per route. hyper leaves the body out of a `HEAD`'s
/// answer itself.
pub fn route<B>(req: &Request<B>, metrics: &PrometheusHandle) -> Response<Body> {
    match (req.method(), req.uri().path()) {
        (&Method::GET | &Method::HEAD, "/metrics") => prometheus_text(metrics),
        // Every other path answers the metrics too (docs/METRICS.md).
        (&Method::GET | &Method::HEAD, _) => prometheus_text(metrics),
        _ => plain(StatusCode::METHOD_NOT_ALLOWED, ""),
    }
}

/// `200` with the metrics in Prometheus text format.
fn prometheus_text(metrics: &PrometheusHandle) -> Response<Body> {
    plain(StatusCode::OK, metrics.render())
}

/// A response of `status` with `body` as Prometheus text.
fn plain(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use metrics_exporter_prometheus::PrometheusBuilder;

    fn request(method: Method, path: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
    }

    async fn text(response: Response<Body>) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn routes_answer_metrics_to_get_and_head_and_405_to_other_methods() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || metrics::counter!("probe_total").increment(3));
        for (method, path) in [
            (Method::GET, "/metrics"),
            (Method::HEAD, "/"),
            (Method::GET, "/x"),
        ] {
            let r = route(&request(method, path), &handle);
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.headers()[CONTENT_TYPE], PROMETHEUS_TEXT);
            assert!(text(r).await.contains("probe_total 3"));
        }
        let r = route(&request(Method::POST, "/metrics"), &handle);
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(text(r).await, "");
    }
}
