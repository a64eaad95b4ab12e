//! Compiles `proto/trace.proto` with protox (pure Rust, no `protoc` needed)
//! into prost types plus pbjson serde impls (the proto3 JSON mapping).

use std::path::PathBuf;

use prost::Message;

const TOKEN_LOGIT: &str = ".basecamp.trace.v1.TokenLogit";
const TOKEN_LOGIT_RUST: &str = "crate::token_logit::TokenLogit";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time: a build script reused from a cache built elsewhere
    // (another checkout path) must still find this checkout's proto.
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let proto_file = proto_dir.join("trace.proto");
    println!("cargo:rerun-if-changed={}", proto_file.display());

    let descriptors = protox::compile([&proto_file], [&proto_dir])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("trace_descriptor.bin");
    std::fs::write(&descriptor_path, descriptors.encode_to_vec())?;

    prost_build::Config::new()
        // BTreeMap keeps map encoding byte-stable across runs.
        .btree_map(["."])
        // A Record is as large as its largest body kind. Token logits, most
        // of a trace's records, are stored inline at nearly their own size
        // (TokenLogit is 248 bytes: its text and top-5 inline); PlanStep
        // (336) is boxed so it does not grow every record. Header (184) and
        // ErrorContext (144) were boxed when TokenLogit was 128 and stay
        // boxed: a few a trace, and the API stays as it was.
        .boxed(".basecamp.trace.v1.Record.body.plan_step")
        .boxed(".basecamp.trace.v1.Record.body.header")
        .boxed(".basecamp.trace.v1.Record.body.error_context")
        // Token logits, nearly all of a trace, are decoded without a heap
        // allocation by a struct of our own (src/token_logit.rs).
        .extern_path(TOKEN_LOGIT, TOKEN_LOGIT_RUST)
        .compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptor_path)?)?
        .btree_map(["."])
        .exclude([TOKEN_LOGIT])
        .build(&[".basecamp.trace.v1"])?;
    Ok(())
}
