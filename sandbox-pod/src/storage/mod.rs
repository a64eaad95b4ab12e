//! Where traces go, and how they get there without ever being lost.
//!
//! The sandbox writes every `.trace` and the shard's `summary.json` to local
//! disk first; this module then copies them to the task's destination, an
//! `s3://bucket/prefix` (AWS or any S3-compatible server) or a local
//! directory, under the date-partitioned layout of DESIGN.md:
//! `<prefix>/<yyyy>/<mm>/<dd>/<namespace>/<task>/<variant>/<shard>/<file>`.
//!
//! - [`Destination`]: the parsed `s3://...` or path, extended only by
//!   validated key segments;
//! - [`ShardPartition`] and [`UtcDate`]: the date-partitioned key layout;
//! - [`Storage`]: upload (single or multipart, retried with backoff), fetch,
//!   list (with sizes and modification times), stat, and delete (a prefix,
//!   or objects one by one with an [`ObjectDeletion`] each), configured by
//!   [`StorageConfig`];
//! - [`UploadReport`]: per file, uploaded or failed with its error; on
//!   failure the local copy stays where it was;
//! - [`StorageError`]: messages that name the operation, the places, the
//!   cause and the attempts, and a bounded [`StorageError::category`].
//!
//! ```no_run
//! # async fn demo() -> Result<(), basecamp_sandbox::storage::StorageError> {
//! use basecamp_sandbox::storage::{Destination, ShardPartition, Storage, StorageConfig, UtcDate};
//! let dest = Destination::parse("s3://ds-logs/ecommerce-v3")?;
//! let started = UtcDate::from_system_time(std::time::SystemTime::now())?;
//! let partition = ShardPartition::new(started, "team-a", "ecommerce-eval", "baseline", 3)?;
//! let storage = Storage::new(StorageConfig::from_env());
//! let report = storage.upload_dir(std::path::Path::new("/traces/shard-3"), &dest.for_shard(&partition)).await;
//! if !report.is_complete() {
//!     eprintln!("{report}");
//! }
//! # Ok(())
//! # }
//! ```

mod config;
mod destination;
mod error;
mod local;
mod partition;
mod report;
mod s3;
mod store;

pub use config::{DEFAULT_PART_SIZE, MIN_PART_SIZE, RetryPolicy, StaticCredentials, StorageConfig};
pub use destination::{Destination, S3Location};
pub use error::{FailureKind, Operation, StorageError};
pub use partition::{ShardPartition, UtcDate, validate_segment};
pub use report::{FileUpload, UploadReport, UploadStatus};
pub use s3::ObjectInfo;
pub use store::{ObjectDeletion, Storage};
