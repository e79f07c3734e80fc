//! The output: one human-readable line, then one JSON line, from the connections'
//! results summed.

use crate::histogram::Histogram;
use crate::Args;
use std::io::{self, Write};

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

fn us(ns: u64) -> f64 {
    (ns as f64 / 100.0).round() / 10.0
}

pub(crate) struct Summary<'a> {
    pub(crate) args: &'a Args,
    pub(crate) target: String,
    pub(crate) hist: Histogram,
    pub(crate) requests: u64,
    pub(crate) seconds: f64,
    pub(crate) errors: u64,
    pub(crate) first_bad: Option<String>,
    pub(crate) extra_lines: u64,
    pub(crate) io_errors: u64,
    pub(crate) first_io_error: Option<String>,
}

impl Summary<'_> {
    pub(crate) fn print(&self) {
        let a = self.args;
        let rps = if self.seconds > 0.0 {
            self.requests as f64 / self.seconds
        } else {
            0.0
        };
        let h = &self.hist;
        let (p50, p90, p99, p999, max, mean) = (
            us(h.quantile(0.50)),
            us(h.quantile(0.90)),
            us(h.quantile(0.99)),
            us(h.quantile(0.999)),
            us(h.max_ns),
            us(h.mean()),
        );
        let label = if a.label.is_empty() {
            "loadgen"
        } else {
            &a.label
        };
        let mut human = format!(
            "{label}: {} conns={} depth={} requests={} in {:.2}s = {:.0} req/s; \
             batch latency us: p50={p50} p90={p90} p99={p99} p99.9={p999} max={max} mean={mean}; \
             errors={}",
            self.target, a.conns, a.depth, self.requests, self.seconds, rps, self.errors
        );
        if let Some(b) = &self.first_bad {
            human.push_str(&format!(" (first bad reply: {b:?})"));
        }
        if self.extra_lines > 0 {
            human.push_str(&format!(" extra_lines={}", self.extra_lines));
        }
        if self.io_errors > 0 {
            human.push_str(&format!(
                " io_errors={} (first: {})",
                self.io_errors,
                self.first_io_error.as_deref().unwrap_or("")
            ));
        }
        // Ignore EPIPE (`loadgen ... | head -n 1`).
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{human}");

        let mut j = String::with_capacity(512);
        j.push_str("{\"label\":");
        json_str(&mut j, &a.label);
        j.push_str(",\"target\":");
        json_str(&mut j, &self.target);
        j.push_str(",\"request\":");
        json_str(&mut j, &a.request);
        j.push_str(&format!(
            ",\"conns\":{},\"depth\":{},\"reply_lines\":{},\"threads\":{},\"requests\":{},\"seconds\":{:.3},\
             \"rps\":{:.1},\"p50_us\":{p50},\"p90_us\":{p90},\"p99_us\":{p99},\
             \"p999_us\":{p999},\"max_us\":{max},\"mean_us\":{mean},\"errors\":{},\
             \"extra_lines\":{},\"io_errors\":{}",
            a.conns,
            a.depth,
            a.reply_lines,
            a.threads,
            self.requests,
            self.seconds,
            rps,
            self.errors,
            self.extra_lines,
            self.io_errors
        ));
        j.push_str(",\"first_bad\":");
        match &self.first_bad {
            Some(b) => json_str(&mut j, b),
            None => j.push_str("null"),
        }
        j.push_str(",\"first_io_error\":");
        match &self.first_io_error {
            Some(e) => json_str(&mut j, e),
            None => j.push_str("null"),
        }
        j.push('}');
        let _ = writeln!(out, "{j}");
        let _ = out.flush();
    }
}
