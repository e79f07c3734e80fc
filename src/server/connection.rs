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

use super::dispatch::{self, Pending};
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
    let mut decoder = LineDecoder::new(limits.max_line_bytes);
    let mut rbuf = BytesMut::with_capacity(4096);
    // Bytes of `rbuf` already answered; dropped from its front before the next read.
    let mut used = 0usize;
    let mut wbuf = BytesMut::with_capacity(4096);
    let mut pending: FuturesOrdered<Pending> = FuturesOrdered::new();
    let mut eof = false;
    let mut quit = false;
    let mut stopping = false;
    let mut drained = false;
    let mut lines_this_turn = 0usize;
    // Bytes of `rbuf` whose lines were walked for a prefetch, and searched for one.
    let mut prefetched = 0usize;
    let mut searched = 0usize;
    loop {
        if lines_this_turn >= LINES_PER_TURN {
            lines_this_turn = 0;
            tokio::task::yield_now().await;
        }
        // Turn buffered lines into requests, up to the in-flight bound; they are
        // decided at one instant (one clock read).
        let mut clock = BatchClock::default();
        let mut at_bound = false;
        if limiter.prefetches() {
            (prefetched, searched) =
                prefetch(&limiter, &rbuf, prefetched.max(used), searched.max(used));
        }
        while !quit {
            if pending.len() >= limits.max_in_flight
                || wbuf.len() >= MAX_WRITE_BATCH
                || lines_this_turn >= LINES_PER_TURN
            {
                at_bound = true;
                break;
            }
            let (n, found) = decoder.scan(&rbuf[used..], eof);
            let at = used;
            used += n;
            if found.is_some() {
                lines_this_turn += 1;
            }
            match found {
                None => break,
                Some(Found::TooLong) => {
                    crate::metrics::error_reply(ErrorCode::TooLong);
                    pending.push_back(Pending::Ready(Some(Reply::Error(ProtoError::new(
                        ErrorCode::TooLong,
                        format!(
                            "line longer than server.max_line_bytes = {}",
                            decoder.max_line_bytes()
                        ),
                    )))))
                }
                Some(Found::Line(line)) => {
                    let line = &rbuf[at + line.start..at + line.end];
                    let (reply, is_quit) = dispatch::handle_with(&limiter, line, &mut clock, &peer);
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
        // What was answered leaves the buffer (a pointer move: the bytes stay until
        // the next read's `reserve` reuses the room).
        if used > 0 {
            bytes::Buf::advance(&mut rbuf, used);
            prefetched = prefetched.saturating_sub(used);
            searched = searched.saturating_sub(used);
            used = 0;
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
            // Decoding stopped at a bound and replies have made room (or were
            // written): lines may still be waiting in the buffer, decode them before
            // reading more.
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
        // Biased, in this order: a reply or a read that is ready always wins over the
        // idle timer, so a busy connection is never closed as idle.
        tokio::select! {
            biased;
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
