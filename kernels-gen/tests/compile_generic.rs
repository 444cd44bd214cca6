//! Compiles the generic family's kernel for every fixture (every supported op at
//! representative shapes, `generic_cases`) for every supported architecture, printing
//! registers and spills per kernel.
//!
//! Skips with a printed reason when NVRTC is absent, unless `SPECC_REQUIRE_NVRTC=1`.

mod generic_cases;

use generic_cases::{cases, lay_out};
use specc_kernels_gen::generic::single;
use specc_kernels_gen::{Arch, KernelSource};
use std::time::Instant;

#[test]
fn every_generic_op_compiles_for_every_arch() {
    let Some(nvrtc) = specc_kernels_gen::Nvrtc::or_skip() else {
        return;
    };
    let mut jobs: Vec<(String, KernelSource, Arch)> = Vec::new();
    for c in cases() {
        let laid = lay_out(&c);
        let ks = single(&c.op, &laid.inputs, &laid.output)
            .unwrap_or_else(|e| panic!("{}: {e}", c.label));
        for k in ks {
            for arch in Arch::ALL {
                jobs.push((c.label.clone(), k.clone(), arch));
            }
        }
    }
    let start = Instant::now();
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(4);
    let chunks: Vec<_> = jobs.chunks(jobs.len().div_ceil(threads)).collect();
    let results: Vec<Result<String, String>> = std::thread::scope(|sc| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                let nvrtc = &nvrtc;
                sc.spawn(move || {
                    chunk
                        .iter()
                        .map(|(label, k, arch)| match nvrtc.compile(k, *arch) {
                            Ok(c) => Ok(format!(
                                "{label:<52} {arch:<8} {:>5} {:>7} {:>6}  {}",
                                c.stats.registers,
                                c.stats.spill_stores + c.stats.spill_loads,
                                c.stats.smem_bytes,
                                k.name
                            )),
                            Err(e) => Err(format!("{label} [{arch}]: {e}")),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    println!(
        "{:<52} {:<8} {:>5} {:>7} {:>6}  kernel",
        "fixture", "arch", "regs", "spill B", "smem"
    );
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(line) => println!("{line}"),
            Err(e) => failures.push(e),
        }
    }
    println!(
        "{} compiles in {:.1} s on {threads} threads",
        jobs.len(),
        start.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Without a GPU: every fixture is a valid one-node graph the interpreter runs, and the
/// generator accepts it.
#[test]
fn every_fixture_runs_on_the_interpreter_and_generates() {
    for (i, c) in cases().iter().enumerate() {
        let mut rng = generic_cases::Rng::new(i as u64);
        let args: Vec<_> = c.inputs.iter().map(|o| o.tensor(&mut rng)).collect();
        let want = generic_cases::reference(c, &args)
            .unwrap_or_else(|e| panic!("{}: interpreter: {e}", c.label));
        assert_eq!(want.dtype, c.out.0, "{}", c.label);
        let laid = lay_out(c);
        assert_eq!(
            single(&c.op, &laid.inputs, &laid.output)
                .unwrap_or_else(|e| panic!("{}: {e}", c.label))
                .len(),
            1
        );
    }
}

/// Every one-block grid-stride kernel of the fixtures, chained in fixture order into one
/// kernel (`specc_kernels_gen::chain`), compiles for every architecture: the members' bodies
/// live side by side in one function (their scopes keep their names apart).
#[test]
fn a_chain_of_every_chainable_fixture_compiles_for_every_arch() {
    let Some(nvrtc) = specc_kernels_gen::Nvrtc::or_skip() else {
        return;
    };
    let members: Vec<KernelSource> = cases()
        .iter()
        .flat_map(|c| {
            let laid = lay_out(c);
            single(&c.op, &laid.inputs, &laid.output).unwrap_or_else(|e| panic!("{}: {e}", c.label))
        })
        .filter(specc_kernels_gen::chain::chainable)
        .collect();
    assert!(
        members.len() >= 10,
        "only {} chainable fixtures",
        members.len()
    );
    let refs: Vec<&KernelSource> = members.iter().collect();
    let chain = specc_kernels_gen::chain::chain(&refs).unwrap();
    for arch in Arch::ALL {
        let c = nvrtc
            .compile(&chain, arch)
            .unwrap_or_else(|e| panic!("chain of {} [{arch}]: {e}", members.len()));
        // Spills are not checked: a chain's members are a few elements each, so local
        // memory traffic (if ptxas spills the larger members' temporaries) is noise.
        println!(
            "chain of {} members {arch:<8} {:>5} registers {:>5} spills",
            members.len(),
            c.stats.registers,
            c.stats.spill_stores + c.stats.spill_loads
        );
    }
}
