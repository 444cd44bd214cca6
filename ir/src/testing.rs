//! Support for tests that cannot run on this machine (no GPU, no NVRTC): a skip is never
//! silent. [`skip`] prints the test and the reason to stderr and, where `SPECC_SKIP_LOG`
//! names a file, appends the same line to it, so a whole `cargo test` run can end with the
//! list of what did not run (`.ci/run` prints it).

use std::fmt::Display;
use std::io::Write;

/// The environment variable naming the file skipped tests are appended to.
pub const SKIP_LOG_ENV: &str = "SPECC_SKIP_LOG";

/// Reports that the calling test skips its body because of `reason`. The test is named by
/// its thread (libtest names each test's thread after the test).
pub fn skip(reason: impl Display) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("(unnamed test)");
    // The test binary: `{target}-{hash}`.
    let exe = std::env::current_exe().ok();
    let stem = exe
        .as_ref()
        .and_then(|p| p.file_stem())
        .and_then(|s| s.to_str());
    let binary = stem.map_or("", |s| s.rsplit_once('-').map_or(s, |(name, _)| name));
    let line = format!("SKIPPED {binary}::{test}: {reason}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV) {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        // One write per line: appends from parallel tests do not interleave.
        if let Ok(mut f) = file {
            let _ = f.write_all(format!("{line}\n").as_bytes());
        }
    }
}
