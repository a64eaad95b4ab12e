//! Just enough of the protobuf wire format to read single fields straight
//! from a record's bytes, with no allocation and no decoding of the fields a
//! query does not name. Malformed bytes are an error, never a panic.

use prost::encoding::decode_varint;

use crate::reader::RecordKind;

#[derive(Debug, Clone, Copy)]
pub enum Wire<'a> {
    Varint(u64),
    I64(u64),
    I32(u32),
    Len(&'a [u8]),
}

/// Iterates `(field number, value)` pairs of one message.
pub struct Fields<'a> {
    buf: &'a [u8],
}

#[derive(Debug, Clone, Copy)]
pub struct Malformed;

pub fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Wire<'a>), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.buf.is_empty() {
            return None;
        }
        Some(self.read().inspect_err(|_| self.buf = &[]))
    }
}

impl<'a> Fields<'a> {
    fn read(&mut self) -> Result<(u32, Wire<'a>), Malformed> {
        let key = decode_varint(&mut self.buf).map_err(|_| Malformed)?;
        let field = (key >> 3) as u32;
        let value = match key & 7 {
            0 => Wire::Varint(decode_varint(&mut self.buf).map_err(|_| Malformed)?),
            1 => {
                let (v, rest) = self.buf.split_first_chunk::<8>().ok_or(Malformed)?;
                self.buf = rest;
                Wire::I64(u64::from_le_bytes(*v))
            }
            2 => {
                let n = decode_varint(&mut self.buf).map_err(|_| Malformed)?;
                let n = usize::try_from(n).ok().filter(|&n| n <= self.buf.len()).ok_or(Malformed)?;
                let (v, rest) = self.buf.split_at(n);
                self.buf = rest;
                Wire::Len(v)
            }
            5 => {
                let (v, rest) = self.buf.split_first_chunk::<4>().ok_or(Malformed)?;
                self.buf = rest;
                Wire::I32(u32::from_le_bytes(*v))
            }
            _ => return Err(Malformed),
        };
        Ok((field, value))
    }
}

/// The body message of a `Record` (the bytes of its `oneof body` field).
/// Which field that is: `RecordKind::takes_over`, as the reader decides the kind.
pub fn record_body(record: &[u8]) -> Result<&[u8], Malformed> {
    let (mut body, mut kind) = (None, RecordKind::Other(0));
    for f in fields(record) {
        if let (n, Wire::Len(bytes)) = f?
            && n >= 2
        {
            let this = RecordKind::from_field(n);
            if this.takes_over(kind) {
                body = Some(bytes);
                kind = this;
            }
        }
    }
    body.ok_or(Malformed)
}

/// The last occurrence of `field` (protobuf's rule for a repeated scalar).
pub fn last_field<'a>(msg: &'a [u8], field: u32) -> Result<Option<Wire<'a>>, Malformed> {
    let mut found = None;
    for f in fields(msg) {
        let (n, v) = f?;
        if n == field {
            found = Some(v);
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::{PlanStep, Record, record::Body};
    use prost::Message;

    #[test]
    fn reads_fields_of_an_encoded_record() {
        let record = Record {
            step: 7,
            body: Some(Body::PlanStep(Box::new(PlanStep {
                tool: "t".into(),
                latency_micros: 1234,
                ..Default::default()
            }))),
        };
        let bytes = record.encode_to_vec();
        let body = record_body(&bytes).unwrap();
        assert!(matches!(last_field(body, 4).unwrap(), Some(Wire::Len(b"t"))));
        assert!(matches!(last_field(body, 18).unwrap(), Some(Wire::Varint(1234))));
        assert!(last_field(body, 19).unwrap().is_none());
        // A field a newer writer adds after the body is not the body.
        let mut newer = bytes.clone();
        prost::encoding::string::encode(12, &"span-1".to_string(), &mut newer);
        assert!(matches!(last_field(record_body(&newer).unwrap(), 4).unwrap(), Some(Wire::Len(b"t"))));
        // Any truncation is an error, not a panic.
        for cut in 0..bytes.len() {
            let _ = record_body(&bytes[..cut]).and_then(|b| last_field(b, 18));
        }
    }
}
