//! Chains: several one-block grid-stride kernels run one after another inside the single
//! block of ONE launch (`chain_mixed_{hash8}`).
//!
//! Why: a speculative step's bookkeeping (positions, lengths, ring indices, accept counts)
//! is dozens of ops on a handful of integers, each its own generic kernel of one block. In a
//! CUDA graph every launch costs ~2 µs of dependency latency whatever it computes, so they
//! cost more than the attention of a layer; chained they cost one launch.
//!
//! Correctness rests on two facts:
//! - a member is a [`KernelSource::grid_stride`] kernel: its body is grid-stride loops over
//!   fixed extents and nothing else, so it computes the same result at any grid and block
//!   size, in particular in one block of any width;
//! - members run in launch order with `__syncthreads()` between them, which makes every
//!   global write of a member visible to every thread of the block before the next member
//!   reads it (the block is the whole grid), as the launch boundary did.
//!
//! Each member's body keeps its own operand numbering inside a scope that rebinds `ops` to
//! its slice of the chain's operand table; the chain's table is the members' tables
//! concatenated. The chain waits for the previous grid once ([`PDL_ENTER`]).

use sha2::{Digest, Sha256};

use crate::abi::{Extent, KernelSource, LaunchSpec, PARAMS, PDL_ENTER};
use crate::module::GENERATED_MARKER;
use crate::writer::emit;
use crate::Error;

const FAMILY: &str = "chain";

/// Whether `k` may be a chain member: a grid-stride kernel of one block without shared
/// memory.
pub fn chainable(k: &KernelSource) -> bool {
    let one = |e: &Extent| matches!(e, Extent::Fixed(1));
    k.grid_stride && k.launch.grid.iter().all(one) && k.launch.smem_bytes == 0
}

/// One kernel running `members` in order in one block (see the module docs). Every member
/// must be [`chainable`], written by `abi::assemble` without module items, with the same
/// prelude.
pub fn chain(members: &[&KernelSource]) -> Result<KernelSource, Error> {
    if members.len() < 2 {
        return Err(Error::param(
            FAMILY,
            "members",
            "a chain needs two kernels or more",
        ));
    }
    let prelude = prelude_of(members[0])?;
    let threads = members
        .iter()
        .map(|k| k.launch.block[0])
        .max()
        .unwrap_or(32);
    let mut operands = Vec::new();
    let mut body = crate::writer::Writer::at_depth(1);
    body.line(PDL_ENTER);
    for (i, k) in members.iter().enumerate() {
        if !chainable(k) {
            return Err(Error::param(
                FAMILY,
                "members",
                format!("{} is not a one-block grid-stride kernel", k.name),
            ));
        }
        if prelude_of(k)? != prelude {
            return Err(Error::param(
                FAMILY,
                "members",
                format!("{} has another prelude than {}", k.name, members[0].name),
            ));
        }
        let inner = member_body(k)?;
        emit!(body, "{{  // {}", k.name);
        emit!(
            body,
            "  void* const* __restrict__ ops = chain_ops + {};",
            operands.len()
        );
        for line in inner.lines() {
            if line.is_empty() {
                body.blank();
            } else {
                emit!(body, "  {}", line.trim_start_matches("  "));
            }
        }
        body.line("}");
        if i + 1 < members.len() {
            body.line("__syncthreads();");
        }
        operands.extend(k.operands.iter().copied());
    }
    let body = body.finish();
    let mut h = Sha256::new();
    h.update(threads.to_le_bytes());
    h.update(body.as_bytes());
    let hash8: String = h.finalize()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let name = format!("{FAMILY}_mixed_{hash8}");
    let params = PARAMS.replacen("ops", "chain_ops", 1);
    let kernel = format!(
        "extern \"C\" __global__ void __launch_bounds__({threads})\n{name}({params}) {{\n{body}}}\n"
    );
    Ok(KernelSource {
        entry: name.clone(),
        name,
        source: format!("{prelude}{GENERATED_MARKER}{kernel}"),
        kernel,
        launch: LaunchSpec {
            grid: [Extent::Fixed(1), Extent::Fixed(1), Extent::Fixed(1)],
            block: [threads, 1, 1],
            smem_bytes: 0,
        },
        operands,
        grid_stride: false,
    })
}

/// The prelude `k`'s source starts with.
fn prelude_of(k: &KernelSource) -> Result<&str, Error> {
    k.source
        .strip_suffix(k.kernel.as_str())
        .and_then(|s| s.strip_suffix(GENERATED_MARKER))
        .ok_or_else(|| {
            Error::param(
                FAMILY,
                "members",
                format!("{} is not prelude + marker + kernel", k.name),
            )
        })
}

/// The statements of `k`'s function after its [`PDL_ENTER`] line, at depth 1.
fn member_body(k: &KernelSource) -> Result<&str, Error> {
    let bad = |what: &str| {
        Error::param(
            FAMILY,
            "members",
            format!(
                "{}: {what} (not a kernel as abi::assemble writes it)",
                k.name
            ),
        )
    };
    let open = format!("\n{}({PARAMS}) {{\n", k.name);
    let head = k
        .kernel
        .strip_prefix("extern \"C\" __global__ void __launch_bounds__(")
        .ok_or_else(|| bad("module items or another signature"))?;
    let at = head.find(&open).ok_or_else(|| bad("no signature"))?;
    let body = head[at + open.len()..]
        .strip_suffix("}\n")
        .ok_or_else(|| bad("no closing brace"))?;
    body.strip_prefix(&format!("  {PDL_ENTER}\n"))
        .ok_or_else(|| bad("code before the PDL wait"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::Loc;
    use crate::generic::{single, TensorArg};
    use specc_ir::{BinaryOp, DType, Op};

    fn add(a: u64, b: u64, y: u64, n: u64) -> KernelSource {
        let t = |off| TensorArg::new(Loc::arena(off), DType::I32, &[n]);
        single(&Op::Binary(BinaryOp::Add), &[t(a), t(b)], &t(y))
            .unwrap()
            .remove(0)
    }

    #[test]
    fn members_run_in_order_with_their_operands_appended() {
        let first = add(0, 256, 512, 4);
        let second = add(512, 0, 768, 100);
        assert!(chainable(&first) && chainable(&second));
        let c = chain(&[&first, &second]).unwrap();
        assert!(c.name.starts_with("chain_mixed_"));
        assert_eq!(c.family(), "chain");
        let mut want = first.operands.clone();
        want.extend(&second.operands);
        assert_eq!(c.operands, want);
        assert_eq!(c.launch.block, [128, 1, 1]);
        assert_eq!(c.kernel.matches("pdl_enter();").count(), 1);
        assert_eq!(c.kernel.matches("__syncthreads();").count(), 1);
        let a = c.kernel.find(&format!("// {}", first.name)).unwrap();
        let b = c.kernel.find(&format!("// {}", second.name)).unwrap();
        assert!(a < b);
        assert!(c.kernel.contains("ops = chain_ops + 0;"));
        assert!(c
            .kernel
            .contains(&format!("ops = chain_ops + {};", first.operands.len())));
        assert!(!chainable(&c), "a chain has block synchronisation");
    }

    #[test]
    fn refuses_what_it_cannot_run_in_one_block() {
        let one = add(0, 256, 512, 4);
        let wide = add(0, 4096, 8192, 1000);
        assert!(!chainable(&wide), "4 blocks");
        assert!(chain(&[&one]).is_err());
        let e = chain(&[&one, &wide]).unwrap_err().to_string();
        assert!(e.contains("not a one-block grid-stride kernel"), "{e}");
    }
}
