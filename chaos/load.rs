//! The load: client threads sending CHECKs over the Unix socket, each reply timed and
//! labelled by source.

use super::*;

/// Index into [`SOURCES`] (`redis`, `cache`, `local`, `fail_open`, `fail_closed`).
pub(crate) const REDIS: usize = 0;
pub(crate) const CACHE: usize = 1;

#[derive(Debug, Clone)]
pub(crate) enum Outcome {
    /// A well-formed CHECK reply.
    Decision { allowed: bool, source: usize },
    /// An `ERR …` reply, or a line that is not a CHECK reply.
    Bad(String),
}

/// One request as a client saw it.
#[derive(Debug, Clone)]
pub(crate) struct Sample {
    pub(crate) daemon: usize,
    pub(crate) rule: usize,
    pub(crate) key: u32,
    /// When the request's batch was written, since the load started.
    pub(crate) sent: Duration,
    /// Until its reply line was read.
    pub(crate) latency: Duration,
    pub(crate) outcome: Outcome,
}

impl Sample {
    pub(crate) fn received(&self) -> Duration {
        self.sent + self.latency
    }
    pub(crate) fn source(&self) -> Option<usize> {
        match self.outcome {
            Outcome::Decision { source, .. } => Some(source),
            Outcome::Bad(_) => None,
        }
    }
    pub(crate) fn is_fallback(&self) -> bool {
        self.source().is_some_and(|s| s > CACHE)
    }
    pub(crate) fn allowed_by(&self, source: usize) -> bool {
        matches!(self.outcome, Outcome::Decision { allowed: true, source: s } if s == source)
    }
}

/// What one client thread did.
#[derive(Default)]
pub(crate) struct ThreadResult {
    pub(crate) samples: Vec<Sample>,
    /// Request lines written.
    pub(crate) requests: u64,
    /// Problems: a missing reply, a failed write, a wrong answer to the final PING.
    pub(crate) problems: Vec<String>,
}

/// Sustained load: `threads` clients per daemon, each writing a batch of 1–4 CHECKs
/// (random rule and key), reading the replies, pausing `pace`, until stopped.
pub(crate) struct Load {
    pub(crate) t0: Instant,
    /// The wall clock at `t0` (to place the daemon's log lines on the timeline).
    pub(crate) t0_wall: SystemTime,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) handles: Vec<thread::JoinHandle<ThreadResult>>,
}

impl Load {
    pub(crate) fn start(sockets: &[PathBuf], threads: usize, pace: Duration) -> Load {
        let t0 = Instant::now();
        let t0_wall = SystemTime::now();
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for (d, socket) in sockets.iter().enumerate() {
            for t in 0..threads {
                let socket = socket.clone();
                let stop = Arc::clone(&stop);
                let seed = 0x9E37_79B9_7F4A_7C15_u64 ^ (((d as u64) << 32) | (t as u64 + 1));
                handles.push(
                    thread::Builder::new()
                        .name(format!("load-d{d}-t{t}"))
                        .spawn(move || client_thread(&socket, d, seed, pace, t0, &stop))
                        .expect("spawning a load thread"),
                );
            }
        }
        Load {
            t0,
            t0_wall,
            stop,
            handles,
        }
    }

    /// Time since the load started.
    pub(crate) fn now(&self) -> Duration {
        self.t0.elapsed()
    }

    pub(crate) fn finish(self) -> (Vec<Sample>, u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let mut samples = Vec::new();
        let mut requests = 0;
        let mut problems = Vec::new();
        for h in self.handles {
            match h.join() {
                Ok(r) => {
                    samples.extend(r.samples);
                    requests += r.requests;
                    problems.extend(r.problems);
                }
                Err(_) => problems.push("a load thread panicked".into()),
            }
        }
        samples.sort_by_key(|s| s.sent);
        (samples, requests, problems)
    }
}

pub(crate) fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub(crate) fn client_thread(
    socket: &Path,
    daemon: usize,
    mut rng: u64,
    pace: Duration,
    t0: Instant,
    stop: &AtomicBool,
) -> ThreadResult {
    let mut out = ThreadResult::default();
    let stream = match UnixStream::connect(socket) {
        Ok(s) => s,
        Err(e) => {
            out.problems
                .push(format!("connecting to {}: {e}", socket.display()));
            return out;
        }
    };
    stream
        .set_read_timeout(Some(REPLY_TIMEOUT))
        .expect("timeout");
    stream
        .set_write_timeout(Some(REPLY_TIMEOUT))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("cloning a UnixStream");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    let mut batch = Vec::with_capacity(4);
    let mut buf = String::with_capacity(256);
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < LOAD_HARD_CAP {
        let n = 1 + (xorshift(&mut rng) % 4) as usize;
        batch.clear();
        buf.clear();
        for _ in 0..n {
            let r = xorshift(&mut rng);
            let (rule, key) = ((r % 3) as usize, ((r >> 8) % u64::from(KEYS)) as u32);
            let _ = writeln!(buf, "CHECK {} k{key}", RULES[rule].0);
            batch.push((rule, key));
        }
        let sent = Instant::now();
        if let Err(e) = writer.write_all(buf.as_bytes()) {
            out.problems.push(format!("writing a request: {e}"));
            return out;
        }
        out.requests += n as u64;
        for &(rule, key) in &batch {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => {
                    out.problems
                        .push("the daemon closed the connection (missing reply)".into());
                    return out;
                }
                Ok(_) => {}
                Err(e) => {
                    out.problems
                        .push(format!("no reply within {REPLY_TIMEOUT:?}: {e}"));
                    return out;
                }
            }
            let latency = sent.elapsed();
            let text = line.trim_end_matches('\n');
            let outcome = match try_parse_reply(text) {
                Some(r) if r.limit == CAPACITY as u64 => Outcome::Decision {
                    allowed: r.allowed(),
                    source: SOURCES.iter().position(|s| *s == r.source).unwrap_or(0),
                },
                _ => Outcome::Bad(text.to_string()),
            };
            out.samples.push(Sample {
                daemon,
                rule,
                key,
                sent: sent - t0,
                latency,
                outcome,
            });
        }
        thread::sleep(pace);
    }
    // Exactly one reply per request: nothing extra is waiting before this PONG.
    line.clear();
    let pong = writer
        .write_all(b"PING\n")
        .and_then(|()| reader.read_line(&mut line));
    if pong.is_err() || line != "PONG\n" {
        out.problems.push(format!(
            "final PING: expected PONG, got {line:?} ({pong:?})"
        ));
    }
    out
}
