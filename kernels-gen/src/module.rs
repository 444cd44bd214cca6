//! Modules: several generated kernels compiled as ONE NVRTC program (one cubin, several
//! `extern "C"` entries).
//!
//! Why: every NVRTC program pays a fixed cost — starting the front end and parsing the
//! prelude (`cuda_bf16.h`, `cuda_fp16.h`, `cuda/*.cuh`) — of about 80 ms on a 2-core
//! machine, which is most of the cost of a small kernel (a constant fill compiles in ~5 ms
//! once the headers are parsed). Grouping kernels that share a prelude pays it once per
//! group.
//!
//! Layout of a module's source: the shared prelude, the `// ---- generated ----` marker,
//! then each kernel's generated text (module items + the kernel) inside its own
//! `namespace specc_<name> { ... }`, so module-scope items of different kernels (tables,
//! helper functions of the same name) cannot collide. Kernels keep their exact symbol: an
//! `extern "C"` function declared in a namespace has C linkage, so the entry is the
//! unmangled kernel name. Invariant relied on: generated items leave no macro defined
//! (`#define` in items is always paired with `#undef`).
//!
//! A module of one kernel is that kernel's own source, unchanged, so its cache key and cubin
//! are those of [`crate::Nvrtc::compile`].

use crate::abi::KernelSource;
use sha2::{Digest, Sha256};

/// The line between a module's prelude and its generated kernels (see `abi::assemble`).
pub const GENERATED_MARKER: &str = "\n// ---- generated ----\n";

/// Scheduling estimate of the fixed cost of one NVRTC program, in bytes of generated
/// kernel text compiling in the same time (≈ 80 ms vs ≈ 0.04 ms per byte, measured on
/// NVRTC 13 for the sm_90a kernels of the 8B engines).
const PROGRAM_COST_BYTES: usize = 2000;

/// A group of kernels compiled as one NVRTC program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleSource {
    /// The kernel's name for a module of one kernel, else `module_{hash8 of source}`.
    pub name: String,
    /// The `extern "C"` symbols the cubin holds (kernel names), in source order.
    pub entries: Vec<String>,
    /// The whole program text.
    pub source: String,
}

/// The prelude a kernel's source starts with, when the source is `prelude + marker +
/// kernel` as `abi::assemble` writes it; `None` for a hand-assembled source.
fn prelude_of(k: &KernelSource) -> Option<&str> {
    k.source
        .strip_suffix(k.kernel.as_str())?
        .strip_suffix(GENERATED_MARKER)
}

/// Estimated compile cost of a kernel's generated text (see [`PROGRAM_COST_BYTES`]).
fn cost(k: &KernelSource) -> usize {
    k.kernel.len()
}

/// The module of one kernel: its own source.
fn single(k: &KernelSource) -> ModuleSource {
    ModuleSource {
        name: k.name.clone(),
        entries: vec![k.entry.clone()],
        source: k.source.clone(),
    }
}

/// Joins kernels that share `prelude` into one program.
fn joined(prelude: &str, kernels: &[&KernelSource]) -> ModuleSource {
    if let [k] = kernels {
        return single(k);
    }
    let mut source = format!("{prelude}{GENERATED_MARKER}");
    for k in kernels {
        source.push_str(&format!(
            "namespace specc_{name} {{\n{body}}}  // namespace specc_{name}\n\n",
            name = k.name,
            body = k.kernel
        ));
    }
    let digest = Sha256::digest(source.as_bytes());
    let hash8: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    ModuleSource {
        name: format!("module_{hash8}"),
        entries: kernels.iter().map(|k| k.entry.clone()).collect(),
        source,
    }
}

