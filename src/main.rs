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
use std::path::PathBuf;
use std::process::ExitCode;

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
    if cli.print_man {
        return match cli_docs::print_man::<Cli>() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ratelimitd: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(shell) = cli.print_completions {
        cli_docs::print_completions::<Cli>(shell);
        return ExitCode::SUCCESS;
    }
    let Some(config_path) = cli.config else {
        unreachable!("clap requires --config without --print-man/--print-completions");
    };
    journal::init();
    let config = match Config::load(&config_path) {
        Ok(c) => c,
        Err(e) => {
            // Under systemd this is how a reload's check fails: at priority err.
            journal::eprint_error(&format!("ratelimitd: invalid configuration: {e}"));
            return ExitCode::from(2);
        }
    };
    let envoy = match ratelimitd::envoy::load::limits_for(&config) {
        Ok(limits) => limits,
        Err(e) => {
            journal::eprint_error(&format!("ratelimitd: invalid configuration: {e}"));
            return ExitCode::from(2);
        }
    };
    if cli.check {
        // The files the config names must be usable too: a reload that would fail on
        // an unreadable password file or a bad certificate fails here.
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
        let envoy = match (&config.envoy.listen, &envoy) {
            (Some(listen), Some(l)) => format!(
                ", envoy {listen}: {} domains, {} limits",
                l.domains.len(),
                l.all.len()
            ),
            _ => String::new(),
        };
        println!(
            "{}: OK ({} rules, redis.mode = {:?}, socket {}{envoy})",
            config_path.display(),
            config.rules.len(),
            config.redis.mode,
            config.server.socket.display()
        );
        return ExitCode::SUCCESS;
    }
    match daemon::run(config_path, config, envoy) {
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
