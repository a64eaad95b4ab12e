//! Reading traces: sequentially ([`TraceReader`]) or by step through the
//! footer index ([`IndexedTrace`]).
//!
//! The reader trusts nothing: both frame lengths are capped before any
//! allocation, the header and the payload carry their own checksums, and
//! protobuf decoding happens only on verified bytes. A file that ends early
//! yields its complete frames and then [`TraceError::Truncated`]; damage
//! yields the frames before it and then [`TraceError::Corrupt`] with the
//! byte offset of the bad frame. A file that reads to its footer index and
//! trailer without an episode end record (which the writer always writes
//! before them) yields its records and then [`TraceError::NoEpisodeEnd`]:
//! only a trace whose episode ended is [`Tail::Complete`], so every reader
//! of a trace says when its episode did not end.
//!
//! A reader told which record kinds it needs
//! ([`TraceReader::skip_frames_without`]), or which it does not
//! ([`TraceReader::without`], [`read_trace_without`]: a reader that needs no
//! token logits, the bulk of a policy's trace), skips the frames of a version-2
//! file that cannot hold them without decompressing them (see
//! [`crate::format`]). A skipped frame's header checksum and payload
//! checksum are still verified (the CRC costs a pass over the compressed
//! bytes, a small fraction of decompressing them), so a flipped byte is
//! reported whatever the query; what is not checked for a skipped frame is
//! that its payload decompresses to `raw_len` bytes of valid records.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use prost::Message;

use crate::error::TraceError;
use crate::format::{
    self, FORMAT_VERSION, FRAME_HEADER_LEN, FrameHeader, FrameKind, MAGIC, PREAMBLE_LEN, SCHEMA_MAJOR, TRAILER_LEN,
    TRAILER_MAGIC,
};
use crate::pb::{Header, Record, TraceIndex, record::Body};

/// One verified frame: decompressed into `FrameReader::raw`, or skipped
/// (then `raw` is empty).
struct Frame {
    kind: FrameKind,
    offset: u64,
    record_kinds: u16,
    continues_step: bool,
    /// Checksummed but not decompressed ([`FrameHeader::skippable_for`]).
    skipped: bool,
}

/// Reads frames one by one from a position known to start a frame.
struct FrameReader<R> {
    inner: R,
    file: String,
    offset: u64,
    compressed: Vec<u8>,
    raw: Vec<u8>,
    decompressor: zstd::bulk::Decompressor<'static>,
    /// The file's format version (from the preamble).
    version: u32,
    decompressed: u64,
    skipped: u64,
}

enum FrameRead {
    Frame(Frame),
    /// Clean end of input exactly at a frame boundary.
    Eof,
}

impl<R: Read> FrameReader<R> {
    fn new(inner: R, file: String, offset: u64, version: u32) -> Result<Self, TraceError> {
        let decompressor = zstd::bulk::Decompressor::new().map_err(|source| TraceError::io(file.clone(), source))?;
        Ok(Self {
            inner,
            file,
            offset,
            compressed: Vec::new(),
            raw: Vec::new(),
            decompressor,
            version,
            decompressed: 0,
            skipped: 0,
        })
    }

    fn corrupt(&self, offset: u64, reason: impl Into<String>) -> TraceError {
        TraceError::Corrupt { file: self.file.clone(), offset, reason: reason.into() }
    }

    /// Reads the next frame into `self.raw`. `Ok(None)`-like EOF only at a boundary;
    /// a partial header or payload is reported as a truncation at `offset`.
    /// With `wanted`, a frame that [`FrameHeader::skippable_for`] it is
    /// checksummed but not decompressed (`self.raw` is left empty).
    fn next_frame(&mut self, wanted: Option<u16>) -> Result<FrameRead, FrameError> {
        let start = self.offset;
        let mut header = [0u8; FRAME_HEADER_LEN];
        match read_full(&mut self.inner, &mut header).map_err(|e| self.io(e))? {
            0 => return Ok(FrameRead::Eof),
            n if n < FRAME_HEADER_LEN => return Err(FrameError::Truncated(start)),
            _ => {}
        }
        let header = FrameHeader::decode(&header)
            .and_then(|h| h.check_version(self.version).map(|()| h))
            .map_err(|reason| FrameError::Fatal(self.corrupt(start, reason)))?;
        self.compressed.clear();
        self.compressed.resize(header.compressed_len as usize, 0);
        let got = read_full(&mut self.inner, &mut self.compressed).map_err(|e| self.io(e))?;
        if got < self.compressed.len() {
            return Err(FrameError::Truncated(start));
        }
        let crc = crc32fast::hash(&self.compressed);
        if crc != header.payload_crc {
            return Err(FrameError::Fatal(self.corrupt(
                start,
                format!("payload checksum mismatch (stored {:08x}, computed {crc:08x})", header.payload_crc),
            )));
        }
        let frame = Frame {
            kind: header.kind,
            offset: start,
            record_kinds: header.record_kinds,
            continues_step: header.flags & format::FLAG_CONTINUES_STEP != 0,
            skipped: false,
        };
        self.raw.clear();
        if wanted.is_some_and(|w| header.skippable_for(w)) {
            self.skipped += 1;
            self.offset += (FRAME_HEADER_LEN + self.compressed.len()) as u64;
            return Ok(FrameRead::Frame(Frame { skipped: true, ..frame }));
        }
        self.raw.reserve(header.raw_len as usize);
        let n = self
            .decompressor
            .decompress_to_buffer(&self.compressed, &mut self.raw)
            .map_err(|e| FrameError::Fatal(self.corrupt(start, format!("zstd: {e}"))))?;
        if n != header.raw_len as usize {
            return Err(FrameError::Fatal(
                self.corrupt(start, format!("decompressed to {n} bytes, header says {}", header.raw_len)),
            ));
        }
        self.decompressed += 1;
        self.offset += (FRAME_HEADER_LEN + self.compressed.len()) as u64;
        Ok(FrameRead::Frame(frame))
    }

