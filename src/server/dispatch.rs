//! One request line into its reply: parse it, ask the limiter, encode the answer.
//!
//! The one place where the wire format meets the decision flow: the parser knows no
//! rules, the limiter knows no wire format. Every `ERR` reply of a request is counted
//! here.

use crate::admission::Peer;
use crate::clock::BatchClock;
use crate::limiter::slots::{SlotAnswer, SlotError, Slots, NO_CONNECTION};
use crate::limiter::{Bound, Check, CheckAll, CheckError, Decided, Limiter};
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
    /// A `CHECKALL` with store calls in flight.
    All(Pin<Box<dyn Future<Output = Bound> + Send>>),
    /// An `ACQUIRE` or `RELEASE` in flight (rule name as sent, for errors).
    Slots(Pin<Box<dyn Future<Output = SlotAnswer> + Send>>, Box<[u8]>),
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
            Answer::All(fut) => fut.as_mut().poll(cx).map(bound_reply),
            Answer::Slots(fut, rule) => fut.as_mut().poll(cx).map(|a| slot_reply(a, rule)),
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
    handle_on(limiter, line, clock, peer, NO_CONNECTION)
}

/// [`handle_with`] on connection `conn` ([`crate::limiter::slots::Holder::conn`]): the
/// slots its `ACQUIRE`s take are given back when the connection closes.
pub fn handle_on(
    limiter: &Arc<Limiter>,
    line: &[u8],
    clock: &mut BatchClock,
    peer: &Peer,
    conn: u64,
) -> (Answer, bool) {
    let ready = |reply: Reply| Answer::Ready(Some(reply));
    match protocol::parse(line) {
        Ok(Request::Acquire { rule, key }) => {
            (slots(limiter.acquire(rule, key, peer, conn), rule), false)
        }
        Ok(Request::Release { rule, key, token }) => {
            (slots(limiter.release(rule, key, token, peer), rule), false)
        }
        Ok(Request::Check { rule, key, cost }) => {
            let pending = match limiter.check(rule, key, cost, clock, peer) {
                Check::Ready(Ok(d)) => ready(Reply::Decision(d.decision, d.window_ms)),
                Check::Ready(Err(CheckError::Composite { .. })) => {
                    match limiter.check_composite(rule, key, cost, clock, peer) {
                        Some(CheckAll::Ready(Ok(b))) => ready(bound_reply(b)),
                        Some(CheckAll::Ready(Err(r))) => ready(refusal(r.error, rule).into()),
                        Some(CheckAll::Redis(fut)) => Answer::All(fut),
                        // The rules were reloaded in between: ask again.
                        None => return handle_with(limiter, line, clock, peer),
                    }
                }
                Check::Ready(Err(e)) => ready(refusal(e, rule).into()),
                Check::Redis(fut) => Answer::Redis(fut),
            };
            (pending, false)
        }
        Ok(Request::CheckAll(triples)) => {
            let asks: Vec<(&[u8], &[u8], u32)> = triples
                .as_slice()
                .iter()
                .map(|t| (t.rule, t.key, t.cost))
                .collect();
            let pending = match limiter.check_all(&asks, clock, peer) {
                CheckAll::Ready(Ok(b)) => ready(bound_reply(b)),
                CheckAll::Ready(Err(r)) => {
                    let rule = asks.get(r.index).map_or(&b""[..], |a| a.0);
                    ready(refusal(r.error, rule).into())
                }
                CheckAll::Redis(fut) => Answer::All(fut),
            };
            (pending, false)
        }
        Ok(Request::Refund { rule, key, units }) => {
            let pending = match limiter.refund(rule, key, units, clock, peer) {
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

/// The reply of a `CHECKALL`: the binding triple's fields and its rule's name.
fn bound_reply(b: Bound) -> Reply {
    Reply::Bound(b.decided.decision, b.decided.window_ms, b.rule)
}

/// The answer of a slot request on `rule` (as the client sent it).
fn slots(s: Slots, rule: &[u8]) -> Answer {
    match s {
        Slots::Ready(a) => Answer::Ready(Some(slot_reply(a, rule))),
        Slots::Pending(fut) => Answer::Slots(fut, rule.into()),
    }
}

/// The reply line of a slot request's answer (an `ERR` is counted here).
fn slot_reply(a: SlotAnswer, rule: &[u8]) -> Reply {
    let error = match a {
        SlotAnswer::Acquired(d, token) => return Reply::Acquired(d, token),
        SlotAnswer::Denied(d) => return Reply::Decision(d, 0),
        SlotAnswer::Released => return Reply::Ok,
        SlotAnswer::Refused(e) => e,
    };
    let code = match &error {
        SlotError::UnknownRule => {
            let e = ProtoError::new(
                ErrorCode::Rule,
                format!("unknown rule '{}'", protocol::printable(rule, 64)),
            );
            metrics::error_reply(e.code);
            return e.into();
        }
        SlotError::NotConcurrency { .. } => ErrorCode::Rule,
        SlotError::Forbidden { .. } => ErrorCode::Perm,
        SlotError::KeyTooLong => ErrorCode::Key,
        SlotError::Token { .. } => ErrorCode::Token,
        SlotError::Busy(_) => ErrorCode::Busy,
    };
    metrics::error_reply(code);
    ProtoError::new(code, error.to_string()).into()
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
        CheckError::RefundOfSlots { .. } => ProtoError::new(ErrorCode::Cost, e.to_string()),
        CheckError::Concurrency { .. } => ProtoError::new(ErrorCode::Rule, e.to_string()),
        CheckError::Forbidden { .. } => ProtoError::new(ErrorCode::Perm, e.to_string()),
        CheckError::Busy { .. } => ProtoError::new(ErrorCode::Busy, e.to_string()),
        CheckError::Leased { .. } => ProtoError::new(ErrorCode::Rule, e.to_string()),
        CheckError::Override { .. } => ProtoError::new(ErrorCode::Param, e.to_string()),
        CheckError::Composite { .. } => ProtoError::new(ErrorCode::Internal, e.to_string()),
    };
    metrics::error_reply(error.code);
    error
}
