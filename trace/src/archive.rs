//! Trace archives: `.tar.zst` files any `zstd -d | tar x` can unpack, with
//! an index so one trace comes out without decompressing the others.
//!
//! ```text
//! archive := member-frame* index-frame end-frame locator
//! member-frame := one zstd frame of (ustar header | trace bytes | padding to 512)
//! index-frame  := one zstd frame of the tar entry ".basecamp-archive-index.json"
//! end-frame    := one zstd frame of the tar end marker (two zero blocks)
//! locator      := zstd skippable frame (magic 0x184D2A5E, length 24):
//!                 "BCARIDX1" | index frame offset u64 LE | index frame length u64 LE
//! ```
//!
//! Concatenated zstd frames decompress to their concatenation, and
//! decompressors skip skippable frames, so the whole file is an ordinary
//! tar.zst. A reader that knows the layout reads the locator (the last 32
//! bytes), then the index (each member's name, episode, sizes, sha256 and
//! the byte range of its frame), then only the frame it wants.

use std::io::{self, Read, Seek, SeekFrom, Write};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::error::TraceError;
use crate::reader::{Tail, TraceReader};

pub const INDEX_NAME: &str = ".basecamp-archive-index.json";
const INDEX_FORMAT: &str = "basecamp-archive-v1";
const SKIPPABLE_MAGIC: u32 = 0x184D_2A5E;
const LOCATOR_MAGIC: &[u8; 8] = b"BCARIDX1";
const LOCATOR_LEN: usize = 8 + 24;
const BLOCK: usize = 512;
const ZSTD_LEVEL: i32 = 3;
/// Largest index accepted when reading (bounds the allocation for a hostile file).
const MAX_INDEX_BYTES: u64 = 256 << 20;
/// Largest member accepted when reading (no trace comes near it; it bounds
/// the allocation a hostile index or frame header could ask for).
const MAX_MEMBER_BYTES: u64 = 1 << 30;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{file}: {cause}")]
    Io { file: String, cause: io::Error },
    #[error("{file}: not a basecamp trace archive: {reason}")]
    NotAnArchive { file: String, reason: String },
    #[error("{file}: member {name} (frame at byte {offset}) is damaged: {reason}")]
    Damaged { file: String, name: String, offset: u64, reason: String },
    #[error(transparent)]
    Trace(#[from] TraceError),
    #[error(
        "{file}: member name {name:?} does not fit a tar header: a name of at most 100 bytes, after a directory \
         prefix of at most 155"
    )]
    NameTooLong { file: String, name: String },
}

/// One archived trace, as the index describes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Member {
    pub name: String,
    pub episode: String,
    pub task: String,
    pub variant: String,
    pub shard: u32,
    /// Steps with records (other than step 0).
    pub steps: u32,
    /// True when the trace was finished (episode end, index, trailer).
    pub complete: bool,
    /// Size of the trace file.
    pub bytes: u64,
    pub sha256: String,
    /// Byte range of the member's zstd frame in the archive.
    pub frame_offset: u64,
    pub frame_len: u64,
}

impl Member {
    /// Whether `data` is this member's trace (same size and sha256), e.g. a
    /// file already where it would be extracted.
    pub fn holds_the_same_bytes_as(&self, data: &[u8]) -> bool {
        data.len() as u64 == self.bytes && hex::encode(Sha256::digest(data)) == self.sha256
    }
}

#[derive(Serialize, Deserialize)]
struct Index {
    format: String,
    members: Vec<Member>,
}

/// A member compressed and described, ready to append (made in parallel, appended in order).
pub struct PreparedMember {
    member: Member,
    frame: Vec<u8>,
    damage: Option<String>,
}

impl PreparedMember {
    pub fn member(&self) -> &Member {
        &self.member
    }

    /// Why the trace is not complete (cut short, or damaged where it was
    /// read), when it is not: it is archived as it is.
    pub fn damage(&self) -> Option<&str> {
        self.damage.as_deref()
    }
}