    fn io(&self, source: io::Error) -> FrameError {
        FrameError::Fatal(TraceError::io(self.file.clone(), source))
    }
}

enum FrameError {
    /// The input ended inside the frame starting at this offset.
    Truncated(u64),
    Fatal(TraceError),
}

/// Like `read_exact`, but reports how many bytes were read before EOF.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Checks the preamble and returns the file's format version.
fn read_preamble(r: &mut impl Read, file: &str) -> Result<u32, TraceError> {
    let mut pre = [0u8; PREAMBLE_LEN];
    let n = read_full(r, &mut pre).map_err(|source| TraceError::io(file, source))?;
    if n == 0 {
        return Err(TraceError::Empty { file: file.into() });
    }
    let magic_len = n.min(MAGIC.len());
    if pre[..magic_len] != MAGIC[..magic_len] {
        return Err(TraceError::NotATrace { file: file.into() });
    }
    if n < PREAMBLE_LEN {
        return Err(TraceError::Truncated { file: file.into(), offset: n as u64, steps_recovered: 0 });
    }
    let version = format::u32_at(&pre, 8);
    if version == 0 {
        // No writer ever wrote version 0: damage, not a file from the future.
        return Err(TraceError::Corrupt {
            file: file.into(),
            offset: MAGIC.len() as u64,
            reason: "the preamble's format version is 0, which no writer produces".into(),
        });
    }
    if version > FORMAT_VERSION {
        return Err(TraceError::UnsupportedFormat { file: file.into(), version, supported: FORMAT_VERSION });
    }
    Ok(version)
}

fn check_header(header: &Header, file: &str) -> Result<(), TraceError> {
    if header.schema_major > SCHEMA_MAJOR {
        return Err(TraceError::NewerSchema {
            file: file.into(),
            major: header.schema_major,
            minor: header.schema_minor,
            supported: SCHEMA_MAJOR,
        });
    }
    Ok(())
}

/// Where a trace's records stopped.
#[derive(Debug)]
pub enum Tail {
    /// The writer finished: episode end, index and trailer are present.
    Complete,
    /// The records read are a trustworthy prefix; the rest is missing or
    /// damaged, or ([`TraceError::NoEpisodeEnd`]) the file reads to its
    /// trailer without the episode end that makes a trace complete.
    Damaged(TraceError),
}

/// Sequential reader: the header, then every record in order.
pub struct TraceReader<R> {
    frames: FrameReader<R>,
    header: Header,
    /// Position of the next undecoded record inside `frames.raw`.
    pos: usize,
    frame_offset: u64,
    in_records_frame: bool,
    last_step: Option<u32>,
    last_kind: RecordKind,
    /// Distinct steps (other than 0) seen in verified frames.
    steps_seen: u32,
    /// Whether an episode end record was read, or sits in a frame skipped
    /// undecompressed (its header's record-kinds mask says so): a trace
    /// that reaches its trailer without one is not complete.
    ended: bool,
    tail: Option<Tail>,
    /// Record-kinds mask and continues-step flag of the current frame.
    frame_kinds: u16,
    frame_continues: bool,
    /// Set by [`TraceReader::skip_frames_without`].
    wanted: Option<u16>,
    /// Record kinds the iterator neither decodes nor yields ([`TraceReader::without`]).
    unwanted: u16,
    /// A kind, and how many more of its records to decode ([`TraceReader::at_most`]).
    cap: Option<(RecordKind, usize)>,
    /// The capped kind's records left undecoded, per step.
    left_out: LeftOut,
    /// The footer index frame, once read: its offset and its entries (or
    /// why they do not decode). See [`TraceReader::footer_index`].
    footer: Option<(u64, Result<TraceIndex, String>)>,
}

/// Records a capped read left out, per step ([`TraceReader::at_most`]).
pub type LeftOut = std::collections::BTreeMap<u32, usize>;

impl TraceReader<BufReader<File>> {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| TraceError::io(name.clone(), source))?;
        Self::new(BufReader::with_capacity(256 << 10, file), name)
    }
}

