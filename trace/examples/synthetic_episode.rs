//! Writes a realistic generated episode to a `.trace` file:
//! `cargo run -p basecamp-trace --example synthetic_episode -- OUT.trace [SEED] [STEPS]`.
//! `make demo` uses it, then reads the file back with `basecamp trace parse`.

use std::fs::File;
use std::process::ExitCode;
use std::str::FromStr;

use basecamp_trace::synthetic::{EpisodeShape, generate};
use basecamp_trace::writer::DEFAULT_ZSTD_LEVEL;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        eprintln!("usage: synthetic_episode OUT.trace [SEED] [STEPS]");
        return ExitCode::from(2);
    };
    let mut shape = EpisodeShape::default();
    let parsed = arg_or(&args, 1, shape.seed).and_then(|seed| Ok((seed, arg_or(&args, 2, shape.steps)?)));
    match parsed {
        Ok((seed, steps)) => (shape.seed, shape.steps) = (seed, steps),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    let episode = generate(&shape);
    match File::create(out).and_then(|f| episode.write_to(f, DEFAULT_ZSTD_LEVEL)) {
        Ok(_) => {
            println!("wrote {out}: {} records over {} steps", episode.record_count(), shape.steps);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("failed to write {out}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn arg_or<T: FromStr>(args: &[String], i: usize, default: T) -> Result<T, String> {
    match args.get(i) {
        None => Ok(default),
        Some(a) => a.parse().map_err(|_| format!("argument {i} ({a:?}) is not a non-negative integer")),
    }
}
