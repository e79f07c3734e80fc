//! The report of a scenario: its JSON file and its table row in `$CHAOS_REPORT_DIR`,
//! and the number formatting they share.

use super::*;

pub(crate) struct Report {
    pub(crate) json: String,
    pub(crate) row: String,
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

pub(crate) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

pub(crate) fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

pub(crate) fn latency_json(sorted: &[Duration]) -> String {
    format!(
        "{{\"n\": {}, \"p50_ms\": {:.2}, \"p99_ms\": {:.2}, \"max_ms\": {:.2}}}",
        sorted.len(),
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.99)),
        ms(sorted.last().copied().unwrap_or_default())
    )
}

pub(crate) fn source_counts(samples: &[&Sample]) -> [u64; 5] {
    let mut counts = [0u64; 5];
    for s in samples {
        if let Some(i) = s.source() {
            counts[i] += 1;
        }
    }
    counts
}

pub(crate) fn counts_json(counts: &[u64; 5]) -> String {
    let fields: Vec<String> = SOURCES
        .iter()
        .zip(counts)
        .map(|(s, n)| format!("\"{s}\": {n}"))
        .collect();
    format!("{{{}}}", fields.join(", "))
}

/// The table header matching [`Report::row`].
pub(crate) fn header() -> String {
    format!(
        "{:<23} {:<4} {:>8} {:>8} {:>4} {:>7} {:>7} {:>12} {:<39} {:>11} {:>12} {:>12}",
        "scenario",
        "res",
        "requests",
        "replies",
        "ERR",
        "p99 ms",
        "max ms",
        "open/cls/unp",
        "sources from the fault on",
        "recovery ms",
        "redis adm/bd",
        "local adm/bd"
    )
}

/// When a daemon log line (`2026-01-02T10:39:38.950805Z …`, UTC) was written, in ms
/// since `t0` (the wall clock at the load's start); None if it has no timestamp.
pub(crate) fn log_time_ms(line: &str, t0: SystemTime) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.strip_suffix('Z')?;
    let mut hms = time.split(':');
    let h: f64 = hms.next()?.parse().ok()?;
    let m: f64 = hms.next()?.parse().ok()?;
    let sec: f64 = hms.next()?.parse().ok()?;
    let of_day = h * 3600.0 + m * 60.0 + sec;
    let t0_of_day = t0.duration_since(UNIX_EPOCH).ok()?.as_secs_f64() % 86_400.0;
    // Across midnight: the nearest difference.
    let diff = (of_day - t0_of_day + 43_200.0).rem_euclid(86_400.0) - 43_200.0;
    Some(diff * 1000.0)
}

pub(crate) fn report_dir() -> PathBuf {
    std::env::var_os("CHAOS_REPORT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/chaos"))
}

pub(crate) fn write_report(name: &str, report: &Report) {
    let dir = report_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(dir.join("header.txt"), format!("{}\n", header()));
    if let Err(e) = std::fs::write(dir.join(format!("{name}.json")), &report.json)
        .and_then(|()| std::fs::write(dir.join(format!("{name}.row")), format!("{}\n", report.row)))
    {
        eprintln!("chaos: cannot write the report to {}: {e}", dir.display());
    }
}
