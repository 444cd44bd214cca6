//! Why the CUDA backend is unavailable in a build without it.

#[cfg(not(feature = "cuda"))]
pub fn unavailable() -> anyhow::Error {
    anyhow::anyhow!(
        "--backend cuda: this specc was built without CUDA support (rebuild with `cargo build --release --features cuda`)"
    )
}
