//! What one concurrency level measured, and the percentile rule.

use std::time::Duration;

use serde::Serialize;

/// One finished streamed request.
#[derive(Clone, Debug)]
pub struct RequestRecord {
    /// From just before the request was sent (connection set-up included) to the first
    /// chunk that carried text; `None` when no chunk did (a request that produced nothing).
    pub ttft: Option<Duration>,
    /// Gaps between successive text-carrying chunks (one per chunk after the first).
    pub chunk_gaps: Vec<Duration>,
    /// The server's `usage.completion_tokens` when it sent one, else the number of
    /// text-carrying chunks.
    pub output_tokens: u64,
    /// From just before the request was sent to the end of the stream.
    pub latency: Duration,
}

/// One row of the table and one object of the `--json` list.
#[derive(Clone, Debug, Serialize)]
pub struct LevelSummary {
    pub concurrency: usize,
    pub requests: usize,
    pub output_tokens: u64,
    pub duration_s: f64,
    /// All requests' output tokens over the level's wall time (first send to last end).
    pub output_tok_s: f64,
    pub ttft_ms_p50: Option<f64>,
    pub ttft_ms_p99: Option<f64>,
    /// Inter-token latency: the gap between successive streamed chunks.
    pub itl_ms_p50: Option<f64>,
    pub itl_ms_p99: Option<f64>,
    /// Time per output token after the first, per request: (latency − TTFT) / (tokens − 1).
    /// Unlike ITL it stays per token when a chunk carries several (speculative decoding).
    pub tpot_ms_p50: Option<f64>,
}

impl LevelSummary {
    pub fn new(concurrency: usize, records: &[RequestRecord], wall: Duration) -> Self {
        let ms = |d: &Duration| d.as_secs_f64() * 1e3;
        let ttft: Vec<f64> = records
            .iter()
            .filter_map(|r| r.ttft.as_ref())
            .map(ms)
            .collect();
        let itl: Vec<f64> = records
            .iter()
            .flat_map(|r| r.chunk_gaps.iter())
            .map(ms)
            .collect();
        let tpot: Vec<f64> = records
            .iter()
            .filter_map(|r| {
                let ttft = r.ttft?;
                (r.output_tokens > 1)
                    .then(|| ms(&r.latency.saturating_sub(ttft)) / (r.output_tokens - 1) as f64)
            })
            .collect();
        let output_tokens = records.iter().map(|r| r.output_tokens).sum();
        let duration_s = wall.as_secs_f64();
        LevelSummary {
            concurrency,
            requests: records.len(),
            output_tokens,
            duration_s,
            output_tok_s: if duration_s > 0.0 {
                output_tokens as f64 / duration_s
            } else {
                0.0
            },
            ttft_ms_p50: percentile(&ttft, 50.0),
            ttft_ms_p99: percentile(&ttft, 99.0),
            itl_ms_p50: percentile(&itl, 50.0),
            itl_ms_p99: percentile(&itl, 99.0),
            tpot_ms_p50: percentile(&tpot, 50.0),
        }
    }
}

/// The p-th percentile (0 ≤ p ≤ 100) by linear interpolation between closest ranks (numpy's
/// default, Hyndman–Fan type 7): sort the n samples, take the fractional rank
/// h = (n − 1) · p / 100 and interpolate between the samples at ⌊h⌋ and ⌈h⌉. `None` for no
/// samples; NaN samples are not expected (durations) and sort last.
pub fn percentile(samples: &[f64], p: f64) -> Option<f64> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let h = (sorted.len() - 1) as f64 * (p.clamp(0.0, 100.0) / 100.0);
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    Some(sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: Option<f64>, want: f64) {
        let got = got.expect("a value");
        assert!((got - want).abs() < 1e-9, "got {got}, want {want}");
    }

    /// Values numpy.percentile gives for the same samples.
    #[test]
    fn linear_interpolation_matches_numpy() {
        let x = [15.0, 20.0, 35.0, 40.0, 50.0];
        close(percentile(&x, 0.0), 15.0);
        close(percentile(&x, 50.0), 35.0);
        close(percentile(&x, 100.0), 50.0);
        close(percentile(&x, 40.0), 29.0);
        close(percentile(&x, 99.0), 49.6);
        // Order of the input does not matter.
        close(percentile(&[50.0, 15.0, 40.0, 20.0, 35.0], 40.0), 29.0);
        let y: Vec<f64> = (1..=10).map(f64::from).collect();
        close(percentile(&y, 50.0), 5.5);
        close(percentile(&y, 99.0), 9.91);
        close(percentile(&y, 25.0), 3.25);
    }

    #[test]
    fn edge_cases() {
        assert_eq!(percentile(&[], 50.0), None);
        close(percentile(&[7.0], 99.0), 7.0);
        close(percentile(&[1.0, 2.0], 50.0), 1.5);
    }

    #[test]
    fn summary_of_records() {
        let ms = Duration::from_millis;
        let records = vec![
            RequestRecord {
                ttft: Some(ms(100)),
                chunk_gaps: vec![ms(10), ms(20)],
                output_tokens: 3,
                latency: ms(130),
            },
            RequestRecord {
                ttft: Some(ms(200)),
                chunk_gaps: vec![ms(30)],
                // Two chunks carried five tokens (usage said so).
                output_tokens: 5,
                latency: ms(240),
            },
        ];
        let s = LevelSummary::new(2, &records, Duration::from_secs(2));
        assert_eq!(s.requests, 2);
        assert_eq!(s.output_tokens, 8);
        close(Some(s.output_tok_s), 4.0);
        close(s.ttft_ms_p50, 150.0);
        close(s.ttft_ms_p99, 199.0);
        close(s.itl_ms_p50, 20.0);
        close(s.itl_ms_p99, 29.8);
        // (130 − 100) / 2 = 15 and (240 − 200) / 4 = 10.
        close(s.tpot_ms_p50, 12.5);
    }
}
