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
/// line that cannot be shown is dropped instead. While a progress bar is
/// drawn ([`stderr::around_lines`]), the line is written around it.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        $crate::stderr::line(format_args!($($arg)*));
    }};
}

/// Where [`stderr_line!`] writes: stderr, around whatever else draws there.
pub mod stderr {
    use std::io::Write as _;
    use std::sync::RwLock;

    /// Runs the write it is given at a moment it chooses, e.g. with a
    /// progress bar cleared (indicatif's `ProgressBar::suspend`).
    pub type Around = Box<dyn Fn(&mut dyn FnMut()) + Send + Sync>;

    static AROUND: RwLock<Option<Around>> = RwLock::new(None);

    /// Writes lines through `around` from now on (`None`: directly again).
    /// `basecamp run` sets its progress bar here, so that the lines of the
    /// shards it runs (a policy server waited for, a shard that gave up) do
    /// not tear the bar.
    pub fn around_lines(around: Option<Around>) {
        *AROUND.write().unwrap_or_else(std::sync::PoisonError::into_inner) = around;
    }

    /// Writes one line (see [`stderr_line!`](crate::stderr_line)).
    pub fn line(args: std::fmt::Arguments<'_>) {
        let mut write = || {
            let _ = writeln!(std::io::stderr(), "{args}");
        };
        match AROUND.read().as_deref() {
            Ok(Some(around)) => around(&mut write),
            _ => write(),
        }
    }

    #[cfg(test)]
    mod tests {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};

        #[test]
        fn lines_go_through_what_is_set_around_them_until_it_is_taken_away() {
            let written = Arc::new(AtomicUsize::new(0));
            let counter = written.clone();
            super::around_lines(Some(Box::new(move |write| {
                write();
                counter.fetch_add(1, Ordering::SeqCst);
            })));
            crate::stderr_line!("a line written around a progress bar");
            // Other tests of this process may write meanwhile: at least this one went through.
            assert!(written.load(Ordering::SeqCst) >= 1);
            super::around_lines(None);
            let after = written.load(Ordering::SeqCst);
            crate::stderr_line!("a line written directly");
            assert_eq!(written.load(Ordering::SeqCst), after);
        }
    }
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
