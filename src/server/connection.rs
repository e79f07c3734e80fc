//! One client connection: read lines, decide them concurrently, write the replies in
//! request order.
//!
//! Requests are decoded as they arrive and decided concurrently (at most
//! `server.max_in_flight` at once; beyond that the socket is simply not read, which is
//! backpressure), while replies go back strictly in request order ([`FuturesOrdered`]).
//! Lines are decided where they lie in the read buffer (no copy or allocation per
//! line), and every reply ready after a read goes out in one write.
//!
//! Memory per connection is bounded whatever the client does: the read buffer holds at
//! most about one line (`server.max_line_bytes`) plus one read, at most
//! `server.max_in_flight` requests are being decided, and replies waiting to be written
//! are at most [`MAX_WRITE_BATCH`] plus one reply per request in flight; a client that
//! does not read its replies is simply no longer read (and is closed after
//! `server.idle_timeout_ms`).

use super::dispatch::{self, Answer};
use super::ConnectionLimits;
use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::limiter::Limiter;
use crate::protocol::{ErrorCode, Found, LineDecoder, ProtoError, Reply};
use bytes::BytesMut;
use futures::stream::{FuturesOrdered, StreamExt};
use futures::FutureExt;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::ReadHalf;
use tokio::net::UnixStream;
use tokio_util::sync::CancellationToken;

/// Replies encoded but not yet written, bytes, beyond which decoding stops until they are
/// written: lines answered at once (errors, `PING`, local decisions) cannot pile up
/// replies faster than the client takes them.
pub const MAX_WRITE_BATCH: usize = 64 * 1024;

/// Lines answered by one connection between two turns given to the others: a client
/// pipelining without pause must not keep the runtime's thread (and the I/O driver that
/// wakes every other connection) to itself.
pub const LINES_PER_TURN: usize = 32;

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

