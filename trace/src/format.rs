//! The on-disk framing of a `.trace` file.
//!
//! ```text
//! file     := preamble frame* [index-frame trailer]
//! preamble := MAGIC (8 bytes) | format version (u32 LE)
//! frame    := header (20 bytes) | zstd payload (compressed_len bytes)
//! header   := kind u8 | record kinds u16 | flags u8 | compressed_len u32 | raw_len u32
//!             | crc32(payload) u32 | crc32(header bytes 0..16) u32
//! trailer  := offset of the index frame (u64 LE) | TRAILER_MAGIC (8 bytes)
//! ```
//!
//! A records frame decompresses to length-delimited `Record` messages. The
//! writer closes a frame at every step boundary, so a process killed
//! mid-episode leaves every finished step readable. The header checksum lets
//! a reader tell a corrupt length (corruption) from a short file (truncation)
//! before it trusts the length for an allocation; both lengths are capped.
//!
//! **Version 2** (written today) gives header bytes 1..4 a meaning; in
//! version 1 they are zero, and a version-1 file with anything else there is
//! corrupt. Bytes 1..3 are the *record kinds* mask ([`kind_bit`]): which
//! `Record.body` kinds the frame holds, 0 meaning "not said" (a version-1
//! frame, an index frame, a hand-made frame). Byte 3 holds flags; only
//! [`FLAG_CONTINUES_STEP`] is defined. The writer also closes a frame at
//! every step change and wherever the records switch between token_logit
//! and any other kind, so token_logit records (95% of a typical trace's
//! bytes) sit in frames of their own while the file's record order stays
//! exactly the order of appending. A reader that needs only some kinds may
//! skip, without decompressing, a frame whose mask is non-zero, holds none
//! of those kinds, and continues a step already seen: it loses no record it
//! wants and no step. Readers check, on every frame they do decompress, that
//! each record's kind is in the mask and that a continuing frame holds only
//! the previous frame's step, so a lying header is reported as corruption.

/// First bytes of every trace file. The high byte and CR/LF catch text-mode mangling.
pub const MAGIC: [u8; 8] = *b"\x89BCTR\r\n\x1a";
/// Framing version this library writes. Readers read every version up to it
/// and refuse a newer one.
pub const FORMAT_VERSION: u32 = 2;
/// The first version whose frame headers carry the record-kinds mask and flags.
pub const KIND_MASK_VERSION: u32 = 2;
pub const PREAMBLE_LEN: usize = 12;
pub const FRAME_HEADER_LEN: usize = 20;
pub const TRAILER_MAGIC: [u8; 8] = *b"BCTRIDX1";
pub const TRAILER_LEN: usize = 16;

/// The schema major version this library writes and reads.
pub const SCHEMA_MAJOR: u32 = 1;
/// The schema minor version this library writes (readers accept any minor).
pub const SCHEMA_MINOR: u32 = 3;

/// Largest accepted compressed payload of one frame.
pub const MAX_COMPRESSED_FRAME: u32 = 64 << 20;
/// Largest accepted decompressed payload of one frame: bounds every allocation
/// a reader makes for hostile input.
pub const MAX_RAW_FRAME: u32 = 64 << 20;
/// The writer closes a frame early once this many raw bytes are buffered,
/// so one huge step never makes a frame a reader would refuse.
pub const FRAME_FLUSH_THRESHOLD: usize = 8 << 20;

/// Frame flag (version 2): every record of this frame has the step of the
/// last record of the previous records frame (the header frame, which holds
/// only the header record, does not count). Skipping such a frame loses no step.
pub const FLAG_CONTINUES_STEP: u8 = 1;
/// Every flag a reader of this version understands; others are corruption.
pub const KNOWN_FLAGS: u8 = FLAG_CONTINUES_STEP;

/// The bit of the record-kinds mask for a record whose body is field
/// `body_field` of `Record` (2..=15 map to bit 2..=15); a record with no body
/// or a body field above 15 (from a newer schema) sets bit 0.
pub const fn kind_bit(body_field: u32) -> u16 {
    if body_field >= 2 && body_field < 16 { 1 << body_field } else { 1 }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Records = 1,
    Index = 2,
}

impl FrameKind {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::Records),
            2 => Some(Self::Index),
            _ => None,
        }
    }
}

