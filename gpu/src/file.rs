//! Logits tensors in safetensors files: memory-mapped (`memmap2`) or held
//! in memory (a file a policy sent inline, or read from a pipe), parsed
//! with the `safetensors` crate, and handed out as [`LogitsView`]s without a
//! copy when the data is aligned (a copy otherwise).
//!
//! A logits tensor is 2-D `[tokens, vocab]` (leading dimensions of size 1,
//! as in `[1, tokens, vocab]`, are dropped) in F32 or BF16. Without a name,
//! the file's only tensor is used, or the one called `logits`. Every error
//! names the file and the tensor. [`write_tensors`] writes such files (for
//! tests and tools).

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use half::bf16;
use memmap2::Mmap;
pub use safetensors::Dtype as TensorDtype;
use safetensors::SafeTensors;

use crate::logits::{LogitsError, LogitsView};

/// What can go wrong reading or writing a logits file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be opened or mapped.
    #[error("cannot read {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a safetensors file.
    #[error("{} is not a valid safetensors file: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's words.
        message: String,
    },
    /// No tensor of that name.
    #[error("{} has no tensor {name:?}; it has: {}", path.display(), list(available))]
    MissingTensor {
        /// The file.
        path: PathBuf,
        /// The name asked for.
        name: String,
        /// What the file holds.
        available: Vec<String>,
    },
    /// No name given, and the file holds no tensor at all.
    #[error("{} holds no tensors", path.display())]
    NoTensors {
        /// The file.
        path: PathBuf,
    },
    /// No name given and no obvious choice. The message says what the file
    /// holds; the caller adds how to name one (a flag, a field).
    #[error(
        "{} holds {} tensors and none is called \"logits\" (it has: {})",
        path.display(), available.len(), list(available)
    )]
    AmbiguousTensor {
        /// The file.
        path: PathBuf,
        /// What the file holds.
        available: Vec<String>,
    },
    /// Not F32 or BF16.
    #[error("tensor {name:?} in {} is {dtype}: logits must be F32 or BF16", path.display())]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its element type.
        dtype: String,
    },
    /// Not `[tokens, vocab]`.
    #[error(
        "tensor {name:?} in {} has shape {shape:?}: logits must be [tokens, vocab] with vocab >= 1 \
         (leading dimensions of 1, as in [1, tokens, vocab], are dropped)",
        path.display()
    )]
    Rank {
        /// The file.
        path: PathBuf,
        /// The tensor.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// Writing failed.
    #[error("cannot write {}: {message}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

fn list(names: &[String]) -> String {
    if names.is_empty() { "no tensors".to_string() } else { names.join(", ") }
}

impl FileError {
    /// A fixed name for this kind of error, for Event reasons and metric labels.
    pub fn category(&self) -> &'static str {
        match self {
            FileError::Open { .. } => "LogitsFileUnreadable",
            FileError::Parse { .. } => "LogitsFileInvalid",
            FileError::MissingTensor { .. } => "LogitsTensorMissing",
            FileError::NoTensors { .. } => "LogitsFileEmpty",
            FileError::AmbiguousTensor { .. } => "LogitsTensorAmbiguous",
            FileError::Dtype { .. } => "LogitsDtype",
            FileError::Rank { .. } => "LogitsRank",
            FileError::Write { .. } => "LogitsFileWrite",
        }
    }
}

/// A safetensors file: memory-mapped from disk, or bytes held in memory
/// (a file a policy sent inline).
pub struct LogitsFile {
    /// The file, or for bytes the name errors call them by.
    path: PathBuf,
    bytes: Backing,
}

enum Backing {
    Map(Mmap),
    Shared(Arc<[u8]>),
}

impl std::ops::Deref for Backing {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Backing::Map(map) => map,
            Backing::Shared(bytes) => bytes,
        }
    }
}

/// One logits tensor read from a file.
pub struct LoadedLogits<'a> {
    /// The tensor's name.
    pub name: String,
    /// `[tokens, vocab]`.
    pub shape: [usize; 2],
    data: LoadedData<'a>,
}

