//! One module per subcommand.

mod compile;
mod engine;
mod gpu;
mod inspect;
mod logits;
mod run;

use anyhow::Result;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compile {
            model,
            out,
            max_context,
            random_weights,
        } => compile::compile(model, &out, max_context, random_weights),
        Command::Inspect { engine } => inspect::inspect(&engine),
        Command::Run {
            model,
            prompt,
            max_tokens,
            backend,
            max_context,
            spec,
            random_weights,
        } => {
            let src = engine::Source::new(model, random_weights);
            run::run(
                src,
                spec.as_deref(),
                &prompt,
                max_tokens,
                backend,
                max_context,
            )
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
    }
}
