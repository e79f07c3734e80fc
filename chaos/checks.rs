//! The checks every scenario makes on what the clients saw: replies, latency, sources,
//! recovery, admitted counts (their bounds checked in `admitted.rs`), log lines.

use super::*;

#[allow(clippy::too_many_arguments)]
pub(crate) fn analyze(
    sc: &mut Scenario,
    samples: &[Sample],
    requests: u64,
    problems: Vec<String>,
    fallback: Fallback,
    transitions: Transitions,
    data_losses: u32,
) -> Report {
    let end = samples.last().map(|s| s.sent).unwrap_or_default();
    let replies = samples.len() as u64;
    let bad: Vec<&Sample> = samples
        .iter()
        .filter(|s| matches!(s.outcome, Outcome::Bad(_)))
        .collect();

    // 1. Exactly one reply per request, no ERR, no crash or restart.
    for p in &problems {
        sc.failures.push(format!("client: {p}"));
    }
    if replies != requests {
        sc.failures
            .push(format!("{requests} requests but {replies} replies"));
    }
    if let Some(Outcome::Bad(line)) = bad.first().map(|s| &s.outcome) {
        sc.failures.push(format!(
            "{} replies are ERR or malformed, first: {line:?}",
            bad.len()
        ));
    }
    let mut alive = true;
    let mut logs = Vec::new();
    for (i, d) in sc.daemons.iter_mut().enumerate() {
        if let Some(status) = d.wait_exit(Duration::ZERO) {
            alive = false;
            sc.failures.push(format!("daemon {i} exited: {status}"));
        }
        logs.push(d.log());
    }
    for (i, log) in logs.iter().enumerate() {
        let starts = log.matches("ratelimitd serving").count();
        if starts != 1 || log.contains("panicked") {
            alive = false;
            sc.failures
                .push(format!("daemon {i}: {starts} starts / panic in its log"));
        }
    }

    // 2. Latency during the faults.
    let in_fault = |s: &Sample| {
        sc.episodes.iter().any(|e| {
            let until = e.answering.unwrap_or(end) + FAULT_TAIL;
            // In flight at any moment of the fault window.
            s.received() >= e.start && s.sent <= until
        })
    };
    let mut fault_lat: Vec<Duration> = samples
        .iter()
        .filter(|s| in_fault(s))
        .map(|s| s.latency)
        .collect();
    fault_lat.sort();
    let mut all_lat: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    all_lat.sort();
    let (p99, max) = (
        percentile(&fault_lat, 0.99),
        fault_lat.last().copied().unwrap_or_default(),
    );
    if fault_lat.is_empty() {
        sc.failures.push("no replies during the fault".into());
    }
    if p99 > P99_BOUND {
        sc.failures.push(format!(
            "p99 latency during the fault {:.1} ms > {} ms",
            ms(p99),
            ms(P99_BOUND)
        ));
    }
    if max > MAX_BOUND {
        sc.failures.push(format!(
            "max latency during the fault {:.1} ms > {} ms",
            ms(max),
            ms(MAX_BOUND)
        ));
    }

    // 3. Sources: as configured per rule, present during each fault if required.
    let first_fault = sc.episodes.first().map(|e| e.start).unwrap_or(end);
    // Decided while Redis was healthy (fallback decisions there can only come from a
    // slow call opening the circuit: see the transition checks).
    let before: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.received() < first_fault)
        .collect();
    if !before.iter().any(|s| s.source() == Some(REDIS)) {
        sc.failures
            .push("no Redis decision before the fault".into());
    }
    for s in samples {
        let Some(src) = s.source() else { continue };
        let allowed = src == REDIS || src == CACHE || SOURCES[src] == FALLBACK_SOURCE[s.rule];
        let verdict_ok = match SOURCES[src] {
            "fail_open" => matches!(s.outcome, Outcome::Decision { allowed: true, .. }),
            "fail_closed" | "cache" => {
                matches!(s.outcome, Outcome::Decision { allowed: false, .. })
            }
            _ => true,
        };
        if !allowed || !verdict_ok {
            sc.failures.push(format!(
                "{} answered {:?} with source {}",
                RULES[s.rule].0, s.outcome, SOURCES[src]
            ));
            break;
        }
    }
    let mut episodes_json = Vec::new();
    let mut recovery_max: Option<f64> = None;
    let mut fault_sources = [0u64; 5];
    for (i, e) in sc.episodes.clone().iter().enumerate() {
        let next = sc
            .episodes
            .get(i + 1)
            .map(|n| n.start)
            .unwrap_or(end + Duration::from_secs(1));
        let window: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.sent >= e.start && s.sent < next)
            .collect();
        let counts = source_counts(&window);
        for (t, c) in fault_sources.iter_mut().zip(counts) {
            *t += c;
        }
        if fallback == Fallback::Required {
            for (rule, (name, _)) in RULES.iter().enumerate() {
                let want = FALLBACK_SOURCE[rule];
                if !window
                    .iter()
                    .any(|s| s.rule == rule && s.source().map(|x| SOURCES[x]) == Some(want))
                {
                    sc.failures
                        .push(format!("fault {i}: no `{want}` decision for {name}"));
                }
            }
        }
        // Recovery: from Redis answering again to the first decision by Redis (while
        // the circuit is open no decision goes to Redis).
        let mut recovery = None;
        if let Some(answering) = e.answering {
            if next < answering + RECOVERY_BOUND + Duration::from_millis(200) {
                sc.failures
                    .push(format!("fault {i}: too little load after Redis answered"));
            }
            if window.iter().any(|s| s.is_fallback()) {
                match window
                    .iter()
                    .find(|s| s.sent >= answering && s.source() == Some(REDIS))
                {
                    Some(back) => {
                        let r = ms(back.sent) - ms(answering);
                        recovery = Some(r);
                        recovery_max = Some(recovery_max.map_or(r, |m: f64| m.max(r)));
                        if r > ms(RECOVERY_BOUND) {
                            sc.failures.push(format!(
                                "fault {i}: back to redis {r:.0} ms after Redis answered again (> {} ms)",
                                ms(RECOVERY_BOUND)
                            ));
                        }
                    }
                    None => sc
                        .failures
                        .push(format!("fault {i}: decisions never came back to redis")),
                }
            }
        }
        episodes_json.push(format!(
            "{{\"fault_start_ms\": {:.1}, \"redis_answering_ms\": {}, \"recovery_ms\": {}, \"sources\": {}}}",
            ms(e.start),
            e.answering.map_or("null".into(), |a| format!("{:.1}", ms(a))),
            recovery.map_or("null".into(), |r| format!("{r:.1}")),
            counts_json(&counts)
        ));
    }

    // 4. Admitted counts within the contract's bounds.
    let admitted = check_admitted(sc, samples, data_losses);

    // 5. Transitions: logged once each (open, close, open, close, ...; never twice in a
    // row, the last one a close); `One`: exactly one open from a fault's injection until
    // Redis answers again; `AtMost(n)`: at most n until 1 s after. A circuit opening
    // outside every fault must be a slow call (`no answer within redis.timeout_ms`, as a
    // busy machine produces) closed again within 1 s: counted as `unprovoked_trips`.
    let t0_wall = sc.load_t0_wall;
    let windows: Vec<(f64, f64, f64)> = sc
        .episodes
        .iter()
        .map(|e| {
            let answering = e.answering.unwrap_or(end);
            (ms(e.start), ms(answering), ms(answering + RECOVERY_BOUND))
        })
        .collect();
    let mut opens = 0;
    let mut closes = 0;
    let mut unprovoked = 0;
    let mut circuit_lines = Vec::new();
    for (d, log) in logs.iter().enumerate() {
        let mut events = Vec::new(); // (ms since load start, is_open, line)
        for line in log.lines().filter(|l| l.contains("circuit")) {
            let at = log_time_ms(line, t0_wall);
            let at_text = at.map_or("?".into(), |t| format!("{t:.0}"));
            circuit_lines.push(json_str(&format!("daemon {d} at {at_text} ms: {line}")));
            let open = line.contains("circuit open");
            if open || line.contains("circuit closed") {
                events.push((at.unwrap_or(f64::NAN), open, line));
            }
        }
        opens += events.iter().filter(|e| e.1).count();
        closes += events.iter().filter(|e| !e.1).count();
        let alternates = events.iter().enumerate().all(|(k, e)| e.1 == (k % 2 == 0));
        if !alternates || events.len() % 2 != 0 {
            sc.failures.push(format!(
                "daemon {d}: circuit transitions not logged once each, or left open \
                 (see log_circuit_lines): {:?}",
                events
                    .iter()
                    .map(|e| (e.0.round(), e.1))
                    .collect::<Vec<_>>()
            ));
        }
        for (w, &(start, answering, tail)) in windows.iter().enumerate() {
            let count = |until: f64| {
                events
                    .iter()
                    .filter(|e| e.1 && e.0 >= start && e.0 <= until)
                    .count()
            };
            // Already open when the fault began (a slow call just before it): the
            // fault then needs no open of its own.
            let open_at_start = events.iter().rfind(|e| e.0 < start).is_some_and(|e| e.1);
            let (n, ok) = match transitions {
                Transitions::One => {
                    let n = count(answering);
                    (n, n + usize::from(open_at_start) == 1)
                }
                Transitions::AtMost(max) => (count(tail), count(tail) <= max),
            };
            if !ok {
                sc.failures.push(format!(
                    "daemon {d}, fault {w}: {n} `circuit open` lines, expected {transitions:?} \
                     (see log_circuit_lines)"
                ));
            }
        }
        for (k, &(at, open, line)) in events.iter().enumerate() {
            let provoked = windows
                .iter()
                .any(|&(start, _, tail)| at >= start && at <= tail);
            if !open || provoked {
                continue;
            }
            unprovoked += 1;
            // Closed within 1 s, or by the recovery from a fault that began meanwhile.
            let closed_at = events.get(k + 1).map(|c| c.0);
            let closed_after = closed_at.map(|c| c - at);
            let closed_in_time = closed_at.is_some_and(|c| {
                c - at <= ms(RECOVERY_BOUND)
                    || windows
                        .iter()
                        .any(|&(start, _, tail)| start > at && c >= start && c <= tail)
            });
            if !line.contains("no answer within redis.timeout_ms") || !closed_in_time {
                sc.failures.push(format!(
                    "daemon {d}: circuit opened outside any fault, at {at:.0} ms \
                     (faults: {windows:.0?}), closed {closed_after:?} ms later: {line}"
                ));
            }
        }
        let _ = std::fs::create_dir_all(report_dir());
        let _ = std::fs::write(report_dir().join(format!("{}.daemon{d}.log", sc.name)), log);
    }

    let seen: Vec<&str> = SOURCES
        .iter()
        .zip(fault_sources)
        .filter(|(_, n)| *n > 0)
        .map(|(s, _)| *s)
        .collect();
    let passed = sc.failures.is_empty();
    let row = format!(
        "{:<23} {:<4} {:>8} {:>8} {:>4} {:>7.1} {:>7.1} {:>12} {:<39} {:>11} {:>12} {:>12}",
        sc.name,
        if passed { "ok" } else { "FAIL" },
        requests,
        replies,
        bad.len(),
        ms(p99),
        ms(max),
        format!("{opens}/{closes}/{unprovoked}"),
        seen.join(","),
        recovery_max.map_or("-".into(), |r| format!("{r:.0}")),
        format!("{}/{}", admitted.redis, admitted.redis_bound),
        format!("{}/{}", admitted.local, admitted.local_bound),
    );
    let json = format!(
        "{{\n  \"scenario\": {},\n  \"title\": {},\n  \"passed\": {passed},\n  \"failures\": [{}],\n  \
         \"daemons\": {},\n  \"threads_per_daemon\": {},\n  \"fallback_hosts\": {},\n  \
         \"redis_timeout_ms\": {TIMEOUT_MS},\n  \"wall_time_s\": {:.1},\n  \"load_time_s\": {:.1},\n  \
         \"requests\": {requests},\n  \"replies\": {replies},\n  \"err_replies\": {},\n  \
         \"daemons_alive\": {alive},\n  \
         \"latency_during_fault\": {},\n  \"latency_all\": {},\n  \
         \"sources_all\": {},\n  \"sources_from_fault\": {},\n  \"episodes\": [{}],\n  \
         \"recovery_ms_max\": {},\n  \
         \"admitted\": {{\"redis\": {}, \"redis_bound\": {}, \"local\": {}, \"local_bound\": {}, \
         \"global_local_max_ratio\": {:.3}, \"data_losses\": {data_losses}}},\n  \
         \"log_transitions\": {{\"circuit_open\": {opens}, \"circuit_closed\": {closes}, \
         \"unprovoked_trips\": {unprovoked}, \"expected\": {}}},\n  \
         \"log_circuit_lines\": [{}]\n}}\n",
        json_str(sc.name),
        json_str(sc.title),
        sc.failures.iter().map(|f| json_str(f)).collect::<Vec<_>>().join(", "),
        sc.daemons.len(),
        sc.threads,
        sc.hosts,
        sc.started.elapsed().as_secs_f64(),
        end.as_secs_f64(),
        bad.len(),
        latency_json(&fault_lat),
        latency_json(&all_lat),
        counts_json(&source_counts(&samples.iter().collect::<Vec<_>>())),
        counts_json(&fault_sources),
        episodes_json.join(", "),
        recovery_max.map_or("null".into(), |r| format!("{r:.1}")),
        admitted.redis,
        admitted.redis_bound,
        admitted.local,
        admitted.local_bound,
        admitted.global_local_max_ratio,
        json_str(&format!("{transitions:?} per fault and daemon, none outside faults")),
        circuit_lines.join(", "),
    );
    Report { json, row }
}