enum LoadedData<'a> {
    F32(Cow<'a, [f32]>),
    Bf16(Cow<'a, [bf16]>),
}

impl LoadedLogits<'_> {
    /// The tensor as a view.
    pub fn view(&self) -> Result<LogitsView<'_>, LogitsError> {
        let [rows, vocab] = self.shape;
        match &self.data {
            LoadedData::F32(d) => LogitsView::f32(d, rows, vocab),
            LoadedData::Bf16(d) => LogitsView::bf16(d, rows, vocab),
        }
    }

    /// Whether the data is read in place from the mapping (no copy).
    pub fn zero_copy(&self) -> bool {
        matches!(&self.data, LoadedData::F32(Cow::Borrowed(_)) | LoadedData::Bf16(Cow::Borrowed(_)))
    }
}

impl LogitsFile {
    /// Open and map `path`; a pipe (`--logits <(...)`, a piped
    /// `/dev/stdin`), which cannot be mapped, is read into memory.
    pub fn open(path: &Path) -> Result<Self, FileError> {
        let open = |source| FileError::Open { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(open)?;
        let kind = file.metadata().map_err(open)?.file_type();
        if kind.is_dir() {
            let why = std::io::Error::new(std::io::ErrorKind::IsADirectory, "is a directory, not a safetensors file");
            return Err(open(why));
        }
        if is_pipe(&kind) {
            let mut bytes = Vec::new();
            (&file).read_to_end(&mut bytes).map_err(open)?;
            return Ok(Self::from_bytes(path, bytes.into()));
        }
        if !kind.is_file() {
            // A device: /dev/zero would be read for ever, /dev/null maps to nothing.
            return Err(open(std::io::Error::other("is neither a regular file nor a pipe")));
        }
        // SAFETY: the mapping is read-only; like every reader of a mapped
        // file we rely on nobody truncating or rewriting it while we read.
        let map = unsafe { Mmap::map(&file) }.map_err(open)?;
        Ok(Self { path: path.to_path_buf(), bytes: Backing::Map(map) })
    }

    /// A safetensors file's bytes already in memory; `name` stands for the
    /// path in error messages (e.g. `step 3 raw_logits (inline)`).
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Arc<[u8]>) -> Self {
        Self { path: name.into(), bytes: Backing::Shared(bytes) }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn parse(&self) -> Result<SafeTensors<'_>, FileError> {
        let invalid = |message: String| FileError::Parse { path: self.path.clone(), message };
        // First: a name given twice can also make the entries look invalid
        // (the parser keeps the last one's offsets).
        if let Some(name) = named_twice(&self.bytes) {
            return Err(invalid(format!("the header names {name:?} twice")));
        }
        SafeTensors::deserialize(&self.bytes).map_err(|e| {
            use safetensors::SafeTensorError as E;
            // The crate's messages name no tensor and no sizes.
            let said = match e {
                E::TensorInvalidInfo => size_mismatch(&self.bytes),
                E::HeaderTooSmall | E::HeaderTooLarge | E::InvalidHeaderLength => header_length_problem(&self.bytes),
                E::MetadataIncompleteBuffer => data_length_problem(&self.bytes),
                E::InvalidOffset(_) => offsets_problem(&self.bytes),
                _ => None,
            };
            invalid(said.unwrap_or_else(|| e.to_string()))
        })
    }

    /// Tensor names, sorted.
    pub fn tensor_names(&self) -> Result<Vec<String>, FileError> {
        let mut names: Vec<String> = self.parse()?.names().into_iter().map(str::to_string).collect();
        names.sort();
        Ok(names)
    }

