//! Where a training task's things are (TRAINING.md, "Locations"): the
//! checkpoint root `C`, the dataset, a checkpoint, and `steps.json`.

use basecamp_api::HarnessTask;
use basecamp_api::task::parse_checkpoint_step;
use basecamp_sandbox::storage::{Destination, StorageError};

use crate::controller::aggregate::reports_prefix;

/// The file listing every evaluated step, next to the task's reports.
pub const STEPS_FILE: &str = "steps.json";
/// The dataset's directory under `C`.
pub const DATASET_DIR: &str = "dataset";

/// A training task's locations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locations {
    /// `C`, always ending in `/`.
    pub checkpoints: String,
    /// `C`, parsed.
    pub checkpoints_destination: Destination,
    /// `C/dataset/` (with `dataPipeline`).
    pub dataset: Option<String>,
    /// The trace destination (`traces.destination`), where evaluations write
    /// traces and reports; `None`: evaluations cannot be aggregated.
    pub traces: Option<Destination>,
    /// `<dest>/reports/<ns>/<task>/steps.json`.
    pub steps_file: Option<Destination>,
    /// The step of `resumeFrom`.
    pub resumed_from_step: Option<u64>,
}

/// Why the locations cannot be worked out (validation normally catches it).
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    /// Neither `trainingConfig.checkpoints` nor `traces.destination`.
    #[error(
        "the trainer needs a checkpoint location: set spec.trainingConfig.checkpoints or spec.traces.destination (s3://...)"
    )]
    NoCheckpointLocation,
    /// A location that does not parse.
    #[error("spec.{field}: {source}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// The parse error.
        source: StorageError,
    },
}

fn with_slash(location: &str) -> String {
    format!("{}/", location.trim_end_matches('/'))
}

/// The checkpoint root `C`: `trainingConfig.checkpoints`, else
/// `<traces.destination>/checkpoints/<ns>/<task>/`, ending in `/`.
pub fn checkpoint_root(task: &HarnessTask, namespace: &str, name: &str) -> Option<String> {
    let training = task.spec.training_config.as_ref()?;
    if let Some(checkpoints) = training.checkpoints.as_deref().filter(|c| !c.trim().is_empty()) {
        return Some(with_slash(checkpoints.trim()));
    }
    let destination = task.spec.traces.as_ref()?.destination.as_deref()?.trim();
    (!destination.is_empty()).then(|| format!("{}checkpoints/{namespace}/{name}/", with_slash(destination)))
}

/// Where checkpoint `segment` (`step-N`, as the trainer named it) is: `C/step-N/`.
pub fn checkpoint_location(root: &str, segment: &str) -> String {
    format!("{}{segment}/", with_slash(root))
}

impl Locations {
    /// The locations of a training task.
    pub fn of(task: &HarnessTask, namespace: &str, name: &str) -> Result<Self, LocationError> {
        let checkpoints = checkpoint_root(task, namespace, name).ok_or(LocationError::NoCheckpointLocation)?;
        let checkpoints_destination = Destination::parse(&checkpoints)
            .map_err(|source| LocationError::Invalid { field: "trainingConfig.checkpoints", source })?;
        let traces = match task.spec.traces.as_ref().and_then(|t| t.destination.as_deref()) {
            Some(destination) => Some(
                Destination::parse(destination)
                    .map_err(|source| LocationError::Invalid { field: "traces.destination", source })?,
            ),
            None => None,
        };
        let steps_file = match &traces {
            Some(traces) => Some(
                reports_prefix(traces, namespace, name)
                    .and_then(|reports| reports.join(STEPS_FILE))
                    .map_err(|source| LocationError::Invalid { field: "traces.destination", source })?,
            ),
            None => None,
        };
        let resumed_from_step =
            task.spec.training_config.as_ref().and_then(|t| t.resume_from.as_deref()).and_then(parse_checkpoint_step);
        Ok(Self {
            dataset: task.spec.data_pipeline.as_ref().map(|_| format!("{checkpoints}{DATASET_DIR}/")),
            checkpoints,
            checkpoints_destination,
            traces,
            steps_file,
            resumed_from_step,
        })
    }
}
