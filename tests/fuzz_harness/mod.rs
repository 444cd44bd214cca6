//! An in-tree mutation fuzzer: seeds (real files of the repository, or small synthetic ones)
//! are mutated with a deterministic generator — bit flips, interesting bytes and numbers,
//! deletions, duplications, splices of the format's own tokens — and each input is handed to
//! a target that must return (an `Ok` or a one-line error) without panicking or hanging.
//!
//! Budget: `SPECC_FUZZ_ITERS` executions per target if set (the long runs recorded in
//! `bench/NOTES.md`), else `SPECC_FUZZ_SECS` seconds (default 5: the bounded CI run). A
//! failing input is written to `target/fuzz-failures/` and named in the panic message.
//!
//! Memory: an execution may hold at most [`heap_bound`] bytes of heap at once. Every size a
//! file declares (layer counts, vocabularies, tensor shapes, header lengths) must be checked
//! against what the file and the machine can hold before anything that size is allocated,
//! so a small input never costs more than a fixed allowance plus a multiple of its length.
//! This needs the binary's global allocator to be [`alloc::Counting`].

pub mod alloc;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The slowest one execution may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(5);

/// The most heap one execution on an input of `len` bytes may hold at once: 32 MiB (the
/// engine target holds a whole plan, ~3 MiB) plus 64 bytes per input byte (parsed trees).
pub fn heap_bound(len: usize) -> u64 {
    (32 << 20) + 64 * len as u64
}

/// xorshift64*: fixed seeds, so a run is reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Tokens splice-inserted by the mutator: structure of JSON / TOML and values that break
/// naive parsers (huge, negative, non-finite, wrong types).
const TOKENS: &[&str] = &[
    "\"",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "=",
    "\n",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e308",
    "-1e308",
    "NaN",
    "inf",
    "18446744073709551616",
    "9223372036854775807",
    "4294967296",
    "1000000000000",
    "0.0",
    "\"\"",
    "[]",
    "{}",
    "\\u0000",
    "../",
    "\u{ffff}",
    "#",
];

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..=rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = at.min(v.len() - 1);
                v[i] = [0u8, 0xff, 0x7f, 0x80, b'9', b'-', b'.'][rng.below(7)];
            }
            2 => {
                let len = rng.below(32).min(v.len() - at.min(v.len()));
                v.drain(at..at + len);
            }
            3 if !v.is_empty() => {
                let start = rng.below(v.len());
                let len = rng.below(64).min(v.len() - start);
                let chunk = v[start..start + len].to_vec();
                v.splice(at..at, chunk);
            }
            4 => {
                let t = TOKENS[rng.below(TOKENS.len())].as_bytes();
                v.splice(at..at, t.iter().copied());
            }
            5 => {
                // Replace a run of digits by an interesting number.
                if let Some(i) = (at..v.len()).find(|&i| v[i].is_ascii_digit()) {
                    let end = (i..v.len())
                        .find(|&j| !v[j].is_ascii_digit())
                        .unwrap_or(v.len());
                    let n =
                        ["0", "-1", "4294967296", "18446744073709551615", "1e999"][rng.below(5)];
                    v.splice(i..end, n.bytes());
                }
            }
            _ => v.truncate(at),
        }
    }
    v
}

/// Executions per target in this run (see the module docs).
fn budget() -> (Option<u64>, Duration) {
    let iters = std::env::var("SPECC_FUZZ_ITERS")
        .ok()
        .and_then(|v| v.parse().ok());
    let secs = std::env::var("SPECC_FUZZ_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    (iters, Duration::from_secs(secs))
}

/// Runs `target` on mutations of `seeds` for the run's budget; every seed also runs as is.
/// Returns the number of executions.
pub fn fuzz(name: &str, seeds: &[Vec<u8>], mut target: impl FnMut(&[u8])) -> u64 {
    let (iters, secs) = budget();
    let mut rng = Rng::new(0x5eed ^ name.len() as u64);
    let start = Instant::now();
    let mut n = 0u64;
    let mut most_heap = 0u64;
    loop {
        let input = if (n as usize) < seeds.len() {
            seeds[n as usize].clone()
        } else {
            let seed = &seeds[rng.below(seeds.len())];
            mutate(&mut rng, seed)
        };
        let t = Instant::now();
        let mut outcome = Ok(());
        let heap = alloc::peak_during(|| {
            outcome = catch_unwind(AssertUnwindSafe(|| target(&input)));
        });
        let took = t.elapsed();
        let over = heap > heap_bound(input.len());
        most_heap = most_heap.max(heap);
        if outcome.is_err() || took > HANG || over {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{name}-{n}.bin"));
            let _ = std::fs::write(&file, &input);
            let what = if outcome.is_err() {
                "panicked".to_string()
            } else if over {
                format!(
                    "held {heap} bytes of heap, past its bound {}",
                    heap_bound(input.len())
                )
            } else {
                "hung".to_string()
            };
            panic!(
                "{name}: input {n} {what} ({took:?}); saved to {}",
                file.display()
            );
        }
        n += 1;
        let done = match iters {
            Some(max) => n >= max,
            None => start.elapsed() >= secs,
        };
        if done {
            break;
        }
    }
    eprintln!(
        "{name}: {n} executions in {:.1} s, no panic, hang or heap past the bound \
         (most held by one: {:.1} MiB)",
        start.elapsed().as_secs_f64(),
        most_heap as f64 / (1 << 20) as f64
    );
    n
}