    /// The logits tensor `name` (or the default one; see the module comment).
    pub fn logits(&self, name: Option<&str>) -> Result<LoadedLogits<'_>, FileError> {
        let tensors = self.parse()?;
        let available = || {
            let mut names: Vec<String> = tensors.names().into_iter().map(str::to_string).collect();
            names.sort();
            names
        };
        let name = match name {
            Some(name) => name.to_string(),
            None => {
                let names = available();
                match names.as_slice() {
                    [] => return Err(FileError::NoTensors { path: self.path.clone() }),
                    [only] => only.clone(),
                    _ if names.iter().any(|n| n == "logits") => "logits".to_string(),
                    _ => return Err(FileError::AmbiguousTensor { path: self.path.clone(), available: names }),
                }
            }
        };
        let tensor = tensors.tensor(&name).map_err(|_| FileError::MissingTensor {
            path: self.path.clone(),
            name: name.clone(),
            available: available(),
        })?;
        let bytes = tensor.data();
        let data = match tensor.dtype() {
            TensorDtype::F32 => LoadedData::F32(cast_f32(bytes)),
            TensorDtype::BF16 => LoadedData::Bf16(cast_bf16(bytes)),
            other => {
                return Err(FileError::Dtype { path: self.path.clone(), name, dtype: format!("{other:?}") });
            }
        };
        let shape = tensor.shape().to_vec();
        let rank_error = || FileError::Rank { path: self.path.clone(), name: name.clone(), shape: shape.clone() };
        let (lead, last_two) = match shape.len() {
            0 | 1 => return Err(rank_error()),
            n => shape.split_at(n - 2),
        };
        if lead.iter().any(|&d| d != 1) || last_two[1] == 0 {
            return Err(rank_error());
        }
        let dims = [last_two[0], last_two[1]];
        Ok(LoadedLogits { name, shape: dims, data })
    }
}

/// The first name a (parsed) file's header gives twice: JSON allows it and
/// the parser keeps the last entry, so which tensor was meant is not known.
fn named_twice(bytes: &[u8]) -> Option<String> {
    struct FirstRepeat(Option<String>);
    impl<'de> serde::Deserialize<'de> for FirstRepeat {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Keys;
            impl<'de> serde::de::Visitor<'de> for Keys {
                type Value = FirstRepeat;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a JSON object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<FirstRepeat, A::Error> {
                    let mut seen = std::collections::HashSet::new();
                    let mut repeat = None;
                    while let Some(key) = map.next_key::<String>()? {
                        map.next_value::<serde::de::IgnoredAny>()?;
                        if repeat.is_none() && !seen.insert(key.clone()) {
                            repeat = Some(key);
                        }
                    }
                    Ok(FirstRepeat(repeat))
                }
            }
            deserializer.deserialize_map(Keys)
        }
    }
    serde_json::from_slice::<FirstRepeat>(header_json(bytes)?).ok()?.0
}

/// The header length the first 8 bytes give.
fn header_len(bytes: &[u8]) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()
}

/// The header's JSON, when the file holds as much as its length says.
fn header_json(bytes: &[u8]) -> Option<&[u8]> {
    bytes.get(8..8usize.checked_add(header_len(bytes)?)?)
}

/// Which tensor's data_offsets span other than its shape and dtype take,
/// said with both sizes: what the crate reports as "invalid shape, data
/// type, or offset for tensor".
fn size_mismatch(bytes: &[u8]) -> Option<String> {
    header_entries(bytes)?.into_iter().find_map(|(name, info)| {
        let elements = info.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let needed = elements.checked_mul(info.dtype.bitsize())? / 8;
        let (start, end) = info.data_offsets;
        let spanned = end.checked_sub(start)?;
        (spanned != needed).then(|| {
            format!(
                "tensor {name:?} of shape {:?} and type {} takes {needed} bytes, but its data_offsets [{start}, {end}] span {spanned}",
                info.shape, info.dtype
            )
        })
    })
}