impl<R: Read> TraceReader<R> {
    /// Reads the preamble and the header; `name` is used in every error.
    pub fn new(mut inner: R, name: impl Into<String>) -> Result<Self, TraceError> {
        let file = name.into();
        let version = read_preamble(&mut inner, &file)?;
        let mut frames = FrameReader::new(inner, file.clone(), PREAMBLE_LEN as u64, version)?;
        let frame = match frames.next_frame(None) {
            Ok(FrameRead::Frame(f)) => f,
            Ok(FrameRead::Eof) | Err(FrameError::Truncated(_)) => {
                return Err(TraceError::Truncated { file, offset: PREAMBLE_LEN as u64, steps_recovered: 0 });
            }
            Err(FrameError::Fatal(e)) => return Err(e),
        };
        let missing = || TraceError::MissingHeader { file: file.clone(), offset: frame.offset };
        if frame.kind != FrameKind::Records {
            return Err(missing());
        }
        let mut slice = frames.raw.as_slice();
        let first = Record::decode_length_delimited(&mut slice).map_err(|_| missing())?;
        let pos = frames.raw.len() - slice.len();
        let Some(Body::Header(header)) = first.body else {
            return Err(missing());
        };
        check_header(&header, &file)?;
        Ok(Self {
            frames,
            header: *header,
            pos,
            frame_offset: frame.offset,
            in_records_frame: true,
            last_step: None,
            last_kind: RecordKind::Header,
            steps_seen: 0,
            ended: false,
            tail: None,
            frame_kinds: frame.record_kinds,
            frame_continues: frame.continues_step,
            wanted: None,
            unwanted: 0,
            cap: None,
            left_out: LeftOut::new(),
            footer: None,
        })
    }

    /// Lets the reader skip, undecompressed, frames that hold none of
    /// `kinds` and only records of a step already read (version-2 files;
    /// see [`crate::format`]). Records of other kinds may still be yielded
    /// (those sharing a frame with wanted ones); no record of `kinds` and no
    /// step is lost. Checksums are verified on skipped frames too.
    pub fn skip_frames_without(&mut self, kinds: &[RecordKind]) {
        self.wanted = Some(RecordKind::mask(kinds));
    }

    /// Leaves out the records of `kinds`: the iterator neither decodes nor
    /// yields them, and frames that hold nothing else are skipped
    /// undecompressed (version-2 files). Every other record and every step
    /// is still read, and damage is found as without it (checksums are
    /// verified on skipped frames too).
    pub fn without(mut self, kinds: &[RecordKind]) -> Self {
        self.unwanted = RecordKind::mask(kinds);
        self.wanted = Some(!self.unwanted);
        self
    }

    /// Decodes and yields the first `n` records of `kind` only; the later
    /// ones are counted per step ([`TraceReader::left_out`]) but not decoded.
    /// For views that draw a bounded number of token logits of an episode
    /// that holds many more.
    pub fn at_most(mut self, kind: RecordKind, n: usize) -> Self {
        self.cap = Some((kind, n));
        self
    }

    /// The records [`TraceReader::at_most`] left out so far, per step.
    pub fn left_out(&self) -> &LeftOut {
        &self.left_out
    }

    /// The file's format version.
    pub fn format_version(&self) -> u32 {
        self.frames.version
    }

    /// Frames decompressed so far, the header's included.
    pub fn frames_decompressed(&self) -> u64 {
        self.frames.decompressed
    }

    /// Frames skipped without decompressing ([`TraceReader::skip_frames_without`]).
    pub fn frames_skipped(&self) -> u64 {
        self.frames.skipped
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn file_name(&self) -> &str {
        &self.frames.file
    }

    /// Byte offset of the frame the last returned record came from.
    pub fn frame_offset(&self) -> u64 {
        self.frame_offset
    }

    /// How the file ended; `None` until iteration has finished.
    pub fn tail(&self) -> Option<&Tail> {
        self.tail.as_ref()
    }

    /// The footer index as the writer recorded it, once iteration reached
    /// it: the index frame's byte offset and its entries, or why they do not
    /// decode. The reader does not check the entries against the records
    /// (`validate` does; random access through [`IndexedTrace`] trusts them).
    pub fn footer_index(&self) -> Option<(u64, Result<&TraceIndex, &str>)> {
        self.footer.as_ref().map(|(offset, index)| (*offset, index.as_ref().map_err(String::as_str)))
    }

    /// Number of distinct steps (other than 0) read so far from verified frames.
    pub fn steps_recovered(&self) -> u32 {
        self.steps_seen
    }

    /// Ends iteration; returns the damage (once) for the caller to yield.
    fn stop(&mut self, tail: Tail) -> Option<TraceError> {
        let err = match &tail {
            Tail::Complete => None,
            Tail::Damaged(e) => Some(e.clone()),
        };
        self.tail = Some(tail);
        err
    }

    fn truncated(&self, offset: u64) -> TraceError {
        TraceError::Truncated { file: self.frames.file.clone(), offset, steps_recovered: self.steps_recovered() }
    }

    /// After the index frame: the trailer must follow, then nothing.
    fn check_trailer(&mut self, index_offset: u64) -> Tail {
        let at = self.frames.offset;
        let mut trailer = [0u8; TRAILER_LEN + 1];
        let n = match read_full(&mut self.frames.inner, &mut trailer) {
            Ok(n) => n,
            Err(source) => return Tail::Damaged(TraceError::io(self.frames.file.clone(), source)),
        };
        if n < TRAILER_LEN {
            return Tail::Damaged(self.truncated(at));
        }
        let corrupt = |reason: &str| {
            Tail::Damaged(TraceError::Corrupt { file: self.frames.file.clone(), offset: at, reason: reason.into() })
        };
        if trailer[8..16] != TRAILER_MAGIC
            || u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes")) != index_offset
        {
            return corrupt("bad trailer");
        }
        if n > TRAILER_LEN {
            return corrupt("unexpected bytes after the trailer");
        }
        Tail::Complete
    }
}

impl<R: Read> TraceReader<R> {
    /// The next record without decoding its body: its step, its section and
    /// its bytes. Verification (checksums, lengths) is the same as for
    /// [`Iterator::next`]; callers that only need some sections (search,
    /// indexing) skip the cost of decoding the rest.
    pub fn next_raw(&mut self) -> Option<Result<RawRecord<'_>, TraceError>> {
        match self.advance()? {
            Ok(range) => {
                let bytes = &self.frames.raw[range];
                Some(Ok(RawRecord { step: self.last_step.unwrap_or(0), kind: self.last_kind, bytes }))
            }
            Err(e) => Some(Err(e)),
        }
    }

