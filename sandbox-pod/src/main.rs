//! `basecamp-sandbox`: the runtime inside each sandbox pod (and behind
//! `basecamp run` locally). The runtime itself arrives with the sandbox
//! runtime issue; until then this binary only describes itself.

use clap::Parser;

/// Runs an agent's episodes in a sandbox and writes one .trace per episode.
#[derive(Parser)]
#[command(name = "basecamp-sandbox", version, about, long_about = None)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    Cli::parse();
    anyhow::bail!(
        "basecamp-sandbox: the sandbox runtime is not implemented yet; see `basecamp trace` for the trace tools"
    )
}
