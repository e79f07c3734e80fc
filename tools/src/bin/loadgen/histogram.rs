//! The latency histogram: log-linear buckets over nanoseconds, 2^SUB_BITS sub-buckets
//! per power of two (relative error < 1/128), so that every batch is recorded in O(1)
//! and the connections' histograms merge exactly.

const SUB_BITS: u32 = 7;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

pub(crate) struct Histogram {
    counts: Vec<u64>,
    total: u64,
    sum_ns: u128,
    pub(crate) max_ns: u64,
    min_ns: u64,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            sum_ns: 0,
            max_ns: 0,
            min_ns: u64::MAX,
        }
    }

    #[inline]
    pub(crate) fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let e = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = e - SUB_BITS;
        ((shift as u64 + 1) * SUB + ((v >> shift) - SUB)) as usize
    }

    /// Midpoint of the bucket at `idx`.
    pub(crate) fn value_at(idx: usize) -> u64 {
        let idx = idx as u64;
        if idx < SUB {
            return idx;
        }
        let shift = idx / SUB - 1;
        let lo = (SUB + idx % SUB) << shift;
        lo + ((1u64 << shift) >> 1)
    }

    #[inline]
    pub(crate) fn record(&mut self, ns: u64) {
        self.counts[Self::index(ns)] += 1;
        self.total += 1;
        self.sum_ns += ns as u128;
        self.max_ns = self.max_ns.max(ns);
        self.min_ns = self.min_ns.min(ns);
    }

    pub(crate) fn merge(&mut self, o: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += *b;
        }
        self.total += o.total;
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
        self.min_ns = self.min_ns.min(o.min_ns);
    }

    /// Value at quantile `q` in nanoseconds (0 if empty).
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value_at(i).clamp(self.min_ns, self.max_ns);
            }
        }
        self.max_ns
    }

    pub(crate) fn mean(&self) -> u64 {
        if self.total == 0 {
            0
        } else {
            (self.sum_ns / self.total as u128) as u64
        }
    }
}
