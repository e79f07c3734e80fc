//! The `ratelimitd` daemon: `ratelimitd --config <path>` (see `--help`), and
//! `ratelimitd ctl`, the operator's client of a running daemon ([`ctl`]).
//!
//! Only the command line and logging live here; the daemon itself is
//! [`ratelimitd::daemon`].

mod cli_docs;
mod ctl;
mod journal;

use clap::Parser;
use ratelimitd::config::Config;
use ratelimitd::daemon;
use ratelimitd::envoy::limits::Shared as EnvoyLimits;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// mimalloc: the daemon allocates and frees small buffers per request (frames,
/// replies, futures); glibc's malloc spent about a sixth of its CPU there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Per-host rate-limit daemon: answers CHECK requests on a Unix socket, deciding in
/// Redis (Cluster) and falling back to local buckets when Redis is unreachable.
#[derive(Parser, Debug)]
#[command(
    version,
    about,
    override_usage = "ratelimitd --config <PATH> [--check]\n       ratelimitd ctl [--socket <PATH>] [--json] <inspect|reset|rules|top> ...",
    subcommand_negates_reqs = true,
    disable_help_subcommand = true
)]
struct Cli {
    /// Configuration file (TOML), see ratelimitd.toml(5).
    #[arg(
        long,
        short = 'c',
        value_name = "PATH",
        value_hint = clap::ValueHint::FilePath,
        required_unless_present_any = ["print_man", "print_completions"]
    )]
    config: Option<PathBuf>,
    /// Validate the configuration, print a summary and exit (0 valid, 2 invalid).
    #[arg(long)]
    check: bool,
    /// Print the manual page ratelimitd(8) (roff) and exit.
    #[arg(long, hide = true)]
    print_man: bool,
    /// Print the completion script for SHELL and exit.
    #[arg(long, hide = true, value_name = "SHELL")]
    print_completions: Option<clap_complete::Shell>,
    #[command(subcommand)]
    command: Option<Command>,
}

/// What else the binary does besides running the daemon.
#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Ask a running daemon: inspect or reset a key, list the rules, the hottest keys
    /// (operators only: server.admin_uids / admin_gids).
    Ctl(ctl::Ctl),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Ctl(args)) = cli.command {
        return ctl::run(args);
    }
    if let Some(code) = print_docs(&cli) {
        return code;
    }
    let Some(config_path) = cli.config else {
        unreachable!("clap requires --config without --print-man/--print-completions");
    };
    journal::init();
    let (config, envoy) = match load(&config_path) {
        Ok(loaded) => loaded,
        Err(e) => {
            // Under systemd this is how a reload's check fails: at priority err.
            journal::eprint_error(&format!("ratelimitd: invalid configuration: {e}"));
            return ExitCode::from(2);
        }
    };
    if cli.check {
        return check(&config_path, &config, envoy.as_ref());
    }
    run_daemon(config_path, config, envoy)
}

/// `--print-man` and `--print-completions`: the page or script printed, and the exit code;
/// `None` for any other command line.
fn print_docs(cli: &Cli) -> Option<ExitCode> {
    if cli.print_man {
        return Some(match cli_docs::print_man::<Cli>() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ratelimitd: {e}");
                ExitCode::FAILURE
            }
        });
    }
    let shell = cli.print_completions?;
    cli_docs::print_completions::<Cli>(shell);
    Some(ExitCode::SUCCESS)
}

/// The configuration at `path` and the Envoy limits it names.
///
/// # Errors
/// Why either is invalid (unreadable, malformed, or refused by validation).
fn load(path: &Path) -> Result<(Config, Option<EnvoyLimits>), String> {
    let config = Config::load(path).map_err(|e| e.to_string())?;
    let envoy = ratelimitd::envoy::load::limits_for(&config).map_err(|e| e.to_string())?;
    Ok((config, envoy))
}

/// `--check`: the files the configuration names checked too (a reload that would fail on
/// an unreadable password file or a bad certificate fails here), then a summary; 0 valid,
/// 2 invalid.
fn check(path: &Path, config: &Config, envoy: Option<&EnvoyLimits>) -> ExitCode {
    if config.redis.mode != ratelimitd::config::RedisMode::None {
        match ratelimitd::store::connect::check_files(&config.redis) {
            Ok(warnings) => {
                for w in warnings {
                    eprintln!("ratelimitd: warning: {w}");
                }
            }
            Err(e) => {
                journal::eprint_error(&format!("ratelimitd: invalid configuration: {e}"));
                return ExitCode::from(2);
            }
        }
    }
    let envoy = match (&config.envoy.listen, envoy) {
        (Some(listen), Some(l)) => format!(
            ", envoy {listen}: {} domains, {} limits",
            l.domains.len(),
            l.all.len()
        ),
        _ => String::new(),
    };
    println!(
        "{}: OK ({} rules, redis.mode = {:?}, socket {}{envoy})",
        path.display(),
        config.rules.len(),
        config.redis.mode,
        config.server.socket.display()
    );
    ExitCode::SUCCESS
}

/// Runs the daemon until it is stopped; a runtime that cannot start is reported on
/// stderr (logging needs it), anything else through the log.
fn run_daemon(path: PathBuf, config: Config, envoy: Option<EnvoyLimits>) -> ExitCode {
    match daemon::run(path, config, envoy) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ daemon::StartError::Runtime(_)) => {
            journal::eprint_error(&format!("ratelimitd: {e}"));
            ExitCode::FAILURE
        }
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
