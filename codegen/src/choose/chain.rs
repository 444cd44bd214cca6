//! Which consecutive launches run as one chain ([`specc_kernels_gen::chain`]).
//!
//! Every maximal run of two or more consecutive one-block grid-stride launches of the same
//! step phase becomes one launch: the members' work is a few integers each (a step's
//! bookkeeping), so the ~2 µs a graph pays per launch is most of their cost. Runs stop at a
//! phase boundary so per-phase timings stay attributable. Members may come from different
//! token buckets (a draft forward's ops inside a verify step): grid-stride kernels read no
//! bucket constant.

use specc_ir::engine::Phase;
use specc_kernels_gen::abi::KernelSource;
use specc_kernels_gen::chain::chainable;

/// Whether a launch of `k` in `phase` may join a run that `first` started.
pub fn joins(first: (&KernelSource, Phase), k: (&KernelSource, Phase)) -> bool {
    chainable(first.0) && chainable(k.0) && first.1 == k.1
}