    /// Why a record contradicts its frame header's mask or flag, if it does:
    /// readers that skip frames trust both, so a lie is corruption.
    fn mask_lie(&self, step: u32, kind: RecordKind) -> Option<String> {
        if self.frame_kinds != 0 && self.frame_kinds & kind.bit() == 0 {
            return Some(format!(
                "a record of body field {} in a frame whose header lists kinds {:#06x}",
                kind.field(),
                self.frame_kinds
            ));
        }
        if self.frame_continues && self.last_step != Some(step) {
            let previous = self.last_step.map_or_else(|| "none".to_string(), |s| s.to_string());
            return Some(format!("a record of step {step} in a frame whose header says it continues step {previous}"));
        }
        None
    }

    /// Moves to the next record and returns its byte range in the frame.
    fn advance(&mut self) -> Option<Result<std::ops::Range<usize>, TraceError>> {
        if self.tail.is_some() {
            return None;
        }
        loop {
            if self.in_records_frame && self.pos < self.frames.raw.len() {
                let at = self.pos;
                return match split_record(&self.frames.raw[at..]) {
                    Ok((len_prefix, len, step, kind)) => {
                        if let Some(reason) = self.mask_lie(step, kind) {
                            let err = TraceError::Corrupt {
                                file: self.frames.file.clone(),
                                offset: self.frame_offset,
                                reason: format!("record {at} bytes into the frame: {reason}"),
                            };
                            return self.stop(Tail::Damaged(err)).map(Err);
                        }
                        let start = at + len_prefix;
                        self.pos = start + len;
                        if step > 0 && self.last_step != Some(step) {
                            self.steps_seen += 1;
                        }
                        self.last_step = Some(step);
                        self.last_kind = kind;
                        self.ended |= kind == RecordKind::EpisodeEnd;
                        Some(Ok(start..start + len))
                    }
                    Err(reason) => {
                        let err = TraceError::Corrupt {
                            file: self.frames.file.clone(),
                            offset: self.frame_offset,
                            reason: format!("record {at} bytes into the frame does not decode: {reason}"),
                        };
                        self.stop(Tail::Damaged(err)).map(Err)
                    }
                };
            }
            // Skipping needs a step already read for the skipped frame to continue.
            let wanted = self.wanted.filter(|_| self.last_step.is_some());
            match self.frames.next_frame(wanted) {
                Ok(FrameRead::Frame(frame)) => {
                    self.frame_offset = frame.offset;
                    self.frame_kinds = frame.record_kinds;
                    self.frame_continues = frame.continues_step;
                    self.pos = 0;
                    // A skipped frame's records are never split: its mask says what it held.
                    self.ended |= frame.skipped && frame.record_kinds & RecordKind::EpisodeEnd.bit() != 0;
                    match frame.kind {
                        FrameKind::Records => self.in_records_frame = true,
                        FrameKind::Index => {
                            self.in_records_frame = false;
                            let index = TraceIndex::decode(self.frames.raw.as_slice()).map_err(|e| e.to_string());
                            self.footer = Some((frame.offset, index));
                            let tail = match self.check_trailer(frame.offset) {
                                Tail::Complete if !self.ended => Tail::Damaged(TraceError::NoEpisodeEnd {
                                    file: self.frames.file.clone(),
                                    offset: frame.offset,
                                }),
                                tail => tail,
                            };
                            return self.stop(tail).map(Err);
                        }
                    }
                }
                Ok(FrameRead::Eof) => {
                    let offset = self.frames.offset;
                    return self.stop(Tail::Damaged(self.truncated(offset))).map(Err);
                }
                Err(FrameError::Truncated(offset)) => {
                    return self.stop(Tail::Damaged(self.truncated(offset))).map(Err);
                }
                Err(FrameError::Fatal(e)) => return self.stop(Tail::Damaged(e)).map(Err),
            }
        }
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let range = match self.next_wanted()? {
            Ok(range) => range,
            Err(e) => return Some(Err(e)),
        };
        let mut record = Record::default();
        match decode_record_into(&self.frames.raw[range.clone()], &mut record) {
            Ok(()) => Some(Ok(record)),
            Err(e) => self.undecodable(range.start, e).map(Err),
        }
    }
}

