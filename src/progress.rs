//! Progress on stderr for the slow stages: engine builds (planning every graph and bucket,
//! then NVRTC) and weight loading. indicatif draws nothing when stderr is not a terminal,
//! so piped, logged and tested output is unchanged.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use specc_codegen::BuildProgress;

/// A bar over `len` steps of `what`, on stderr.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
        .expect("a valid progress template")
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb
}

/// A bar over `len` bytes of `what`, on stderr.
pub fn bytes_bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {elapsed})",
    )
    .expect("a valid progress template")
    .progress_chars("=> ");
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb
}

/// A spinner for a stage of unknown length, on stderr (the CUDA backend's weight upload).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn spinner(what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
        .expect("a valid progress template");
    pb.set_style(style);
    pb.set_message(what.to_string());
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// A build's progress callback drawing on `pb`: the plans made, then NVRTC's compile.
pub fn build_reporter(pb: &ProgressBar) -> impl Fn(BuildProgress) {
    let pb = pb.clone();
    move |p| match p {
        BuildProgress::Planned { done, total } => {
            pb.set_length(total as u64);
            pb.set_position(done as u64);
        }
        BuildProgress::Compiling { kernels } => {
            pb.set_message(format!("NVRTC: compiling {kernels} kernels"));
            pb.enable_steady_tick(Duration::from_millis(100));
        }
    }
}