/// Reads a trace's header and checks how it ends, then builds its tar entry
/// and compresses it as one frame. `file` names the source in errors.
pub fn prepare_member(file: &str, name: &str, data: &[u8]) -> Result<PreparedMember, ArchiveError> {
    let mut reader = TraceReader::new(data, file)?;
    while let Some(r) = reader.next_raw() {
        if r.is_err() {
            break;
        }
    }
    let header = reader.header().clone();
    let (complete, damage) = match reader.tail() {
        Some(Tail::Complete) => (true, None),
        Some(Tail::Damaged(e)) => (false, Some(e.to_string())),
        None => (false, Some("its end was not reached".to_string())),
    };
    let steps = reader.steps_recovered();
    let entry = tar_entry(file, name, data)?;
    let frame = compress_checked(&entry).map_err(|cause| ArchiveError::Io { file: file.into(), cause })?;
    Ok(PreparedMember {
        member: Member {
            name: name.to_string(),
            episode: header.episode_id,
            task: header.task,
            variant: header.variant,
            shard: header.shard,
            steps,
            complete,
            bytes: data.len() as u64,
            sha256: hex::encode(Sha256::digest(data)),
            frame_offset: 0,
            frame_len: frame.len() as u64,
        },
        frame,
        damage,
    })
}

/// Writes members, then the index, the tar end and the locator.
pub struct ArchiveWriter<W: Write> {
    out: W,
    offset: u64,
    members: Vec<Member>,
}

impl<W: Write> ArchiveWriter<W> {
    pub fn new(out: W) -> Self {
        Self { out, offset: 0, members: Vec::new() }
    }

