//! Compiles `proto/trace.proto` with protox (pure Rust, no `protoc` needed)
//! into prost types plus pbjson serde impls (the proto3 JSON mapping).

use std::path::PathBuf;

use prost::Message;

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
        .compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptor_path)?)?
        .btree_map(["."])
        .build(&[".basecamp.trace.v1"])?;
    Ok(())
}
