//! The trace benchmark: `cargo bench -p basecamp-trace --bench trace` (`make bench-trace`).
//!
//! Every throughput comes with peers measured in the same run, interleaved
//! round-robin so that a noisy neighbour slows them alike: the bare `prost`
//! encode/decode of the same records (the floor), the structs prost would
//! generate for token logits (the peer of the hand-written `TokenLogit`),
//! zstd on its own, and gzip.
//! Each case is sampled `REPS` times; the figures are medians with min/max,
//! and ratios are taken per round before their median. Sizes (memory deltas
//! vs snapshots, zstd vs gzip) are deterministic and measured once.
//!
//! Input: the realistic synthetic episode (`EpisodeShape::default()`: 50
//! steps, 20 memory keys, 200 tokens x top-5 logits per step). Output: a
//! table on stdout and `bench/results/trace.json`. MB means 10^6 bytes.
//! `TRACE_BENCH_REPS` and `TRACE_BENCH_SAMPLE_MS` override the sampling; a
//! filter argument (`cargo bench -p basecamp-trace --bench trace -- read.`)
//! times only the cases whose names contain it, for profiling, and writes no file.

use std::fs::{self, File};
use std::hint::black_box;
use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use basecamp_bench_support::{TempDir, env_or, git_commit, machine, utc_now, write_results};
use basecamp_trace::format::{self, FRAME_HEADER_LEN, FrameHeader, FrameKind, PREAMBLE_LEN};
use basecamp_trace::json::{TraceJson, trace_to_json, write_trace_json};
use basecamp_trace::otlp;
use basecamp_trace::pb::{EpisodeEnd, Record, record::Body};
use basecamp_trace::redact::{Pattern, Redactor};
use basecamp_trace::synthetic::{self, EpisodeShape, MemoryMode, SyntheticEpisode};
use basecamp_trace::token_logit::generated;
use basecamp_trace::{
    RecordKind, Tail, TraceContents, TraceReader, TraceWriter, read_trace, read_trace_from, read_trace_from_without,
};
use flate2::Compression;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use prost::Message;
use serde_json::{Value, json};

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../bench/results/trace.json");
const ZSTD_LEVEL: i32 = 3;
const GZIP_LEVEL: u32 = 6;
const DEFAULT_REPS: usize = 9;
const DEFAULT_SAMPLE_MS: u64 = 100;

const TARGET_WRITE_RECORDS_PER_S: f64 = 300_000.0;
const TARGET_READ_MB_PER_S: f64 = 500.0;
const TARGET_MEMORY_REDUCTION_PCT: f64 = 95.0;
const CLAIM_MEMORY_REDUCTION_PCT: f64 = 87.0;
const CLAIM_ZSTD_SMALLER_PCT: f64 = 40.0;

fn main() {
    let reps = env_or("TRACE_BENCH_REPS", DEFAULT_REPS).max(1);
    let sample_ms = env_or("TRACE_BENCH_SAMPLE_MS", DEFAULT_SAMPLE_MS).max(1);
    let started = Instant::now();
    let shape = EpisodeShape::default();
    let episode = synthetic::generate(&shape);
    let input = Input::new(&episode);
    let tmp = TempDir::new("trace");

    let mut cases = timed_cases(&episode, &input, tmp.path());
    // `cargo bench` passes `--bench`; any other argument filters the cases.
    if let Some(filter) = std::env::args().skip(1).find(|a| !a.starts_with("--")) {
        cases.retain(|c| c.name.contains(&filter));
        run_round_robin(&mut cases, reps, sample_ms as f64 / 1000.0);
        for c in &cases {
            let t = c.time_per_iter();
            println!("{:<28} {} ms/iter", c.name, range(t, 1e3, 3, ""));
        }
        return;
    }
    run_round_robin(&mut cases, reps, sample_ms as f64 / 1000.0);

    let memory = memory_section(&shape);
    let compression = compression_sizes(&input);
    let report = Report { shape: &shape, input: &input, cases: &cases, memory: &memory, compression: &compression };
    report.print(reps, sample_ms);
    let json = report.to_json(reps, sample_ms, started.elapsed().as_secs_f64());
    write_results(RESULTS, &json);
    let path = Path::new(RESULTS);
    println!("\nwrote {} in {:.1} s", path.display(), started.elapsed().as_secs_f64());
}

// ---- the input, prepared once -------------------------------------------------

/// The episode's records exactly as the writer encodes them, frame by frame,
/// plus the writer's own output, checked against each other.
struct Input {
    /// Header (with the schema version the writer sets), every step's records, the episode end.
    records: Vec<Record>,
    /// Length-delimited record bytes of each records frame the writer makes:
    /// the header frame, one per step, the episode-end frame.
    frames: Vec<Vec<u8>>,
    /// All of `frames` concatenated: the raw encoded bytes of the episode.
    raw: Vec<u8>,
    /// The `.trace` file as `SyntheticEpisode::write_to` makes it.
    trace: Vec<u8>,
    /// Decompressed bytes a reader goes through: every frame's raw length, index included.
    decompressed_len: u64,
    frame_count: usize,
    /// The trace as the reader returns it (for the JSON document cases).
    contents: TraceContents,
    /// Length of its pretty JSON document (`trace parse`'s output).
    json_len: u64,
}

