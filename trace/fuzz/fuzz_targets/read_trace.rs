//! Arbitrary bytes into both readers: they must never panic, every error
//! must name the file, and whatever is recovered must hold together.
//!
//! Two views of each input, so mutations get past the checksums:
//! - the bytes as a file, as they are;
//! - (when the input starts with `F`) the rest as frame contents: chunks of
//!   `kind u8 | len u16 LE | raw bytes`, each compressed and framed with
//!   correct checksums behind a valid preamble, and a trailer pointing at the
//!   last index chunk. This reaches protobuf decoding and the footer index
//!   (offsets anywhere) with fuzzer-chosen bytes. Each record of those
//!   chunks also goes through the reader's own decoder for token logits,
//!   which must give what prost's derive of the message gives whenever it
//!   gives anything.

#![no_main]

use std::io::Cursor;

use basecamp_trace::format::{self, FrameHeader, FrameKind};
use basecamp_trace::pb::{Record, record::Body};
use basecamp_trace::token_logit::{decode_record_into, generated};
use basecamp_trace::{IndexedTrace, Tail, TraceError, read_trace_from};
use libfuzzer_sys::fuzz_target;
use prost::Message;

const NAME: &str = "fuzz.trace";

fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((b'F', rest)) => {
            let (file, chunks) = framed(rest);
            chunks.into_iter().for_each(fast_path_agrees_with_prost);
            check(&file);
        }
        _ => check(data),
    }
});

fn check(file: &[u8]) {
    match read_trace_from(file, NAME) {
        Ok(trace) => {
            if let Tail::Damaged(e) = &trace.tail {
                names_the_file(e);
            }
        }
        Err(e) => names_the_file(&e),
    }
    match IndexedTrace::new(Cursor::new(file), NAME) {
        Ok(mut indexed) => {
            if let Some(e) = indexed.damage() {
                names_the_file(e);
            }
            let steps: Vec<u32> = indexed.steps().take(64).collect();
            for step in steps {
                if let Err(e) = indexed.read_step(step) {
                    names_the_file(&e);
                }
            }
        }
        Err(e) => names_the_file(&e),
    }
}

fn names_the_file(e: &TraceError) {
    let message = e.to_string();
    assert!(message.starts_with("fuzz.trace: "), "message does not name the file: {message}");
    assert!(!message.contains('\n'), "message is more than one line: {message}");
}

/// Whenever the fast path decodes a record of `raw` (length-delimited
/// records), prost's derive decodes the same record.
fn fast_path_agrees_with_prost(mut raw: &[u8]) {
    while let Ok(len) = prost::decode_length_delimiter(&mut raw) {
        let Some(bytes) = raw.get(..len) else { return };
        raw = &raw[len..];
        let mut fast = Record::default();
        if !decode_record_into(bytes, &mut fast) {
            continue;
        }
        let reference = generated::Record::decode(bytes).expect("prost's derive decodes what the fast path decodes");
        let token = reference.token_logit.as_ref().map(Into::into).unwrap_or_default();
        let want = Record { step: reference.step, body: Some(Body::TokenLogit(token)) };
        // Encodings compare NaN payloads too, which `==` on floats does not.
        assert_eq!(fast.encode_to_vec(), want.encode_to_vec(), "the fast path and prost disagree on {bytes:02x?}");
    }
}

/// The file made of `rest`'s chunks, and the raw contents of its records chunks.
fn framed(mut rest: &[u8]) -> (Vec<u8>, Vec<&[u8]>) {
    let mut file = format::preamble().to_vec();
    let mut records = Vec::new();
    let mut index_offset = None;
    while rest.len() >= 3 {
        let kind = if rest[0] & 1 == 0 { FrameKind::Records } else { FrameKind::Index };
        let len = (u16::from_le_bytes([rest[1], rest[2]]) as usize).min(rest.len() - 3);
        let raw = &rest[3..3 + len];
        rest = &rest[3 + len..];
        match kind {
            FrameKind::Index => index_offset = Some(file.len() as u64),
            _ => records.push(raw),
        }
        let Ok(compressed) = zstd::bulk::compress(raw, 1) else { return (file, records) };
        let header = FrameHeader {
            kind,
            record_kinds: 0,
            flags: 0,
            compressed_len: compressed.len() as u32,
            raw_len: raw.len() as u32,
            payload_crc: crc32fast::hash(&compressed),
        };
        file.extend_from_slice(&header.encode());
        file.extend_from_slice(&compressed);
    }
    if let Some(offset) = index_offset {
        file.extend_from_slice(&format::trailer(offset));
    }
    (file, records)
}
