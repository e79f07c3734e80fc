//! A rule's parameters: as configured ([`Algorithm`]: which algorithm, its limit, its
//! rate or window) and as one host's share of them, ready for a decision ([`Shape`]:
//! what every algorithm's parameters provide to the registry and the store).

use super::{leaky_bucket, token_bucket, Kind, Params, MICRO};

/// The second parameter of a rule, by family: a bucket's rate or a window's length.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Per {
    /// Units per second (buckets).
    Rate(f64),
    /// Window length, ms (windows).
    WindowMs(u64),
}

impl Per {
    /// The rate, units/s (a window's length as a number, should a family be mixed up:
    /// validation pairs every kind with its family, so this never happens).
    pub fn rate(self) -> f64 {
        match self {
            Per::Rate(r) => r,
            Per::WindowMs(ms) => ms as f64,
        }
    }

    /// The window length, ms (see [`Per::rate`] for the other family).
    pub fn window_ms(self) -> u64 {
        match self {
            Per::WindowMs(ms) => ms,
            Per::Rate(r) => r as u64,
        }
    }
}

/// A rule's algorithm as configured: which one, its `capacity`/`limit` and its rate or
/// window, in the config's own units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Algorithm {
    /// Which algorithm.
    pub kind: Kind,
    /// The capacity (buckets) or limit (windows), ≥ 1.
    pub limit: u64,
    /// The refill/leak rate (buckets) or the window (windows).
    pub per: Per,
}

impl Algorithm {
    /// The parameters of one of `hosts` hosts sharing the limit (`hosts = 1`: the
    /// whole limit, as Redis and `mode = "none"` enforce it).
    pub fn params(&self, hosts: u32) -> Params {
        Params::new(self.kind, self.limit, self.per, hosts)
    }

    /// The policy window, ms: a window's length; for a bucket, the time it takes to go
    /// from empty to full (`capacity ÷ rate`), rounded up. This is the `w` of an IETF
    /// `RateLimit-Policy` header: `limit` units per window.
    pub fn window_ms(&self) -> u64 {
        match self.per {
            Per::Rate(rate) => (self.limit as f64 * 1000.0 / rate)
                .ceil()
                .min(u64::MAX as f64) as u64,
            Per::WindowMs(ms) => ms,
        }
    }

    /// The capacity (buckets) or limit (windows).
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// The parameters of one family, as the registry needs them from every algorithm.
pub trait Shape: Sized {
    /// `limit` and `per` shared by `hosts` hosts (each gets its share).
    fn shared(limit: u64, per: Per, hosts: u32) -> Self;
    /// True if a request of `cost` units can ever be allowed under these parameters
    /// (false when `cost` exceeds a host's fallback share of the limit).
    fn can_ever_pass(&self, cost: u64) -> bool;
    /// The three script arguments after the key, for a request of `cost` units.
    fn script_args(&self, cost: u32) -> [Arg; 3];
    /// The capacity or limit of this share, in units (possibly fractional).
    fn units(&self) -> f64;
}

/// One argument of a Lua twin, typed so the store sends it exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A count (µ-units, µs, units): sent as an integer when whole, else as a double.
    Whole(f64),
    /// A rate: sent as a double (shortest round-trip form; Lua reads it back exactly).
    Double(f64),
    /// An integer.
    Int(i64),
}

/// One host's share of a bucket: `capacity` units in µ-units and `rate` units/s, each
/// divided by `hosts` (capacity floored to whole µ-units: never above the share).
pub fn bucket_share(capacity: u64, rate: f64, hosts: u32) -> (f64, f64) {
    let hosts = f64::from(hosts.max(1));
    ((capacity as f64 * MICRO / hosts).floor(), rate / hosts)
}

/// [`Shape`] of a bucket's parameters: `capacity` in µ-units and the rate field named.
macro_rules! bucket_shape {
    ($params:ty, $rate:ident) => {
        impl Shape for $params {
            fn shared(capacity: u64, per: Per, hosts: u32) -> Self {
                <$params>::shared(capacity, per.rate(), hosts)
            }

            fn can_ever_pass(&self, cost: u64) -> bool {
                cost as f64 * MICRO <= self.capacity
            }

            fn units(&self) -> f64 {
                self.capacity / MICRO
            }

            fn script_args(&self, cost: u32) -> [Arg; 3] {
                [
                    Arg::Whole(self.capacity),
                    Arg::Double(self.$rate),
                    Arg::Int(i64::from(cost) * MICRO as i64),
                ]
            }
        }
    };
}
bucket_shape!(token_bucket::Params, refill_rate);
bucket_shape!(leaky_bucket::Params, leak_rate);

/// `limit` and `window` of the three window algorithms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowParams {
    /// Units allowed per window: the rule's `limit`, or `limit ÷ hosts` for a local
    /// fallback (then possibly fractional: `10 ÷ 4 = 2.5` admits 2).
    pub limit: f64,
    /// Window length in µs (a whole number of ms, ≥ 1 ms).
    pub window: f64,
}

impl WindowParams {
    /// `limit` units per `window_ms`, shared by `hosts` hosts (each gets `limit ÷ hosts`;
    /// the window stays the same).
    pub fn shared(limit: u64, window_ms: u64, hosts: u32) -> Self {
        WindowParams {
            limit: limit as f64 / f64::from(hosts.max(1)),
            window: window_ms as f64 * 1000.0,
        }
    }
}

impl Shape for WindowParams {
    fn shared(limit: u64, per: Per, hosts: u32) -> Self {
        WindowParams::shared(limit, per.window_ms(), hosts)
    }

    fn can_ever_pass(&self, cost: u64) -> bool {
        cost as f64 <= self.limit
    }

    fn units(&self) -> f64 {
        self.limit
    }

    fn script_args(&self, cost: u32) -> [Arg; 3] {
        [
            Arg::Whole(self.limit),
            Arg::Whole(self.window),
            Arg::Int(i64::from(cost)),
        ]
    }
}