/// The largest header the `safetensors` crate reads.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// The header length in the first 8 bytes, with the file's size: what the
/// crate calls "header too small", "header too large" or "invalid header
/// length" (a text file's first 8 bytes read as a length of exabytes).
fn header_length_problem(bytes: &[u8]) -> Option<String> {
    let Some(first) = bytes.get(..8) else {
        return Some(format!(
            "it is {} bytes long, less than the 8-byte header length a safetensors file starts with",
            bytes.len()
        ));
    };
    let header = u64::from_le_bytes(first.try_into().ok()?);
    let after = bytes.len() - 8;
    Some(if header > MAX_HEADER_BYTES {
        format!(
            "its first 8 bytes give a header length of {header} bytes, more than the {MAX_HEADER_BYTES} a safetensors \
             header may have (is it a safetensors file?)"
        )
    } else {
        format!(
            "its first 8 bytes give a header length of {header} bytes, but only {after} bytes follow them \
             (cut short, or not a safetensors file)"
        )
    })
}

/// The header's entries, without `__metadata__`, as the crate reads them.
fn header_entries(bytes: &[u8]) -> Option<Vec<(String, safetensors::tensor::TensorInfo)>> {
    let entries: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header_json(bytes)?).ok()?;
    entries
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, entry)| Some((name, serde_json::from_value(entry).ok()?)))
        .collect()
}

/// How much data the header's tensors take against what follows the header:
/// the crate's "incomplete metadata, file not fully covered", which is what
/// a file cut short (a copy that did not finish) or with bytes appended says.
fn data_length_problem(bytes: &[u8]) -> Option<String> {
    let present = bytes.len().checked_sub(8usize.checked_add(header_len(bytes)?)?)?;
    let needed = header_entries(bytes)?.iter().map(|(_, info)| info.data_offsets.1).max().unwrap_or(0);
    Some(if present < needed {
        format!(
            "its tensors take {needed} bytes of data after the header, but the file has only {present}: \
             it is cut short ({} bytes missing)",
            needed - present
        )
    } else {
        format!(
            "its tensors take {needed} bytes of data after the header, but the file has {present}: \
             {} bytes after the last tensor belong to none",
            present - needed
        )
    })
}

/// The first tensor whose data does not start where the one before it ends
/// (the crate's "invalid offset for tensor `x`"): data overlapping another
/// tensor's, a gap, or offsets that run backwards.
fn offsets_problem(bytes: &[u8]) -> Option<String> {
    let mut entries = header_entries(bytes)?;
    entries.sort_by_key(|(_, info)| info.data_offsets);
    let mut end = 0;
    for (name, info) in &entries {
        let (start, stop) = info.data_offsets;
        if stop < start {
            return Some(format!("tensor {name:?} has data_offsets [{start}, {stop}]: the end is before the start"));
        }
        if start != end {
            let how = if start < end { "overlaps the data before it" } else { "leaves a gap after the data before it" };
            return Some(format!(
                "tensor {name:?} has data_offsets [{start}, {stop}] but the data before it ends at {end}: it {how} \
                 (tensors must follow each other, from offset 0)"
            ));
        }
        end = stop;
    }
    None
}

/// A pipe (`--logits <(...)`, a piped `/dev/stdin`): it cannot be mapped, and
/// it ends when its writer does, so it is read whole.
fn is_pipe(kind: &std::fs::FileType) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        kind.is_fifo()
    }
    #[cfg(not(unix))]
    {
        let _ = kind;
        false
    }
}

fn cast_f32(bytes: &[u8]) -> Cow<'_, [f32]> {
    if cfg!(target_endian = "little") && bytes.as_ptr().align_offset(align_of::<f32>()) == 0 {
        // SAFETY: aligned, length checked by safetensors (a multiple of 4),
        // every bit pattern is an f32, and the file is little-endian as is
        // this machine.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), bytes.len() / 4) })
    } else {
        Cow::Owned(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

fn cast_bf16(bytes: &[u8]) -> Cow<'_, [bf16]> {
    if cfg!(target_endian = "little") && bytes.as_ptr().align_offset(align_of::<bf16>()) == 0 {
        // SAFETY: as for f32; `bf16` is `#[repr(transparent)]` over `u16`.
        Cow::Borrowed(unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<bf16>(), bytes.len() / 2) })
    } else {
        Cow::Owned(bytes.chunks_exact(2).map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect())
    }
}