impl<R: Read> TraceReader<R> {
    /// The byte range of the next record the reader was asked for (not
    /// left out by [`TraceReader::without`] or [`TraceReader::at_most`]).
    fn next_wanted(&mut self) -> Option<Result<std::ops::Range<usize>, TraceError>> {
        loop {
            match self.advance()? {
                Ok(_) if self.last_kind.bit() & self.unwanted != 0 => continue,
                Ok(range) => match &mut self.cap {
                    Some((kind, 0)) if *kind == self.last_kind => {
                        *self.left_out.entry(self.last_step.unwrap_or(0)).or_default() += 1;
                    }
                    Some((kind, left)) if *kind == self.last_kind => {
                        *left -= 1;
                        return Some(Ok(range));
                    }
                    _ => return Some(Ok(range)),
                },
                Err(e) => return Some(Err(e)),
            }
        }
    }

    /// [`Iterator::next`], decoded into a new last element of `records`
    /// instead of returned: a token logit record is ~250 bytes, and moving
    /// each through the iterator's layers of `Option`s and `Result`s costs
    /// as much as decoding it. `Some(Ok(()))` when a record was added.
    fn next_into(&mut self, records: &mut Vec<Record>) -> Option<Result<(), TraceError>> {
        let range = match self.next_wanted()? {
            Ok(range) => range,
            Err(e) => return Some(Err(e)),
        };
        records.push(Record::default());
        let last = records.last_mut().expect("just pushed");
        match decode_record_into(&self.frames.raw[range.clone()], last) {
            Ok(()) => Some(Ok(())),
            Err(e) => {
                records.pop();
                self.undecodable(range.start, e).map(Err)
            }
        }
    }

    /// Stops the reader at a record that does not decode.
    fn undecodable(&mut self, at: usize, e: prost::DecodeError) -> Option<TraceError> {
        let err = TraceError::Corrupt {
            file: self.frames.file.clone(),
            offset: self.frame_offset,
            reason: format!("record {at} bytes into the frame does not decode: {e}"),
        };
        self.stop(Tail::Damaged(err))
    }
}

/// Which section a record belongs to: the field number of its `body`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Header,
    PlanStep,
    MemoryDelta,
    TokenLogit,
    RewardSignal,
    ErrorContext,
    MemorySnapshot,
    PolicyTurn,
    Injection,
    EpisodeEnd,
    /// A body from a newer writer, or none.
    Other(u32),
}

impl RecordKind {
    /// The kind of a record with this body.
    pub fn of_body(body: Option<&Body>) -> Self {
        match body {
            None => Self::Other(0),
            Some(Body::Header(_)) => Self::Header,
            Some(Body::PlanStep(_)) => Self::PlanStep,
            Some(Body::MemoryDelta(_)) => Self::MemoryDelta,
            Some(Body::TokenLogit(_)) => Self::TokenLogit,
            Some(Body::RewardSignal(_)) => Self::RewardSignal,
            Some(Body::ErrorContext(_)) => Self::ErrorContext,
            Some(Body::MemorySnapshot(_)) => Self::MemorySnapshot,
            Some(Body::PolicyTurn(_)) => Self::PolicyTurn,
            Some(Body::Injection(_)) => Self::Injection,
            Some(Body::EpisodeEnd(_)) => Self::EpisodeEnd,
        }
    }

    /// The `Record` field number of the body.
    pub fn field(self) -> u32 {
        match self {
            Self::Header => 2,
            Self::PlanStep => 3,
            Self::MemoryDelta => 4,
            Self::TokenLogit => 5,
            Self::RewardSignal => 6,
            Self::ErrorContext => 7,
            Self::MemorySnapshot => 8,
            Self::PolicyTurn => 9,
            Self::Injection => 10,
            Self::EpisodeEnd => 11,
            Self::Other(field) => field,
        }
    }

    /// This kind's bit in a frame header's record-kinds mask.
    pub fn bit(self) -> u16 {
        format::kind_bit(self.field())
    }

    /// The bits of all of `kinds`.
    fn mask(kinds: &[RecordKind]) -> u16 {
        kinds.iter().fold(0, |mask, k| mask | k.bit())
    }

    /// Whether this is a body kind of this schema (not [`RecordKind::Other`]).
    fn is_known(self) -> bool {
        !matches!(self, Self::Other(_))
    }

    /// Whether a body field of this kind, met after one of kind `earlier`
    /// (`Other(0)` before any), is the record's body: the last field this
    /// schema knows, as prost decodes the oneof; a field it does not know (a
    /// newer writer's, after the body) only while no known body came first.
    pub(crate) fn takes_over(self, earlier: RecordKind) -> bool {
        self.is_known() || !earlier.is_known()
    }

    pub(crate) fn from_field(field: u32) -> Self {
        match field {
            2 => Self::Header,
            3 => Self::PlanStep,
            4 => Self::MemoryDelta,
            5 => Self::TokenLogit,
            6 => Self::RewardSignal,
            7 => Self::ErrorContext,
            8 => Self::MemorySnapshot,
            9 => Self::PolicyTurn,
            10 => Self::Injection,
            11 => Self::EpisodeEnd,
            other => Self::Other(other),
        }
    }
}

/// A verified record whose body has not been decoded yet.
#[derive(Debug, Clone, Copy)]
pub struct RawRecord<'a> {
    pub step: u32,
    pub kind: RecordKind,
    /// The encoded `Record` message (without its length prefix).
    pub bytes: &'a [u8],
}