/// Groups the distinct kernels of `kernels` (by name; the first of each name) into modules
/// to compile on `threads` workers: kernels sharing a prelude are split into at most
/// `threads` modules of balanced estimated cost (longest first, each to the lightest
/// module), so the workers stay busy while each prelude is parsed at most `threads` times.
/// Kernels whose source is not `prelude + marker + kernel` get a module each. The result
/// is deterministic (same kernels and threads → same modules, so the disk cache hits), and
/// ordered costliest first (the order to hand to a work queue).
pub fn group_modules(kernels: &[&KernelSource], threads: usize) -> Vec<ModuleSource> {
    let mut distinct: Vec<&KernelSource> = Vec::new();
    for k in kernels {
        if !distinct.iter().any(|d| d.name == k.name) {
            distinct.push(k);
        }
    }
    // Preludes in first-seen order, each with its kernels.
    let mut groups: Vec<(&str, Vec<&KernelSource>)> = Vec::new();
    let mut modules: Vec<(usize, ModuleSource)> = Vec::new();
    for k in distinct {
        match prelude_of(k) {
            Some(p) => match groups.iter_mut().find(|(q, _)| *q == p) {
                Some((_, ks)) => ks.push(k),
                None => groups.push((p, vec![k])),
            },
            None => modules.push((PROGRAM_COST_BYTES + cost(k), single(k))),
        }
    }
    for (prelude, mut ks) in groups {
        // Longest first; ties by name so the split does not depend on the input order.
        ks.sort_by(|a, b| cost(b).cmp(&cost(a)).then_with(|| a.name.cmp(&b.name)));
        let parts = threads.clamp(1, ks.len());
        let mut bins: Vec<(usize, Vec<&KernelSource>)> = vec![(0, Vec::new()); parts];
        for k in ks {
            let lightest = (0..parts)
                .min_by_key(|&i| (bins[i].0, i))
                .expect("at least one bin");
            bins[lightest].0 += cost(k);
            bins[lightest].1.push(k);
        }
        for (c, members) in bins {
            modules.push((PROGRAM_COST_BYTES + c, joined(prelude, &members)));
        }
    }
    modules.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
    modules.into_iter().map(|(_, m)| m).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Loc;
    use crate::generic::{single as generate, TensorArg};
    use specc_ir::{DType, Dim, Op, TensorType};

    fn fill(value: i64, n: u64) -> KernelSource {
        let op = Op::Fill {
            value: value as f64,
            ty: TensorType::new(DType::I32, [Dim::Static(n)]),
        };
        let out = TensorArg::new(Loc::arena(0), DType::I32, &[n]);
        generate(&op, &[], &out).unwrap().remove(0)
    }

    #[test]
    fn one_kernel_is_its_own_source() {
        let k = fill(3, 4);
        let m = group_modules(&[&k], 2);
        assert_eq!(m, vec![single(&k)]);
        assert_eq!(m[0].name, k.name);
    }

    #[test]
    fn kernels_sharing_a_prelude_are_split_over_the_threads() {
        let ks: Vec<KernelSource> = (0..5).map(|v| fill(v, 8)).collect();
        let refs: Vec<&KernelSource> = ks.iter().collect();
        let m = group_modules(&refs, 2);
        assert_eq!(m.len(), 2);
        let mut entries: Vec<&String> = m.iter().flat_map(|m| &m.entries).collect();
        entries.sort();
        let mut names: Vec<&String> = ks.iter().map(|k| &k.name).collect();
        names.sort();
        assert_eq!(entries, names, "every kernel in exactly one module");
        for module in &m {
            assert!(module.name.starts_with("module_"));
            assert_eq!(module.source.matches(GENERATED_MARKER).count(), 1);
            for e in &module.entries {
                assert!(module.source.contains(&format!("namespace specc_{e} {{")));
            }
        }
        // Deterministic whatever the input order, and duplicates are dropped.
        let mut rev = refs.clone();
        rev.reverse();
        rev.push(refs[0]);
        assert_eq!(group_modules(&rev, 2), m);
    }

    #[test]
    fn hand_assembled_sources_stay_alone() {
        let mut k = fill(1, 4);
        k.source = format!("// custom\n{}", k.kernel);
        let other = fill(2, 4);
        let m = group_modules(&[&k, &other], 1);
        assert_eq!(m.len(), 2);
        assert!(m.iter().any(|x| *x == single(&k)));
    }
}
