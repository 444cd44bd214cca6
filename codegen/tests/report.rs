//! The plan report of a built engine lists exactly the launches that run, and every kernel.

use std::path::Path;

use specc_codegen::{build, plan_report, BuildOptions, Cubins};
use specc_ir::engine::{Arch, Target};
use specc_models::spec_bundle::engine_input;
use specc_models::Model;

fn default_dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/default"))
}

/// Table rows of the section that starts at `header`: the lines after the table's separator
/// up to the first line that is not a row.
fn section_rows<'a>(report: &'a str, header: &str) -> Vec<&'a str> {
    let mut lines = report.lines().skip_while(|l| *l != header);
    assert!(lines.next().is_some(), "no section `{header}` in\n{report}");
    lines
        .skip_while(|l| !l.starts_with("|-"))
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .collect()
}

#[test]
fn report_lists_every_launch_of_every_plan_and_every_kernel() {
    let model = Model::open(default_dir()).unwrap();
    let (input, _) = engine_input(&model, None, 64, None, &Default::default(), &|p: &Path| {
        p.to_path_buf()
    })
    .unwrap();
    let opts = BuildOptions {
        cubins: Cubins::IfAvailable,
        ..Default::default()
    };
    let built = build(input, &Target::for_archs(&[Arch::Sm90a]), &opts).unwrap();
    let e = &built.engine;
    assert!(!e.plans.is_empty());
    // With or without NVRTC, every index the engine holds resolves.
    e.check(Path::new("engine.json")).unwrap();
    for report in [plan_report(e, Some(&built.sources)), plan_report(e, None)] {
        assert!(report.contains("LlamaForCausalLM"), "{report}");
        assert!(report.contains("plain decoding"), "{report}");
        assert!(report.contains("sm_90a"), "{report}");
        let mut rows_total = 0;
        for p in &e.plans {
            let header = format!(
                "== {} B={} T={} Ctx={} ==",
                p.role, p.bucket.b, p.bucket.t, p.bucket.ctx
            );
            let rows = section_rows(&report, &header);
            assert_eq!(rows.len(), p.launches.len(), "{header}");
            for (i, (row, l)) in rows.iter().zip(&p.launches).enumerate() {
                let cells: Vec<&str> = row.split('|').map(str::trim).collect();
                assert_eq!(cells[1], i.to_string(), "{row}");
                assert_eq!(cells[2], format!("g{}", l.group), "{row}");
                assert_eq!(cells[3], e.kernels[l.kernel as usize].name, "{row}");
            }
            rows_total += rows.len();
        }
        let launches: usize = e.plans.iter().map(|p| p.launches.len()).sum();
        assert_eq!(rows_total, launches);
        let kernel_rows = section_rows(&report, &format!("kernels ({}):", e.kernels.len()));
        for k in &e.kernels {
            assert!(
                kernel_rows
                    .iter()
                    .any(|r| r.split('|').nth(1).map(str::trim) == Some(k.name.as_str())),
                "kernel {} missing from the kernel table",
                k.name
            );
        }
        let stats_rows: usize = e.kernels.iter().map(|k| k.stats.len().max(1)).sum();
        assert_eq!(kernel_rows.len(), stats_rows);
    }
}
