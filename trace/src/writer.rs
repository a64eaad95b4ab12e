//! The streaming trace writer.
//!
//! Records are encoded into an in-memory buffer as the episode runs; every
//! [`TraceWriter::end_step`] compresses that buffer into a checksummed zstd
//! frame and hands it to the operating system, so a process killed at any
//! moment leaves every completed step readable. [`TraceWriter::finish`]
//! appends the episode end, the step index and the trailer.
//!
//! A frame also closes when the step changes and when the records switch
//! between token_logit and other kinds, so token logits sit in frames of
//! their own that readers which do not want them can skip undecompressed;
//! each frame's header says which record kinds it holds and whether it
//! continues the previous frame's step (see [`crate::format`]). The records
//! stay in the order they were appended.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use prost::Message;

use crate::format::{self, FRAME_FLUSH_THRESHOLD, FrameHeader, FrameKind, SCHEMA_MAJOR, SCHEMA_MINOR};
use crate::pb::{EpisodeEnd, Header, IndexEntry, Record, TraceIndex, record::Body};
use crate::reader::RecordKind;

/// zstd level used when none is given: fast, and within a few percent of level 6's size.
pub const DEFAULT_ZSTD_LEVEL: i32 = 3;
/// Frames below this many raw bytes (a step of one tool call) use
/// [`SMALL_FRAME_ZSTD_LEVEL`]: at that size zstd's entropy tables cost more
/// time than they save bytes (measured by `make bench-sandbox`).
pub const SMALL_FRAME_BYTES: usize = 4 << 10;
pub const SMALL_FRAME_ZSTD_LEVEL: i32 = -1;
/// The bytes `record` takes in a frame (its length prefix included): the
/// writer refuses a record over [`FRAME_RAW_LIMIT`].
pub fn framed_len(record: &Record) -> usize {
    let len = record.encoded_len();
    prost::length_delimiter_len(len) + len
}

/// Most raw bytes the writer puts in one frame: within the reader's
/// [`format::MAX_RAW_FRAME`], and small enough that zstd's worst case
/// (`compress_bound`: n + n/256 above 128 KiB) stays within
/// [`format::MAX_COMPRESSED_FRAME`]. A record longer than this is refused.
pub const FRAME_RAW_LIMIT: usize = {
    let limit = if format::MAX_RAW_FRAME < format::MAX_COMPRESSED_FRAME {
        format::MAX_RAW_FRAME
    } else {
        format::MAX_COMPRESSED_FRAME
    } as usize;
    limit - (limit >> 8) - 1
};

pub struct TraceWriter<W: Write> {
    out: Option<W>,
    /// Bytes written so far: the offset the next frame will start at.
    offset: u64,
    raw: Vec<u8>,
    compressed: Vec<u8>,
    compressor: zstd::bulk::Compressor<'static>,
    small_compressor: zstd::bulk::Compressor<'static>,
    index: Vec<IndexEntry>,
    last_step: Option<u32>,
    record_count: u64,
    /// Record-kinds mask of the records in `raw`.
    raw_kinds: u16,
    /// Whether `raw` holds token_logit records (then it holds nothing else).
    raw_is_tokens: bool,
    /// Step of the last records frame written, the header frame left out.
    last_frame_step: Option<u32>,
}

impl TraceWriter<File> {
    /// Creates (truncating) `path` and writes the header frame.
    pub fn create(path: impl AsRef<Path>, header: Header) -> io::Result<Self> {
        let file = File::create(path.as_ref())?;
        Self::new(file, header, DEFAULT_ZSTD_LEVEL)
    }

    /// Creates `path`, which must not exist (`io::ErrorKind::AlreadyExists`
    /// otherwise: another trace is never truncated), and writes the header frame.
    pub fn create_new(path: impl AsRef<Path>, header: Header) -> io::Result<Self> {
        let file = File::options().write(true).create_new(true).open(path.as_ref())?;
        Self::new(file, header, DEFAULT_ZSTD_LEVEL)
    }
}

