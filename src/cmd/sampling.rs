//! `--temperature`, `--top-k`, `--top-p`, `--seed`: checked (spec.toml's rules, in flag
//! words), then laid over a base acceptance (the spec's, the engine's, or greedy).

use std::path::Path;

use anyhow::{bail, Result};
use specc_models::{Acceptance, SamplingKnobs};

use crate::cli::SamplingArgs;

/// The acceptance `flags` make of `base`: `base` without flags, greedy at `--temperature 0`,
/// else sampling with the given knobs replacing `base`'s (a greedy base samples at
/// temperature 1 over every token with seed 0).
pub fn acceptance(flags: &SamplingArgs, base: &Acceptance) -> Result<Acceptance> {
    let knobs = knobs(flags)?;
    if flags.temperature == Some(0.0) {
        return Ok(Acceptance::Greedy);
    }
    Ok(match knobs.any() {
        true => knobs.over(base),
        false => base.clone(),
    })
}

/// The flags as knobs (`--temperature 0` left out: it means greedy), or a one-line error
/// naming the first bad flag.
fn knobs(flags: &SamplingArgs) -> Result<SamplingKnobs> {
    let top_k = match flags.top_k {
        Some(k) if k < 1 => bail!("--top-k {k}: expected an integer >= 1"),
        k => k.map(|k| k as u64),
    };
    let knobs = SamplingKnobs {
        temperature: flags.temperature.filter(|&t| t != 0.0),
        top_k,
        top_p: flags.top_p,
        seed: flags.seed,
    };
    if let Some((key, expected, found)) = knobs.invalid() {
        let greedy = match key {
            "temperature" => " (or 0 for greedy decoding)",
            _ => "",
        };
        bail!(
            "--{} {found}: expected {expected}{greedy}",
            key.replace('_', "-")
        );
    }
    Ok(knobs)
}

/// What an engine directory runs with: a greedy engine only decodes greedily (an error
/// naming the first sampling flag otherwise); a sampling engine reads each lane's
/// temperature, top-k and top-p from device state, so the flags replace its default knobs
/// (`--temperature 0`: greedy lanes), but its seed is compiled into its draws (another
/// `--seed` is an error).
pub fn for_engine(
    flags: &SamplingArgs,
    compiled: &Acceptance,
    engine_dir: &Path,
) -> Result<Acceptance> {
    let wanted = acceptance(flags, compiled)?;
    match (compiled, &wanted) {
        (Acceptance::Greedy, Acceptance::Greedy) => Ok(wanted),
        (Acceptance::Greedy, Acceptance::Sample { .. }) => {
            let flag = [
                flags.temperature.map(|v| format!("--temperature {v}")),
                flags.top_k.map(|v| format!("--top-k {v}")),
                flags.top_p.map(|v| format!("--top-p {v}")),
                flags.seed.map(|v| format!("--seed {v}")),
            ]
            .into_iter()
            .flatten()
            .next()
            .unwrap_or_default();
            bail!(
                "{flag}: {} was compiled for greedy decoding, and its step graphs take the argmax (compile it with a --temperature to sample, or run the model directory)",
                engine_dir.display()
            )
        }
        (Acceptance::Sample { seed, .. }, _) => {
            if let Some(s) = flags.seed.filter(|s| s != seed) {
                bail!(
                    "--seed {s}: {} was compiled with seed {seed}, which its draws mix in (compile it again with --seed {s}, or run the model directory)",
                    engine_dir.display()
                );
            }
            Ok(match wanted {
                Acceptance::Greedy => Acceptance::Sample {
                    temperature: 0.0,
                    top_k: None,
                    top_p: 1.0,
                    seed: *seed,
                },
                w => w,
            })
        }
    }
}