impl RawRecord<'_> {
    pub fn decode(&self) -> Result<Record, prost::DecodeError> {
        decode_record(self.bytes)
    }
}

/// One encoded record (without its length prefix): token logits, nearly all
/// of a trace, through their own decoder, the rest and anything unusual
/// through prost.
pub fn decode_record(bytes: &[u8]) -> Result<Record, prost::DecodeError> {
    let mut record = Record::default();
    decode_record_into(bytes, &mut record)?;
    Ok(record)
}

/// [`decode_record`] into a record already in place, replacing what it held.
fn decode_record_into(bytes: &[u8], record: &mut Record) -> Result<(), prost::DecodeError> {
    if !crate::token_logit::decode_record_into(bytes, record) {
        *record = Record::decode(bytes)?;
    }
    Ok(())
}

/// Reads one length-delimited record's framing and top-level fields without
/// decoding the body: (length-prefix size, record length, step, kind). The
/// kind is that of the last body field this schema knows, as prost decodes
/// the oneof; fields it does not know are ignored (trace.proto's promise),
/// unless the record has no known body.
fn split_record(buf: &[u8]) -> Result<(usize, usize, u32, RecordKind), String> {
    let mut cursor = buf;
    let len = prost::encoding::decode_varint(&mut cursor).map_err(|e| e.to_string())?;
    let prefix = buf.len() - cursor.len();
    let len = usize::try_from(len).map_err(|_| "record length overflows".to_string())?;
    if len > cursor.len() {
        return Err(format!("record claims {len} bytes, {} remain in the frame", cursor.len()));
    }
    let mut body = &cursor[..len];
    let (mut step, mut kind) = (0u32, RecordKind::Other(0));
    while !body.is_empty() {
        let key = prost::encoding::decode_varint(&mut body).map_err(|e| e.to_string())?;
        let (field, wire) = ((key >> 3) as u32, key & 7);
        match wire {
            0 => {
                let v = prost::encoding::decode_varint(&mut body).map_err(|e| e.to_string())?;
                if field == 1 {
                    step = v as u32;
                }
            }
            2 => {
                let n = prost::encoding::decode_varint(&mut body).map_err(|e| e.to_string())?;
                let n = usize::try_from(n).ok().filter(|&n| n <= body.len()).ok_or("field length past the record")?;
                body = &body[n..];
                let this = RecordKind::from_field(field);
                if field >= 2 && this.takes_over(kind) {
                    kind = this;
                }
            }
            1 if body.len() >= 8 => body = &body[8..],
            5 if body.len() >= 4 => body = &body[4..],
            _ => return Err(format!("bad wire type {wire} for field {field}")),
        }
    }
    Ok((prefix, len, step, kind))
}

/// A whole trace in memory: the header, the records after it, and how it ended.
#[derive(Debug)]
pub struct TraceContents {
    pub header: Header,
    pub records: Vec<Record>,
    pub tail: Tail,
}

impl TraceContents {
    /// The problem with the file's end, if any.
    pub fn damage(&self) -> Option<&TraceError> {
        match &self.tail {
            Tail::Complete => None,
            Tail::Damaged(e) => Some(e),
        }
    }
}

/// Reads a whole trace, keeping the readable prefix of a damaged one.
/// Errs only when not even the header could be read.
pub fn read_trace(path: impl AsRef<Path>) -> Result<TraceContents, TraceError> {
    Ok(TraceReader::open(path)?.into_contents())
}

/// Like [`read_trace`] over any reader (a byte slice, a download).
pub fn read_trace_from(inner: impl Read, name: impl Into<String>) -> Result<TraceContents, TraceError> {
    Ok(TraceReader::new(inner, name)?.into_contents())
}

/// Like [`read_trace`], without the records of `kinds` (e.g.
/// `[RecordKind::TokenLogit]` for a reader that needs no logits): they are
/// not decoded, and their frames are not decompressed
/// ([`TraceReader::without`]). The header, every other record and the tail
/// are what [`read_trace`] gives.
pub fn read_trace_without(path: impl AsRef<Path>, kinds: &[RecordKind]) -> Result<TraceContents, TraceError> {
    Ok(TraceReader::open(path)?.without(kinds).into_contents())
}

/// Like [`read_trace_without`] over any reader.
pub fn read_trace_from_without(
    inner: impl Read,
    name: impl Into<String>,
    kinds: &[RecordKind],
) -> Result<TraceContents, TraceError> {
    Ok(TraceReader::new(inner, name)?.without(kinds).into_contents())
}

/// Like [`read_trace`], with only the first `n` records of `kind` decoded;
/// how many of the rest each step had comes with it ([`TraceReader::at_most`]).
pub fn read_trace_at_most(
    path: impl AsRef<Path>,
    kind: RecordKind,
    n: usize,
) -> Result<(TraceContents, LeftOut), TraceError> {
    Ok(TraceReader::open(path)?.at_most(kind, n).into_contents_and_left_out())
}

impl<R: Read> TraceReader<R> {
    /// Every record left and how the trace ended: what [`read_trace`] gives
    /// for a reader already opened (an S3 object, a reader with [`TraceReader::without`]).
    pub fn into_contents(mut self) -> TraceContents {
        collect_from(&mut self)
    }

