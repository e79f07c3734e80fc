//! The gRPC server of the Rate Limit Service: tonic, on a TCP address or a Unix socket
//! (`[envoy] listen`), until shutdown.
//!
//! The generated types and service trait come from the `envoy-types` crate (prebuilt
//! from Envoy's protos: no `protoc` at build time). Only `ShouldRateLimit` is served;
//! the answer is made by [`super::service::Rls`].

use super::service::{Rls, RlsError};
use crate::config::envoy::EnvoyListen;
use crate::server::BindError;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// A bound listener of the front end.
pub enum Bound {
    /// TCP.
    Tcp(TcpListener),
    /// A Unix socket file this daemon created, with its identity (removed at shutdown
    /// only if still the same file).
    Unix(UnixListener, PathBuf, Option<(u64, u64)>),
}

impl Bound {
    /// Binds `listen`; a Unix socket is created like `server.socket`, with `mode`.
    pub async fn bind(listen: &EnvoyListen, mode: u32) -> Result<Bound, BindError> {
        match listen {
            EnvoyListen::Tcp(addr) => {
                TcpListener::bind(addr)
                    .await
                    .map(Bound::Tcp)
                    .map_err(|source| BindError::Io {
                        path: PathBuf::from(addr.to_string()),
                        source,
                    })
            }
            EnvoyListen::Unix(path) => {
                let listener = crate::server::bind(path, mode)?;
                let id = crate::server::socket::identity(path);
                Ok(Bound::Unix(listener, path.clone(), id))
            }
        }
    }

    /// The TCP address bound (for `127.0.0.1:0` in tests), if TCP.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        match self {
            Bound::Tcp(l) => l.local_addr().ok(),
            Bound::Unix(..) => None,
        }
    }
}

struct Service(Arc<Rls>);

#[tonic::async_trait]
impl RateLimitService for Service {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        match self.0.should_rate_limit(request.get_ref()).await {
            Ok(r) => Ok(Response::new(r)),
            Err(RlsError::Invalid(m)) => Err(Status::invalid_argument(m)),
        }
    }
}

/// Serves `rls` on `bound` until `shutdown`, then lets calls in flight finish; removes
/// its Unix socket file.
pub async fn serve(bound: Bound, rls: Arc<Rls>, shutdown: CancellationToken) {
    let router = tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::from_arc(Arc::new(Service(rls))));
    let stopped = shutdown.clone();
    let result = match bound {
        Bound::Tcp(listener) => {
            let incoming = TcpListenerStream::new(listener).map(|s| {
                s.inspect(|s| {
                    // Each call is a small request and a small reply: no Nagle delay.
                    let _ = s.set_nodelay(true);
                })
            });
            router
                .serve_with_incoming_shutdown(incoming, stopped.cancelled_owned())
                .await
        }
        Bound::Unix(listener, path, id) => {
            let incoming = UnixListenerStream::new(listener);
            let r = router
                .serve_with_incoming_shutdown(incoming, stopped.cancelled_owned())
                .await;
            if let Err(e) = crate::server::socket::remove_if_ours(&path, id) {
                tracing::warn!(socket = %path.display(), error = %e, "could not remove the envoy.listen socket file");
            }
            r
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "the Envoy RLS server stopped");
    }
}
