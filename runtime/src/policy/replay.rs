//! The policy replayed over recorded acceptance: for each request, whether the draft's
//! greedy token matched the target's at each position of the text (a draft of `k` from
//! position `t` accepts the run of matches starting there, at most `k`), with step times
//! per variant. Goodput is tokens over step and re-priming time, as a served request at
//! concurrency 1 sees it.
//!
//! `testdata/default_python_matches.txt`: the embedded default (draft_model) over
//! `bench/prompts/python.jsonl`, 16 requests × 128 tokens at concurrency 1, read off a
//! `SPECC_POLICY_TRACE=1` server at a fixed k = 5 (a step emitting `a + 1` tokens is `a`
//! matches then a miss; after 5 matches the next position was not tried, `?`, taken as a
//! match). Match rates per request 0.40–0.87; `P(match | match) = 0.58`,
//! `P(match | miss) = 0.52`: acceptance on this text is close to memoryless.

use super::{AdaptivePolicy, SpecPolicy};

/// One request's positions: whether the draft matched the target there.
pub(super) fn requests(text: &str) -> Vec<Vec<bool>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().chars().map(|c| c != '0').collect())
        .collect()
}

/// Tokens and seconds of `requests` run one at a time through `p`, whose variants are
/// `ks` (ascending) at `times` seconds a step; a speculative step after `gap` plain
/// steps first re-primes the draft at `reprime` seconds a token of the gap.
pub(super) fn replay(
    p: &mut AdaptivePolicy,
    requests: &[Vec<bool>],
    times: &[f64],
    reprime: f64,
) -> (usize, f64) {
    let ks = p.ks().to_vec();
    for (v, &t) in times.iter().enumerate() {
        p.set_time(1, v, t);
    }
    p.observe_reprime(1, reprime);
    let (mut tokens, mut seconds) = (0, 0.0);
    for matches in requests {
        p.admit(0);
        let (mut t, mut gap) = (0, 0);
        while t < matches.len() {
            let v = p.choose(1, &[true]);
            seconds += times[v];
            if ks[v] == 0 {
                t += 1;
                gap += 1;
                tokens += 1;
                continue;
            }
            seconds += reprime * gap as f64;
            gap = 0;
            let accepted = matches[t..].iter().take(ks[v]).take_while(|&&m| m).count();
            p.observe(0, v, accepted);
            t += accepted + 1;
            tokens += accepted + 1;
        }
    }
    (tokens, seconds)
}

/// Tokens per second of `requests` through a policy over `ks` in `mode`.
pub(super) fn goodput(
    ks: &[usize],
    mode: SpecPolicy,
    requests: &[Vec<bool>],
    times: &[f64],
    reprime: f64,
) -> f64 {
    let mut p = AdaptivePolicy::new(ks.to_vec(), 1, mode);
    let (tokens, seconds) = replay(&mut p, requests, times, reprime);
    tokens as f64 / seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    const MATCHES: &str = include_str!("testdata/default_python_matches.txt");
    /// Step times of plain, k = 1, 3, 5 measured at load on the 2-core AMD EPYC VM
    /// (`SPECC_POLICY_TRACE=1`, embedded default), and the draft's re-priming per token.
    const EPYC_TIMES: [f64; 4] = [0.87e-3, 1.15e-3, 1.88e-3, 2.35e-3];
    const EPYC_REPRIME: f64 = 0.035e-3;

    /// At the EPYC's step times a k = 1 draft pays on every request (it breaks even at a
    /// match rate of 0.32; the lowest request's is 0.40): the adaptive policy must come
    /// close to the best fixed variant. Two misses in a row (a quarter of all pairs) put a
    /// lane in plain decoding; unless plain steps age its evidence it stays there until a
    /// probe 64 steps later, most of a 128-token request (bench/NOTES.md, session 49).
    #[test]
    fn adaptive_comes_close_to_the_best_fixed_k_on_the_defaults_python_prompts() {
        let reqs = requests(MATCHES);
        let plain = goodput(&[0], SpecPolicy::Fixed, &reqs, &EPYC_TIMES[..1], 0.0);
        let fixed: Vec<f64> = [1, 3, 5]
            .iter()
            .zip(&EPYC_TIMES[1..])
            .map(|(&k, &t)| goodput(&[k], SpecPolicy::Fixed, &reqs, &[t], 0.0) / plain)
            .collect();
        let adaptive = goodput(
            &[0, 1, 3, 5],
            SpecPolicy::Adaptive,
            &reqs,
            &EPYC_TIMES,
            EPYC_REPRIME,
        ) / plain;
        eprintln!("fixed k = 1, 3, 5: {fixed:.3?}× plain; adaptive {adaptive:.3}×");
        let best = fixed.iter().copied().fold(0.0, f64::max);
        assert!((best - 1.163).abs() < 1e-3, "fixed k = 1 {best:.4}");
        assert!(
            adaptive >= 0.97 * best,
            "adaptive {adaptive:.3} of {best:.3}"
        );
    }
}
