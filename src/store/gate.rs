//! Whether a lease call may still go out. A holder's lease calls of one key must reach
//! Redis in the order it makes them: a call that gives back or asks ends the caller's
//! stored lease, and returns its unspent units only if it names that grant
//! (docs/DESIGN.md "Leases"). A call reaching Redis after the holder's next one would
//! end, as spent, the grant the next one brought while the holder spends it: its room
//! in the bucket (a slice's refill too) would go back to the key while its units are
//! still spent, an over-admission. The limiter makes a key's next call only once the
//! store has stopped waiting for the one before ([`super::Store::lease`] returned: its
//! answer, or `redis.timeout_ms`). Alone, a call's EVALSHA is on the connection from its
//! first poll, ahead of anything sent after on that connection. Through a batch it may
//! go later: queued, in a batch whose task runs after the next call's, re-sent after
//! `NOSCRIPT`, refused by the batch and sent alone, a redirection followed. So each of
//! those sends goes through a [`Gate`]: it puts the call on its connection only while
//! its caller waits, in one step its caller's giving up cannot come between.

use fred::error::{Error, ErrorKind};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

/// One lease call's leave to go out: open while its caller waits for it.
#[derive(Debug)]
pub(in crate::store) struct Gate(Mutex<bool>);

impl Gate {
    /// An open gate.
    pub fn new() -> Arc<Gate> {
        Arc::new(Gate(Mutex::new(true)))
    }

    /// Held while the call is put on its connection: `None` once its caller stopped
    /// waiting. Closing waits for a send in progress, which is then on its connection.
    pub fn open(&self) -> Option<MutexGuard<'_, bool>> {
        let guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        (*guard).then_some(guard)
    }

    /// The caller stopped waiting: nothing of the call goes out from now on.
    pub fn close(&self) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = false;
    }
}

/// Closes its gate when dropped: held by the future that waits for the call, so the
/// gate closes whatever ends the wait (an answer, `redis.timeout_ms`, the request's
/// client going away).
pub(in crate::store) struct CloseOnDrop(pub Arc<Gate>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// The error of a lease call not sent because its caller had stopped waiting (nobody
/// reads it).
pub(in crate::store) fn not_sent() -> Error {
    Error::new(
        ErrorKind::Timeout,
        "not sent: its caller had stopped waiting for it",
    )
}

/// `make()`'s Redis call, put on its connection now if `gate` is open (no gate: a
/// decision, always), then awaited; [`not_sent`] if the gate is closed.
///
/// # Errors
/// The call's, or [`not_sent`].
pub(in crate::store) async fn send<T, F>(
    gate: Option<&Gate>,
    make: impl FnOnce() -> F,
) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>>,
{
    let Some(gate) = gate else {
        return make().await;
    };
    let call = {
        let Some(_open) = gate.open() else {
            return Err(not_sent());
        };
        let mut call = Box::pin(make());
        if let Some(done) = poll_once(&mut call) {
            return done;
        }
        call
    };
    call.await
}

/// Polls `call` once, which puts its command on the connection (fred hands a command to
/// its connection at the first poll, before waiting for the answer), with a waker that
/// does nothing: the caller polls it again at once with its own. `Some` when it is
/// already done.
pub(in crate::store) fn poll_once<F: Future + Unpin>(call: &mut F) -> Option<F::Output> {
    let mut cx = Context::from_waker(futures::task::noop_waker_ref());
    match std::pin::Pin::new(call).poll(&mut cx) {
        Poll::Ready(done) => Some(done),
        Poll::Pending => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_closed_gate_sends_nothing() {
        let gate = Gate::new();
        let sent = send(Some(&gate), || async { Ok::<_, Error>(1) }).await;
        assert_eq!(sent.ok(), Some(1));
        drop(CloseOnDrop(Arc::clone(&gate)));
        let mut made = false;
        let refused = send(Some(&gate), || {
            made = true;
            async { Ok::<_, Error>(2) }
        })
        .await;
        assert!(!made, "the call was not even made");
        assert_eq!(
            refused.err().map(|e| e.kind().clone()),
            Some(ErrorKind::Timeout)
        );
        // Without a gate (a decision), always sent.
        assert_eq!(
            send(None, || async { Ok::<_, Error>(3) }).await.ok(),
            Some(3)
        );
    }

    #[tokio::test]
    async fn the_first_poll_happens_while_the_gate_is_held() {
        let gate = Gate::new();
        let g = Arc::clone(&gate);
        // The call's first poll finds the gate held (by the send itself).
        let reply = send(Some(&gate), || async move {
            let held = g.0.try_lock().is_err();
            tokio::task::yield_now().await;
            Ok::<_, Error>(held)
        })
        .await;
        assert_eq!(reply.ok(), Some(true));
        // Released after: closing does not wait.
        gate.close();
        assert!(gate.open().is_none());
    }
}
