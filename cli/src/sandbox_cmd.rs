//! `basecamp sandbox`: talk to a running sandbox.
//!
//! `inject` pushes an observation into a running episode through the
//! sandbox's HTTP endpoint — driver mode's `--listen` server or server mode
//! (`basecamp-sandbox serve`), which take the same request — delivered
//! before the policy's turn at `--at-step N` (or its next turn).

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use basecamp_sandbox::gym::client::SandboxClient;
use clap::Subcommand;
use serde_json::Value;

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Inject an observation into a running episode (driver mode's --listen server, or serve mode).
    Inject(InjectArgs),
}

#[derive(clap::Args)]
pub struct InjectArgs {
    /// The sandbox's base URL, e.g. http://127.0.0.1:8090.
    #[arg(long)]
    endpoint: String,
    /// The episode's id (driver mode: the test-set row id; serve mode: the episode_id).
    #[arg(long, value_parser = clap::builder::NonEmptyStringValueParser::new())]
    episode: String,
    /// The observation as JSON (quote text as JSON: '"the customer called"'), or @FILE to read it from a file.
    #[arg(long)]
    observation: String,
    /// Deliver before the policy's turn at this step (1-based) instead of its next turn.
    #[arg(long, value_parser = crate::at_least_one::<u32>)]
    at_step: Option<u32>,
    /// The injection's id in the trace (default: live-<n>, chosen by the sandbox).
    #[arg(long)]
    id: Option<String>,
    /// How long to wait for the sandbox's answer, in seconds.
    #[arg(long, default_value_t = 30, value_parser = crate::at_least_one::<u64>)]
    timeout_s: u64,
}

pub fn run(cmd: SandboxCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SandboxCommand::Inject(args) => inject(&args),
    }
}

/// The `--observation` value as JSON; an error gives the line and column.
fn observation(text: &str) -> anyhow::Result<Value> {
    let (source, text) = match text.strip_prefix('@') {
        Some(file) => {
            let content = std::fs::read_to_string(Path::new(file)).with_context(|| format!("cannot read {file}"))?;
            (file.to_string(), content)
        }
        None => ("--observation".to_string(), text.to_string()),
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| {
        // serde_json's message already says the line and column.
        anyhow::anyhow!("{source} is not valid JSON: {e}; quote text as a JSON string, e.g. '\"the customer called\"'")
    })?;
    if value.is_null() {
        bail!("{source} is null: give the observation to inject");
    }
    Ok(value)
}

fn inject(args: &InjectArgs) -> anyhow::Result<ExitCode> {
    let observation = observation(&args.observation)?;
    let client = SandboxClient::new(&args.endpoint, Duration::from_secs(args.timeout_s))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let answer = runtime.block_on(client.inject(&args.episode, observation, args.at_step, args.id.as_deref()))?;
    let id = answer["id"].as_str().unwrap_or("?");
    let when = match (answer["delivered_at_step"].as_u64(), answer["at_step"].as_u64()) {
        (Some(step), _) => format!("delivered at step {step}"),
        (None, Some(step)) => format!("queued for step {step}"),
        (None, None) => "queued for the episode's next step".to_string(),
    };
    writeln!(std::io::stdout(), "injected {id} into episode {}: {when}", args.episode)?;
    Ok(ExitCode::SUCCESS)
}
