//! The count of daemons sharing the limits (`fallback.hosts = "auto"`) kept across
//! restarts, and its floor `fallback.min_hosts`.
//!
//! The count comes from the heartbeats in Redis ([`crate::store::hosts`]). A daemon
//! started while Redis is down has heard none: without a saved count it would enforce
//! the whole limit (÷ 1) until Redis answers, and N such daemons N times the limit. So
//! each count heard is written to `live-hosts` in the state directory (atomically: a
//! temporary file renamed over it) and read back at start; with no file, the count
//! starts at `fallback.min_hosts`. The count in force is never below `min_hosts`.
//!
//! The state directory is `$STATE_DIRECTORY` (systemd's `StateDirectory=`, the first
//! entry if it lists several), else `fallback.state_dir`, else none (nothing is saved).

use crate::config::FallbackConfig;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file, in the state directory, holding the last count heard.
pub const FILE_NAME: &str = "live-hosts";

/// The largest count a file may hold (as `fallback.hosts`).
const MAX_HOSTS: u32 = 10_000;

/// The saved count of daemons alive and the floor of the count in force.
#[derive(Debug)]
pub struct SavedHosts {
    /// `<state dir>/live-hosts`, if there is a state directory.
    path: Option<PathBuf>,
    /// `fallback.min_hosts`.
    min: u32,
    /// The count the file holds (read at start, then as last written).
    saved: Option<u32>,
}

impl SavedHosts {
    /// The state directory of `fallback` and `$STATE_DIRECTORY`, and the count saved
    /// there (a file that cannot be read or holds no count is logged and ignored).
    pub fn open(fallback: &FallbackConfig) -> Self {
        let env = std::env::var_os("STATE_DIRECTORY");
        let dir = env
            .as_deref()
            .and_then(|v| std::env::split_paths(v).find(|p| !p.as_os_str().is_empty()))
            .or_else(|| fallback.state_dir.clone());
        let path = dir.map(|d| d.join(FILE_NAME));
        let saved = path.as_deref().and_then(read);
        SavedHosts {
            path,
            min: fallback.min_hosts,
            saved,
        }
    }

    /// The count to put in force before any heartbeat: the one saved, else
    /// `min_hosts`; never below `min_hosts`.
    pub fn at_start(&self) -> u32 {
        self.in_force(self.saved.unwrap_or(1))
    }

    /// Where the count is saved, if anywhere.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The count saved at start (or since), if any.
    pub fn saved(&self) -> Option<u32> {
        self.saved
    }

    /// A heartbeat heard `alive` daemons: saves it if it differs from the file (a
    /// failure is logged, the count still applies), and returns the count to put in
    /// force (`alive`, at least `min_hosts`).
    pub fn heard(&mut self, alive: u32) -> u32 {
        if let Some(path) = &self.path {
            if self.saved != Some(alive) {
                match write(path, alive) {
                    Ok(()) => self.saved = Some(alive),
                    Err(e) => tracing::warn!(
                        file = %path.display(), error = %e,
                        "could not save the count of daemons alive; a restart while Redis is down will start from fallback.min_hosts"
                    ),
                }
            }
        }
        self.in_force(alive)
    }

    fn in_force(&self, alive: u32) -> u32 {
        alive.max(self.min).max(1)
    }
}

/// The count in `path`; `None` if there is no file, or (logged) if it holds no count.
fn read(path: &Path) -> Option<u32> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the saved count of daemons alive; ignored");
            return None;
        }
    };
    let n = text
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=MAX_HOSTS).contains(n));
    if n.is_none() {
        tracing::warn!(file = %path.display(), "the saved count of daemons alive is not an integer from 1 to {MAX_HOSTS}; ignored");
    }
    n
}

/// Writes `n` to `path` atomically: a temporary file beside it, synced, renamed over it.
fn write(path: &Path, n: u32) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    writeln!(f, "{n}")?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved_in(dir: &Path, min: u32) -> SavedHosts {
        SavedHosts {
            path: Some(dir.join(FILE_NAME)),
            min,
            saved: read(&dir.join(FILE_NAME)),
        }
    }

    #[test]
    fn a_count_heard_is_read_back_and_the_floor_holds() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = saved_in(dir.path(), 2);
        assert_eq!(s.at_start(), 2, "no file: the floor");
        assert_eq!(s.heard(1), 2, "never below the floor");
        assert_eq!(s.heard(3), 3);
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap(),
            "3\n"
        );
        assert!(!dir.path().join("live-hosts.tmp").exists());
        assert_eq!(saved_in(dir.path(), 1).at_start(), 3);
        assert_eq!(saved_in(dir.path(), 5).at_start(), 5);
    }

    #[test]
    fn a_bad_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        for bad in ["", "0", "x", "10001", "-3"] {
            std::fs::write(dir.path().join(FILE_NAME), bad).unwrap();
            assert_eq!(saved_in(dir.path(), 1).at_start(), 1, "{bad:?}");
        }
        let none = SavedHosts {
            path: None,
            min: 1,
            saved: None,
        };
        assert_eq!(none.at_start(), 1);
    }
}