    /// [`TraceReader::into_contents`] and the records [`TraceReader::at_most`]
    /// left out: what [`read_trace_at_most`] gives for a reader already opened.
    pub fn into_contents_and_left_out(mut self) -> (TraceContents, LeftOut) {
        let contents = collect_from(&mut self);
        (contents, std::mem::take(&mut self.left_out))
    }
}

fn collect_from<R: Read>(reader: &mut TraceReader<R>) -> TraceContents {
    let mut records = Vec::new();
    while let Some(Ok(())) = reader.next_into(&mut records) {}
    let tail = reader.tail.take().expect("iteration ended, so the tail is set");
    TraceContents { header: std::mem::take(&mut reader.header), records, tail }
}

/// (step, offset of the frame holding its first record), in file order.
type StepIndex = Vec<(u32, u64)>;

/// Random access to the steps of a trace through its footer index. A file
/// without a valid footer (a crashed writer) is indexed by one scan instead.
pub struct IndexedTrace<R> {
    inner: R,
    file: String,
    header: Header,
    /// The file's format version.
    version: u32,
    index: StepIndex,
    /// Set when the index was rebuilt by scanning and the scan hit damage.
    damage: Option<TraceError>,
    /// Whether the file ends with its footer index, as only a finished
    /// trace does.
    finished: bool,
}

impl IndexedTrace<File> {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let name = path.display().to_string();
        let file = File::open(path).map_err(|source| TraceError::io(name.clone(), source))?;
        Self::new(file, name)
    }
}

impl<R: Read + Seek> IndexedTrace<R> {
    pub fn new(mut inner: R, name: impl Into<String>) -> Result<Self, TraceError> {
        let file = name.into();
        let io = |source| TraceError::io(file.clone(), source);
        inner.seek(SeekFrom::Start(0)).map_err(io)?;
        let (header, version) = {
            let reader = TraceReader::new(&mut inner, file.clone())?;
            (reader.header, reader.frames.version)
        };
        let footer = Self::read_footer(&mut inner, &file, version).map_err(io)?;
        let finished = footer.is_some();
        let (index, damage) = match footer {
            Some(index) => (index, None),
            None => {
                inner.seek(SeekFrom::Start(0)).map_err(io)?;
                Self::scan(&mut inner, &file)?
            }
        };
        Ok(Self { inner, file, header, version, index, damage, finished })
    }

    /// The footer's index, or `None` when there is no valid footer.
    fn read_footer(inner: &mut R, file: &str, version: u32) -> io::Result<Option<StepIndex>> {
        let len = inner.seek(SeekFrom::End(0))?;
        if len < (PREAMBLE_LEN + TRAILER_LEN) as u64 {
            return Ok(None);
        }
        inner.seek(SeekFrom::Start(len - TRAILER_LEN as u64))?;
        let mut trailer = [0u8; TRAILER_LEN];
        inner.read_exact(&mut trailer)?;
        let index_offset = u64::from_le_bytes(trailer[..8].try_into().expect("8 bytes"));
        if trailer[8..] != TRAILER_MAGIC || index_offset < PREAMBLE_LEN as u64 || index_offset >= len {
            return Ok(None);
        }
        inner.seek(SeekFrom::Start(index_offset))?;
        let Ok(mut frames) = FrameReader::new(&mut *inner, file.to_string(), index_offset, version) else {
            return Ok(None);
        };
        let Ok(FrameRead::Frame(frame)) = frames.next_frame(None) else {
            return Ok(None);
        };
        if frame.kind != FrameKind::Index {
            return Ok(None);
        }
        let Ok(index) = TraceIndex::decode(frames.raw.as_slice()) else {
            return Ok(None);
        };
        Ok(Some(index.entries.iter().filter(|e| e.offset < index_offset).map(|e| (e.step, e.offset)).collect()))
    }

    fn scan(inner: &mut R, file: &str) -> Result<(StepIndex, Option<TraceError>), TraceError> {
        let mut reader = TraceReader::new(BufReader::new(inner), file.to_string())?;
        // The header frame starts step 0, as in the writer's footer index;
        // the iterator below never yields the header record itself.
        let mut index: Vec<(u32, u64)> = vec![(0, reader.frame_offset())];
        let mut damage = None;
        while let Some(record) = reader.next() {
            match record {
                Ok(r) => {
                    if index.last().is_none_or(|&(s, _)| s != r.step) {
                        index.push((r.step, reader.frame_offset()));
                    }
                }
                Err(e) => damage = Some(e),
            }
        }
        Ok((index, damage))
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Steps present, in file order.
    pub fn steps(&self) -> impl Iterator<Item = u32> + '_ {
        self.index.iter().map(|&(s, _)| s)
    }