/// A decoded, checksum-verified frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    /// Record-kinds mask ([`kind_bit`]); 0 when the frame does not say (version 1).
    pub record_kinds: u16,
    /// Flags ([`FLAG_CONTINUES_STEP`]); 0 in version 1.
    pub flags: u8,
    pub compressed_len: u32,
    pub raw_len: u32,
    pub payload_crc: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0] = self.kind as u8;
        b[1..3].copy_from_slice(&self.record_kinds.to_le_bytes());
        b[3] = self.flags;
        b[4..8].copy_from_slice(&self.compressed_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..16]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header; the error says what was wrong. The
    /// mask and flags are returned as stored: [`FrameHeader::check_version`]
    /// says whether the file's format version allows them.
    pub fn decode(b: &[u8; FRAME_HEADER_LEN]) -> Result<Self, String> {
        let stored_crc = u32_at(b, 16);
        let crc = crc32fast::hash(&b[..16]);
        if crc != stored_crc {
            return Err(format!("frame header checksum mismatch (stored {stored_crc:08x}, computed {crc:08x})"));
        }
        let kind = FrameKind::from_byte(b[0]).ok_or_else(|| format!("unknown frame kind {}", b[0]))?;
        let compressed_len = u32_at(b, 4);
        let raw_len = u32_at(b, 8);
        if compressed_len > MAX_COMPRESSED_FRAME {
            return Err(format!("frame claims {compressed_len} compressed bytes, limit is {MAX_COMPRESSED_FRAME}"));
        }
        if raw_len > MAX_RAW_FRAME {
            return Err(format!("frame claims {raw_len} raw bytes, limit is {MAX_RAW_FRAME}"));
        }
        let record_kinds = u16::from_le_bytes([b[1], b[2]]);
        Ok(Self { kind, record_kinds, flags: b[3], compressed_len, raw_len, payload_crc: u32_at(b, 12) })
    }

    /// Checks the mask and flags against the file's format version.
    pub fn check_version(&self, version: u32) -> Result<(), String> {
        if version < KIND_MASK_VERSION {
            if self.record_kinds != 0 || self.flags != 0 {
                return Err("reserved frame header bytes are not zero".into());
            }
        } else if self.flags & !KNOWN_FLAGS != 0 {
            return Err(format!("unknown frame header flags {:#04x}", self.flags & !KNOWN_FLAGS));
        }
        Ok(())
    }

    /// Whether a reader that wants only the kinds in `wanted` may skip this
    /// frame without decompressing it (see the module doc).
    pub fn skippable_for(&self, wanted: u16) -> bool {
        self.kind == FrameKind::Records
            && self.record_kinds != 0
            && self.record_kinds & wanted == 0
            && self.flags & FLAG_CONTINUES_STEP != 0
    }
}

pub fn preamble() -> [u8; PREAMBLE_LEN] {
    let mut b = [0u8; PREAMBLE_LEN];
    b[..8].copy_from_slice(&MAGIC);
    b[8..].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    b
}

pub fn trailer(index_offset: u64) -> [u8; TRAILER_LEN] {
    let mut b = [0u8; TRAILER_LEN];
    b[..8].copy_from_slice(&index_offset.to_le_bytes());
    b[8..].copy_from_slice(&TRAILER_MAGIC);
    b
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_flips() {
        let h = FrameHeader {
            kind: FrameKind::Records,
            record_kinds: kind_bit(5),
            flags: FLAG_CONTINUES_STEP,
            compressed_len: 10,
            raw_len: 20,
            payload_crc: 7,
        };
        let bytes = h.encode();
        assert_eq!(FrameHeader::decode(&bytes).unwrap(), h);
        for bit in 0..FRAME_HEADER_LEN * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(FrameHeader::decode(&flipped).is_err(), "flip of bit {bit} went unnoticed");
        }
    }

    #[test]
    fn oversized_lengths_are_refused_even_with_a_valid_checksum() {
        let h = FrameHeader {
            kind: FrameKind::Records,
            record_kinds: 0,
            flags: 0,
            compressed_len: 1,
            raw_len: u32::MAX,
            payload_crc: 0,
        };
        let err = FrameHeader::decode(&h.encode()).unwrap_err();
        assert!(err.contains("limit"), "{err}");
    }

    #[test]
    fn version_one_keeps_bytes_one_to_four_reserved() {
        let mut h = FrameHeader {
            kind: FrameKind::Records,
            record_kinds: 0,
            flags: 0,
            compressed_len: 1,
            raw_len: 1,
            payload_crc: 0,
        };
        assert!(h.check_version(1).is_ok());
        h.record_kinds = kind_bit(3);
        let err = h.check_version(1).unwrap_err();
        assert!(err.contains("reserved"), "{err}");
        assert!(h.check_version(2).is_ok());
        h.flags = 0x80;
        assert!(h.check_version(2).unwrap_err().contains("flags"));
    }

    #[test]
    fn only_continuing_frames_that_say_their_kinds_are_skippable() {
        let token = kind_bit(5);
        let plan = kind_bit(3);
        let h = |record_kinds, flags| FrameHeader {
            kind: FrameKind::Records,
            record_kinds,
            flags,
            compressed_len: 1,
            raw_len: 1,
            payload_crc: 0,
        };
        assert!(h(token, FLAG_CONTINUES_STEP).skippable_for(plan));
        assert!(!h(token, FLAG_CONTINUES_STEP).skippable_for(plan | token));
        assert!(!h(token, 0).skippable_for(plan), "a frame starting a step is read");
        assert!(!h(0, FLAG_CONTINUES_STEP).skippable_for(plan), "mask 0 says nothing");
    }
}
