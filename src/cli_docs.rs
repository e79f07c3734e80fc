//! The daemon's manual page and shell completions, generated from its command line so
//! they never drift from `--help`: `ratelimitd --print-man` (roff, ratelimitd(8)) and
//! `ratelimitd --print-completions bash|zsh|fish|elvish|powershell`. The Debian package
//! ships the output, committed under debian/ (tests/deb.sh checks it is current).

use clap::CommandFactory;
use clap_complete::Shell;
use std::io::Write;

/// What the manual adds to `--help`: signals, files, exit status, see also.
const MAN_EXTRA: &str = r#".SH SIGNALS
.TP
.B SIGTERM, SIGINT
Stop accepting, answer the requests already received, remove the socket file (unless
systemd passed it) and exit 0.
.TP
.B SIGHUP
Reload the configuration. A bad file is logged and the rules in force stay;
\fBsystemctl reload ratelimitd\fR runs \fB\-\-check\fR first, so a bad file fails the
reload itself.
.SH OPERATOR COMMANDS
\fBratelimitd ctl\fR [\fB\-\-socket\fR \fIPATH\fR | \fB\-\-config\fR \fIPATH\fR] [\fB\-\-json\fR] \fIVERB\fR
asks a running daemon, for peers in \fBserver.admin_uids\fR / \fBadmin_gids\fR (default
root only). The socket is \fB\-\-socket\fR, else \fBserver.socket\fR of \fB\-\-config\fR
(default /etc/ratelimitd/ratelimitd.toml). Output is text, or JSON with \fB\-\-json\fR.
.TP
.BI "inspect " "RULE KEY"
The key's state as a CHECK of cost 0 sees it (nothing taken), the rule's parameters,
this daemon's lease, deny-cache entry and local bucket for the key, its slot and primary.
.TP
.BI "reset " "RULE KEY"
Deletes the key's state in Redis, this daemon's local bucket for it and its deny cache;
other daemons' cached DENYs end within their \fBcache.ttl_ms\fR.
.TP
.BI "override " "RULE KEY PARAM" = "VALUE" "... [ttl=" DURATION "] | clear"
Gives the key other parameters of its rule's algorithm (capacity, refill_rate,
leak_rate, limit, window) on every daemon at once, until cleared or for the ttl; stored in
Redis beside the key's state. \fBclear\fR removes it; \fBreset\fR keeps it.
.TP
.B rules
Every rule and its parameters.
.TP
.BI "top " "RULE" " [" N ]
This daemon's N (default 10) hottest keys of the rule over the last minute, with their
decision and deny counts.
.PP
\fBctl\fR exits 0 when answered, 1 when refused (the daemon's \fBERR\fR line is printed on
stderr) or unreachable, 2 for a bad argument.
.SH EXIT STATUS
0 on a clean stop or a valid \fB\-\-check\fR; 2 for an invalid configuration (systemd
does not restart it); 1 for any other failure.
.SH ENVIRONMENT
.TP
.B RUST_LOG
Log filter (default \fBinfo,fred=error\fR).
.TP
.B LISTEN_FDS, LISTEN_PID, NOTIFY_SOCKET, WATCHDOG_USEC, JOURNAL_STREAM
Set by systemd: socket activation, readiness and watchdog, and the journal (warnings
and errors are sent with their priority and fields).
.SH FILES
.TP
.I /etc/ratelimitd/ratelimitd.toml
The configuration, see \fBratelimitd.toml\fR(5).
.TP
.I /run/ratelimitd/ratelimitd.sock
The socket, created by \fBratelimitd.socket\fR, group \fBratelimitd-clients\fR.
.TP
.I /usr/share/doc/ratelimitd/SYSTEMD.md
The units, sizing, credentials, hardening.
.SH SEE ALSO
\fBratelimitd.toml\fR(5), \fBsystemctl\fR(1), \fBjournalctl\fR(1)
"#;

/// Writes ratelimitd(8) to stdout.
pub fn print_man<C: CommandFactory>() -> std::io::Result<()> {
    let cmd = C::command().name("ratelimitd");
    let man = clap_mangen::Man::new(cmd)
        .section("8")
        .manual("System Administration");
    let mut out = Vec::new();
    man.render(&mut out)?;
    out.extend_from_slice(MAN_EXTRA.as_bytes());
    std::io::stdout().write_all(&out)
}

/// Writes the completion script for `shell` to stdout.
pub fn print_completions<C: CommandFactory>(shell: Shell) {
    let mut cmd = C::command();
    clap_complete::generate(shell, &mut cmd, "ratelimitd", &mut std::io::stdout());
}