    /// Damage found while rebuilding the index of a file without a footer.
    /// Whether the trace was finished: it ends with the footer index its
    /// writer adds last (a trace still being written, or cut off by a
    /// crash or a full disk, does not). The writer adds the footer after
    /// the episode end; a file made otherwise may have a footer without
    /// one, which only a full read ([`TraceReader`]'s
    /// [`TraceError::NoEpisodeEnd`]) tells.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    pub fn damage(&self) -> Option<&TraceError> {
        self.damage.as_ref()
    }

    /// Every record of `step`, reading only the frames that hold it.
    pub fn read_step(&mut self, step: u32) -> Result<Vec<Record>, TraceError> {
        let &(_, offset) = self
            .index
            .iter()
            .find(|&&(s, _)| s == step)
            .ok_or_else(|| TraceError::StepNotFound { file: self.file.clone(), step })?;
        let io = |source| TraceError::io(self.file.clone(), source);
        self.inner.seek(SeekFrom::Start(offset)).map_err(io)?;
        let mut frames = FrameReader::new(BufReader::new(&mut self.inner), self.file.clone(), offset, self.version)?;
        let mut out = Vec::new();
        loop {
            let frame = match frames.next_frame(None) {
                Ok(FrameRead::Frame(f)) if f.kind == FrameKind::Records => f,
                Ok(_) => return Ok(out),
                Err(FrameError::Truncated(at)) => {
                    return if out.is_empty() {
                        Err(TraceError::Truncated { file: self.file.clone(), offset: at, steps_recovered: 0 })
                    } else {
                        Ok(out)
                    };
                }
                Err(FrameError::Fatal(e)) => return Err(e),
            };
            let mut slice = frames.raw.as_slice();
            while !slice.is_empty() {
                let mut after_prefix = slice;
                let decoded = match prost::decode_length_delimiter(&mut after_prefix) {
                    Ok(len) if len <= after_prefix.len() => {
                        let (bytes, rest) = after_prefix.split_at(len);
                        slice = rest;
                        decode_record(bytes)
                    }
                    _ => Record::decode_length_delimited(&mut slice),
                };
                let record = decoded.map_err(|e| TraceError::Corrupt {
                    file: self.file.clone(),
                    offset: frame.offset,
                    reason: format!("record does not decode: {e}"),
                })?;
                if record.step > step {
                    return Ok(out);
                }
                if record.step == step {
                    out.push(record);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{EpisodeShape, generate};

    #[test]
    fn raw_records_agree_with_decoded_records() {
        let shape = EpisodeShape { steps: 4, tokens_per_step: 3, ..Default::default() };
        let bytes = generate(&shape).write_to(Vec::new(), 3).unwrap();
        let decoded: Vec<Record> = TraceReader::new(bytes.as_slice(), "t").unwrap().map(|r| r.unwrap()).collect();
        let mut raw_reader = TraceReader::new(bytes.as_slice(), "t").unwrap();
        let mut n = 0;
        while let Some(raw) = raw_reader.next_raw() {
            let raw = raw.unwrap();
            let record = &decoded[n];
            assert_eq!(raw.step, record.step);
            assert_eq!(raw.decode().unwrap(), *record);
            let expected_kind = match record.body.as_ref().unwrap() {
                Body::PlanStep(_) => RecordKind::PlanStep,
                Body::MemoryDelta(_) => RecordKind::MemoryDelta,
                Body::TokenLogit(_) => RecordKind::TokenLogit,
                Body::RewardSignal(_) => RecordKind::RewardSignal,
                Body::ErrorContext(_) => RecordKind::ErrorContext,
                Body::PolicyTurn(_) => RecordKind::PolicyTurn,
                Body::EpisodeEnd(_) => RecordKind::EpisodeEnd,
                other => panic!("unexpected body {other:?}"),
            };
            assert_eq!(raw.kind, expected_kind);
            n += 1;
        }
        assert_eq!(n, decoded.len());
        assert!(matches!(raw_reader.tail(), Some(Tail::Complete)));
        assert_eq!(raw_reader.steps_recovered(), 4);
    }

    /// A newer writer may add a field to `Record` (a minor bump), encoded
    /// after the body: the record keeps the kind of its body, so the frame's
    /// kind mask still holds and the record is read, not called corruption.
    #[test]
    fn an_unknown_record_field_after_the_body_keeps_the_body_kind() {
        let mut file = Vec::new();
        drop(crate::TraceWriter::new(&mut file, Header::default(), 3).unwrap());
        let plan = Record { step: 1, body: Some(Body::PlanStep(Box::default())) };
        let mut record = plan.encode_to_vec();
        // `string span_id = 12`, as a newer writer would put it after the body.
        prost::encoding::string::encode(12, &"span-1".to_string(), &mut record);
        let mut raw = Vec::new();
        prost::encoding::encode_varint(record.len() as u64, &mut raw);
        raw.extend_from_slice(&record);
        let compressed = zstd::bulk::compress(&raw, 3).unwrap();
        let header = FrameHeader {
            kind: FrameKind::Records,
            record_kinds: RecordKind::PlanStep.bit(),
            flags: 0,
            compressed_len: compressed.len() as u32,
            raw_len: raw.len() as u32,
            payload_crc: crc32fast::hash(&compressed),
        };
        file.extend_from_slice(&header.encode());
        file.extend_from_slice(&compressed);

        let mut reader = TraceReader::new(file.as_slice(), "t").unwrap();
        let raw = reader.next_raw().unwrap().unwrap();
        assert_eq!((raw.step, raw.kind), (1, RecordKind::PlanStep));
        let contents = read_trace_from(file.as_slice(), "t").unwrap();
        assert_eq!(contents.records, [plan]);
        assert!(matches!(contents.damage(), Some(TraceError::Truncated { .. })), "{:?}", contents.tail);
    }
}
