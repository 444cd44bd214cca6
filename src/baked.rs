//! The engine `build.rs` baked into this binary: prebuilt cubins of the embedded default's
//! kernels (when NVRTC was found at build time) and a summary of what was baked. Only the CUDA
//! backend reads them.

#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/embedded_engine.rs"));
}

pub use generated::*;
