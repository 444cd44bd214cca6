//! Controlled acceptance for random weights (`--synthetic-acceptance P`, a benchmarking
//! aid): the target's greedy next token is `π(t)` for the current token `t`, a seeded
//! permutation of the vocabulary, and a draft model's is `π'(t)`, equal to `π(t)` on a
//! seeded fraction P of the tokens. Each drafted token is then accepted with probability ≈ P
//! independently of the others, so a speculative step accepts `Σ_{i=1..k} P^i` drafts on
//! average: acceptance is a dial, at any model shape, without a trained draft.
//!
//! Construction (only three tensors differ from the ordinary random fill):
//! - `model.embed_tokens.weight` row t is `A · u_t`, with `u_t` a seeded random unit
//!   direction and `A = EMBED_RMS · √H` (per-dimension RMS [`EMBED_RMS`]). The random
//!   decoder layers only see RMS-normed inputs through weights of variance 1/fan-in, so each
//!   adds O(1) per dimension to the residual stream (≈ √layers over the model): the stream
//!   stays within a few degrees of `u_t`.
//! - `model.norm.weight` is 1, so the final RMSNorm gives ≈ `√H · u_t`.
//! - `lm_head.weight` row `π(t)` is `u_t` (unit rows). The logit of `π(t)` is ≈ `√H` (64 at
//!   H = 4096, 16 at H = 256); every other logit is a dot product of `√H · u_t` with an
//!   independent unit direction, ≈ N(0, 1): the largest of 128 k of them is ≈ 5.
//!
//! `π` is one cycle through every token but the end-of-sequence ids (which it fixes), so a
//! greedy stream visits fresh tokens (independent acceptances) and never ends by itself.
//! `π'` differs from `π` on the seeded set D (each token in D with probability 1 − P) by a
//! cyclic shift inside D: `π'(D[i]) = π(D[i + 1])`, a permutation that never equals `π` on D.
//! Target and draft share the plant seed, so they share π; their own hidden sizes give
//! their own directions `u_t`, which nothing compares across models.

use safetensors::Dtype;

/// Per-dimension RMS of a planted embedding row: ≫ the ≈ √layers that the random decoder
/// layers add, so the residual stream keeps its token's direction.
pub const EMBED_RMS: f32 = 64.0;

/// Which side of a speculative pair a planted checkpoint is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlantRole {
    /// Greedy next token `π(t)`.
    Target,
    /// Greedy next token `π'(t)`: `π(t)` on a fraction `acceptance` of the tokens.
    Draft,
}

/// What a planted random checkpoint realises; equal values give equal tensors.
#[derive(Clone, Debug, PartialEq)]
pub struct Plant {
    /// Seed of the directions, π and D: shared by a target and its draft.
    pub seed: u64,
    /// P: the fraction of tokens on which the draft's next token is the target's.
    pub acceptance: f64,
    /// Token ids π fixes (the target's end-of-sequence ids).
    pub fixed: Vec<u32>,
    pub role: PlantRole,
}

/// The tensors a plant overrides, by checkpoint name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Planted {
    Embedding,
    Head,
    FinalNorm,
}

pub const EMBEDDING: &str = "model.embed_tokens.weight";
pub const HEAD: &str = "lm_head.weight";
pub const FINAL_NORM: &str = "model.norm.weight";

impl Planted {
    pub(super) fn of(name: &str) -> Option<Planted> {
        match name {
            EMBEDDING => Some(Planted::Embedding),
            HEAD => Some(Planted::Head),
            FINAL_NORM => Some(Planted::FinalNorm),
            _ => None,
        }
    }
}

