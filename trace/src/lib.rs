//! Basecamp execution traces.
//!
//! A `.trace` file holds one episode: a header, then the five sections of
//! DESIGN.md as protobuf records (`plan_execution`, `memory_state`,
//! `token_logit`, `reward_signal`, `error_context`), in checksummed zstd
//! frames closed at every step so a killed writer leaves a readable prefix,
//! and a footer index for random access to steps.
//!
//! - [`mod@format`]: the byte layout;
//! - [`writer`] / [`reader`]: streaming write, sequential and indexed read;
//! - [`canonical`]: canonical JSON and its sha256, the identity of arguments and memory;
//! - [`memory`]: memory, patches and the deltas they produce;
//! - [`json`]: a trace as JSON (the proto3 JSON mapping);
//! - [`synthetic`]: realistic generated episodes for tests, benchmarks and demos;
//! - [`token_logit`]: the token_logit record, decoded without heap allocations;
//! - [`query`]: the search language over trace sections;
//! - [`validate`]: every promise of a trace checked (schema, steps, memory hash chain, rewards);
//! - [`redact`]: personal data replaced by salted hashes, the trace kept valid;
//! - [`archive`]: `.tar.zst` archives of traces with an index for extracting one alone;
//! - [`otlp`]: traces as OpenTelemetry GenAI spans (OTLP/JSON);
//! - [`inputs`]: files, directories and globs as inputs, worked through in parallel in a stable order.

pub mod archive;
pub mod canonical;
pub mod error;
pub mod format;
pub mod inputs;
pub mod json;
pub mod memory;
pub mod metrics;
pub mod otlp;
pub mod query;
pub mod reader;
pub mod redact;
pub mod synthetic;
pub mod token_logit;
pub mod validate;
pub mod writer;

/// The generated protobuf types of `proto/trace.proto`.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/basecamp.trace.v1.rs"));
    include!(concat!(env!("OUT_DIR"), "/basecamp.trace.v1.serde.rs"));
    pub use crate::token_logit::{TokenLogit, TokenText, TopK};
}

pub use canonical::{Digest, canonical_json, hash_canonical_text, hash_json};
pub use error::TraceError;
pub use memory::{Memory, MemoryDelta, MemoryPatch, PatchOp};
pub use reader::{
    IndexedTrace, LeftOut, RawRecord, RecordKind, Tail, TraceContents, TraceReader, read_trace, read_trace_at_most,
    read_trace_from, read_trace_from_without, read_trace_without,
};
pub use writer::TraceWriter;

#[cfg(test)]
mod tests {
    use super::pb;

    /// A trace in memory is mostly a `Vec<Record>` of token logits: a body
    /// kind grown past a TokenLogit would grow every record (see build.rs,
    /// which boxes the larger kinds).
    #[test]
    fn a_record_is_no_larger_than_a_token_logit_and_its_tag() {
        let token = std::mem::size_of::<pb::TokenLogit>();
        assert!(std::mem::size_of::<pb::Record>() <= token + 8, "Record {} bytes", std::mem::size_of::<pb::Record>());
    }
}