/// The acceptance a server builds for: sampling, so one step graph serves greedy and
/// sampled requests together (each lane's knobs in device state); a greedy `acceptance`
/// becomes sampling whose lanes decode greedily unless a request says otherwise.
pub fn per_lane(acceptance: Acceptance) -> Acceptance {
    match acceptance {
        Acceptance::Greedy => Acceptance::Sample {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
        },
        a => a,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(temperature: Option<f64>, top_k: Option<i64>, top_p: Option<f64>) -> SamplingArgs {
        SamplingArgs {
            temperature,
            top_k,
            top_p,
            seed: None,
        }
    }

    #[test]
    fn flags_override_the_base() {
        let spec = Acceptance::Sample {
            temperature: 0.7,
            top_k: None,
            top_p: 1.0,
            seed: 3,
        };
        let none = SamplingArgs::default();
        assert_eq!(acceptance(&none, &spec).unwrap(), spec);
        assert_eq!(
            acceptance(&none, &Acceptance::Greedy).unwrap(),
            Acceptance::Greedy
        );
        assert_eq!(
            acceptance(&flags(None, Some(5), None), &spec).unwrap(),
            Acceptance::Sample {
                temperature: 0.7,
                top_k: Some(5),
                top_p: 1.0,
                seed: 3
            }
        );
        assert_eq!(
            acceptance(&flags(None, None, Some(0.9)), &Acceptance::Greedy).unwrap(),
            Acceptance::Sample {
                temperature: 1.0,
                top_k: None,
                top_p: 0.9,
                seed: 0
            }
        );
        assert_eq!(
            acceptance(&flags(Some(0.0), Some(5), None), &spec).unwrap(),
            Acceptance::Greedy,
            "temperature 0 is greedy"
        );
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (f, want) in [
            (
                flags(Some(-1.0), None, None),
                "--temperature -1: expected a finite number > 0",
            ),
            (flags(Some(f64::INFINITY), None, None), "--temperature inf:"),
            (
                flags(None, Some(0), None),
                "--top-k 0: expected an integer >= 1",
            ),
            (
                flags(None, None, Some(0.0)),
                "--top-p 0: expected a number in (0, 1]",
            ),
            (flags(None, None, Some(1.5)), "--top-p 1.5:"),
        ] {
            let e = acceptance(&f, &Acceptance::Greedy).unwrap_err().to_string();
            assert!(e.starts_with(want), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }

    #[test]
    fn an_engine_keeps_its_acceptance() {
        let dir = Path::new("/e");
        let greedy = Acceptance::Greedy;
        for_engine(&SamplingArgs::default(), &greedy, dir).unwrap();
        for_engine(&flags(Some(0.0), None, None), &greedy, dir).unwrap();
        let e = for_engine(&flags(None, Some(4), None), &greedy, dir).unwrap_err();
        let e = e.to_string();
        assert!(
            e.starts_with("--top-k 4: /e was compiled for greedy decoding"),
            "{e}"
        );
        // A sampling engine takes other knobs per lane, but not another seed.
        let sample = Acceptance::Sample {
            temperature: 0.7,
            top_k: None,
            top_p: 1.0,
            seed: 3,
        };
        assert_eq!(
            for_engine(&flags(Some(1.5), Some(4), None), &sample, dir).unwrap(),
            Acceptance::Sample {
                temperature: 1.5,
                top_k: Some(4),
                top_p: 1.0,
                seed: 3
            }
        );
        assert_eq!(
            for_engine(&flags(Some(0.0), None, None), &sample, dir).unwrap(),
            Acceptance::Sample {
                temperature: 0.0,
                top_k: None,
                top_p: 1.0,
                seed: 3
            },
            "--temperature 0: greedy lanes"
        );
        let seeded = SamplingArgs {
            seed: Some(4),
            ..SamplingArgs::default()
        };
        let e = for_engine(&seeded, &sample, dir).unwrap_err().to_string();
        assert!(
            e.starts_with("--seed 4: /e was compiled with seed 3"),
            "{e}"
        );
    }
}
