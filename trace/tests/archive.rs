//! Archives: any tar.zst tool unpacks them; one member comes out alone,
//! even when another member is damaged.

use std::cell::Cell;
use std::io::{Cursor, Read, Seek, SeekFrom, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;

use basecamp_trace::archive::{ArchiveError, ArchiveReader, ArchiveWriter, INDEX_NAME, Member, prepare_member};
use basecamp_trace::synthetic::{EpisodeShape, generate};

fn traces() -> Vec<(String, Vec<u8>)> {
    (1..=3)
        .map(|seed| {
            let ep = generate(&EpisodeShape { seed, steps: 8, tokens_per_step: 20, ..Default::default() });
            (format!("ep-{seed}.trace"), ep.write_to(Vec::new(), 3).unwrap())
        })
        .collect()
}

fn archive(traces: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut w = ArchiveWriter::new(Vec::new());
    for (name, data) in traces {
        w.append(prepare_member(name, name, data).unwrap()).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn the_index_lists_members_and_each_comes_out_identical() {
    let traces = traces();
    let bytes = archive(&traces);
    let mut r = ArchiveReader::new(Cursor::new(bytes), "a.tar.zst").unwrap();
    let names: Vec<&str> = r.members().iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["ep-1.trace", "ep-2.trace", "ep-3.trace"]);
    let m = r.members()[1].clone();
    assert_eq!((m.episode.as_str(), m.steps, m.complete), ("ep-0002", 8, true));
    assert_eq!(r.find("ep-0002"), [&m]);
    assert_eq!(r.find("ep-2"), [&m]);
    assert!(r.find("ep-9").is_empty());
    for (i, (_, data)) in traces.iter().enumerate() {
        let member = r.members()[i].clone();
        assert_eq!(&r.read_member(&member).unwrap(), data);
    }
}

#[test]
fn any_zstd_and_tar_unpack_it() {
    let traces = traces();
    let bytes = archive(&traces);
    let dir = untar_with_gnu_tar(&bytes, &traces);
    assert!(dir.path().join(INDEX_NAME).exists());
}

/// `bytes` unpacked by `zstd` decoding and GNU tar, each trace checked: the
/// concatenated frames (the skippable locator included) are one tar stream.
fn untar_with_gnu_tar(bytes: &[u8], traces: &[(String, Vec<u8>)]) -> tempfile::TempDir {
    let tar = zstd::stream::decode_all(bytes).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("tar").arg("-x").arg("-C").arg(dir.path()).stdin(Stdio::piped()).spawn().unwrap();
    child.stdin.take().unwrap().write_all(&tar).unwrap();
    assert!(child.wait().unwrap().success());
    for (name, data) in traces {
        assert_eq!(&std::fs::read(dir.path().join(name)).unwrap(), data, "{name}");
    }
    dir
}

#[test]
fn one_member_is_read_without_touching_the_others() {
    let traces = traces();
    let mut bytes = archive(&traces);
    let r = ArchiveReader::new(Cursor::new(bytes.clone()), "a.tar.zst").unwrap();
    let (first, third) = (r.members()[0].clone(), r.members()[2].clone());
    // Destroy the first member's frame entirely.
    for b in &mut bytes[first.frame_offset as usize..(first.frame_offset + first.frame_len) as usize] {
        *b = 0xAA;
    }
    let mut r = ArchiveReader::new(Cursor::new(bytes), "a.tar.zst").unwrap();
    assert_eq!(r.read_member(&third).unwrap(), traces[2].1);
    let err = r.read_member(&first).unwrap_err();
    assert!(matches!(err, ArchiveError::Damaged { .. }));
    assert_eq!(err.to_string(), "a.tar.zst: member ep-1.trace (frame at byte 0) is damaged: not a zstd frame");
}

#[test]
fn a_file_that_is_not_an_archive_is_one_clear_error() {
    let err =
        ArchiveReader::new(Cursor::new(b"plain text, no locator at all........".to_vec()), "x.tar.zst").err().unwrap();
    assert_eq!(
        err.to_string(),
        "x.tar.zst: not a basecamp trace archive: no index locator at the end (cut short by an interrupted write or \
         copy, or made by another tool)"
    );
    // A real archive cut short says the same, not something about its members.
    let bytes = archive(&traces());
    let err = ArchiveReader::new(Cursor::new(bytes[..bytes.len() - 10].to_vec()), "cut.tar.zst").err().unwrap();
    assert!(err.to_string().contains("no index locator at the end (cut short by an interrupted write"), "{err}");
}

/// A reader that counts the bytes read through it.
struct Counting<R> {
    inner: R,
    read: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

impl<R: Seek> Seek for Counting<R> {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        self.inner.seek(pos)
    }
}

/// A damaged index's frame length is checked before anything is read: it
/// was used as is, so `u64::MAX` read the rest of the archive into memory.
#[test]
fn a_frame_length_beyond_what_the_member_can_take_is_refused_before_reading() {
    let bytes = archive(&traces());
    let file_len = bytes.len() as u64;
    let read = Rc::new(Cell::new(0));
    let mut r = ArchiveReader::new(Counting { inner: Cursor::new(bytes), read: read.clone() }, "a.tar.zst").unwrap();
    let first = r.members()[0].clone();
    for (damaged, says) in [
        (Member { frame_len: u64::MAX, ..first.clone() }, "more than the"),
        (Member { frame_len: first.frame_len + first.bytes, ..first.clone() }, "more than the"),
        (Member { frame_offset: file_len - 10, ..first.clone() }, "past the end of the"),
    ] {
        let read_before = read.get();
        let err = r.read_member(&damaged).unwrap_err();
        assert_eq!(read.get(), read_before, "{damaged:?}: nothing is read for a damaged index entry");
        let message = err.to_string();
        let start = format!("a.tar.zst: member {} (frame at byte {}) is damaged: ", first.name, damaged.frame_offset);
        assert!(
            message.starts_with(&start)
                && message.contains(&format!("frame_len {}", damaged.frame_len))
                && message.contains(says),
            "{message}"
        );
    }
    assert_eq!(r.read_member(&first).unwrap().len() as u64, first.bytes);
}

/// A path in the operator's S3 layout is often over the 100 bytes of a tar
/// name: its directories go in the ustar prefix (155 bytes more), and both
/// the archive's own reader and GNU tar see the whole name. Before: refused.
#[test]
fn a_member_name_over_100_bytes_goes_in_the_ustar_prefix() {
    let long_dir = format!("2026/01/02/{}/{}/a/shard-0", "team-recommendations-prod", "x".repeat(63));
    let traces: Vec<(String, Vec<u8>)> =
        traces().into_iter().map(|(name, data)| (format!("{long_dir}/{name}"), data)).collect();
    assert!(traces[0].0.len() > 100, "{}", traces[0].0);
    let bytes = archive(&traces);
    let mut r = ArchiveReader::new(Cursor::new(bytes.clone()), "a.tar.zst").unwrap();
    for (i, (name, data)) in traces.iter().enumerate() {
        let member = r.members()[i].clone();
        assert_eq!(&member.name, name);
        assert_eq!(&r.read_member(&member).unwrap(), data);
    }
    untar_with_gnu_tar(&bytes, &traces);
    // A file name alone over 100 bytes has no place: refused, naming both limits.
    let too_long = format!("{}.trace", "e".repeat(100));
    let Err(err) = prepare_member("in/x.trace", &too_long, &traces[0].1) else { panic!("a name too long is refused") };
    assert!(err.to_string().contains("a name of at most 100 bytes, after a directory prefix of at most 155"), "{err}");
}

/// Every zstd frame carries its content checksum: a flipped bit anywhere in
/// the index frame is found when the index is read, never a listing with
/// another name, episode or offset. Before: 666 of 1,108 single-bit flips
/// were read as a changed index, exit 0.
#[test]
fn a_bit_flip_in_the_index_frame_is_damage_not_a_different_index() {
    let bytes = archive(&traces());
    let locator = &bytes[bytes.len() - 32..];
    let offset = u64::from_le_bytes(locator[16..24].try_into().unwrap()) as usize;
    let len = u64::from_le_bytes(locator[24..32].try_into().unwrap()) as usize;
    let original = ArchiveReader::new(Cursor::new(bytes.clone()), "a.tar.zst").unwrap().members().to_vec();
    let mut changed = Vec::new();
    for at in offset..offset + len {
        for bit in [0x01u8, 0x10, 0x80] {
            let mut flipped = bytes.clone();
            flipped[at] ^= bit;
            if let Ok(r) = ArchiveReader::new(Cursor::new(flipped), "a.tar.zst")
                && r.members() != original.as_slice()
            {
                changed.push((at - offset, bit));
            }
        }
    }
    assert!(changed.is_empty(), "flips read as another index: {changed:?}");
}
