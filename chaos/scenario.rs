//! A scenario: the cluster, the daemons, the load, the fault episodes; and Redis as
//! the test sees it (answering, accepting writes).

use super::*;

/// True when Redis answers again as a whole: exactly three nodes say they are
/// primaries, each reports `cluster_state:ok` and accepts a write to a key of its own.
pub(crate) fn redis_answering(addrs: &[String]) -> bool {
    let masters: Vec<&String> = addrs
        .iter()
        .filter(|a| {
            redis_text(a, &["INFO", "replication"])
                .map(|i| i.contains("role:master\r"))
                .unwrap_or(false)
        })
        .collect();
    masters.len() == 3
        && masters.iter().all(|a| {
            redis_text(a, &["CLUSTER", "INFO"])
                .map(|i| i.contains("cluster_state:ok\r"))
                .unwrap_or(false)
                && accepts_write(a)
        })
}

/// True if the primary at `addr` accepts `SET chaos:{wN} 1` for some `N` whose slot
/// it owns (others answer MOVED); false on any other error (OOM, CLUSTERDOWN, …).
pub(crate) fn accepts_write(addr: &str) -> bool {
    for i in 0..128 {
        match redis_command(addr, &["SET", &format!("chaos:{{w{i}}}"), "1"]) {
            Ok(Resp::Simple(s)) if s == "OK" => return true,
            Ok(Resp::Error(e)) if e.starts_with("MOVED") => continue,
            _ => return false,
        }
    }
    false
}

/// One fault: when it was injected and when Redis answered again (since load start).
#[derive(Debug, Clone)]
pub(crate) struct Episode {
    pub(crate) start: Duration,
    pub(crate) answering: Option<Duration>,
}

/// Whether fallback decisions must, may or must not appear.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Fallback {
    /// Redis cannot decide: every rule's fallback source must show up in each fault.
    Required,
    /// Redis stays up (flushed scripts, killed connections): fallback may show up
    /// briefly, and must be over within 1 s.
    Allowed,
}

/// How many `circuit open` / `circuit closed` lines each daemon must log within each
/// fault's window (from its injection to 1 s after Redis answers again); none may be
/// logged outside the faults' windows.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transitions {
    /// Exactly one open and one close per fault.
    One,
    /// At most this many per fault window (a fault made of several drops), each open
    /// closed again within the window.
    AtMost(usize),
}

pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) title: &'static str,
    pub(crate) cluster: RedisCluster,
    pub(crate) addrs: Vec<String>,
    pub(crate) daemons: Vec<Daemon>,
    pub(crate) hosts: u32,
    pub(crate) threads: usize,
    pub(crate) load: Option<Load>,
    pub(crate) episodes: Vec<Episode>,
    pub(crate) failures: Vec<String>,
    pub(crate) started: Instant,
    pub(crate) load_t0_wall: SystemTime,
}

pub(crate) fn daemon_config(addrs: &[String], hosts: u32) -> String {
    let mut c = format!(
        "[redis]\nmode = \"cluster\"\nnodes = {}\ntimeout_ms = {TIMEOUT_MS}\nprefix = \"rl\"\n\n\
         [cache]\nttl_ms = 500\n\n[fallback]\nhosts = {hosts}\n",
        toml_str_array(addrs)
    );
    for (name, on) in RULES {
        let _ = write!(
            c,
            "\n[[rule]]\nname = \"{name}\"\nalgorithm = \"token_bucket\"\n\
             capacity = {CAPACITY}\nrefill_rate = {REFILL_RATE:.1}\non_redis_failure = \"{on}\"\n"
        );
    }
    c
}

impl Scenario {
    /// A fresh cluster, `daemons` daemons (`fallback.hosts = hosts`) and `threads`
    /// load threads per daemon, already loading for [`WARMUP`].
    pub(crate) fn start(
        name: &'static str,
        title: &'static str,
        daemons: usize,
        hosts: u32,
    ) -> Scenario {
        Self::start_with_node_timeout(name, title, daemons, hosts, CLUSTER_NODE_TIMEOUT_MS)
    }

