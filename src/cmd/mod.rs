//! One module per subcommand.

mod compile;
mod engine;
mod inspect;
mod logits;
mod run;
mod spec_run;

use anyhow::Result;

use crate::cli::{Cli, Command};

pub fn dispatch(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Compile {
            model,
            out,
            max_context,
        } => compile::compile(model, &out, max_context),
        Command::Inspect { engine } => inspect::inspect(&engine),
        Command::Run {
            model,
            prompt,
            max_tokens,
            backend,
            max_context,
            spec,
        } => match spec {
            Some(spec) => spec_run::run(model, &spec, &prompt, max_tokens, backend, max_context),
            None => run::run(model, &prompt, max_tokens, backend, max_context),
        },
        Command::Logits {
            model,
            ids,
            backend,
            out,
        } => logits::logits(model, &ids, backend, &out),
    }
}
