//! `basecamp trace ...`: the trace tools.

mod analyze;
mod parse;

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Print a whole trace (header, every record, how the file ended).
    Parse(parse::ParseArgs),
    /// Top-k log-probabilities, entropy and KL(A || B) per token from raw logits (safetensors).
    Analyze(analyze::AnalyzeArgs),
}

pub fn run(cmd: TraceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TraceCommand::Parse(args) => parse::run(&args),
        TraceCommand::Analyze(args) => analyze::run(&args),
    }
}
