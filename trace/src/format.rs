//! The on-disk framing of a `.trace` file.
//!
//! ```text
//! file     := preamble frame* [index-frame trailer]
//! preamble := MAGIC (8 bytes) | format version (u32 LE)
//! frame    := header (20 bytes) | zstd payload (compressed_len bytes)
//! header   := kind u8 | 3 reserved zero bytes | compressed_len u32 | raw_len u32
//!             | crc32(payload) u32 | crc32(header bytes 0..16) u32
//! trailer  := offset of the index frame (u64 LE) | TRAILER_MAGIC (8 bytes)
//! ```
//!
//! A records frame decompresses to length-delimited `Record` messages. The
//! writer closes a frame at every step boundary, so a process killed
//! mid-episode leaves every finished step readable. The header checksum lets
//! a reader tell a corrupt length (corruption) from a short file (truncation)
//! before it trusts the length for an allocation; both lengths are capped.

/// First bytes of every trace file. The high byte and CR/LF catch text-mode mangling.
pub const MAGIC: [u8; 8] = *b"\x89BCTR\r\n\x1a";
/// Framing version. Readers refuse a newer one.
pub const FORMAT_VERSION: u32 = 1;
pub const PREAMBLE_LEN: usize = 12;
pub const FRAME_HEADER_LEN: usize = 20;
pub const TRAILER_MAGIC: [u8; 8] = *b"BCTRIDX1";
pub const TRAILER_LEN: usize = 16;

/// The schema major version this library writes and reads.
pub const SCHEMA_MAJOR: u32 = 1;
/// The schema minor version this library writes (readers accept any minor).
pub const SCHEMA_MINOR: u32 = 1;

/// Largest accepted compressed payload of one frame.
pub const MAX_COMPRESSED_FRAME: u32 = 64 << 20;
/// Largest accepted decompressed payload of one frame: bounds every allocation
/// a reader makes for hostile input.
pub const MAX_RAW_FRAME: u32 = 64 << 20;
/// The writer closes a frame early once this many raw bytes are buffered,
/// so one huge step never makes a frame a reader would refuse.
pub const FRAME_FLUSH_THRESHOLD: usize = 8 << 20;

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
    pub compressed_len: u32,
    pub raw_len: u32,
    pub payload_crc: u32,
}

impl FrameHeader {
    pub fn encode(&self) -> [u8; FRAME_HEADER_LEN] {
        let mut b = [0u8; FRAME_HEADER_LEN];
        b[0] = self.kind as u8;
        b[4..8].copy_from_slice(&self.compressed_len.to_le_bytes());
        b[8..12].copy_from_slice(&self.raw_len.to_le_bytes());
        b[12..16].copy_from_slice(&self.payload_crc.to_le_bytes());
        let crc = crc32fast::hash(&b[..16]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a header; the error says what was wrong.
    pub fn decode(b: &[u8; FRAME_HEADER_LEN]) -> Result<Self, String> {
        let stored_crc = u32_at(b, 16);
        let crc = crc32fast::hash(&b[..16]);
        if crc != stored_crc {
            return Err(format!("frame header checksum mismatch (stored {stored_crc:08x}, computed {crc:08x})"));
        }
        let kind = FrameKind::from_byte(b[0]).ok_or_else(|| format!("unknown frame kind {}", b[0]))?;
        if b[1..4] != [0, 0, 0] {
            return Err("reserved frame header bytes are not zero".into());
        }
        let compressed_len = u32_at(b, 4);
        let raw_len = u32_at(b, 8);
        if compressed_len > MAX_COMPRESSED_FRAME {
            return Err(format!("frame claims {compressed_len} compressed bytes, limit is {MAX_COMPRESSED_FRAME}"));
        }
        if raw_len > MAX_RAW_FRAME {
            return Err(format!("frame claims {raw_len} raw bytes, limit is {MAX_RAW_FRAME}"));
        }
        Ok(Self { kind, compressed_len, raw_len, payload_crc: u32_at(b, 12) })
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
        let h = FrameHeader { kind: FrameKind::Records, compressed_len: 10, raw_len: 20, payload_crc: 7 };
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
        let h = FrameHeader { kind: FrameKind::Records, compressed_len: 1, raw_len: u32::MAX, payload_crc: 0 };
        let err = FrameHeader::decode(&h.encode()).unwrap_err();
        assert!(err.contains("limit"), "{err}");
    }
}