impl<W: Write> TraceWriter<W> {
    /// Writes the preamble and the header (in a frame of its own) to `out`.
    /// The schema version fields of `header` are set by the writer.
    pub fn new(mut out: W, mut header: Header, zstd_level: i32) -> io::Result<Self> {
        header.schema_major = SCHEMA_MAJOR;
        header.schema_minor = SCHEMA_MINOR;
        let preamble = format::preamble();
        out.write_all(&preamble)?;
        let mut writer = Self {
            out: Some(out),
            offset: preamble.len() as u64,
            raw: Vec::with_capacity(64 << 10),
            compressed: Vec::new(),
            compressor: zstd::bulk::Compressor::new(zstd_level)?,
            small_compressor: zstd::bulk::Compressor::new(SMALL_FRAME_ZSTD_LEVEL.min(zstd_level))?,
            index: Vec::new(),
            last_step: None,
            record_count: 0,
            raw_kinds: 0,
            raw_is_tokens: false,
            last_frame_step: None,
        };
        writer.append(0, Body::Header(Box::new(header)))?;
        writer.end_step()?;
        // Step 0's first records frame must not claim to continue the header
        // frame: sequential readers never yield the header record, so a
        // reader skipping that frame would lose step 0.
        writer.last_frame_step = None;
        Ok(writer)
    }

    /// Appends one record to the current step. Steps are expected to be
    /// non-decreasing; the index points at the first frame holding each step.
    /// A record too long for any frame is refused ([`TraceWriter::write_record`]).
    pub fn append(&mut self, step: u32, body: Body) -> io::Result<()> {
        self.write_record(&Record { step, body: Some(body) })
    }

    /// Appends one record (see [`TraceWriter::append`]). A record too long
    /// for any frame ([`FRAME_RAW_LIMIT`]) is refused, and nothing else is
    /// lost: the records before it are still written, and later ones may follow.
    pub fn write_record(&mut self, record: &Record) -> io::Result<()> {
        let kind = RecordKind::of_body(record.body.as_ref());
        let framed_len = framed_len(record);
        if framed_len > FRAME_RAW_LIMIT {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a trace record of step {} (body field {}) is {framed_len} bytes encoded, over the frame limit of \
                     {FRAME_RAW_LIMIT} bytes; it was not written (the records before it are kept): shorten the \
                     value that makes it this long",
                    record.step,
                    kind.field()
                ),
            ));
        }
        let is_tokens = kind == RecordKind::TokenLogit;
        // Closing the buffer first also keeps a big record appended to a
        // nearly full buffer from making a frame over the limit.
        if !self.raw.is_empty()
            && (self.last_step != Some(record.step)
                || self.raw_is_tokens != is_tokens
                || self.raw.len() + framed_len > FRAME_RAW_LIMIT)
        {
            self.write_frame(FrameKind::Records)?;
        }
        self.raw_kinds |= kind.bit();
        self.raw_is_tokens = is_tokens;
        if self.last_step != Some(record.step) {
            // The buffer is empty (closed above), so the step's first frame starts at `offset`.
            self.index.push(IndexEntry { step: record.step, offset: self.offset });
            self.last_step = Some(record.step);
        }
        record.encode_length_delimited(&mut self.raw).expect("encoding into a Vec cannot run out of space");
        self.record_count += 1;
        if self.raw.len() >= FRAME_FLUSH_THRESHOLD {
            self.write_frame(FrameKind::Records)?;
        }
        Ok(())
    }

    /// Closes the current frame: everything appended so far survives a crash.
    pub fn end_step(&mut self) -> io::Result<()> {
        if !self.raw.is_empty() {
            self.write_frame(FrameKind::Records)?;
        }
        Ok(())
    }

    /// Number of records appended, header included.
    pub fn record_count(&self) -> u64 {
        self.record_count
    }

    /// Bytes handed to the output so far.
    pub fn bytes_written(&self) -> u64 {
        self.offset
    }

    /// Writes the episode end, the index and the trailer, and returns the output.
    pub fn finish(mut self, end: EpisodeEnd) -> io::Result<W> {
        let step = self.last_step.unwrap_or(0);
        self.append(step, Body::EpisodeEnd(end))?;
        self.end_step()?;
        let index = TraceIndex { entries: std::mem::take(&mut self.index), record_count: self.record_count };
        let index_offset = self.offset;
        index.encode(&mut self.raw).expect("encoding into a Vec cannot run out of space");
        self.write_frame(FrameKind::Index)?;
        let mut out = self.out.take().expect("finish consumes the writer, so out is still present");
        out.write_all(&format::trailer(index_offset))?;
        out.flush()?;
        Ok(out)
    }

    /// Writes what is buffered and returns the output with no episode end,
    /// index or trailer: the trace reads as truncated after its last record,
    /// as one whose writer was killed does (so a copy of such a trace, e.g.
    /// a redacted one, is cut off the same way rather than made to look complete).
    pub fn finish_truncated(mut self) -> io::Result<W> {
        self.end_step()?;
        let mut out = self.out.take().expect("finish_truncated consumes the writer, so out is still present");
        out.flush()?;
        Ok(out)
    }

    fn write_frame(&mut self, kind: FrameKind) -> io::Result<()> {
        let (record_kinds, flags) = match kind {
            FrameKind::Records => {
                let step = self.last_step.expect("a records frame holds at least one record");
                let continues = self.last_frame_step == Some(step);
                (self.raw_kinds, if continues { format::FLAG_CONTINUES_STEP } else { 0 })
            }
            FrameKind::Index => (0, 0),
        };
        let bound = zstd::zstd_safe::compress_bound(self.raw.len());
        self.compressed.clear();
        self.compressed.reserve(bound);
        let compressor =
            if self.raw.len() < SMALL_FRAME_BYTES { &mut self.small_compressor } else { &mut self.compressor };
        compressor.compress_to_buffer(&self.raw, &mut self.compressed)?;
        let header = FrameHeader {
            kind,
            record_kinds,
            flags,
            compressed_len: len_u32(self.compressed.len())?,
            raw_len: len_u32(self.raw.len())?,
            payload_crc: crc32fast::hash(&self.compressed),
        };
        let out = self.out.as_mut().expect("out is only taken by finish, which consumes the writer");
        out.write_all(&header.encode())?;
        out.write_all(&self.compressed)?;
        out.flush()?;
        self.offset += (format::FRAME_HEADER_LEN + self.compressed.len()) as u64;
        self.raw.clear();
        self.raw_kinds = 0;
        if kind == FrameKind::Records {
            self.last_frame_step = self.last_step;
        }
        Ok(())
    }
}

