//! One module per subcommand.

mod bench;
pub mod bench_serve;
mod compile;
pub(crate) mod engine;
pub(crate) mod fit;
pub(crate) mod gpu;
mod inspect;
mod logits;
mod run;
pub(crate) mod sampling;

use anyhow::Result;

use crate::cli::{Cli, Command};
use crate::embedded;

pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compile {
            model,
            out,
            max_context,
            arch,
            random_weights,
            layers,
            synthetic_acceptance,
            spec,
            sampling,
        } => compile::compile(compile::CompileArgs {
            model,
            out: &out,
            max_context,
            archs: &arch,
            random_weights,
            synthetic_acceptance,
            layers: layers.map(|n| n as usize),
            spec: spec.as_deref(),
            sampling,
        }),
        Command::Inspect { engine } => inspect::inspect(&engine),
        Command::Serve(args) => crate::serve::serve(args),
        Command::Bench {
            model,
            spec,
            batch,
            context,
            iters,
            per_kernel,
            tokens,
            json,
            accept_len,
            random_weights,
            layers,
            synthetic_acceptance,
            compare,
            suite,
            torch_modes,
        } => bench::bench(bench::BenchArgs {
            tokens,
            src: engine::Source::new(model, random_weights)
                .with_layers(layers)
                .with_synthetic_acceptance(synthetic_acceptance),
            spec,
            batch,
            context,
            iters,
            per_kernel,
            json,
            accept_len,
            compare,
            suite,
            torch_modes,
        }),
        Command::Run {
            model,
            prompt,
            prompt_file,
            max_tokens,
            stop,
            sampling,
            backend,
            max_context,
            spec,
            no_spec,
            spec_policy,
            prefill_chunk,
            ids_out,
            random_weights,
            layers,
            synthetic_acceptance,
        } => {
            let prompt = crate::prompt::read(prompt.as_deref(), prompt_file.as_deref())?;
            // The embedded default speculates with its own spec unless told otherwise.
            let spec = match (&model, spec, no_spec || random_weights) {
                (None, None, false) => {
                    Some(embedded::default_model_dir()?.join(embedded::SPEC_FILE))
                }
                (_, spec, _) => spec,
            };
            let src = engine::Source::new(model, random_weights)
                .with_layers(layers)
                .with_synthetic_acceptance(synthetic_acceptance);
            run::run(run::RunArgs {
                model: src,
                spec_file: spec.as_deref(),
                no_spec,
                spec_policy,
                prompt: &prompt,
                max_tokens,
                stop: &stop,
                sampling,
                backend,
                max_context,
                prefill_chunk,
                ids_out: ids_out.as_deref(),
            })
        }
        Command::Logits {
            model,
            ids,
            backend,
            out,
            random_weights,
        } => logits::logits(
            engine::Source::new(model, random_weights),
            &ids,
            backend,
            &out,
        ),
        Command::BenchServe(args) => bench_serve::bench_serve(&args),
    }
}
