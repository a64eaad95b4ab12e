//! Where the trace commands read traces from: local files, directories and
//! globs (`basecamp_trace::inputs`), and `s3://BUCKET/PREFIX` (every
//! `*.trace` object under the prefix, in key order) or `s3://BUCKET/KEY.trace`.
//! A directory, glob or prefix that names no trace is an error.
//!
//! S3 goes through the sandbox's storage client (`AWS_ENDPOINT_URL_S3`, the
//! standard credential chain, retries). Objects are fetched one at a time
//! per worker, when that worker gets to them, so a prefix of any size needs
//! the memory of a few traces.

use std::fs::File;
use std::io::{self, BufReader, Cursor, IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use basecamp_sandbox::storage::{Destination, FailureKind, S3Location, Storage, StorageConfig};
use basecamp_trace::inputs::{TRACE_SUFFIX, expand_inputs_named};
use basecamp_trace::{TraceError, TraceReader};

/// An output file being written (see [`Sources::create_output`]).
pub struct Output {
    /// The path asked for.
    pub path: PathBuf,
    /// The temporary file written, renamed to `path` by [`Output::commit`];
    /// `None` when `path` is written in place.
    partial: Option<PartialFile>,
    sink: Sink,
}

/// A temporary output file, removed when dropped unless it was renamed into
/// place: an error returned early or a panic leaves no `FILE.partial` behind.
struct PartialFile(PathBuf);

impl PartialFile {
    /// The path, no longer removed on drop.
    fn keep(mut self) -> PathBuf {
        std::mem::take(&mut self.0)
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

enum Sink {
    File(File),
    Stdout(io::Stdout),
}

impl Output {
    /// Whether the output goes to this process's stdout or a device, where
    /// a command's own messages must not be printed to stdout.
    pub fn in_place(&self) -> bool {
        self.partial.is_none()
    }

    /// Whether the output is a terminal (`-` or `/dev/stdout` at a prompt,
    /// `/dev/tty`): no place for binary data.
    pub fn is_terminal(&self) -> bool {
        match &self.sink {
            Sink::File(file) => file.is_terminal(),
            Sink::Stdout(stdout) => stdout.is_terminal(),
        }
    }

    /// Makes the complete output visible under its name.
    pub fn commit(self) -> anyhow::Result<()> {
        let Some(partial) = self.partial else { return Ok(()) };
        drop(self.sink);
        // Removed by `partial`'s drop if the rename fails.
        std::fs::rename(&partial.0, &self.path)
            .with_context(|| format!("cannot rename {} to {}", partial.0.display(), self.path.display()))?;
        partial.keep();
        Ok(())
    }

    /// Drops an output that failed: its temporary file is removed.
    pub fn discard(self) {
        drop(self);
    }
}

impl Write for &Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &self.sink {
            Sink::File(file) => (&*file).write(buf),
            Sink::Stdout(stdout) => stdout.lock().write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &self.sink {
            Sink::File(file) => (&*file).flush(),
            Sink::Stdout(stdout) => stdout.lock().flush(),
        }
    }
}

/// One trace to read.
pub struct Source {
    /// How messages and output name it: the path, or the `s3://` URL.
    pub name: String,
    /// `/`-separated, relative to the argument that found it (the directory,
    /// the glob's fixed prefix, the S3 prefix); the file name for a file
    /// named directly. Mirrored by outputs, so `a/ep.trace` and `b/ep.trace` stay apart.
    pub relative: String,
    /// [`Source::relative`] with the file name's own bytes (which need not
    /// be UTF-8), for outputs written next to each other on disk.
    pub relative_path: PathBuf,
    location: Location,
}

enum Location {
    Local(PathBuf),
    S3(Destination),
}

impl Source {
    /// How errors name it: [`super::one_line`] of its name, so a file name
    /// holding a newline cannot forge another line of output.
    pub fn shown(&self) -> String {
        super::one_line(&self.name).into_owned()
    }

    /// The file, when the source is local.
    pub fn local_path(&self) -> Option<&Path> {
        match &self.location {
            Location::Local(path) => Some(path),
            Location::S3(_) => None,
        }
    }
}

/// A reader over either kind of source.
pub type SourceReader = TraceReader<Box<dyn Read + Send>>;

/// Opens one source again each time it is called ([`Sources::reopener`]).
pub type Reopener = Box<dyn FnMut() -> Result<SourceReader, TraceError> + Send>;

/// The resolved inputs, and the S3 client when some are on S3.
pub struct Sources {
    pub items: Vec<Source>,
    s3: Option<(tokio::runtime::Runtime, Storage)>,
}

impl Sources {
    /// The one trace `file` names (`trace parse FILE`, `trace replay`): a
    /// local file, or an `s3://BUCKET/KEY.trace` object; a prefix is refused.
    pub fn one(file: &Path) -> anyhow::Result<Self> {
        let Some(url) = file.to_str().filter(|f| f.starts_with("s3://")) else {
            let name = file.display().to_string();
            let relative_path = PathBuf::from(file.file_name().unwrap_or(file.as_os_str()));
            let source = Source {
                relative: relative_path.to_string_lossy().into_owned(),
                relative_path,
                name,
                location: Location::Local(file.to_path_buf()),
            };
            return Ok(Self { items: vec![source], s3: None });
        };
        if !url.ends_with(TRACE_SUFFIX) {
            bail!(
                "{url}: give one trace object, s3://BUCKET/KEY{TRACE_SUFFIX} (trace search, validate and report take a prefix)"
            );
        }
        Self::resolve(&[url.to_string()])
    }

    /// Expands every argument, in order, each source once.
    pub fn resolve<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> anyhow::Result<Self> {
        let mut items = Vec::new();
        let mut s3 = None;
        let mut seen = std::collections::HashSet::new();
        for arg in args {
            let arg = arg.as_ref();
            let found: Vec<Source> = if let Some(url) = arg.to_str().filter(|a| a.starts_with("s3://")) {
                let (runtime, storage) = match &mut s3 {
                    Some(client) => client,
                    None => s3.insert(s3_client()?),
                };
                list_s3(runtime, storage, url)?
            } else {
                let found = expand_inputs_named(&[arg], TRACE_SUFFIX)?;
                // As for an S3 prefix and a glob: a directory that holds no
                // trace is a mistake (a wrong path, traces named otherwise),
                // not zero traces that all pass.
                if found.is_empty() && Path::new(arg).is_dir() {
                    bail!(
                        "{}: no {TRACE_SUFFIX} files in this directory (searched recursively)",
                        Path::new(arg).display()
                    );
                }
                found
                    .into_iter()
                    .map(|input| Source {
                        name: input.path.display().to_string(),
                        relative_path: relative_path(&input.path, &input.relative),
                        relative: input.relative,
                        location: Location::Local(input.path),
                    })
                    .collect()
            };
            for source in found {
                // By the file itself: two names that differ only in bytes
                // that are not UTF-8 display alike, and both are inputs; one
                // reached by two spellings (`run ./run`, `$PWD/run`, a
                // symbolic link) is one input. Hard links stay two names.
                let key = match &source.location {
                    Location::Local(path) => {
                        std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()).into_os_string()
                    }
                    Location::S3(_) => source.name.clone().into(),
                };
                if seen.insert((matches!(source.location, Location::S3(_)), key)) {
                    items.push(source);
                }
            }
        }
        Ok(Self { items, s3 })
    }

    /// Opens the output file `out` under its temporary name (`FILE.partial`,
    /// renamed by [`Output::commit`] when complete, so an interrupted command
    /// leaves nothing that looks finished). `-`, a path under `/dev/`
    /// (`/dev/stdout`) and an existing file that is not a regular one (a
    /// FIFO, a terminal) are written in place: they cannot be renamed over.
    /// Refused: a directory (the message asks for `what`, e.g. `the file to
    /// write`, suggesting `DIR/<example>`), and one of the inputs.
    pub fn create_output(&self, out: &Path, what: &str, example: &str) -> anyhow::Result<Output> {
        if out.is_dir() {
            bail!("{} is a directory; give {what}, e.g. {}", out.display(), out.join(example).display());
        }
        if out == Path::new("-") {
            return Ok(Output { path: out.to_path_buf(), partial: None, sink: Sink::Stdout(io::stdout()) });
        }
        self.refuse_as_output(out)?;
        if out.starts_with("/dev") || std::fs::metadata(out).is_ok_and(|m| !m.is_file()) {
            let file = File::options()
                .write(true)
                .open(out)
                .with_context(|| format!("cannot open {} for writing", out.display()))?;
            return Ok(Output { path: out.to_path_buf(), partial: None, sink: Sink::File(file) });
        }
        let tmp = super::partial_path(out);
        let file = File::create(&tmp).with_context(|| format!("cannot create {}", out.display()))?;
        Ok(Output { path: out.to_path_buf(), partial: Some(PartialFile(tmp)), sink: Sink::File(file) })
    }

    /// Refuses an output file that is one of the local inputs: writing it
    /// would truncate or replace a trace before (or after) it is read.
    fn refuse_as_output(&self, out: &Path) -> anyhow::Result<()> {
        let Ok(out) = std::fs::canonicalize(out) else {
            // Not there yet: it cannot be an input.
            return Ok(());
        };
        for source in &self.items {
            if let Location::Local(path) = &source.location
                && std::fs::canonicalize(path).is_ok_and(|p| p == out)
            {
                bail!("{}: the output would overwrite this input; choose another -o file", source.shown());
            }
        }
        Ok(())
    }

    /// The whole trace file.
    pub fn read_bytes(&self, source: &Source) -> Result<Vec<u8>, TraceError> {
        match &source.location {
            Location::Local(path) => std::fs::read(path).map_err(|e| TraceError::io(source.shown(), e)),
            Location::S3(destination) => {
                let (runtime, storage) = self.s3.as_ref().expect("an s3 source comes with the client that listed it");
                runtime
                    .block_on(storage.fetch(destination))
                    .map_err(|e| TraceError::io(source.shown(), io::Error::other(e.to_string())))
            }
        }
    }

    /// The file `name` in the directory (or under the S3 prefix) that holds
    /// `source`, such as its shard's `summary.json`: `None` when there is
    /// no such file or object; `Err` when it could not be read.
    pub fn read_beside(&self, source: &Source, name: &str) -> anyhow::Result<Option<(String, Vec<u8>)>> {
        match &source.location {
            Location::Local(path) => {
                let beside = path.with_file_name(name);
                match std::fs::read(&beside) {
                    Ok(bytes) => Ok(Some((beside.display().to_string(), bytes))),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(e).with_context(|| format!("cannot read {}", beside.display())),
                }
            }
            Location::S3(destination) => {
                let (runtime, storage) = self.s3.as_ref().expect("an s3 source comes with the client that listed it");
                let object = destination.as_s3().expect("an S3 source's destination is on S3");
                let key = match object.key.rsplit_once('/') {
                    Some((dir, _)) => format!("{dir}/{name}"),
                    None => name.to_string(),
                };
                let beside = Destination::S3(S3Location { bucket: object.bucket.clone(), key });
                match runtime.block_on(storage.fetch(&beside)) {
                    Ok(bytes) => Ok(Some((beside.to_string(), bytes))),
                    Err(e) if e.kind() == Some(FailureKind::NotFound) => Ok(None),
                    Err(e) => Err(e).with_context(|| format!("cannot fetch {beside}")),
                }
            }
        }
    }

    /// Opens `source` as often as the caller needs (commands that read a
    /// trace twice): a local file is opened again each time; a pipe
    /// (`/dev/stdin`, `<(...)`), which can be read only once, and an S3
    /// object are read whole once and then from memory. A device other
    /// than a pipe (a terminal) is refused: it holds no trace.
    pub fn reopener(&self, source: &Source) -> Result<Reopener, TraceError> {
        use std::os::unix::fs::FileTypeExt as _;
        let name = source.shown();
        let bytes: Arc<[u8]> = match &source.location {
            Location::Local(path) => {
                let kind = std::fs::metadata(path).map_err(|e| TraceError::io(name.clone(), e))?.file_type();
                if kind.is_file() {
                    let path = path.clone();
                    return Ok(Box::new(move || open_local(&path, name.clone())));
                }
                if !(kind.is_fifo() || kind.is_socket()) {
                    return Err(TraceError::io(name, io::Error::other("neither a regular file nor a pipe")));
                }
                self.read_bytes(source)?.into()
            }
            Location::S3(_) => self.read_bytes(source)?.into(),
        };
        Ok(Box::new(move || TraceReader::new(Box::new(Cursor::new(Arc::clone(&bytes))), name.clone())))
    }

    /// A reader positioned after the header: a local file is streamed, an
    /// S3 object is fetched whole first.
    pub fn open(&self, source: &Source) -> Result<SourceReader, TraceError> {
        match &source.location {
            Location::Local(path) => open_local(path, source.shown()),
            Location::S3(_) => TraceReader::new(Box::new(Cursor::new(self.read_bytes(source)?)), source.shown()),
        }
    }
}

/// A local trace file, streamed through a buffer, its header read; `name`
/// is how messages name it.
pub fn open_local(path: &Path, name: String) -> Result<SourceReader, TraceError> {
    let file = File::open(path).map_err(|e| TraceError::io(name.clone(), e))?;
    TraceReader::new(Box::new(BufReader::with_capacity(256 << 10, file)), name)
}

/// The last components of `path`, as many as `relative` (built from them,
/// lossily) has: the same names with their original bytes.
fn relative_path(path: &Path, relative: &str) -> PathBuf {
    let count = relative.split('/').filter(|c| !c.is_empty()).count();
    let components: Vec<_> = path.components().collect();
    components[components.len().saturating_sub(count)..].iter().collect()
}

/// The trace commands' S3 client (`AWS_ENDPOINT_URL_S3`, the standard
/// credential chain, retries) and the runtime it runs on.
pub(crate) fn s3_client() -> anyhow::Result<(tokio::runtime::Runtime, Storage)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the S3 client's runtime")?;
    Ok((runtime, Storage::new(StorageConfig::from_env())))
}

/// `s3://B/KEY.trace` is one object; anything else is a prefix listed for `*.trace`.
fn list_s3(runtime: &tokio::runtime::Runtime, storage: &Storage, arg: &str) -> anyhow::Result<Vec<Source>> {
    let destination = Destination::parse_prefix(arg)?;
    if arg.ends_with(TRACE_SUFFIX) {
        let relative = arg.rsplit('/').next().unwrap_or(arg).to_string();
        return Ok(vec![Source {
            name: arg.to_string(),
            relative_path: PathBuf::from(&relative),
            relative,
            location: Location::S3(destination),
        }]);
    }
    let objects = runtime.block_on(storage.list(&destination)).with_context(|| format!("cannot list {arg}"))?;
    let found: Vec<Source> = objects
        .into_iter()
        .filter(|o| o.relative.ends_with(TRACE_SUFFIX))
        .map(|o| Source {
            name: o.location.to_string(),
            relative_path: PathBuf::from(&o.relative),
            relative: o.relative,
            location: Location::S3(o.location),
        })
        .collect();
    if found.is_empty() {
        anyhow::bail!("{arg}: no .trace objects under this prefix");
    }
    Ok(found)
}
