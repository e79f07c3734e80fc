//! The `ratelimitd` daemon: `ratelimitd --config <path>` (see `--help`).
//!
//! Only the command line and logging live here; the daemon itself is
//! [`ratelimitd::daemon`].

use clap::Parser;
use ratelimitd::config::Config;
use ratelimitd::daemon;
use std::path::PathBuf;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// Per-host rate-limit daemon: answers CHECK requests on a Unix socket, deciding in
/// Redis (Cluster) and falling back to local buckets when Redis is unreachable.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Cli {
    /// Configuration file (TOML).
    #[arg(long, short = 'c', value_name = "PATH")]
    config: PathBuf,
    /// Validate the configuration, print a summary and exit (0 valid, 2 invalid).
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,fred=error")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match Config::load(&cli.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ratelimitd: invalid configuration: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!(
            "{}: OK ({} rules, redis.mode = {:?}, socket {})",
            cli.config.display(),
            config.rules.len(),
            config.redis.mode,
            config.server.socket.display()
        );
        return ExitCode::SUCCESS;
    }
    match daemon::run(cli.config, config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ daemon::StartError::Runtime(_)) => {
            eprintln!("ratelimitd: {e}");
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
