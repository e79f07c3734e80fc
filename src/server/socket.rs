//! The socket file: created with exactly `server.socket_mode`, in a directory no other
//! user can tamper with, replacing only a stale socket left by a dead daemon.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::UnixListener;

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
    /// This user may not create the socket (or its directory) there.
    #[error(
        "{path}: cannot create the socket: {dir} is not writable by this user (uid {uid}). \
         Under systemd, ratelimitd.socket creates the socket (systemctl enable --now \
         ratelimitd.socket); to run the daemon as yourself, point server.socket at a \
         directory you own, e.g. socket = \"ratelimitd.sock\" for the working directory \
         (conf/dev.toml)"
    )]
    NotWritable {
        /// The socket path.
        path: PathBuf,
        /// The directory that refused (the socket's, or the ancestor that could not
        /// hold it).
        dir: PathBuf,
        /// The daemon's effective uid.
        uid: u32,
    },
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
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let io_err = |source: io::Error| {
        if source.kind() == io::ErrorKind::PermissionDenied {
            not_writable(path, dir)
        } else {
            BindError::Io {
                path: path.to_owned(),
                source,
            }
        }
    };
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

/// `NotWritable`, naming the directory that refused: the socket's own if it exists,
/// else the nearest existing ancestor (where `create_dir_all` failed).
fn not_writable(path: &Path, dir: &Path) -> BindError {
    let refused = dir
        .ancestors()
        .find(|d| d.as_os_str().is_empty() || d.exists())
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    BindError::NotWritable {
        path: path.to_owned(),
        dir: refused.to_owned(),
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        uid: unsafe { libc::geteuid() },
    }
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

/// The identity (device, inode) of the socket file at `path`, read without following a
/// symlink; `None` if it is not a socket.
pub fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).ok()?;
    meta.file_type()
        .is_socket()
        .then(|| (meta.dev(), meta.ino()))
}

/// Removes the socket file at `path` at shutdown if it is still the one this daemon
/// bound (`bound`, from [`identity`] after binding): never a symlink (unlink does not
/// follow it, and a symlink is not our socket) nor a socket another daemon created since.
pub fn remove_if_ours(path: &Path, bound: Option<(u64, u64)>) -> io::Result<bool> {
    if bound.is_none() || identity(path) != bound {
        return Ok(false);
    }
    std::fs::remove_file(path).map(|()| true)
}
