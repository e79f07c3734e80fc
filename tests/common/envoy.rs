//! The Envoy Rate Limit Service's gRPC side of the tests: a client over the daemon's
//! Unix socket, the runtime it runs on, and descriptors built from `(key, value)` pairs.
//! The client is the generated one of the `envoy-types` crate the daemon serves.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use std::path::PathBuf;
use tonic::transport::{Channel, Endpoint};

/// A current-thread runtime for one test's gRPC calls.
pub fn grpc_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A client of the Rate Limit Service listening on the Unix socket `path` (which must
/// exist). Panics when the connection fails.
pub async fn unix_rls_client(path: PathBuf) -> RateLimitServiceClient<Channel> {
    let ch = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connecting over the Unix socket");
    RateLimitServiceClient::new(ch)
}

/// A descriptor of `entries`, in order, without a `hits_addend` of its own.
pub fn rls_descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}