impl Plant {
    /// The greedy next token of this plant's model after each token: `π` for the target,
    /// `π'` for the draft. A permutation of `0..vocab`.
    pub fn successor(&self, vocab: usize) -> Vec<u32> {
        let free: Vec<u32> = (0..vocab as u32)
            .filter(|t| !self.fixed.contains(t))
            .collect();
        let mut order = free.clone();
        // Fisher–Yates: a seeded order of the free tokens; π walks it as one cycle.
        for i in (1..order.len()).rev() {
            let j = (mix(self.seed ^ 0x9e11, i as u64) % (i as u64 + 1)) as usize;
            order.swap(i, j);
        }
        let mut next: Vec<u32> = (0..vocab as u32).collect();
        for (i, &t) in order.iter().enumerate() {
            next[t as usize] = order[(i + 1) % order.len()];
        }
        if self.role == PlantRole::Draft {
            let disagree: Vec<u32> = free
                .into_iter()
                .filter(|&t| unit(mix(self.seed ^ 0xd15a, t as u64)) >= self.acceptance)
                .collect();
            let target = next.clone();
            if disagree.len() > 1 {
                for (i, &t) in disagree.iter().enumerate() {
                    let shifted = disagree[(i + 1) % disagree.len()];
                    next[t as usize] = target[shifted as usize];
                }
            }
        }
        next
    }

    /// Fills `out` (rows of `shape`, stored as `dt`) with the planted tensor `which`, rows
    /// in parallel. Callers check the dtype with [`plantable`] first.
    pub(super) fn fill(&self, which: Planted, dt: Dtype, shape: &[usize], out: &mut [u8]) {
        let width = *shape.last().unwrap_or(&1);
        let size = dt.size();
        let rows = out.len() / (width * size).max(1);
        match which {
            Planted::FinalNorm => {
                for c in out.chunks_exact_mut(size) {
                    put(dt, c, 1.0);
                }
            }
            Planted::Embedding => {
                let a = EMBED_RMS * (width as f32).sqrt();
                self.rows(out, width, size, &|t, row| self.direction(t, dt, a, row));
            }
            Planted::Head => {
                let next = self.successor(rows);
                let mut source = vec![0u32; rows];
                for (t, &n) in next.iter().enumerate() {
                    source[n as usize] = t as u32;
                }
                self.rows(out, width, size, &|j, row| {
                    self.direction(source[j] as usize, dt, 1.0, row)
                });
            }
        }
    }

    /// Runs `row(index, bytes)` over every row of `out`, spread over the available cores.
    fn rows(
        &self,
        out: &mut [u8],
        width: usize,
        size: usize,
        row: &(dyn Fn(usize, &mut [u8]) + Sync),
    ) {
        let row_bytes = width * size;
        let rows = out.len() / row_bytes.max(1);
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(32);
        let per = rows.div_ceil(threads).max(1);
        std::thread::scope(|sc| {
            for (c, chunk) in out.chunks_mut(per * row_bytes).enumerate() {
                sc.spawn(move || {
                    for (i, r) in chunk.chunks_exact_mut(row_bytes).enumerate() {
                        row(c * per + i, r);
                    }
                });
            }
        });
    }

    /// `scale · u_t` into one row: `u_t` has seeded uniform entries, normalised to length 1.
    fn direction(&self, t: usize, dt: Dtype, scale: f32, row: &mut [u8]) {
        let size = dt.size();
        let h = mix(self.seed ^ 0xd1e5, t as u64);
        let entry = |i: usize| unit(mix(h, i as u64)) as f32 * 2.0 - 1.0;
        let width = row.len() / size;
        let norm = (0..width).map(|i| entry(i).powi(2)).sum::<f32>().sqrt();
        let k = scale / norm.max(f32::MIN_POSITIVE);
        for (i, c) in row.chunks_exact_mut(size).enumerate() {
            put(dt, c, k * entry(i));
        }
    }
}

/// Mean accepted drafts per step of a chain of `k` drafts, each accepted with probability
/// `p` independently until the first rejection: `Σ_{i=1..k} p^i`.
pub fn expected_accepted(p: f64, k: usize) -> f64 {
    (1..=k as i32).map(|i| p.powi(i)).sum()
}

/// Whether a planted tensor can be stored as `dt` (a float: quantised heads are refused).
pub(super) fn plantable(dt: Dtype) -> bool {
    matches!(dt, Dtype::F32 | Dtype::F16 | Dtype::BF16)
}

fn put(dt: Dtype, c: &mut [u8], v: f32) {
    match dt {
        Dtype::F32 => c.copy_from_slice(&v.to_le_bytes()),
        Dtype::F16 => c.copy_from_slice(&half::f16::from_f32(v).to_le_bytes()),
        _ => c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes()),
    }
}

fn mix(seed: u64, i: u64) -> u64 {
    super::splitmix64(super::splitmix64(seed) ^ i)
}

