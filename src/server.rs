//! The Unix socket server: accept loop, one task per connection, graceful shutdown.
//!
//! Per connection, requests are decoded as they arrive and decided concurrently (at
//! most `server.max_in_flight` at once; beyond that the socket is simply not read,
//! which is backpressure), while replies go back strictly in request order
//! ([`FuturesOrdered`]). Ready replies are batched into one write.

use crate::algorithm::BatchClock;
use crate::config::ServerConfig;
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
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::codec::Decoder;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Per-connection limits, from `[server]`.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Longest request line, bytes.
    pub max_line_bytes: usize,
    /// Requests decided concurrently per connection.
    pub max_in_flight: usize,
    /// Connections served at once; one more is answered `ERR BUSY` and closed.
    pub max_connections: usize,
    /// Close a connection idle (nothing received, nothing to answer) or not taking its
    /// replies for this long; `None` = never.
    pub idle_timeout: Option<Duration>,
    /// Who may connect (`SO_PEERCRED`).
    pub access: PeerAccess,
}

impl From<&ServerConfig> for ConnectionLimits {
    fn from(c: &ServerConfig) -> Self {
        ConnectionLimits {
            max_line_bytes: c.max_line_bytes,
            max_in_flight: c.max_in_flight,
            max_connections: c.max_connections,
            idle_timeout: (c.idle_timeout_ms > 0).then(|| Duration::from_millis(c.idle_timeout_ms)),
            access: PeerAccess {
                uids: c.allow_uids.clone(),
                gids: c.allow_gids.clone(),
            },
        }
    }
}

/// `server.allow_uids` / `server.allow_gids`: both empty lets every peer in (the socket
/// file's permissions still apply); otherwise a peer needs its uid in `uids` or its
/// (effective, primary) gid in `gids`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerAccess {
    /// Allowed peer uids.
    pub uids: Vec<u32>,
    /// Allowed peer gids (primary gid only: `SO_PEERCRED` carries no supplementary groups).
    pub gids: Vec<u32>,
}

impl PeerAccess {
    /// True if a peer with `uid` and `gid` may be served.
    pub fn allows(&self, uid: u32, gid: u32) -> bool {
        (self.uids.is_empty() && self.gids.is_empty())
            || self.uids.contains(&uid)
            || self.gids.contains(&gid)
    }
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
    /// The socket's directory lets anyone replace the socket file.
    #[error(
        "{0}: the socket's directory is world-writable without the sticky bit, so any local \
         user could delete or replace the socket and impersonate the daemon; use a directory \
         only the daemon's user can write (e.g. /run/ratelimitd, mode 0755) or set its \
         sticky bit (chmod +t)"
    )]
    UnsafeDirectory(PathBuf),
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
/// Creates the parent directory if missing, and refuses a directory that is
/// world-writable without the sticky bit. A socket file left by a dead daemon is
/// removed; a live one (it accepts a connection) or a non-socket file is an error. The
/// socket file has exactly `mode` from its creation on (no window with wider bits).
pub fn bind(path: &Path, mode: u32) -> Result<UnixListener, BindError> {
    let io_err = |source| BindError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err)?;
    check_directory(dir)?;
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
    let listener = bind_with_mode(path, mode).map_err(io_err)?;
    listener.set_nonblocking(true).map_err(io_err)?;
    UnixListener::from_std(listener).map_err(io_err)
}

/// Refuses a world-writable directory without the sticky bit (`UnsafeDirectory`).
fn check_directory(dir: &Path) -> Result<(), BindError> {
    let mode = std::fs::metadata(dir)
        .map_err(|source| BindError::Io {
            path: dir.to_owned(),
            source,
        })?
        .permissions()
        .mode();
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(BindError::UnsafeDirectory(dir.to_owned()));
    }
    Ok(())
}