    /// As [`Scenario::start`] on a cluster whose `cluster-node-timeout` is
    /// `node_timeout_ms`: a fault meant to leave the cluster's own state alone (a
    /// primary frozen for less than this) must not let the other nodes mark the
    /// primary failed and promote its replica.
    pub(crate) fn start_with_node_timeout(
        name: &'static str,
        title: &'static str,
        daemons: usize,
        hosts: u32,
        node_timeout_ms: u64,
    ) -> Scenario {
        let started = Instant::now();
        let cluster = RedisCluster::start_with_node_timeout(node_timeout_ms);
        let addrs = cluster.addrs();
        let config = daemon_config(&addrs, hosts);
        // fred's warnings (reconnections, unresponsive connections) help read a failure.
        let log_filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "info,fred=warn".into());
        let daemons: Vec<Daemon> = (0..daemons)
            .map(|_| Daemon::start_with(&daemon_bin(), &[("RUST_LOG", &log_filter)], &config))
            .collect();
        let threads = if daemons.len() == 1 { 4 } else { 2 };
        let sockets: Vec<PathBuf> = daemons.iter().map(|d| d.socket.clone()).collect();
        let load = Load::start(&sockets, threads, Duration::from_millis(3));
        let load_t0_wall = load.t0_wall;
        thread::sleep(WARMUP);
        Scenario {
            name,
            title,
            cluster,
            addrs,
            daemons,
            hosts,
            threads,
            load: Some(load),
            episodes: Vec::new(),
            failures: Vec::new(),
            started,
            load_t0_wall,
        }
    }

    pub(crate) fn now(&self) -> Duration {
        self.load.as_ref().expect("load running").now()
    }

    /// Marks the start of a fault (call right before injecting it).
    pub(crate) fn fault_begins(&mut self) {
        let start = self.now();
        self.episodes.push(Episode {
            start,
            answering: None,
        });
    }

    /// Polls until Redis answers again (see [`redis_answering`]) and marks the time
    /// on the current fault: when the successful check began (conservative for the
    /// recovery time).
    pub(crate) fn wait_redis_answers(&mut self) {
        let addrs = self.addrs.clone();
        let load_t0 = self.load.as_ref().expect("load running").t0;
        let mut began = Duration::ZERO;
        if wait_until(ANSWER_TIMEOUT, || {
            began = load_t0.elapsed();
            redis_answering(&addrs)
        }) {
            self.episodes.last_mut().expect("a fault").answering = Some(began);
        } else {
            self.failures.push(format!(
                "Redis did not answer again within {ANSWER_TIMEOUT:?} of the fault"
            ));
        }
    }

    /// Stops the load, checks everything, writes the report, and panics (naming the
    /// scenario) if a check failed.
    pub(crate) fn finish(self, fallback: Fallback, transitions: Transitions, data_losses: u32) {
        self.finish_with(fallback, transitions, data_losses, |_, _| String::new());
    }

    /// [`Scenario::finish`] with a scenario's own checks: `extra` judges the samples
    /// (pushing failures on the scenario) and returns its figures as JSON, kept in the
    /// report as `"extra"`.
    pub(crate) fn finish_with(
        mut self,
        fallback: Fallback,
        transitions: Transitions,
        data_losses: u32,
        extra: impl FnOnce(&mut Scenario, &[Sample]) -> String,
    ) {
        thread::sleep(AFTERMATH);
        let (samples, requests, problems) = self.load.take().expect("load").finish();
        let extra_json = extra(&mut self, &samples);
        // A circuit opened by a slow call near the end closes on the next probe: let it
        // be logged before reading the logs (the transition checks judge it).
        wait_until(Duration::from_millis(1500), || {
            self.daemons.iter().all(|d| {
                let log = d.log();
                log.matches("circuit open").count() == log.matches("circuit closed").count()
            })
        });
        let report = analyze(
            &mut self,
            &samples,
            requests,
            problems,
            fallback,
            transitions,
            data_losses,
        );
        let mut report = report;
        if !extra_json.is_empty() {
            if let Some(end) = report.json.rfind('}') {
                report
                    .json
                    .insert_str(end, &format!(",\n\"extra\": {extra_json}\n"));
            }
        }
        write_report(self.name, &report);
        eprintln!("{}", report.row);
        if !self.failures.is_empty() {
            panic!(
                "chaos scenario {} failed:\n  - {}\n(report: {})",
                self.name,
                self.failures.join("\n  - "),
                report_dir().join(format!("{}.json", self.name)).display()
            );
        }
    }
}