/// Uniform on [0, 1) from 53 bits of `r`.
fn unit(r: u64) -> f64 {
    (r >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 4096;
    const EOS: u32 = 4095;

    fn plant(role: PlantRole, acceptance: f64) -> Plant {
        Plant {
            seed: 0x5eed,
            acceptance,
            fixed: vec![EOS],
            role,
        }
    }

    #[test]
    fn the_target_successor_is_one_cycle_through_every_token_but_eos() {
        let next = plant(PlantRole::Target, 0.5).successor(VOCAB);
        assert_eq!(next[EOS as usize], EOS, "π fixes the end-of-sequence id");
        let (mut t, mut seen) = (7u32, vec![false; VOCAB]);
        for step in 0..VOCAB - 1 {
            assert!(!seen[t as usize], "π revisits token {t} after {step} steps");
            seen[t as usize] = true;
            t = next[t as usize];
        }
        assert_eq!(
            t,
            7,
            "π's cycle through the {} free tokens closes",
            VOCAB - 1
        );
    }

    /// The draft agrees with the target on ≈ P of the tokens, and a chain of k drafts along
    /// the target's stream accepts `Σ_{i=1..k} P^i` of them per step on average.
    #[test]
    fn the_draft_agrees_on_a_fraction_p_and_chains_accept_geometrically() {
        let k = 4;
        for p in [0.3, 0.6, 0.9] {
            let target = plant(PlantRole::Target, p).successor(VOCAB);
            let draft = plant(PlantRole::Draft, p).successor(VOCAB);
            let mut sorted = draft.clone();
            sorted.sort_unstable();
            assert!(sorted.iter().enumerate().all(|(i, &t)| t as usize == i));
            let agree = (0..VOCAB).filter(|&t| draft[t] == target[t]).count() as f64;
            let frac = agree / VOCAB as f64;
            assert!(
                (frac - p).abs() < 0.03,
                "P = {p}: the draft agrees on {frac:.3}"
            );
            // One pass along the target's stream: each step drafts from the current token.
            let (mut t, mut steps, mut accepted, mut walked) = (1u32, 0usize, 0usize, 0usize);
            while walked < VOCAB - 2 {
                let mut n = 0;
                while n < k && draft[t as usize] == target[t as usize] {
                    t = target[t as usize];
                    n += 1;
                }
                t = target[t as usize];
                walked += n + 1;
                accepted += n;
                steps += 1;
            }
            let got = accepted as f64 / steps as f64;
            let want: f64 = (1..=k as i32).map(|i| p.powi(i)).sum();
            eprintln!(
                "P = {p}: {got:.3} accepted drafts per step over {steps} steps, expected {want:.3}"
            );
            assert!(
                (got - want).abs() < 0.08 * want,
                "P = {p}: {got:.3} accepted per step, expected {want:.3}"
            );
        }
    }

    #[test]
    fn a_planted_head_row_is_the_unit_direction_its_token_embeds() {
        let p = plant(PlantRole::Target, 0.5);
        let (vocab, width) = (64usize, 32usize);
        let shape = [vocab, width];
        let mut emb = vec![0u8; vocab * width * 4];
        let mut head = vec![0u8; vocab * width * 4];
        p.fill(Planted::Embedding, Dtype::F32, &shape, &mut emb);
        p.fill(Planted::Head, Dtype::F32, &shape, &mut head);
        let row = |b: &[u8], r: usize| -> Vec<f32> {
            b[r * width * 4..(r + 1) * width * 4]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let next = p.successor(vocab);
        for (t, &n) in next.iter().enumerate() {
            let e = row(&emb, t);
            let h = row(&head, n as usize);
            let rms = (e.iter().map(|x| x * x).sum::<f32>() / width as f32).sqrt();
            assert!(
                (rms - EMBED_RMS).abs() < 1e-3,
                "token {t}: embedding RMS {rms}"
            );
            let cos: f32 =
                e.iter().zip(&h).map(|(a, b)| a * b).sum::<f32>() / (rms * (width as f32).sqrt());
            assert!(
                (cos - 1.0).abs() < 1e-5,
                "token {t}: head row π(t) is u_t, cos {cos}"
            );
        }
    }
}
