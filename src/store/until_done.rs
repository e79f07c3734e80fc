//! A call that outlives its caller: awaited by whoever asked, and finished on a task of
//! its own when they stop waiting, so that what the call holds (a place in the cap of
//! calls in flight) comes back only when the store is done with it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// A call to Redis that holds its caller's place in the cap of calls in flight (moved
/// into `F`): awaited by its caller,
/// and, if the caller stops waiting (its `redis.timeout_ms` ran out, or its connection
/// closed), finished on a task of its own, so that the slot comes back only when Redis
/// is done with the request. `limit` bounds that task, a backstop: the Redis client gives
/// up on a command by itself.
pub struct UntilDone<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    call: Option<Pin<Box<F>>>,
    limit: Duration,
}

impl<F> UntilDone<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// Wraps `call`.
    pub fn new(call: F, limit: Duration) -> Self {
        UntilDone {
            call: Some(Box::pin(call)),
            limit,
        }
    }
}

impl<F> Future for UntilDone<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let Some(call) = this.call.as_mut() else {
            return Poll::Pending;
        };
        let out = call.as_mut().poll(cx);
        if out.is_ready() {
            this.call = None;
        }
        out
    }
}

impl<F> Drop for UntilDone<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let (Some(call), Ok(runtime)) = (self.call.take(), tokio::runtime::Handle::try_current())
        {
            runtime.spawn(tokio::time::timeout(self.limit, call));
        }
    }
}