/// `bind(2)` under a umask that leaves exactly `mode`, then `chmod` to `mode` (the umask
/// only clears bits): the socket never exists with wider permissions.
fn bind_with_mode(path: &Path, mode: u32) -> io::Result<std::os::unix::net::UnixListener> {
    // SAFETY: umask(2) only swaps the process's file-creation mask; it is restored at
    // once. Start-up creates no other file concurrently.
    let old = unsafe { libc::umask((!mode & 0o777) as libc::mode_t) };
    let bound = std::os::unix::net::UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
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
    let limits = Arc::new(limits);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut refusals = RefusalLog::default();
    let open = crate::metrics::connections();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Some(slot) = admit(&stream, &limits, &slots, &mut refusals) else {
                        continue;
                    };
                    let limiter = Arc::clone(&limiter);
                    let limits = Arc::clone(&limits);
                    let shutdown = shutdown.clone();
                    let open = open.clone();
                    open.increment(1.0);
                    tracker.spawn(async move {
                        if let Err(e) = connection(stream, limiter, &limits, shutdown).await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        open.decrement(1.0);
                        drop(slot);
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

/// Checks a new connection against `allow_uids`/`allow_gids`, then takes one of the
/// `max_connections` slots. A refused connection is told why (`ERR PERM` or `ERR BUSY`,
/// written without waiting: its send buffer is empty), logged, and closed on drop.
fn admit(
    stream: &UnixStream,
    limits: &ConnectionLimits,
    slots: &Arc<Semaphore>,
    refusals: &mut RefusalLog,
) -> Option<OwnedSemaphorePermit> {
    let refuse = |code, message: &str| {
        crate::metrics::error_reply(code);
        let mut line = BytesMut::new();
        Reply::Error(ProtoError::new(code, message)).encode(&mut line);
        let _ = stream.try_write(&line);
    };
    if let Err(message) = check_peer(stream, &limits.access) {
        refuse(ErrorCode::Perm, &message);
        refusals.perm(&message);
        return None;
    }
    match Arc::clone(slots).try_acquire_owned() {
        Ok(slot) => Some(slot),
        Err(_) => {
            refuse(
                ErrorCode::Busy,
                &format!(
                    "too many connections (server.max_connections = {}); retry later",
                    limits.max_connections
                ),
            );
            refusals.busy(limits.max_connections);
            None
        }
    }
}

/// `Err(message for the peer and the log)` if `access` does not let the peer in.
fn check_peer(stream: &UnixStream, access: &PeerAccess) -> Result<(), String> {
    if access.uids.is_empty() && access.gids.is_empty() {
        return Ok(());
    }
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    if access.allows(cred.uid(), cred.gid()) {
        return Ok(());
    }
    let pid = cred.pid().map_or_else(|| "?".into(), |p| p.to_string());
    Err(format!(
        "peer pid {pid} uid {} gid {} is not in server.allow_uids / server.allow_gids",
        cred.uid(),
        cred.gid()
    ))
}

/// Logs refused connections at most once per second per kind, counting the rest.
#[derive(Default)]
struct RefusalLog {
    perm: (Option<std::time::Instant>, u64),
    busy: (Option<std::time::Instant>, u64),
}

/// Refusals of one kind are logged at most this often.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

impl RefusalLog {
    /// True (and the number of refusals not logged since the last line) when a line
    /// may be written now.
    fn due(state: &mut (Option<std::time::Instant>, u64)) -> Option<u64> {
        let now = std::time::Instant::now();
        if state
            .0
            .is_some_and(|t| now.duration_since(t) < REFUSAL_LOG_INTERVAL)
        {
            state.1 += 1;
            return None;
        }
        state.0 = Some(now);
        Some(std::mem::take(&mut state.1))
    }

    fn perm(&mut self, message: &str) {
        if let Some(suppressed) = Self::due(&mut self.perm) {
            tracing::warn!(suppressed, "refused a connection: {message}");
        }
    }

    fn busy(&mut self, max: usize) {
        if let Some(suppressed) = Self::due(&mut self.busy) {
            tracing::warn!(
                suppressed,
                "refused a connection: server.max_connections = {max} reached"
            );
        }
    }
}

/// Writes all of `buf`, giving up (`TimedOut`) if the client has not taken it all within
/// `limit` (a client that stopped reading its replies).
async fn write_within(
    wr: &mut (impl AsyncWriteExt + Unpin),
    buf: &[u8],
    limit: Option<Duration>,
) -> io::Result<()> {
    match limit {
        None => wr.write_all(buf).await,
        Some(limit) => tokio::time::timeout(limit, wr.write_all(buf))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client did not read its replies within server.idle_timeout_ms",
                ))
            }),
    }
}

/// One client connection: read lines, decide concurrently, reply in order.
///
/// Ends on EOF (after answering every line, a last one without `\n` included), after
/// `QUIT` (answered `BYE`), on shutdown (after answering every complete line the
/// client had sent, as far as it can be read without waiting), or after
/// `idle_timeout` without a byte received while nothing was left to answer.
async fn connection(
    mut stream: UnixStream,
    limiter: Arc<Limiter>,
    limits: &ConnectionLimits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let idle_limit = limits.idle_timeout.unwrap_or(Duration::MAX);
    let mut last_read = tokio::time::Instant::now();
    let idle = tokio::time::sleep(limits.idle_timeout.unwrap_or(Duration::ZERO));
    tokio::pin!(idle);
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
        // Turn buffered lines into requests, up to the in-flight bound; they are
        // decided at one instant (one clock read).
        let mut clock = BatchClock::default();
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
                    crate::metrics::error_reply(ErrorCode::TooLong);
                    pending.push_back(Pending::Ready(Some(Reply::Error(ProtoError::new(
                        ErrorCode::TooLong,
                        format!(
                            "line longer than server.max_line_bytes = {}",
                            decoder.max_line_bytes()
                        ),
                    )))))
                }
                Some(Frame::Line(line)) => {
                    let (reply, is_quit) = limiter.handle_with(&line, &mut clock);
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
            write_within(&mut wr, &wbuf, limits.idle_timeout).await?;
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
        let watch_idle = limits.idle_timeout.is_some() && can_read && pending.is_empty();
        tokio::select! {
            Some(reply) = pending.next(), if !pending.is_empty() => reply.encode(&mut wbuf),
            read = rd.read_buf(&mut rbuf), if can_read => {
                if read? == 0 {
                    eof = true;
                }
                last_read = tokio::time::Instant::now();
            }
            _ = shutdown.cancelled(), if !stopping => stopping = true,
            () = &mut idle, if watch_idle => {
                // The timer is re-armed lazily: only when it fires is the last read checked.
                let deadline = last_read + idle_limit;
                if deadline <= tokio::time::Instant::now() {
                    tracing::debug!("closing a connection idle for server.idle_timeout_ms");
                    return Ok(());
                }
                idle.as_mut().reset(deadline);
            }
            else => return Ok(()),
        }
    }
}
