//! Build script: records the git commit the binary is built from, for the metric
//! `ratelimitd_build_info{version,commit}` (`RATELIMITD_COMMIT`, read by
//! `src/metrics/mod.rs`). `git rev-parse --short HEAD`; an environment variable
//! `RATELIMITD_COMMIT` set for the build wins (a package built from a tarball), and
//! outside a git checkout it is `unknown`.

use std::process::Command;

/// The trimmed stdout of `git args…`, if git ran and succeeded.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=RATELIMITD_COMMIT");
    let commit = std::env::var("RATELIMITD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=RATELIMITD_COMMIT={commit}");
    // Built again when HEAD moves: a new commit on the branch, or another branch.
    // Only files that exist: cargo takes a missing one as changed, and would rebuild
    // the crate every time (a fresh clone has no `packed-refs`, or no loose ref).
    let mut paths = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    paths.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in paths {
        if let Some(p) = git(&["rev-parse", "--git-path", &path]) {
            if std::path::Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
}
