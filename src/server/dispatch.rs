//! One request line into its reply: parse it, ask the limiter, encode the answer.
//!
//! The one place where the wire format meets the decision flow: the parser knows no
//! rules, the limiter knows no wire format. Every `ERR` reply of a request is counted
//! here.

use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::limiter::{Check, CheckError, Decided, Limiter};
use crate::metrics;
use crate::protocol::{self, ErrorCode, ProtoError, Reply, Request};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A reply on its way: ready now, or waiting on Redis (bounded by the Redis timeout).
pub enum Answer {
    /// Decided without I/O.
    Ready(Option<Reply>),
    /// A Redis decision in flight.
    Redis(Pin<Box<dyn Future<Output = Decided> + Send>>),
    /// Any other reply waiting on Redis (the operator verbs), bounded by its timeout.
    Pending(Pin<Box<dyn Future<Output = Reply> + Send>>),
}

impl Future for Answer {
    type Output = Reply;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Reply> {
        match self.get_mut() {
            Answer::Ready(reply) => Poll::Ready(reply.take().unwrap_or_else(|| {
                ProtoError::new(ErrorCode::Internal, "reply polled twice").into()
            })),
            Answer::Redis(fut) => fut
                .as_mut()
                .poll(cx)
                .map(|d| Reply::Decision(d.decision, d.window_ms)),
            Answer::Pending(fut) => fut.as_mut().poll(cx),
        }
    }
}

/// Answers one request line (terminator removed) as if this process were the peer (an
/// operator: it may use the operator verbs), with no bound on requests in flight (tests,
/// fuzzing). The `bool` is true for `QUIT`: the
/// connection closes after this reply.
pub fn handle(limiter: &Arc<Limiter>, line: &[u8]) -> (Answer, bool) {
    static SELF: std::sync::OnceLock<Peer> = std::sync::OnceLock::new();
    let peer = SELF.get_or_init(|| {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let itself = crate::admission::PeerAccess {
            uids: vec![uid],
            gids: Vec::new(),
        };
        Peer::unbounded(uid, gid).with_admins(&itself)
    });
    handle_with(limiter, line, &mut BatchClock::default(), peer)
}

/// [`handle`] for `peer`, reading the wall clock through `clock`, shared by the lines of
/// one batch.
pub fn handle_with(
    limiter: &Arc<Limiter>,
    line: &[u8],
    clock: &mut BatchClock,
    peer: &Peer,
) -> (Answer, bool) {
    let ready = |reply: Reply| Answer::Ready(Some(reply));
    match protocol::parse(line) {
        Ok(Request::Check { rule, key, cost }) => {
            let pending = match limiter.check(rule, key, cost, clock, peer) {
                Check::Ready(Ok(d)) => ready(Reply::Decision(d.decision, d.window_ms)),
                Check::Ready(Err(e)) => ready(refusal(e, rule).into()),
                Check::Redis(fut) => Answer::Redis(fut),
            };
            (pending, false)
        }
        Ok(Request::Ping) => (ready(Reply::Pong), false),
        Ok(Request::Quit) => (ready(Reply::Bye), true),
        // The operator verbs (`server.admin_uids`): `super::operator`.
        Ok(request) => match super::operator::handle(limiter, &request, peer) {
            Some(answer) => (answer, false),
            None => {
                let e = ProtoError::new(ErrorCode::Internal, "a request without a handler");
                metrics::error_reply(e.code);
                (ready(e.into()), false)
            }
        },
        Err(e) => {
            metrics::error_reply(e.code);
            (ready(e.into()), false)
        }
    }
}

/// The `ERR` reply of a `CHECK` the limiter refused (`rule` as the client sent it).
fn refusal(e: CheckError, rule: &[u8]) -> ProtoError {
    let error = match e {
        CheckError::UnknownRule => ProtoError::new(
            ErrorCode::Rule,
            format!("unknown rule '{}'", protocol::printable(rule, 64)),
        ),
        CheckError::CostAboveLimit { .. } => ProtoError::new(ErrorCode::Cost, e.to_string()),
        CheckError::KeyTooLong => ProtoError::new(ErrorCode::Key, e.to_string()),
        CheckError::Forbidden { .. } => ProtoError::new(ErrorCode::Perm, e.to_string()),
        CheckError::Busy { .. } => ProtoError::new(ErrorCode::Busy, e.to_string()),
    };
    metrics::error_reply(error.code);
    error
}
