//! `specc`: the command-line front end. It wires the stages together and does nothing else.

mod baked;
mod cli;
mod cmd;
mod embedded;
mod progress;
mod prompt;
mod serve;
mod text;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cmd::dispatch(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line: the chain of causes joined, outermost first; a cause its parent's
            // message already quotes (an OS error inside "cannot read: ...") is not repeated.
            let mut msg = e.to_string();
            for cause in e.chain().skip(1) {
                let text = cause.to_string();
                if !msg.contains(&text) {
                    msg.push_str(": ");
                    msg.push_str(&text);
                }
            }
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
