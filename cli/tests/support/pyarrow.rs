//! pyarrow, a Parquet reader independent of the one that wrote the batches
//! (the parquet crate), in the venv `scripts/pyarrow.sh install` makes
//! (`make test-deps`). The script says where the venv is
//! (`$BASECAMP_PYARROW_PYTHON`, else the Basecamp cache), so the version is
//! pinned in one place; without it the tests fail and say what to run.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// Reads each Parquet file named on the command line and prints one JSON
/// object a file: its schema as Parquet and Arrow see it, the compression
/// of every column chunk, the key/value metadata and the rows, each
/// `reward` as the big-endian hex of its 64 bits (no decimal rounding).
const READER: &str = r#"
import json, struct, sys
import pyarrow.parquet as pq
for path in sys.argv[1:]:
    f = pq.ParquetFile(path)
    meta = f.metadata
    columns = [
        {
            "name": c.name,
            "physical": c.physical_type,
            "logical": str(c.logical_type),
            "maxDefinitionLevel": c.max_definition_level,
            "arrow": str(f.schema_arrow.field(c.name).type),
        }
        for c in (f.schema.column(i) for i in range(meta.num_columns))
    ]
    compression = sorted({
        meta.row_group(g).column(i).compression
        for g in range(meta.num_row_groups) for i in range(meta.num_columns)
    })
    rows = [dict(r, reward=struct.pack(">d", r["reward"]).hex()) for r in f.read().to_pylist()]
    metadata = {k.decode(): v.decode() for k, v in (meta.metadata or {}).items()}
    print(json.dumps({"file": path, "rowGroups": meta.num_row_groups, "columns": columns,
                      "compression": compression, "metadata": metadata, "rows": rows}))
"#;

/// The venv's python, or a failure that says to run `make test-deps`.
pub fn python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/pyarrow.sh");
    let output = Command::new("bash").arg(&script).arg("path").output().expect("bash runs");
    assert!(
        output.status.success(),
        "pyarrow, the tests' Parquet reader, is not installed: run `make test-deps` \
         (or `scripts/pyarrow.sh install`: under a minute, once) or set BASECAMP_PYARROW_PYTHON \
         to a python that imports it; {} said: {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    PathBuf::from(String::from_utf8(output.stdout).expect("a UTF-8 path").trim())
}

/// What pyarrow read from each of `files`, in order (see [`READER`]).
pub fn read(files: &[PathBuf]) -> Vec<Value> {
    assert!(!files.is_empty(), "no Parquet files to read");
    let output = Command::new(python()).arg("-c").arg(READER).args(files).output().expect("python runs");
    assert!(output.status.success(), "pyarrow could not read {files:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .expect("UTF-8 JSON")
        .lines()
        .map(|line| serde_json::from_str(line).expect("the reader prints JSON"))
        .collect()
}
