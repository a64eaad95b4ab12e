//! `basecamp trace ...`: the trace tools.

mod parse;

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand)]
pub enum TraceCommand {
    /// Print a whole trace (header, every record, how the file ended).
    Parse(parse::ParseArgs),
}

pub fn run(cmd: TraceCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TraceCommand::Parse(args) => parse::run(&args),
    }
}
