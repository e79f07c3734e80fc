//! The socket the daemon serves, from start-up to shutdown: the one systemd passed
//! (socket activation) or `server.socket` bound here, and, at shutdown, its file removed
//! only if this daemon created it and it is still there.

use super::StartError;
use crate::config::Config;
use crate::server;
use std::path::PathBuf;
use tokio::net::UnixListener;

/// The socket the daemon serves: the one systemd passed, or `server.socket` bound here.
pub(super) struct Socket {
    /// `server.socket`.
    configured: PathBuf,
    /// The path served (`None`: systemd passed a socket without one).
    pub(super) served: Option<PathBuf>,
    /// Passed by systemd.
    pub(super) activated: bool,
    /// The socket file this daemon created: only that one is removed at shutdown.
    bound: Option<(u64, u64)>,
}

impl Socket {
    /// The listener systemd passed (`activated`), else `server.socket` bound now.
    pub(super) fn open(
        config: &Config,
        activated: Option<(UnixListener, Option<PathBuf>)>,
    ) -> Result<(UnixListener, Socket), StartError> {
        let configured = config.server.socket.clone();
        let (listener, socket) = match activated {
            Some((listener, path)) => {
                if path.as_deref() != Some(configured.as_path()) {
                    tracing::warn!(
                        configured = %configured.display(), passed = ?path,
                        "server.socket differs from the socket systemd passed; serving the one systemd passed"
                    );
                }
                let socket = Socket {
                    configured,
                    served: path,
                    activated: true,
                    bound: None,
                };
                (listener, socket)
            }
            None => {
                let listener = server::bind(&configured, config.server.socket_mode)?;
                let socket = Socket {
                    bound: server::socket::identity(&configured),
                    served: Some(configured.clone()),
                    configured,
                    activated: false,
                };
                (listener, socket)
            }
        };
        tracing::info!(
            socket = %socket.served.as_deref().unwrap_or(&socket.configured).display(),
            socket_activated = socket.activated,
            rules = config.rules.len(),
            "ratelimitd serving"
        );
        Ok((listener, socket))
    }

    /// Removes the socket file at shutdown if this daemon created it and it is still
    /// there. A socket passed by systemd is systemd's: it stays, listening for the next
    /// start.
    pub(super) fn remove(self) {
        if self.activated {
            return;
        }
        let socket = &self.configured;
        match server::socket::remove_if_ours(socket, self.bound) {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(socket = %socket.display(), "the socket file was replaced or removed while serving; left as it is")
            }
            Err(e) => {
                tracing::warn!(socket = %socket.display(), error = %e, "could not remove the socket file")
            }
        }
    }
}
