//! The Basecamp sandbox runtime: the execution boundary around one agent.
//!
//! Every tool call goes through one [`executor`], which applies timeouts and
//! fallbacks, turns tool results into memory patches (tools never touch
//! memory directly), and records each call in the episode's trace. The
//! runtime knows nothing of Kubernetes: the same code runs in a sandbox pod
//! and behind `basecamp run`.
//!
//! - [`tools`]: the tool kinds (`http`, `exec`, `recorded`);
//! - [`executor`]: one tool call, timed, bounded and recorded;
//! - [`gym`]: server mode, the gym-like HTTP API for an external trainer;
//! - [`policy`]: the agent's policy (OpenAI-compatible endpoint, scripted);
//! - [`rewards`]: named reward components, weighted sums, weight schedules;
//! - [`preprocess`]: traces into (state, action, reward) training rows;
//! - [`readiness`]: waiting for the policy server before the first episode;
//! - [`services`]: helper processes the tools talk to (a mock API);
//! - [`storage`]: where traces go (local directory, S3).

/// `eprintln!` that never panics. With stderr gone (`2>&1 | head`),
/// `eprintln!` panics at its next line: in the SIGTERM handler that meant a
/// stop that never came, after a shard an exit 101 instead of its code. A
/// line that cannot be shown is dropped instead.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod config;
pub mod deadline;
pub mod driver;
pub mod episode;
pub mod executor;
pub mod gym;
pub mod logits;
pub mod metrics;
pub mod policy;
pub mod preprocess;
pub mod readiness;
pub mod rewards;
pub mod run;
pub mod server;
pub mod services;
pub mod storage;
#[cfg(feature = "test-support")]
pub mod testing;
pub mod tools;
