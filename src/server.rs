//! The Unix socket server: accept loop, one task per connection, graceful shutdown.
//!
//! Per connection, requests are decoded as they arrive and decided concurrently (at
//! most `server.max_in_flight` at once; beyond that the socket is simply not read,
//! which is backpressure), while replies go back strictly in request order
//! ([`FuturesOrdered`]). Ready replies are batched into one write.

use crate::limiter::{Limiter, Pending};
use crate::protocol::{ErrorCode, Frame, LineDecoder, ProtoError, Reply};
use bytes::BytesMut;
use futures::stream::{FuturesOrdered, StreamExt};
use futures::FutureExt;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Per-connection limits, from `[server]`.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Longest request line, bytes.
    pub max_line_bytes: usize,
    /// Requests decided concurrently per connection.
    pub max_in_flight: usize,
}

/// Why the socket could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// A daemon already answers on the path.
    #[error("{0}: another daemon is already serving on this socket; stop it first")]
    InUse(PathBuf),
    /// Something that is not a socket sits at the path.
    #[error("{0}: exists and is not a socket; refusing to remove it")]
    NotASocket(PathBuf),
    /// The OS refused.
    #[error("{path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
}

/// Binds the Unix socket at `path` with permission bits `mode`.
///
/// Creates the parent directory if missing. A socket file left by a dead daemon is
/// removed; a live one (it accepts a connection) or a non-socket file is an error.
pub fn bind(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let io_err = |source| BindError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io_err)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(BindError::NotASocket(path.to_owned()))
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(BindError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io_err)?;
            tracing::info!(socket = %path.display(), "removed a stale socket file");
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(e)),
    }
    let listener = std::os::unix::net::UnixListener::bind(path).map_err(io_err)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err)?;
    listener.set_nonblocking(true).map_err(io_err)?;
    UnixListener::from_std(listener).map_err(io_err)
}

/// Serves `listener` until `shutdown` is cancelled, then stops accepting and waits for
/// every connection to answer what it has already received.
pub async fn serve(
    listener: UnixListener,
    limiter: Arc<Limiter>,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) {
    let tracker = TaskTracker::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let limiter = Arc::clone(&limiter);
                    let shutdown = shutdown.clone();
                    tracker.spawn(async move {
                        if let Err(e) = connection(stream, limiter, limits, shutdown).await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    drop(listener);
    tracker.close();
    tracker.wait().await;
}

/// One client connection: read lines, decide concurrently, reply in order.
///
/// Ends on EOF (after answering every line, a last one without `\n` included), after
/// `QUIT` (answered `BYE`), or on shutdown (after answering every complete line the
/// client had sent, as far as it can be read without waiting).
async fn connection(
    mut stream: UnixStream,
    limiter: Arc<Limiter>,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let (mut rd, mut wr) = stream.split();
    let mut decoder = LineDecoder::new(limits.max_line_bytes);
    let mut rbuf = BytesMut::with_capacity(4096);
    let mut wbuf = BytesMut::with_capacity(4096);
    let mut pending: FuturesOrdered<Pending> = FuturesOrdered::new();
    let mut eof = false;
    let mut quit = false;
    let mut stopping = false;
    let mut drained = false;
    loop {
        // Turn buffered lines into requests, up to the in-flight bound.
        let mut at_bound = false;
        while !quit {
            if pending.len() >= limits.max_in_flight {
                at_bound = true;
                break;
            }
            let frame = if eof {
                decoder.decode_eof(&mut rbuf)?
            } else {
                decoder.decode(&mut rbuf)?
            };
            match frame {
                None => break,
                Some(Frame::TooLong) => {
                    pending.push_back(Pending::Ready(Some(Reply::Error(ProtoError::new(
                        ErrorCode::TooLong,
                        format!(
                            "line longer than server.max_line_bytes = {}",
                            decoder.max_line_bytes()
                        ),
                    )))))
                }
                Some(Frame::Line(line)) => {
                    let (reply, is_quit) = limiter.handle(&line);
                    match reply {
                        // Nothing ahead of it: a ready reply goes straight out, in order,
                        // without a task node in `pending`.
                        Pending::Ready(Some(reply)) if pending.is_empty() => {
                            reply.encode(&mut wbuf)
                        }
                        reply => pending.push_back(reply),
                    }
                    quit = is_quit;
                }
            }
        }
        // Collect every reply that is ready now, in order, into one write.
        while let Some(Some(reply)) = pending.next().now_or_never() {
            reply.encode(&mut wbuf);
        }
        if !wbuf.is_empty() {
            wr.write_all(&wbuf).await?;
            wbuf.clear();
        }
        if at_bound && pending.len() < limits.max_in_flight {
            // Decoding stopped at the bound and replies have made room: lines may
            // still be waiting in the buffer, decode them before reading more.
            continue;
        }
        if stopping && !drained && !eof && !quit && pending.len() < limits.max_in_flight {
            // Shutting down: still answer what the client sent before it, i.e. what
            // can be read without waiting; stop at the first read that would block.
            rbuf.reserve(4096);
            match rd.try_read_buf(&mut rbuf) {
                Ok(0) => eof = true,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => drained = true,
                Err(e) => return Err(e),
            }
            continue;
        }
        let input_closed = eof || quit || drained;
        if input_closed && pending.is_empty() {
            return Ok(());
        }
        let can_read = !input_closed && !stopping && pending.len() < limits.max_in_flight;
        if can_read {
            rbuf.reserve(4096);
        }
        tokio::select! {
            Some(reply) = pending.next(), if !pending.is_empty() => reply.encode(&mut wbuf),
            read = rd.read_buf(&mut rbuf), if can_read => {
                if read? == 0 {
                    eof = true;
                }
            }
            _ = shutdown.cancelled(), if !stopping => stopping = true,
            else => return Ok(()),
        }
    }
}