/// One tensor to write: its name, element type, shape and little-endian bytes.
pub struct RawTensor {
    /// Name in the file.
    pub name: String,
    /// Element type.
    pub dtype: TensorDtype,
    /// Shape.
    pub shape: Vec<usize>,
    /// Little-endian element bytes.
    pub bytes: Vec<u8>,
}

impl RawTensor {
    /// A float32 tensor.
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self { name: name.to_string(), dtype: TensorDtype::F32, shape: shape.to_vec(), bytes }
    }

    /// A bfloat16 tensor.
    pub fn bf16(name: &str, shape: &[usize], values: &[bf16]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        Self { name: name.to_string(), dtype: TensorDtype::BF16, shape: shape.to_vec(), bytes }
    }
}

/// Write `tensors` to a safetensors file at `path`.
pub fn write_tensors(path: &Path, tensors: &[RawTensor]) -> Result<(), FileError> {
    let write_error = |message: String| FileError::Write { path: path.to_path_buf(), message };
    let views = tensors
        .iter()
        .map(|t| {
            safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.bytes)
                .map(|view| (t.name.clone(), view))
                .map_err(|e| write_error(format!("tensor {:?}: {e}", t.name)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::serialize_to_file(views, None, path).map_err(|e| write_error(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logits_round_trip_through_a_file_without_a_copy() {
        let dir = std::env::temp_dir().join(format!("basecamp-gpu-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("a.safetensors");
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 2.0).collect();
        let halves: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
        write_tensors(
            &path,
            &[
                RawTensor::f32("logits", &[1, 3, 4], &values),
                RawTensor::bf16("draft", &[3, 4], &halves),
                RawTensor { name: "ids".into(), dtype: TensorDtype::I64, shape: vec![3], bytes: vec![0; 24] },
            ],
        )
        .expect("write");
        let file = LogitsFile::open(&path).expect("open");
        assert_eq!(file.tensor_names().expect("names"), vec!["draft", "ids", "logits"]);
        let logits = file.logits(None).expect("the one called logits");
        assert_eq!((logits.name.as_str(), logits.shape), ("logits", [3, 4]));
        assert!(logits.zero_copy());
        assert_eq!(logits.view().expect("view").logit(2, 3), Some(3.5));
        let draft = file.logits(Some("draft")).expect("bf16");
        assert_eq!(draft.view().expect("view").logit(1, 0), Some(0.0));

        let error = file.logits(Some("ids")).err().expect("I64");
        assert_eq!(error.category(), "LogitsDtype");
        assert!(error.to_string().contains("\"ids\"") && error.to_string().contains("I64"), "{error}");
        let error = file.logits(Some("nope")).err().expect("missing");
        assert!(error.to_string().ends_with("has no tensor \"nope\"; it has: draft, ids, logits"), "{error}");

        write_tensors(&path, &[RawTensor::f32("x", &[2, 3, 2], &values), RawTensor::f32("y", &[12], &values)])
            .expect("write");
        let file = LogitsFile::open(&path).expect("open");
        assert_eq!(file.logits(None).err().expect("two, no logits").category(), "LogitsTensorAmbiguous");
        assert_eq!(file.logits(Some("x")).err().expect("3-D, batch 2").category(), "LogitsRank");
        let error = file.logits(Some("y")).err().expect("1-D");
        assert!(error.to_string().contains("has shape [12]"), "{error}");

        let inline = LogitsFile::from_bytes("inline logits", std::fs::read(&path).expect("read").into());
        assert_eq!(inline.logits(Some("x")).err().expect("3-D, batch 2").category(), "LogitsRank");
        let error = inline.logits(Some("nope")).err().expect("missing");
        assert!(error.to_string().starts_with("inline logits has no tensor \"nope\""), "{error}");

        std::fs::write(&path, b"not safetensors").expect("write");
        let error = LogitsFile::open(&path).expect("open").logits(None).err().expect("garbage");
        assert_eq!(error.category(), "LogitsFileInvalid");
        std::fs::remove_dir_all(&dir).ok();
    }
}
