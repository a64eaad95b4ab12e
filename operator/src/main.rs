//! `basecamp-operator`: the controller. The reconcile pipeline arrives with
//! the operator issue; until then this binary only describes itself.

use clap::Parser;

/// Reconciles HarnessTask and SandboxConfig resources into GPU-scheduled sandbox Jobs.
#[derive(Parser)]
#[command(name = "basecamp-operator", version, about, long_about = None)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    Cli::parse();
    anyhow::bail!("basecamp-operator: the controller is not implemented yet")
}