    pub fn append(&mut self, prepared: PreparedMember) -> io::Result<()> {
        let mut member = prepared.member;
        member.frame_offset = self.offset;
        self.out.write_all(&prepared.frame)?;
        self.offset += prepared.frame.len() as u64;
        self.members.push(member);
        Ok(())
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    pub fn finish(mut self) -> io::Result<W> {
        let index = Index { format: INDEX_FORMAT.into(), members: std::mem::take(&mut self.members) };
        let json = serde_json::to_vec_pretty(&index).map_err(io::Error::other)?;
        let entry = tar_entry("index", INDEX_NAME, &json).map_err(io::Error::other)?;
        let frame = compress_checked(&entry)?;
        let index_offset = self.offset;
        self.out.write_all(&frame)?;
        self.offset += frame.len() as u64;
        self.out.write_all(&compress_checked(&[0u8; 2 * BLOCK])?)?;
        let mut locator = Vec::with_capacity(LOCATOR_LEN);
        locator.extend_from_slice(&SKIPPABLE_MAGIC.to_le_bytes());
        locator.extend_from_slice(&24u32.to_le_bytes());
        locator.extend_from_slice(LOCATOR_MAGIC);
        locator.extend_from_slice(&index_offset.to_le_bytes());
        locator.extend_from_slice(&(frame.len() as u64).to_le_bytes());
        self.out.write_all(&locator)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// One zstd frame of `data` with its content checksum (xxh64), which every
/// zstd decoder checks: damage to the index (names, offsets, sha256s) or
/// to a member is found by decompressing it, not trusted. Archives written
/// before had no checksum; they read as before.
fn compress_checked(data: &[u8]) -> io::Result<Vec<u8>> {
    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    compressor.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    compressor.compress(data)
}

/// `name` as ustar stores it: a prefix of at most 155 bytes (its
/// directories, split at a `/`) and the rest, at most 100 bytes. A trace's
/// path in the operator's layout (`yyyy/mm/dd/<namespace>/<task>/<variant>/
/// shard-N/<episode>.trace`, names of up to 63 bytes) is often over 100.
fn ustar_name(name: &str) -> Option<(&str, &str)> {
    if name.len() <= 100 {
        return Some(("", name));
    }
    // The longest prefix that fits leaves the shortest rest.
    name.rmatch_indices('/')
        .map(|(at, _)| at)
        .find(|&at| at > 0 && at <= 155 && name.len() - at - 1 <= 100 && at + 1 < name.len())
        .map(|at| (&name[..at], &name[at + 1..]))
}

/// A ustar header, the data, and padding to a whole block.
fn tar_entry(file: &str, name: &str, data: &[u8]) -> Result<Vec<u8>, ArchiveError> {
    let Some((prefix, rest)) = ustar_name(name) else {
        return Err(ArchiveError::NameTooLong { file: file.into(), name: name.into() });
    };
    let mut h = [0u8; BLOCK];
    h[..rest.len()].copy_from_slice(rest.as_bytes());
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    let octal = |h: &mut [u8; BLOCK], at: usize, len: usize, value: u64| {
        let text = format!("{value:0width$o}", width = len - 1);
        h[at..at + len - 1].copy_from_slice(text.as_bytes());
    };
    octal(&mut h, 100, 8, 0o644);
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, data.len() as u64);
    octal(&mut h, 136, 12, 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    let padded = data.len().div_ceil(BLOCK) * BLOCK;
    let mut entry = Vec::with_capacity(BLOCK + padded);
    entry.extend_from_slice(&h);
    entry.extend_from_slice(data);
    entry.resize(BLOCK + padded, 0);
    Ok(entry)
}

/// Name and data of a decompressed tar entry, checked.
fn untar(entry: &[u8]) -> Result<(String, &[u8]), String> {
    if entry.len() < BLOCK {
        return Err("shorter than a tar header".into());
    }
    let h = &entry[..BLOCK];
    let stored = parse_octal(&h[148..156]).ok_or("bad header checksum field")?;
    let sum: u64 = h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
    if stored != sum {
        return Err(format!("tar header checksum {stored} != {sum}"));
    }
    let field = |bytes: &[u8]| {
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8_lossy(&bytes[..len]).into_owned()
    };
    let (prefix, rest) = (field(&h[345..500]), field(&h[..100]));
    let name = if prefix.is_empty() { rest } else { format!("{prefix}/{rest}") };
    let size = parse_octal(&h[124..136]).ok_or("bad size field")? as usize;
    let data = entry.get(BLOCK..BLOCK + size).ok_or("entry shorter than its size")?;
    Ok((name, data))
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(field).ok()?.trim_matches(|c: char| c == '\0' || c == ' ');
    u64::from_str_radix(text, 8).ok()
}

/// Random access to an archive's members.
pub struct ArchiveReader<R> {
    inner: R,
    file: String,
    /// Length of the archive, which bounds every byte range its index gives.
    len: u64,
    members: Vec<Member>,
}

impl ArchiveReader<std::fs::File> {
    pub fn open(path: &std::path::Path) -> Result<Self, ArchiveError> {
        let file = path.display().to_string();
        let f = std::fs::File::open(path).map_err(|cause| ArchiveError::Io { file: file.clone(), cause })?;
        Self::new(f, file)
    }
}

impl<R: Read + Seek> ArchiveReader<R> {
    /// Reads the locator and the index, nothing else.
    pub fn new(mut inner: R, file: impl Into<String>) -> Result<Self, ArchiveError> {
        let file = file.into();
        let io = |cause| ArchiveError::Io { file: file.clone(), cause };
        let not = |reason: &str| ArchiveError::NotAnArchive { file: file.clone(), reason: reason.into() };
        let len = inner.seek(SeekFrom::End(0)).map_err(io)?;
        if len < LOCATOR_LEN as u64 {
            return Err(not("too short to end with an index locator"));
        }
        inner.seek(SeekFrom::Start(len - LOCATOR_LEN as u64)).map_err(io)?;
        let mut loc = [0u8; LOCATOR_LEN];
        inner.read_exact(&mut loc).map_err(io)?;
        if loc[..4] != SKIPPABLE_MAGIC.to_le_bytes() || loc[4..8] != 24u32.to_le_bytes() || &loc[8..16] != LOCATOR_MAGIC
        {
            return Err(not(
                "no index locator at the end (cut short by an interrupted write or copy, or made by another tool)",
            ));
        }
        let offset = u64::from_le_bytes(loc[16..24].try_into().expect("8 bytes"));
        let frame_len = u64::from_le_bytes(loc[24..32].try_into().expect("8 bytes"));
        if offset.checked_add(frame_len).is_none_or(|end| end > len) || frame_len > MAX_INDEX_BYTES {
            return Err(not("the index locator points outside the file"));
        }
        let entry = read_frame(&mut inner, offset, frame_len, MAX_INDEX_BYTES)
            .map_err(|reason| ArchiveError::Damaged { file: file.clone(), name: INDEX_NAME.into(), offset, reason })?;
        let damaged =
            |reason: String| ArchiveError::Damaged { file: file.clone(), name: INDEX_NAME.into(), offset, reason };
        let (name, data) = untar(&entry).map_err(damaged)?;
        if name != INDEX_NAME {
            return Err(damaged(format!("the index frame holds {name:?}")));
        }
        let index: Index = serde_json::from_slice(data).map_err(|e| damaged(format!("index JSON: {e}")))?;
        if index.format != INDEX_FORMAT {
            return Err(not(&format!("index format {:?}, this reader knows {INDEX_FORMAT}", index.format)));
        }
        Ok(Self { inner, file, len, members: index.members })
    }

    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// Members whose name or episode id is `key`; a name matches with or
    /// without its directories and its `.trace`.
    pub fn find(&self, key: &str) -> Vec<&Member> {
        let matches = |name: &str| name == key || name.strip_suffix(".trace") == Some(key);
        self.members
            .iter()
            .filter(|m| matches(&m.name) || matches(m.name.rsplit('/').next().unwrap_or(&m.name)) || m.episode == key)
            .collect()
    }

    /// One member's bytes: only its frame is read and decompressed; the
    /// tar header, size and sha256 are checked against the index.
    pub fn read_member(&mut self, member: &Member) -> Result<Vec<u8>, ArchiveError> {
        let damaged = |reason: String| ArchiveError::Damaged {
            file: self.file.clone(),
            name: member.name.clone(),
            offset: member.frame_offset,
            reason,
        };
        if member.bytes > MAX_MEMBER_BYTES {
            return Err(damaged(format!("the index says {} bytes, limit is {MAX_MEMBER_BYTES}", member.bytes)));
        }
        // The tar entry: a header block and the data padded to whole blocks.
        let entry_len = BLOCK as u64 + member.bytes.div_ceil(BLOCK as u64) * BLOCK as u64;
        // The frame length is checked before it sizes a read: a damaged
        // index must not read the rest of the archive into memory.
        let worst = zstd::zstd_safe::compress_bound(entry_len as usize) as u64;
        if member.frame_len > worst {
            return Err(damaged(format!(
                "the index says frame_len {}, more than the {worst} bytes its {entry_len}-byte tar entry \
                 compresses to at worst",
                member.frame_len
            )));
        }
        if member.frame_offset.checked_add(member.frame_len).is_none_or(|end| end > self.len) {
            return Err(damaged(format!(
                "the index says frame_len {} from byte {}, past the end of the {}-byte file",
                member.frame_len, member.frame_offset, self.len
            )));
        }
        let entry = read_frame(&mut self.inner, member.frame_offset, member.frame_len, entry_len).map_err(damaged)?;
        let (name, data) = untar(&entry).map_err(damaged)?;
        if name != member.name || data.len() as u64 != member.bytes {
            return Err(damaged(format!(
                "holds {name:?} of {} bytes, the index says {:?} of {}",
                data.len(),
                member.name,
                member.bytes
            )));
        }
        let sha = hex::encode(Sha256::digest(data));
        if sha != member.sha256 {
            return Err(damaged(format!("sha256 {sha} is not the index's {}", member.sha256)));
        }
        Ok(data.to_vec())
    }
}

fn read_frame<R: Read + Seek>(inner: &mut R, offset: u64, len: u64, max_raw: u64) -> Result<Vec<u8>, String> {
    inner.seek(SeekFrom::Start(offset)).map_err(|e| e.to_string())?;
    let mut compressed = Vec::new();
    inner.by_ref().take(len).read_to_end(&mut compressed).map_err(|e| e.to_string())?;
    if compressed.len() as u64 != len {
        return Err(format!("the file ends inside the frame ({} of {len} bytes)", compressed.len()));
    }
    let size = zstd::zstd_safe::get_frame_content_size(&compressed)
        .map_err(|_| "not a zstd frame".to_string())?
        .ok_or("the zstd frame does not state its size")?;
    if size > max_raw {
        return Err(format!("the frame claims {size} bytes, limit is {max_raw}"));
    }
    zstd::bulk::decompress(&compressed, size as usize).map_err(|e| format!("zstd: {e}"))
}
