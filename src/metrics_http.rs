//! The HTTP endpoint that serves the Prometheus text (`[metrics] listen`), kept small
//! on purpose so it can never take resources from the socket's clients.
//!
//! * At most `metrics.max_connections` connections at once: the listener accepts only
//!   when a slot is free, so extra connections wait in the kernel's listen queue and hold
//!   no file descriptor of the daemon.
//! * Each connection gets [`REQUEST_TIMEOUT`] to send its request head (at most
//!   [`MAX_HEAD`] bytes) and take the reply, then it is closed (`Connection: close`): an
//!   idle or slow client frees its slot within that time.
//! * Any `GET` (or `HEAD`) path answers the metrics, as Prometheus expects.

use metrics_exporter_prometheus::PrometheusHandle;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::Semaphore;

/// How long one connection may take to send its request and take the reply.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest request head read, bytes.
pub const MAX_HEAD: usize = 8 * 1024;
/// Connections the kernel may hold for the endpoint before it accepts them.
const BACKLOG: u32 = 128;

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
                    let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, &handle)).await;
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

/// Reads one request head and answers it, then closes.
async fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            return reply(
                &mut stream,
                "431 Request Header Fields Too Large",
                "",
                false,
            )
            .await;
        }
    }
    let method = head.split(|&b| b == b' ').next().unwrap_or_default();
    match method {
        b"GET" => reply(&mut stream, "200 OK", &handle.render(), false).await,
        b"HEAD" => reply(&mut stream, "200 OK", &handle.render(), true).await,
        _ => reply(&mut stream, "405 Method Not Allowed", "", false).await,
    }
}

async fn reply(
    stream: &mut TcpStream,
    status: &str,
    body: &str,
    head_only: bool,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    if !head_only {
        stream.write_all(body.as_bytes()).await?;
    }
    stream.shutdown().await
}
