//! The CUDA backend behind the CLI: builds a [`CudaSpecSession`] for a target (and draft),
//! or explains why it cannot.

#[cfg(feature = "cuda")]
pub use enabled::*;

#[cfg(not(feature = "cuda"))]
pub fn unavailable() -> anyhow::Error {
    anyhow::anyhow!(
        "--backend cuda: this specc was built without CUDA support (rebuild with `cargo build --release --features cuda`)"
    )
}

#[cfg(feature = "cuda")]
mod enabled {
    use anyhow::Result;
    use specc_ir::Graph;
    use specc_models::{Model, SpecBundle};
    use specc_runtime::cuda::{CudaSpecGraphs, CudaSpecSession, WeightSources};
    use specc_runtime::DraftKind;

    /// Plain decoding (k = 0): the target prefill and the self-feeding decode step graph.
    pub fn decode_session<'a>(
        target: &'a Model,
        prefill: &'a Graph,
        step: &'a Graph,
        lanes: usize,
        ctx: u64,
        ring: usize,
    ) -> Result<CudaSpecSession<'a>> {
        let sources = WeightSources {
            sources: vec![("", target.checkpoint())],
        };
        let graphs = CudaSpecGraphs {
            kind: DraftKind::None,
            target_prefill: prefill,
            draft_prefill: prefill,
            step,
            num_steps: 0,
            ring,
        };
        Ok(CudaSpecSession::new(graphs, &sources, lanes, ctx)?)
    }

    pub fn spec_session<'a>(
        target: &'a Model,
        bundle: &'a SpecBundle,
        lanes: usize,
        ctx: u64,
    ) -> Result<CudaSpecSession<'a>> {
        let sources = WeightSources {
            sources: vec![
                ("", target.checkpoint()),
                (bundle.prefix, &bundle.draft_checkpoint),
            ],
        };
        Ok(CudaSpecSession::new(
            CudaSpecGraphs::of(bundle),
            &sources,
            lanes,
            ctx,
        )?)
    }
}
