//! The algorithm table: the one place that lists every algorithm.
//!
//! Each line names an algorithm's variant and its module; the macro derives from it the
//! [`Kind`] (what a rule names), the [`Params`] and [`State`] enums and their dispatch.
//! Every module in the table provides the same items: `SPEC` (a [`Spec`]), `Params`
//! (implementing [`Shape`]), `State`, `decide_in(&mut Option<State>, now, &Params,
//! cost) -> Outcome`, and `seed(&Params, unused, reset_us, now) -> State` (a local state
//! from what Redis last reported for a key).

use super::{
    concurrency, fixed_window, leaky_bucket, sliding_window_counter, sliding_window_log,
    token_bucket, Outcome, Per, Shape, Spec,
};

macro_rules! algorithms {
    ($($variant:ident => $module:ident),+ $(,)?) => {
        /// Which algorithm a rule runs (docs/ALGORITHMS.md lists them).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Kind {
            $(
                #[doc = concat!("[`", stringify!($module), "`].")]
                $variant,
            )+
        }

        impl Kind {
            /// Every algorithm, in table order.
            pub const ALL: &'static [Kind] = &[$(Kind::$variant),+];

            /// The algorithm's entry: config name, key suffix, Lua twin, parameters.
            pub fn spec(self) -> &'static Spec {
                match self {
                    $(Kind::$variant => &$module::SPEC,)+
                }
            }
        }

        /// The parameters of one rule's algorithm, ready for a decision.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Params {
            $(
                #[doc = concat!("[`", stringify!($module), "`].")]
                $variant($module::Params),
            )+
        }

        /// What one key remembers between decisions, per algorithm.
        #[derive(Debug, Clone, PartialEq)]
        pub enum State {
            $(
                #[doc = concat!("[`", stringify!($module), "`].")]
                $variant($module::State),
            )+
        }

        impl Params {
            /// The parameters of `kind` for `limit` and `per`, shared by `hosts` hosts.
            pub fn new(kind: Kind, limit: u64, per: Per, hosts: u32) -> Self {
                match kind {
                    $(Kind::$variant => Params::$variant(Shape::shared(limit, per, hosts)),)+
                }
            }

            /// Which algorithm these parameters are for.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Params::$variant(_) => Kind::$variant,)+
                }
            }

            /// True if a request of `cost` units can ever be allowed under these
            /// parameters (false when `cost` exceeds a host's fallback share).
            pub fn can_ever_pass(&self, cost: u64) -> bool {
                match self {
                    $(Params::$variant(p) => p.can_ever_pass(cost),)+
                }
            }

            /// The capacity (buckets) or limit (windows) of this share, in units
            /// (fractional when a limit is shared by hosts it does not divide).
            pub fn units(&self) -> f64 {
                match self {
                    $(Params::$variant(p) => p.units(),)+
                }
            }

            /// The Lua twin's arguments after the key, for `cost` units.
            pub fn script_args(&self, cost: u32) -> [super::Arg; 3] {
                match self {
                    $(Params::$variant(p) => p.script_args(cost),)+
                }
            }

            /// The state of a key of which `unused` (0..=1) of the limit is left at
            /// `now` µs and that is fully unused `reset_us` later, under these
            /// parameters: what Redis last reported for a key, carried over to a local
            /// decision.
            pub fn seed(&self, unused: f64, reset_us: f64, now: f64) -> State {
                match self {
                    $(Params::$variant(p) => State::$variant($module::seed(p, unused, reset_us, now)),)+
                }
            }

            /// Decides `cost` units at `now` µs against `state` (`None`: a key never
            /// seen) and updates `state` in place. A state of another algorithm (the
            /// rule was changed by a reload) counts as a new key, and stays if this
            /// decision writes nothing.
            pub fn decide(&self, state: &mut Option<State>, now: f64, cost: u64) -> Outcome {
                match self {
                    $(Params::$variant(p) => {
                        let (mut own, other) = match state.take() {
                            Some(State::$variant(s)) => (Some(s), None),
                            other => (None, other),
                        };
                        let outcome = $module::decide_in(&mut own, now, p, cost);
                        *state = own.map(State::$variant).or(other);
                        outcome
                    })+
                }
            }
        }
    };
}

algorithms! {
    TokenBucket => token_bucket,
    LeakyBucket => leaky_bucket,
    FixedWindow => fixed_window,
    SlidingWindowLog => sliding_window_log,
    SlidingWindowCounter => sliding_window_counter,
    Concurrency => concurrency,
}

impl Kind {
    /// The algorithm named `name` in the config.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.spec().name == name)
    }

    /// The name as written in the config.
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }
}

impl<'de> serde::Deserialize<'de> for Kind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        Kind::from_name(&name).ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
            serde::de::Error::custom(format!(
                "unknown variant `{name}`, expected one of `{}`",
                names.join("`, `")
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::WindowParams;
    use super::*;

    #[test]
    fn a_reloaded_rule_with_another_algorithm_starts_fresh() {
        let tb = Params::TokenBucket(token_bucket::Params::shared(2, 1.0, 1));
        let fw = Params::FixedWindow(WindowParams::shared(1, 1000, 1));
        let mut st = None;
        assert!(tb.decide(&mut st, 0.0, 2).allowed);
        assert!(fw.decide(&mut st, 1.0, 1).allowed);
        assert!(!fw.decide(&mut st, 2.0, 1).allowed);
    }

    #[test]
    fn names_and_suffixes_are_unique() {
        for (i, a) in Kind::ALL.iter().enumerate() {
            assert_eq!(Kind::from_name(a.as_str()), Some(*a));
            for b in &Kind::ALL[i + 1..] {
                assert_ne!(a.spec().suffix, b.spec().suffix);
            }
        }
    }
}