impl Input {
    fn new(episode: &SyntheticEpisode) -> Self {
        let mut header = episode.header.clone();
        (header.schema_major, header.schema_minor) = (format::SCHEMA_MAJOR, format::SCHEMA_MINOR);
        let last_step = episode.steps.last().and_then(|s| s.last()).map_or(0, |r| r.step);
        let mut groups = vec![vec![Record { step: 0, body: Some(Body::Header(Box::new(header))) }]];
        // Format 2: a step's token_logit records go in frames of their own,
        // so each step is framed as its runs of token / other records.
        for step in &episode.steps {
            let mut runs: Vec<Vec<Record>> = Vec::new();
            for record in step {
                let token = matches!(record.body, Some(Body::TokenLogit(_)));
                match runs.last_mut() {
                    Some(run) if matches!(run[0].body, Some(Body::TokenLogit(_))) == token => run.push(record.clone()),
                    _ => runs.push(vec![record.clone()]),
                }
            }
            groups.extend(runs);
        }
        groups.push(vec![Record { step: last_step, body: Some(Body::EpisodeEnd(episode.end.clone())) }]);
        let frames: Vec<Vec<u8>> = groups.iter().map(|g| encode_all(g)).collect();
        let records: Vec<Record> = groups.into_iter().flatten().collect();
        assert_eq!(records.len(), episode.record_count());
        let raw = frames.concat();
        let trace = episode.write_to(Vec::new(), ZSTD_LEVEL).expect("writing into a Vec cannot fail");

        // The writer must have framed exactly these bytes, or the peers measure something else.
        let mut walker = FrameWalker::new();
        let mut record_frames = Vec::new();
        let walked = walker.walk(&trace, |kind, raw| {
            if kind == FrameKind::Records {
                record_frames.push(raw.to_vec());
            }
        });
        assert_eq!(record_frames, frames, "the bench's encoding differs from the writer's");
        let read = read_trace_from(&trace[..], "bench.trace").expect("the writer's trace reads back");
        assert!(matches!(read.tail, Tail::Complete), "the writer's trace reads back damaged: {:?}", read.tail);
        assert_eq!(read.records[..], records[1..], "the reader returns other records than were written");
        let pretty = serde_json::to_vec_pretty(&TraceJson { file: "bench.trace", trace: &read }).expect("JSON");
        let old = serde_json::to_vec_pretty(&trace_to_json("bench.trace", &read)).expect("JSON");
        assert!(pretty == old, "the streamed JSON document differs from the Value document");
        Self {
            records,
            frames,
            raw,
            trace,
            decompressed_len: walked.raw_bytes,
            frame_count: walked.frames,
            contents: read,
            json_len: pretty.len() as u64,
        }
    }
}

fn encode_all(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        r.encode_length_delimited(&mut out).expect("encoding into a Vec cannot run out of space");
    }
    out
}

/// Walks the frames of an in-memory trace with the public `format` items:
/// header check, payload crc32, zstd decompression, as the library's private
/// frame reader does, without decoding records.
struct FrameWalker {
    decompressor: zstd::bulk::Decompressor<'static>,
    compressed: Vec<u8>,
    raw: Vec<u8>,
}

struct Walked {
    frames: usize,
    raw_bytes: u64,
}

impl FrameWalker {
    fn new() -> Self {
        let decompressor = zstd::bulk::Decompressor::new().expect("a zstd context");
        Self { decompressor, compressed: Vec::new(), raw: Vec::new() }
    }

    fn walk(&mut self, trace: &[u8], mut on_frame: impl FnMut(FrameKind, &[u8])) -> Walked {
        let mut at = PREAMBLE_LEN;
        let mut walked = Walked { frames: 0, raw_bytes: 0 };
        loop {
            let header_bytes: &[u8; FRAME_HEADER_LEN] =
                trace[at..at + FRAME_HEADER_LEN].try_into().expect("a slice of FRAME_HEADER_LEN bytes");
            let header = FrameHeader::decode(header_bytes).expect("the bench's own trace is intact");
            at += FRAME_HEADER_LEN;
            // Copied like the library's reader does from its `Read`.
            self.compressed.clear();
            self.compressed.extend_from_slice(&trace[at..at + header.compressed_len as usize]);
            at += header.compressed_len as usize;
            assert_eq!(crc32fast::hash(&self.compressed), header.payload_crc);
            self.raw.clear();
            self.raw.reserve(header.raw_len as usize);
            let n = self.decompressor.decompress_to_buffer(&self.compressed, &mut self.raw).expect("valid zstd");
            assert_eq!(n, header.raw_len as usize);
            on_frame(header.kind, &self.raw);
            walked.frames += 1;
            walked.raw_bytes += n as u64;
            if header.kind == FrameKind::Index {
                return walked;
            }
        }
    }
}

// ---- timed cases ---------------------------------------------------------------

/// One timed operation. `records` and `bytes` are what one iteration handles.
struct Case<'a> {
    name: &'static str,
    what: &'static str,
    records: u64,
    bytes: u64,
    bytes_are: &'static str,
    run: Box<dyn FnMut() + 'a>,
    iters: u32,
    /// Seconds per iteration, one entry per round.
    secs: Vec<f64>,
}

impl<'a> Case<'a> {
    fn new(name: &'static str, what: &'static str, run: impl FnMut() + 'a) -> Self {
        Self { name, what, records: 0, bytes: 0, bytes_are: "", run: Box::new(run), iters: 1, secs: Vec::new() }
    }

    fn records(mut self, n: usize) -> Self {
        self.records = n as u64;
        self
    }

    fn bytes(mut self, n: u64, are: &'static str) -> Self {
        (self.bytes, self.bytes_are) = (n, are);
        self
    }

    fn time_per_iter(&self) -> Stats {
        Stats::of(&self.secs)
    }

    fn records_per_s(&self) -> Option<Stats> {
        (self.records > 0).then(|| Stats::of_rates(&self.secs, self.records as f64))
    }

    fn mb_per_s(&self) -> Option<Stats> {
        (self.bytes > 0).then(|| Stats::of_rates(&self.secs, self.bytes as f64 / 1e6))
    }
}