impl<W: Write> Drop for TraceWriter<W> {
    /// A writer dropped without `finish` (an error path, a panic) still
    /// writes what it buffered, leaving a readable truncated trace.
    fn drop(&mut self) {
        if self.out.is_some() && !self.raw.is_empty() {
            let _ = self.write_frame(FrameKind::Records);
        }
    }
}

fn len_u32(len: usize) -> io::Result<u32> {
    let limit = format::MAX_RAW_FRAME.min(format::MAX_COMPRESSED_FRAME) as usize;
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a single trace record of {len} bytes exceeds the frame limit of {limit} bytes"),
        ));
    }
    Ok(len as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{PlanStep, PolicyTurn};
    use crate::reader::{Tail, read_trace_from};

    fn turn(bytes: usize) -> Body {
        Body::PolicyTurn(PolicyTurn { content: "x".repeat(bytes), ..Default::default() })
    }

    /// A big record appended to a nearly full buffer made a frame over the
    /// limit: that write failed and every later one too, losing records
    /// already accepted. Now the buffer is closed first, and a record too big
    /// for any frame is refused alone. Sizes follow the real limits (the
    /// largest allocation is one limit's worth of record, raw and compressed
    /// bytes: under 200 MB).
    #[test]
    fn a_record_that_would_overfill_the_frame_goes_to_the_next_and_one_too_big_is_refused_alone() {
        let mut w = TraceWriter::new(Vec::new(), Header::default(), DEFAULT_ZSTD_LEVEL).unwrap();
        let plan = Body::PlanStep(Box::new(PlanStep { index: 1, tool: "t".into(), ..Default::default() }));
        w.append(1, plan).unwrap();
        let nearly_full = FRAME_FLUSH_THRESHOLD - (1 << 10);
        w.append(1, turn(nearly_full)).unwrap();
        assert!(!w.raw.is_empty(), "the buffer is still open");
        let overfilling = format::MAX_RAW_FRAME as usize - nearly_full + (1 << 10);
        w.append(1, turn(overfilling)).unwrap();

        let err = w.append(1, turn(format::MAX_RAW_FRAME as usize)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let message = err.to_string();
        assert!(message.contains("step 1") && message.contains(&FRAME_RAW_LIMIT.to_string()), "{message}");
        w.append(1, turn(3)).unwrap();
        w.end_step().unwrap();
        let bytes = w.finish(EpisodeEnd { steps: 1, ..Default::default() }).unwrap();

        let trace = read_trace_from(bytes.as_slice(), "t").unwrap();
        assert!(matches!(trace.tail, Tail::Complete), "{:?}", trace.tail);
        let sizes: Vec<usize> = trace
            .records
            .iter()
            .map(|r| match &r.body {
                Some(Body::PolicyTurn(t)) => t.content.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(sizes, [0, nearly_full, overfilling, 3, 0]);
    }

    #[test]
    fn a_full_frame_compresses_within_the_compressed_limit() {
        assert!(FRAME_RAW_LIMIT <= format::MAX_RAW_FRAME as usize);
        assert!(zstd::zstd_safe::compress_bound(FRAME_RAW_LIMIT) <= format::MAX_COMPRESSED_FRAME as usize);
    }
}
