//! How an engine's graphs choose tokens. Greedy graphs take the argmax and cannot sample;
//! sampled graphs read each lane's temperature, top-k and top-p from device state (set at
//! admission, so one captured step serves greedy and sampled lanes together) and draw with
//! the engine's compiled seed; the engine records which, and the knobs lanes get by default.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The acceptance rule of every step graph of an engine (and the token its prefills choose
/// after the prompt).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Acceptance {
    /// The target's argmax; drafts are accepted while they equal it.
    #[default]
    Greedy,
    /// Tokens are draws from the target's distribution `softmax(logits / temperature)`,
    /// restricted to the `top_k` largest logits (ties with the k-th kept) and then to the
    /// nucleus of mass `top_p`, renormalised; speculative steps accept drafts by rejection
    /// sampling against it, which keeps the output exactly that distribution. Each lane has
    /// its own temperature, top-k and top-p (device state); these are the values of lanes
    /// admitted without their own.
    Sample {
        /// `≥ 0` and finite; 0: lanes decode greedily unless admitted with a temperature.
        temperature: f64,
        /// `≥ 1`; `None` keeps every token.
        top_k: Option<u64>,
        /// In `(0, 1]`; 1 keeps every token.
        top_p: f64,
        /// Seed of the counter-based device RNG.
        seed: u64,
    },
}

impl fmt::Display for Acceptance {
    /// `greedy`, or `sample temperature=0.8 top_k=40 top_p=0.9 seed=1` (knobs at their
    /// no-op values left out).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Acceptance::Greedy => f.write_str("greedy"),
            Acceptance::Sample {
                temperature,
                top_k,
                top_p,
                seed,
            } => {
                write!(f, "sample temperature={temperature}")?;
                if let Some(k) = top_k {
                    write!(f, " top_k={k}")?;
                }
                if *top_p < 1.0 {
                    write!(f, " top_p={top_p}")?;
                }
                write!(f, " seed={seed}")
            }
        }
    }
}