fn timed_cases<'a>(episode: &'a SyntheticEpisode, input: &'a Input, tmp: &'a Path) -> Vec<Case<'a>> {
    let n = input.records.len();
    let raw_len = input.raw.len() as u64;
    let decompressed = input.decompressed_len;
    let file_path = tmp.join("episode.trace");
    let read_path = tmp.join("read.trace");
    fs::write(&read_path, &input.trace).expect("write the trace the file reader reads");

    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context");
    let mut parts_compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL).expect("a zstd context");
    let mut decompressor = zstd::bulk::Decompressor::new().expect("a zstd context");
    let zstd_frames: Vec<Vec<u8>> =
        input.frames.iter().map(|f| zstd::bulk::compress(f, ZSTD_LEVEL).expect("zstd compresses")).collect();
    let gzip_frames: Vec<Vec<u8>> = input.frames.iter().map(|f| gzip(f)).collect();
    let mut walker = FrameWalker::new();
    let redactor =
        Redactor::new(["order_id".to_string()], vec![Pattern::Email, Pattern::Phone], b"bench-salt".to_vec());

    vec![
        // Writing.
        Case::new(
            "write.writer.vec",
            "SyntheticEpisode::write_to(Vec::new(), 3): encode + zstd + framing + index",
            || {
                black_box(episode.write_to(Vec::new(), ZSTD_LEVEL).expect("writing into a Vec cannot fail"));
            },
        )
        .records(n)
        .bytes(raw_len, "raw encoded record bytes"),
        Case::new(
            "write.writer.file",
            "File::create + write_to(file, 3) in a temp dir (page cache, no fsync)",
            move || {
                let file = File::create(&file_path).expect("create the bench's temp file");
                black_box(episode.write_to(file, ZSTD_LEVEL).expect("write the bench's temp file"));
            },
        )
        .records(n)
        .bytes(raw_len, "raw encoded record bytes"),
        Case::new("write.floor.prost_encode", "prost encode_length_delimited of the same records into one Vec", || {
            black_box(encode_all(&input.records));
        })
        .records(n)
        .bytes(raw_len, "raw encoded record bytes"),
        Case::new(
            "write.parts.encode_zstd_crc",
            "the writer's parts by hand: per frame prost encode + zstd level 3 (reused context) + crc32",
            move || {
                let mut out = Vec::new();
                let (mut raw, mut compressed) = (Vec::new(), Vec::new());
                let mut start = 0;
                for frame in &input.frames {
                    raw.clear();
                    let mut end = start;
                    while raw.len() < frame.len() {
                        input.records[end].encode_length_delimited(&mut raw).expect("encoding into a Vec");
                        end += 1;
                    }
                    start = end;
                    compressed.clear();
                    compressed.reserve(zstd::zstd_safe::compress_bound(raw.len()));
                    parts_compressor.compress_to_buffer(&raw, &mut compressed).expect("zstd compresses");
                    out.extend_from_slice(&crc32fast::hash(&compressed).to_le_bytes());
                    out.extend_from_slice(&compressed);
                }
                black_box(out);
            },
        )
        .records(n)
        .bytes(raw_len, "raw encoded record bytes"),
        Case::new(
            "zstd3.compress.per_frame",
            "zstd level 3 of each pre-encoded frame (reused context, as the writer)",
            {
                let mut out = Vec::new();
                move || {
                    for frame in &input.frames {
                        out.clear();
                        out.reserve(zstd::zstd_safe::compress_bound(frame.len()));
                        compressor.compress_to_buffer(frame, &mut out).expect("zstd compresses");
                        black_box(&out);
                    }
                }
            },
        )
        .bytes(raw_len, "raw encoded record bytes (input)"),
        Case::new("zstd3.compress.whole", "zstd::bulk::compress(all raw bytes, 3) in one shot", || {
            black_box(zstd::bulk::compress(&input.raw, ZSTD_LEVEL).expect("zstd compresses"));
        })
        .bytes(raw_len, "raw encoded record bytes (input)"),
        Case::new("gzip6.compress.per_frame", "flate2 GzEncoder level 6 of each frame (new encoder each)", || {
            for frame in &input.frames {
                black_box(gzip(frame));
            }
        })
        .bytes(raw_len, "raw encoded record bytes (input)"),
        Case::new("gzip6.compress.whole", "flate2 GzEncoder level 6 of all raw bytes in one stream", || {
            black_box(gzip(&input.raw));
        })
        .bytes(raw_len, "raw encoded record bytes (input)"),
        // Reading.
        Case::new(
            "read.read_trace_from.slice",
            "read_trace_from(&bytes[..]): frames + full decode into Records",
            || {
                let contents = read_trace_from(&input.trace[..], "bench.trace").expect("the bench's trace reads");
                black_box(contents.records);
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed bytes"),
        Case::new(
            "read.without_token_logits.slice",
            "read_trace_from_without(&bytes[..], [TokenLogit]): every record but the token logits (their frames skipped undecompressed), as serve's catalog, basecamp run's root causes and data preprocess read",
            || {
                let contents = read_trace_from_without(&input.trace[..], "bench.trace", &[RecordKind::TokenLogit])
                    .expect("the bench's trace reads");
                black_box(contents.records);
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed bytes of the whole trace"),
        Case::new(
            "read.next_raw.slice",
            "TraceReader::next_raw over &bytes[..]: frames verified + every record's step and section, bodies not decoded",
            || {
                let mut reader = TraceReader::new(&input.trace[..], "bench.trace").expect("the bench's trace reads");
                let mut count = 0usize;
                while let Some(raw) = reader.next_raw() {
                    count += black_box(raw.expect("the bench's trace is intact").bytes.len());
                }
                black_box(count);
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed bytes"),
        Case::new(
            "read.read_trace.file",
            "read_trace(path) of the same trace in a temp file (page cache)",
            move || {
                black_box(read_trace(&read_path).expect("the bench's trace reads").records);
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed bytes"),
        Case::new(
            "read.frames_only.walker",
            "frames only, walked in the bench with public format:: items: header check + crc32 + zstd decompress",
            move || {
                black_box(walker.walk(&input.trace, |_, raw| {
                    black_box(raw);
                }));
            },
        )
        .bytes(decompressed, "decompressed bytes"),
        Case::new(
            "read.floor.prost_decode",
            "prost decode_length_delimited of all raw bytes into a Vec<Record> (prost's field loop, through the \
             hand-written TokenLogit's merge_field)",
            || {
                let mut slice = input.raw.as_slice();
                let mut records = Vec::new();
                while !slice.is_empty() {
                    records.push(Record::decode_length_delimited(&mut slice).expect("the bench's bytes decode"));
                }
                black_box(records);
            },
        )
        .records(n)
        .bytes(raw_len, "raw encoded record bytes"),
        Case::new(
            "read.peer.prost_generated",
            "the same bytes into prost-generated structs (String/Vec token logits, as before 8eee662); records of \
             other kinds skipped, not decoded",
            || {
                let mut slice = input.raw.as_slice();
                let mut records = Vec::new();
                while !slice.is_empty() {
                    records.push(generated::Record::decode_length_delimited(&mut slice).expect("the bench's bytes decode"));
                }
                black_box(records);
            },
        )
        .records(n)
        .bytes(raw_len, "raw encoded record bytes"),
        // The JSON document of `trace parse` (into a sink: no I/O).
        Case::new(
            "json.pretty.streamed",
            "TraceJson written pretty into io::sink(): one record's Value at a time (trace parse --output json)",
            || {
                let doc = TraceJson { file: "bench.trace", trace: &input.contents };
                serde_json::to_writer_pretty(std::io::sink(), &doc).expect("a sink takes everything");
            },
        )
        .records(n)
        .bytes(input.json_len, "pretty JSON bytes written"),
        Case::new(
            "json.pretty.value_document",
            "the same text through one Value of the whole document (trace_to_json), as trace parse built it before",
            || {
                let doc = trace_to_json("bench.trace", &input.contents);
                serde_json::to_writer_pretty(std::io::sink(), &doc).expect("a sink takes everything");
            },
        )
        .records(n)
        .bytes(input.json_len, "pretty JSON bytes written"),
        // The whole of `trace parse FILE`: from the file's bytes to the text.
        Case::new(
            "json.parse.two_reads",
            "write_trace_json pretty into io::sink(): count the records, then read them again one at a time as they are \
             written (trace parse FILE)",
            || {
                let open = || TraceReader::new(&input.trace[..], "bench.trace");
                write_trace_json(open, "bench.trace", std::io::sink(), true).expect("the bench's trace reads");
            },
        )
        .records(n)
        .bytes(input.json_len, "pretty JSON bytes written"),
        Case::new(
            "json.parse.held",
            "read_trace_from, then TraceJson pretty into io::sink(): one read, the trace held whole (trace parse before)",
            || {
                let trace = basecamp_trace::read_trace_from(&input.trace[..], "bench.trace").expect("the bench's trace");
                let doc = TraceJson { file: "bench.trace", trace: &trace };
                serde_json::to_writer_pretty(std::io::sink(), &doc).expect("a sink takes everything");
            },
        )
        .records(n)
        .bytes(input.json_len, "pretty JSON bytes written"),
        // `trace export --otlp` of the same trace (read + spans + compact JSON text).
        Case::new(
            "otlp.export.typed",
            "otlp::export_request + serde_json::to_string: the request written as it serializes (trace export --otlp)",
            || {
                let reader = TraceReader::new(&input.trace[..], "bench.trace").expect("the bench's trace reads");
                let (request, _) = otlp::export_request(reader);
                black_box(serde_json::to_string(&request).expect("JSON"));
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed trace bytes"),
        Case::new(
            "otlp.export.value_document",
            "the same text through one Value of the request (otlp::export), as trace export built it before",
            || {
                let reader = TraceReader::new(&input.trace[..], "bench.trace").expect("the bench's trace reads");
                let (doc, _) = otlp::export(reader);
                black_box(doc.to_string());
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed trace bytes"),
        // `trace redact` of the same trace (two reads, one write) against
        // a copy that reads and writes it unchanged.
        Case::new(
            "redact.order_id_email_phone",
            "Redactor::redact, --pii-fields order_id --patterns email,phone: the PII pass, then the copy",
            move || {
                let open = || TraceReader::new(&input.trace[..], "bench.trace");
                black_box(redactor.redact(open, Vec::new(), "out.trace").expect("the bench's trace redacts"));
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed trace bytes"),
        Case::new(
            "redact.floor.copy",
            "the same trace read and written again unchanged (TraceReader -> TraceWriter, one step per frame group)",
            || {
                black_box(copy_trace(&input.trace));
            },
        )
        .records(n)
        .bytes(decompressed, "decompressed trace bytes"),
        Case::new("zstd3.decompress.per_frame", "zstd decompression of each frame (reused context)", {
            let mut out = Vec::new();
            move || {
                for (compressed, frame) in zstd_frames.iter().zip(&input.frames) {
                    out.clear();
                    out.reserve(frame.len());
                    decompressor.decompress_to_buffer(compressed, &mut out).expect("valid zstd");
                    black_box(&out);
                }
            }
        })
        .bytes(raw_len, "raw encoded record bytes (output)"),
        Case::new("gzip6.decompress.per_frame", "flate2 GzDecoder of each frame", {
            let mut out = Vec::new();
            move || {
                for compressed in &gzip_frames {
                    out.clear();
                    GzDecoder::new(&compressed[..]).read_to_end(&mut out).expect("valid gzip");
                    black_box(&out);
                }
            }
        })
        .bytes(raw_len, "raw encoded record bytes (output)"),
    ]
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(data.len() / 2), Compression::new(GZIP_LEVEL));
    encoder.write_all(data).expect("writing into a Vec cannot fail");
    encoder.finish().expect("finishing into a Vec cannot fail")
}

/// Calibrates each case to about `sample_s` per sample, then runs `reps`
/// rounds, each timing every case once in turn.
fn run_round_robin(cases: &mut [Case], reps: usize, sample_s: f64) {
    for case in cases.iter_mut() {
        (case.run)();
        let t = Instant::now();
        (case.run)();
        let once = t.elapsed().as_secs_f64().max(1e-9);
        case.iters = (sample_s / once).ceil().clamp(1.0, 1e6) as u32;
    }
    for _ in 0..reps {
        for case in cases.iter_mut() {
            let t = Instant::now();
            for _ in 0..case.iters {
                (case.run)();
            }
            case.secs.push(t.elapsed().as_secs_f64() / f64::from(case.iters));
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(values: &[f64]) -> Self {
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 { v[mid] } else { (v[mid - 1] + v[mid]) / 2.0 };
        Self { median, min: v[0], max: v[v.len() - 1] }
    }

    /// `amount / seconds` for each sample.
    fn of_rates(secs: &[f64], amount: f64) -> Self {
        Self::of(&secs.iter().map(|s| amount / s).collect::<Vec<_>>())
    }

    fn json(&self) -> Value {
        json!({"median": self.median, "min": self.min, "max": self.max})
    }
}

/// Reads a trace and writes it again unchanged, with the same step framing.
fn copy_trace(trace: &[u8]) -> Vec<u8> {
    let mut reader = TraceReader::new(trace, "bench.trace").expect("the bench's trace reads");
    let level = basecamp_trace::writer::DEFAULT_ZSTD_LEVEL;
    let mut writer = TraceWriter::new(Vec::new(), reader.header().clone(), level).expect("a Vec takes the header");
    let (mut step, mut end) = (None, EpisodeEnd::default());
    for record in reader.by_ref() {
        let record = record.expect("the bench's trace reads");
        if let Some(Body::EpisodeEnd(e)) = record.body {
            end = e;
            continue;
        }
        if step.is_some_and(|s| s != record.step) {
            writer.end_step().expect("a Vec takes a step");
        }
        step = Some(record.step);
        writer.write_record(&record).expect("a Vec takes a record");
    }
    writer.end_step().expect("a Vec takes a step");
    writer.finish(end).expect("a Vec takes the end")
}

fn case<'c, 'a>(cases: &'c [Case<'a>], name: &str) -> &'c Case<'a> {
    cases.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no case named {name}"))
}

/// Per-round ratio of time(numerator) / sum of time(denominators).
fn time_ratio(cases: &[Case], numerator: &str, denominators: &[&str]) -> Stats {
    let num = &case(cases, numerator).secs;
    let ratios: Vec<f64> =
        (0..num.len()).map(|i| num[i] / denominators.iter().map(|d| case(cases, d).secs[i]).sum::<f64>()).collect();
    Stats::of(&ratios)
}

/// The ratios the report shows: (label, numerator, denominators).
const RATIOS: [(&str, &str, &[&str]); 16] = [
    ("writer (Vec) / bare prost encode", "write.writer.vec", &["write.floor.prost_encode"]),
    ("writer (Vec) / its parts by hand (encode+zstd+crc)", "write.writer.vec", &["write.parts.encode_zstd_crc"]),
    ("writer (Vec) / zstd-3 per frame alone", "write.writer.vec", &["zstd3.compress.per_frame"]),
    ("writer (file) / writer (Vec)", "write.writer.file", &["write.writer.vec"]),
    ("read_trace_from / bare prost decode", "read.read_trace_from.slice", &["read.floor.prost_decode"]),
    (
        "read_trace_from / (frames only + prost decode)",
        "read.read_trace_from.slice",
        &["read.frames_only.walker", "read.floor.prost_decode"],
    ),
    (
        "read_trace_from / (frames only + prost-generated decode)",
        "read.read_trace_from.slice",
        &["read.frames_only.walker", "read.peer.prost_generated"],
    ),
    ("bare prost decode / prost-generated token logits", "read.floor.prost_decode", &["read.peer.prost_generated"]),
    ("read_trace (file) / read_trace_from (slice)", "read.read_trace.file", &["read.read_trace_from.slice"]),
    (
        "read_trace_from / the same without token logits",
        "read.read_trace_from.slice",
        &["read.without_token_logits.slice"],
    ),
    ("JSON document: whole Value / streamed", "json.pretty.value_document", &["json.pretty.streamed"]),
    ("trace parse: two reads, streamed / one read, held", "json.parse.two_reads", &["json.parse.held"]),
    ("OTLP export: Value request / typed request", "otlp.export.value_document", &["otlp.export.typed"]),
    ("redact / copy unchanged", "redact.order_id_email_phone", &["redact.floor.copy"]),
    ("gzip-6 / zstd-3 compress time, per frame", "gzip6.compress.per_frame", &["zstd3.compress.per_frame"]),
    ("gzip / zstd decompress time, per frame", "gzip6.decompress.per_frame", &["zstd3.decompress.per_frame"]),
];

// ---- sizes ---------------------------------------------------------------------

/// The memory section of one episode, one way of recording memory.
struct MemorySizes {
    records: usize,
    /// Steps after step 0 without any memory record.
    steps_without_memory: usize,
    /// Length-delimited encoded bytes of the memory records: all steps, and steps >= 1.
    encoded_all: u64,
    encoded_steps: u64,
    /// The memory records alone written through a `TraceWriter` (one zstd-3
    /// frame per step, frame headers included): all steps, and steps >= 1.
    on_disk_all: u64,
    on_disk_steps: u64,
    /// The whole `.trace` file of the episode.
    file: u64,
    /// What the memory records of steps >= 1 add to the whole file: `file`
    /// minus the file of the same episode without them. Their on-disk cost
    /// where they really live, sharing frames with the step's other records.
    file_marginal_steps: u64,
}

fn is_memory(r: &Record) -> bool {
    matches!(r.body, Some(Body::MemoryDelta(_) | Body::MemorySnapshot(_)))
}

fn memory_sizes(shape: &EpisodeShape) -> MemorySizes {
    let episode = synthetic::generate(shape);
    let mut writer = TraceWriter::new(Vec::new(), episode.header.clone(), ZSTD_LEVEL).expect("a writer into a Vec");
    let start = writer.bytes_written();
    let (mut after_step0, mut encoded_step0) = (start, 0);
    let mut sizes = MemorySizes {
        records: 0,
        steps_without_memory: 0,
        encoded_all: 0,
        encoded_steps: 0,
        on_disk_all: 0,
        on_disk_steps: 0,
        file: 0,
        file_marginal_steps: 0,
    };
    for (i, step) in episode.steps.iter().enumerate() {
        let memory: Vec<&Record> = step.iter().filter(|r| is_memory(r)).collect();
        if i > 0 && memory.is_empty() {
            sizes.steps_without_memory += 1;
        }
        for r in memory {
            sizes.records += 1;
            sizes.encoded_all += (r.encoded_len() + prost::length_delimiter_len(r.encoded_len())) as u64;
            writer.write_record(r).expect("writing into a Vec cannot fail");
        }
        writer.end_step().expect("writing into a Vec cannot fail");
        if i == 0 {
            (after_step0, encoded_step0) = (writer.bytes_written(), sizes.encoded_all);
        }
    }
    sizes.on_disk_all = writer.bytes_written() - start;
    sizes.on_disk_steps = writer.bytes_written() - after_step0;
    sizes.encoded_steps = sizes.encoded_all - encoded_step0;
    writer.finish(EpisodeEnd::default()).expect("writing into a Vec cannot fail");
    sizes.file = file_len(&episode);
    let mut stripped = episode.clone();
    for step in stripped.steps.iter_mut().skip(1) {
        step.retain(|r| !is_memory(r));
    }
    sizes.file_marginal_steps = sizes.file - file_len(&stripped);
    sizes
}

fn file_len(episode: &SyntheticEpisode) -> u64 {
    episode.write_to(Vec::new(), ZSTD_LEVEL).expect("writing into a Vec cannot fail").len() as u64
}

struct MemorySection {
    deltas: MemorySizes,
    snapshots: MemorySizes,
    /// (memory keys, reduction % encoded steps >= 1, reduction % on disk steps >= 1), other shapes for context.
    by_keys: Vec<(usize, f64, f64)>,
}

fn memory_section(shape: &EpisodeShape) -> MemorySection {
    let with_mode = |memory_mode, memory_keys| EpisodeShape { memory_mode, memory_keys, ..shape.clone() };
    let deltas = memory_sizes(&with_mode(MemoryMode::Deltas, shape.memory_keys));
    let snapshots = memory_sizes(&with_mode(MemoryMode::Snapshots, shape.memory_keys));
    let by_keys = [5, 20, 50, 100]
        .into_iter()
        .map(|keys| {
            let d = memory_sizes(&with_mode(MemoryMode::Deltas, keys));
            let s = memory_sizes(&with_mode(MemoryMode::Snapshots, keys));
            (keys, reduction(d.encoded_steps, s.encoded_steps), reduction(d.on_disk_steps, s.on_disk_steps))
        })
        .collect();
    MemorySection { deltas, snapshots, by_keys }
}

fn reduction(smaller: u64, larger: u64) -> f64 {
    100.0 * (1.0 - smaller as f64 / larger as f64)
}

struct CompressionSizes {
    raw_per_frame: u64,
    zstd_per_frame: u64,
    gzip_per_frame: u64,
    raw_whole: u64,
    zstd_whole: u64,
    gzip_whole: u64,
    trace_file: u64,
}

fn compression_sizes(input: &Input) -> CompressionSizes {
    let sum = |f: &dyn Fn(&[u8]) -> usize| input.frames.iter().map(|frame| f(frame) as u64).sum::<u64>();
    CompressionSizes {
        raw_per_frame: sum(&|f| f.len()),
        zstd_per_frame: sum(&|f| zstd::bulk::compress(f, ZSTD_LEVEL).expect("zstd compresses").len()),
        gzip_per_frame: sum(&|f| gzip(f).len()),
        raw_whole: input.raw.len() as u64,
        zstd_whole: zstd::bulk::compress(&input.raw, ZSTD_LEVEL).expect("zstd compresses").len() as u64,
        gzip_whole: gzip(&input.raw).len() as u64,
        trace_file: input.trace.len() as u64,
    }
}

// ---- report --------------------------------------------------------------------

struct Report<'r, 'a> {
    shape: &'r EpisodeShape,
    input: &'r Input,
    cases: &'r [Case<'a>],
    memory: &'r MemorySection,
    compression: &'r CompressionSizes,
}

struct Target {
    name: &'static str,
    kind: &'static str,
    measure: &'static str,
    value: f64,
    threshold: f64,
    unit: &'static str,
}

impl Target {
    fn met(&self) -> bool {
        self.value >= self.threshold
    }
}

impl Report<'_, '_> {
    fn targets(&self) -> Vec<Target> {
        let c = self.compression;
        let m = self.memory;
        let write = case(self.cases, "write.writer.vec").records_per_s().expect("the writer counts records");
        let read = case(self.cases, "read.read_trace_from.slice").mb_per_s().expect("the reader counts bytes");
        let scan = case(self.cases, "read.next_raw.slice").mb_per_s().expect("the scan counts bytes");
        let memory_on_disk = reduction(m.deltas.on_disk_all, m.snapshots.on_disk_all);
        vec![
            Target {
                name: "write_records_per_s",
                kind: "target",
                measure: "median records/s of write_to(Vec, zstd 3), one core",
                value: write.median,
                threshold: TARGET_WRITE_RECORDS_PER_S,
                unit: "records/s",
            },
            Target {
                name: "read_decompressed_mb_per_s",
                kind: "target",
                measure: "median decompressed MB/s of read_trace_from(&[u8]) with full decode",
                value: read.median,
                threshold: TARGET_READ_MB_PER_S,
                unit: "MB/s",
            },
            Target {
                name: "read_decompressed_mb_per_s_record_scan",
                kind: "target",
                measure: "median decompressed MB/s of TraceReader::next_raw (verified frames, record boundaries, steps and sections; bodies decoded on demand)",
                value: scan.median,
                threshold: TARGET_READ_MB_PER_S,
                unit: "MB/s",
            },
            Target {
                name: "memory_delta_reduction_pct",
                kind: "target",
                measure: "memory records on disk (zstd 3, per-step frames), all steps: 1 - deltas/snapshots",
                value: memory_on_disk,
                threshold: TARGET_MEMORY_REDUCTION_PCT,
                unit: "%",
            },
            Target {
                name: "memory_delta_reduction_pct_reference_claim",
                kind: "reference claim",
                measure: "same measure as memory_delta_reduction_pct",
                value: memory_on_disk,
                threshold: CLAIM_MEMORY_REDUCTION_PCT,
                unit: "%",
            },
            Target {
                name: "zstd3_smaller_than_gzip6_pct_reference_claim",
                kind: "reference claim",
                measure: "per-frame record bytes: 1 - zstd3/gzip6",
                value: reduction(c.zstd_per_frame, c.gzip_per_frame),
                threshold: CLAIM_ZSTD_SMALLER_PCT,
                unit: "%",
            },
        ]
    }

    fn print(&self, reps: usize, sample_ms: u64) {
        let input = self.input;
        println!(
            "trace bench: {} steps, {} memory keys, {} tokens x top-{} per step; {} records, {} raw encoded bytes, \
             {} frames, {} bytes on disk (zstd {ZSTD_LEVEL})",
            self.shape.steps,
            self.shape.memory_keys,
            self.shape.tokens_per_step,
            self.shape.top_k,
            input.records.len(),
            input.raw.len(),
            input.frame_count,
            input.trace.len()
        );
        println!("{reps} rounds of ~{sample_ms} ms per case, round-robin; median [min .. max]; MB = 10^6 bytes\n");
        println!("{:<28} {:>28} {:>30} {:>24}", "case", "records/s", "MB/s", "ms/iter");
        for c in self.cases {
            let t = c.time_per_iter();
            println!(
                "{:<28} {:>28} {:>30} {:>24}",
                c.name,
                c.records_per_s().map_or_else(|| "-".into(), |s| range(s, 1e-3, 0, "k")),
                c.mb_per_s().map_or_else(|| "-".into(), |s| range(s, 1.0, 0, "")),
                range(t, 1e3, 3, ""),
            );
        }
        println!("\n{:<52} {:>28}", "time ratio (same round)", "median [min .. max]");
        for (label, num, den) in RATIOS {
            println!("{label:<52} {:>28}", range(time_ratio(self.cases, num, den), 1.0, 2, "x"));
        }

        let (d, s) = (&self.memory.deltas, &self.memory.snapshots);
        println!("\nmemory section (bytes)          deltas   snapshots   reduction");
        let row = |label: &str, a: u64, b: u64| println!("{label:<28} {a:>9} {b:>11} {:>10.1}%", reduction(a, b));
        row("encoded, all steps", d.encoded_all, s.encoded_all);
        row("encoded, steps >= 1", d.encoded_steps, s.encoded_steps);
        row("on disk (zstd 3), all steps", d.on_disk_all, s.on_disk_all);
        row("on disk (zstd 3), steps >= 1", d.on_disk_steps, s.on_disk_steps);
        row("in the file, steps >= 1 (*)", d.file_marginal_steps, s.file_marginal_steps);
        row("whole .trace file", d.file, s.file);
        println!("(*) file size minus the file without the memory records of steps >= 1");
        println!(
            "memory records: {} deltas vs {} records (20 initial deltas + 1 snapshot a step)",
            d.records, s.records
        );
        let by_keys: Vec<String> =
            self.memory.by_keys.iter().map(|(k, e, o)| format!("{k} keys {e:.1}% / {o:.1}%")).collect();
        println!("reduction by memory keys, steps >= 1, encoded / on disk: {}", by_keys.join(", "));

        let c = self.compression;
        println!("\ncompression (bytes)            raw      zstd-3     gzip-6   zstd smaller");
        let row = |label: &str, raw: u64, z: u64, g: u64| {
            println!("{label:<22} {raw:>11} {z:>11} {g:>10} {:>13.1}%", reduction(z, g))
        };
        row("per frame (as written)", c.raw_per_frame, c.zstd_per_frame, c.gzip_per_frame);
        row("whole episode", c.raw_whole, c.zstd_whole, c.gzip_whole);

        println!("\ntargets");
        for t in self.targets() {
            let verdict = match (t.kind, t.met()) {
                ("target", true) => "MET",
                ("target", false) => "MISSED",
                (_, true) => "holds",
                (_, false) => "does not hold",
            };
            println!("  {:<44} {:>14.1} {:<9} >= {:<10} {verdict}", t.name, t.value, t.unit, t.threshold);
        }
    }

    fn to_json(&self, reps: usize, sample_ms: u64, elapsed_s: f64) -> Value {
        let cases: Vec<Value> = self
            .cases
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "what": c.what,
                    "records_per_iter": c.records,
                    "bytes_per_iter": c.bytes,
                    "bytes_are": c.bytes_are,
                    "iters_per_sample": c.iters,
                    "seconds_per_iter": c.time_per_iter().json(),
                    "records_per_s": c.records_per_s().map(|s| s.json()),
                    "mb_per_s": c.mb_per_s().map(|s| s.json()),
                    "samples_seconds_per_iter": c.secs,
                })
            })
            .collect();
        let ratios: Vec<Value> = RATIOS
            .iter()
            .map(|(label, num, den)| {
                json!({"ratio": label, "numerator": num, "denominators": den,
                       "time_ratio": time_ratio(self.cases, num, den).json()})
            })
            .collect();
        let memory_sizes = |s: &MemorySizes| {
            json!({
                "memory_records": s.records,
                "steps_without_memory_records": s.steps_without_memory,
                "encoded_bytes_all_steps": s.encoded_all,
                "encoded_bytes_steps_1_plus": s.encoded_steps,
                "on_disk_bytes_all_steps": s.on_disk_all,
                "on_disk_bytes_steps_1_plus": s.on_disk_steps,
                "whole_trace_file_bytes": s.file,
                "in_file_bytes_steps_1_plus": s.file_marginal_steps,
                "in_file_bytes_what": "whole file minus the file without the memory records of steps >= 1",
            })
        };
        let (d, s) = (&self.memory.deltas, &self.memory.snapshots);
        let c = self.compression;
        let targets: Vec<Value> = self
            .targets()
            .iter()
            .map(|t| {
                json!({"name": t.name, "kind": t.kind, "measure": t.measure, "value": t.value,
                       "threshold": t.threshold, "unit": t.unit, "met": t.met()})
            })
            .collect();
        json!({
            "bench": "trace",
            "command": "cargo bench -p basecamp-trace --bench trace",
            "date_utc": utc_now(),
            "git_commit": git_commit(),
            "machine": machine(None),
            "method": {
                "rounds": reps,
                "target_sample_ms": sample_ms,
                "order": "round-robin: every round times each case once, so ratios compare samples taken moments apart",
                "statistic": "median with min and max over rounds; ratios are computed per round, then summarized",
                "mb": "10^6 bytes",
                "threads": "one (the bench is single-threaded; zstd without workers)",
                "zstd": format!("level {ZSTD_LEVEL}, libzstd {}", zstd::zstd_safe::version_string()),
                "gzip": format!("level {GZIP_LEVEL}, flate2 1.1 default backend (miniz_oxide)"),
                "elapsed_s": elapsed_s,
            },
            "episode": {
                "shape": {
                    "seed": self.shape.seed,
                    "steps": self.shape.steps,
                    "memory_keys": self.shape.memory_keys,
                    "tokens_per_step": self.shape.tokens_per_step,
                    "top_k": self.shape.top_k,
                },
                "records": self.input.records.len(),
                "raw_encoded_bytes": self.input.raw.len(),
                "decompressed_bytes_with_index": self.input.decompressed_len,
                "frames": self.input.frame_count,
                "trace_file_bytes": self.input.trace.len(),
            },
            "cases": cases,
            "ratios": ratios,
            "memory": {
                "what": "memory records (MemoryDelta, or MemorySnapshot after each step) of the same episode; \
                         step 0 holds the 20 initial deltas in both modes",
                "deltas": memory_sizes(d),
                "snapshots": memory_sizes(s),
                "reduction_pct": {
                    "encoded_all_steps": reduction(d.encoded_all, s.encoded_all),
                    "encoded_steps_1_plus": reduction(d.encoded_steps, s.encoded_steps),
                    "on_disk_all_steps": reduction(d.on_disk_all, s.on_disk_all),
                    "on_disk_steps_1_plus": reduction(d.on_disk_steps, s.on_disk_steps),
                    "in_file_steps_1_plus": reduction(d.file_marginal_steps, s.file_marginal_steps),
                    "whole_trace_file": reduction(d.file, s.file),
                },
                "reduction_pct_steps_1_plus_by_memory_keys": self.memory.by_keys.iter().map(|(k, e, o)| {
                    json!({"memory_keys": k, "encoded": e, "on_disk": o})
                }).collect::<Vec<_>>(),
            },
            "compression": {
                "what": "the episode's record bytes per frame as the writer frames them (each compressed alone), \
                         and all of them as one stream",
                "per_frame": {"raw_bytes": c.raw_per_frame, "zstd3_bytes": c.zstd_per_frame,
                              "gzip6_bytes": c.gzip_per_frame,
                              "zstd_over_gzip": c.zstd_per_frame as f64 / c.gzip_per_frame as f64,
                              "zstd_smaller_pct": reduction(c.zstd_per_frame, c.gzip_per_frame)},
                "whole_episode": {"raw_bytes": c.raw_whole, "zstd3_bytes": c.zstd_whole, "gzip6_bytes": c.gzip_whole,
                                  "zstd_over_gzip": c.zstd_whole as f64 / c.gzip_whole as f64,
                                  "zstd_smaller_pct": reduction(c.zstd_whole, c.gzip_whole)},
                "trace_file_bytes": c.trace_file,
            },
            "targets": targets,
        })
    }
}

/// "median [min .. max]" of `s * scale` with `decimals`, and a unit suffix.
fn range(s: Stats, scale: f64, decimals: usize, suffix: &str) -> String {
    format!("{:.d$}{suffix} [{:.d$} .. {:.d$}]", s.median * scale, s.min * scale, s.max * scale, d = decimals)
}

// ---- machine and date ----------------------------------------------------------