/// Walks up to [`LINES_PER_TURN`] complete lines of `buf` from `from` and asks the
/// limiter to prefetch the local bucket of each `CHECK` ([`Limiter::prefetch_local`]),
/// so that the batch's memory loads overlap instead of stalling one decision after
/// another. `searched`: bytes already known to hold no `\n` after `from` (a line still
/// arriving is searched once, not again on every pass). Returns where it stopped (the
/// start of the first line not walked) and how far it searched.
fn prefetch(limiter: &Limiter, buf: &[u8], from: usize, searched: usize) -> (usize, usize) {
    let mut at = from;
    let mut search_from = searched.max(from);
    for _ in 0..LINES_PER_TURN {
        let Some(end) = buf
            .get(search_from..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\n'))
            .map(|i| search_from + i)
        else {
            return (at, buf.len().max(at));
        };
        // Only the verb, rule and key, split as `protocol::parse` splits them (the line
        // is validated when it is decided).
        let mut fields = buf[at..end]
            .split(|&b| b == b' ' || b == b'\t' || b == b'\r')
            .filter(|field| !field.is_empty());
        if fields
            .next()
            .is_some_and(|verb| verb.eq_ignore_ascii_case(b"CHECK"))
        {
            if let (Some(rule), Some(key)) = (fields.next(), fields.next()) {
                limiter.prefetch_local(rule, key);
            }
        }
        at = end + 1;
        search_from = at;
    }
    (at, at)
}

/// One client connection: read lines, decide concurrently, reply in order.
///
/// Ends on EOF (after answering every line, a last one without `\n` included), after
/// `QUIT` (answered `BYE`), on shutdown (after answering every complete line the
/// client had sent, as far as it can be read without waiting), or after
/// `idle_timeout` without a byte received while nothing was left to answer.
pub async fn serve(
    mut stream: UnixStream,
    limiter: Arc<Limiter>,
    limits: &ConnectionLimits,
    peer: Peer,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let idle_limit = limits.idle_timeout.unwrap_or(Duration::MAX);
    let mut last_read = tokio::time::Instant::now();
    let idle = tokio::time::sleep(limits.idle_timeout.unwrap_or(Duration::ZERO));
    tokio::pin!(idle);
    let (mut rd, mut wr) = stream.split();
    // Dropped when this function returns, however: the concurrency slots this
    // connection still holds are given back then.
    let holder = limiter.holder();
    let mut c = Session::new(&limiter, limits, &peer);
    c.conn = holder.conn();
    loop {
        if c.lines_this_turn >= LINES_PER_TURN {
            c.lines_this_turn = 0;
            tokio::task::yield_now().await;
        }
        let at_bound = c.decode();
        c.drop_answered();
        // Collect every reply that is ready now, in order, into one write.
        while let Some(Some(reply)) = c.pending.next().now_or_never() {
            reply.encode(&mut c.wbuf);
        }
        if !c.wbuf.is_empty() {
            write_within(&mut wr, &c.wbuf, limits.idle_timeout).await?;
            c.wbuf.clear();
        }
        let room = c.pending.len() < limits.max_in_flight;
        if at_bound && room {
            // Decoding stopped at a bound and replies have made room (or were
            // written): lines may still be waiting in the buffer, decode them before
            // reading more.
            continue;
        }
        if c.stopping && !c.drained && !c.eof && !c.quit && room {
            c.read_without_waiting(&rd)?;
            continue;
        }
        let input_closed = c.eof || c.quit || c.drained;
        if input_closed && c.pending.is_empty() {
            return Ok(());
        }
        let can_read = !input_closed && !c.stopping && room;
        if can_read {
            c.rbuf.reserve(4096);
        }
        let watch_idle = limits.idle_timeout.is_some() && can_read && c.pending.is_empty();
        // Biased, in this order: a reply or a read that is ready always wins over the
        // idle timer, so a busy connection is never closed as idle.
        tokio::select! {
            biased;
            Some(reply) = c.pending.next(), if !c.pending.is_empty() => reply.encode(&mut c.wbuf),
            read = rd.read_buf(&mut c.rbuf), if can_read => {
                if read? == 0 {
                    c.eof = true;
                }
                last_read = tokio::time::Instant::now();
            }
            _ = shutdown.cancelled(), if !c.stopping => c.stopping = true,
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

/// A connection's buffers, its requests being decided, and where its input stands.
struct Session<'a> {
    limiter: &'a Arc<Limiter>,
    limits: &'a ConnectionLimits,
    peer: &'a Peer,
    decoder: LineDecoder,
    rbuf: BytesMut,
    /// Bytes of `rbuf` already answered; dropped from its front before the next read.
    used: usize,
    wbuf: BytesMut,
    pending: FuturesOrdered<Answer>,
    eof: bool,
    quit: bool,
    stopping: bool,
    drained: bool,
    lines_this_turn: usize,
    /// Bytes of `rbuf` whose lines were walked for a prefetch, and searched for one.
    prefetched: usize,
    searched: usize,
    /// This connection's number in the book of concurrency slots.
    conn: u64,
}

impl<'a> Session<'a> {
    fn new(limiter: &'a Arc<Limiter>, limits: &'a ConnectionLimits, peer: &'a Peer) -> Self {
        Session {
            limiter,
            limits,
            peer,
            decoder: LineDecoder::new(limits.max_line_bytes),
            rbuf: BytesMut::with_capacity(4096),
            used: 0,
            wbuf: BytesMut::with_capacity(4096),
            pending: FuturesOrdered::new(),
            eof: false,
            quit: false,
            stopping: false,
            drained: false,
            lines_this_turn: 0,
            prefetched: 0,
            searched: 0,
            conn: crate::limiter::slots::NO_CONNECTION,
        }
    }

    /// Turns buffered lines into requests, up to the in-flight bound; they are decided
    /// at one instant (one clock read). True when it stopped at a bound (requests in
    /// flight, replies not written, lines this turn) rather than for want of a line.
    fn decode(&mut self) -> bool {
        let mut clock = BatchClock::default();
        if self.limiter.prefetches() {
            (self.prefetched, self.searched) = prefetch(
                self.limiter,
                &self.rbuf,
                self.prefetched.max(self.used),
                self.searched.max(self.used),
            );
        }
        while !self.quit {
            if self.pending.len() >= self.limits.max_in_flight
                || self.wbuf.len() >= MAX_WRITE_BATCH
                || self.lines_this_turn >= LINES_PER_TURN
            {
                return true;
            }
            let (n, found) = self.decoder.scan(&self.rbuf[self.used..], self.eof);
            let at = self.used;
            self.used += n;
            let Some(found) = found else {
                break;
            };
            self.lines_this_turn += 1;
            match found {
                Found::TooLong => {
                    crate::metrics::error_reply(ErrorCode::TooLong);
                    self.pending
                        .push_back(Answer::Ready(Some(Reply::Error(ProtoError::new(
                            ErrorCode::TooLong,
                            format!(
                                "line longer than server.max_line_bytes = {}",
                                self.decoder.max_line_bytes()
                            ),
                        )))))
                }
                Found::Line(line) => {
                    let line = &self.rbuf[at + line.start..at + line.end];
                    let (reply, is_quit) =
                        dispatch::handle_on(self.limiter, line, &mut clock, self.peer, self.conn);
                    match reply {
                        // Nothing ahead of it: a ready reply goes straight out, in order,
                        // without a task node in `pending`.
                        Answer::Ready(Some(reply)) if self.pending.is_empty() => {
                            reply.encode(&mut self.wbuf)
                        }
                        reply => self.pending.push_back(reply),
                    }
                    self.quit = is_quit;
                }
            }
        }
        false
    }

    /// What was answered leaves the buffer (a pointer move: the bytes stay until the
    /// next read's `reserve` reuses the room).
    fn drop_answered(&mut self) {
        if self.used > 0 {
            bytes::Buf::advance(&mut self.rbuf, self.used);
            self.prefetched = self.prefetched.saturating_sub(self.used);
            self.searched = self.searched.saturating_sub(self.used);
            self.used = 0;
        }
    }

    /// Shutting down: still answer what the client sent before it, i.e. what can be
    /// read without waiting; the first read that would block ends the input.
    fn read_without_waiting(&mut self, rd: &ReadHalf<'_>) -> io::Result<()> {
        self.rbuf.reserve(4096);
        match rd.try_read_buf(&mut self.rbuf) {
            Ok(0) => self.eof = true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.drained = true,
            Err(e) => return Err(e),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn limiter() -> Limiter {
        let config = Config::parse(
            "[redis]\nmode = \"none\"\n[[rule]]\nname = \"api\"\nalgorithm = \"token_bucket\"\ncapacity = 5\nrefill_rate = 1.0\n",
            "test",
        )
        .unwrap();
        Limiter::local(&config)
    }

    #[test]
    fn prefetch_walks_complete_lines_and_searches_a_partial_one_once() {
        let l = limiter();
        let buf = b"CHECK api a\r\nPING\nCHECK api b\nCHECK api c".as_slice();
        // Three complete lines walked; the fourth is still arriving: searched to the end.
        assert_eq!(prefetch(&l, buf, 0, 0), (30, buf.len()));
        // Called again with nothing new: nothing is searched again.
        assert_eq!(prefetch(&l, buf, 30, buf.len()), (30, buf.len()));
        // The rest of the line arrives: found from where the search stopped.
        let more = b"CHECK api a\r\nPING\nCHECK api b\nCHECK api c\nCHECK".as_slice();
        assert_eq!(prefetch(&l, more, 30, buf.len()), (42, more.len()));
        // At most LINES_PER_TURN lines per call.
        let many = b"PING\n".repeat(LINES_PER_TURN + 3);
        assert_eq!(
            prefetch(&l, &many, 0, 0),
            (5 * LINES_PER_TURN, 5 * LINES_PER_TURN)
        );
        // Offsets past the buffer (bytes already answered) are safe.
        assert_eq!(prefetch(&l, buf, 100, 100), (100, 100));
    }
}
