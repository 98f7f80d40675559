//! kafka_request: a Kafka request frame's header, and a Produce request's body (v3 to v12),
//! read as kio reads them (rayk/net/codec.py): what a listener's native connection needs to
//! submit a Produce to the produce path without Python (kafka_conns.rs).
//!
//! Strict: anything this does not read whole and exactly (an unknown version, a null where
//! the schema has none, bytes left over, a string that is not UTF-8) is `None`, and the
//! connection hands the frame to Python, which answers it as it answers any request (its
//! decode error included). Records stay the bytes the client sent: borrowed, not copied.

/// Produce's API key, and the versions read here (rayk/net/native_produce.py's span).
pub const PRODUCE: i16 = 0;
pub const PRODUCE_MIN_VERSION: i16 = 3;
pub const PRODUCE_MAX_VERSION: i16 = 12;
/// Produce is flexible (compact strings and arrays, tagged fields, header v2) from v9.
const PRODUCE_FLEXIBLE_FROM: i16 = 9;

/// One partition's records (None: the client sent a null).
pub type PartitionData<'a> = (i32, Option<&'a [u8]>);

#[derive(Debug, PartialEq)]
pub struct Produce<'a> {
    pub api_version: i16,
    pub correlation_id: i32,
    pub client_id: Option<String>,
    pub transactional_id: Option<String>,
    pub acks: i16,
    pub timeout_ms: i32,
    pub topics: Vec<(String, Vec<PartitionData<'a>>)>,
}

/// The frame (after its size prefix) as a Produce request, if it is one read whole.
pub fn produce(frame: &[u8]) -> Option<Produce<'_>> {
    let mut r = Reader { buf: frame, at: 0 };
    let (api_key, api_version, correlation_id) = (r.i16()?, r.i16()?, r.i32()?);
    if api_key != PRODUCE || !(PRODUCE_MIN_VERSION..=PRODUCE_MAX_VERSION).contains(&api_version) {
        return None;
    }
    let flexible = api_version >= PRODUCE_FLEXIBLE_FROM;
    let client_id = r.nullable_string()?; // (a plain string in every header version)
    if flexible {
        r.tagged_fields()?;
    }
    let transactional_id = if flexible { r.compact_nullable_string()? } else { r.nullable_string()? };
    let (acks, timeout_ms) = (r.i16()?, r.i32()?);
    let topic_count = r.array_len(flexible)?;
    let mut topics = Vec::with_capacity(topic_count.min(1024));
    for _ in 0..topic_count {
        let name = if flexible { r.compact_string()? } else { r.string()? };
        let partition_count = r.array_len(flexible)?;
        let mut partitions = Vec::with_capacity(partition_count.min(1024));
        for _ in 0..partition_count {
            let index = r.i32()?;
            let records = if flexible { r.compact_nullable_bytes()? } else { r.nullable_bytes()? };
            if flexible {
                r.tagged_fields()?;
            }
            partitions.push((index, records));
        }
        if flexible {
            r.tagged_fields()?;
        }
        topics.push((name, partitions));
    }
    if flexible {
        r.tagged_fields()?;
    }
    if r.at != frame.len() {
        return None; // bytes after the request: Python's decoder decides what they mean
    }
    Some(Produce { api_version, correlation_id, client_id, transactional_id, acks, timeout_ms, topics })
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let bytes = self.buf.get(self.at..end)?;
        self.at = end;
        Some(bytes)
    }

    fn i16(&mut self) -> Option<i16> {
        Some(i16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn i32(&mut self) -> Option<i32> {
        Some(i32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }

    /// An unsigned varint of at most 32 bits (Kafka's), as kio reads it.
    fn uvarint(&mut self) -> Option<u32> {
        let mut value: u32 = 0;
        for shift in (0..35).step_by(7) {
            let byte = self.take(1)?[0];
            if shift == 28 && byte > 0x0F {
                return None; // more than 32 bits
            }
            value |= u32::from(byte & 0x7F) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn utf8(&mut self, n: usize) -> Option<String> {
        std::str::from_utf8(self.take(n)?).ok().map(str::to_owned)
    }

    fn nullable_string(&mut self) -> Option<Option<String>> {
        match self.i16()? {
            -1 => Some(None),
            n if n >= 0 => Some(Some(self.utf8(n as usize)?)),
            _ => None,
        }
    }

    fn string(&mut self) -> Option<String> {
        self.nullable_string()?
    }

    fn compact_nullable_string(&mut self) -> Option<Option<String>> {
        match self.uvarint()? {
            0 => Some(None),
            n => Some(Some(self.utf8(n as usize - 1)?)),
        }
    }

    fn compact_string(&mut self) -> Option<String> {
        self.compact_nullable_string()?
    }

    fn nullable_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        match self.i32()? {
            -1 => Some(None),
            n if n >= 0 => Some(Some(self.take(n as usize)?)),
            _ => None,
        }
    }

    fn compact_nullable_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        match self.uvarint()? {
            0 => Some(None),
            n => Some(Some(self.take(n as usize - 1)?)),
        }
    }

    /// An array's length; a null array (where the schema has none) is not read here.
    fn array_len(&mut self, compact: bool) -> Option<usize> {
        if compact {
            let n = self.uvarint()?;
            return if n == 0 { None } else { Some(n as usize - 1) };
        }
        let n = self.i32()?;
        if n < 0 {
            return None;
        }
        // Each element takes at least 4 bytes: a count beyond what is left is a lie.
        if (n as usize).saturating_mul(4) > self.buf.len() - self.at {
            return None;
        }
        Some(n as usize)
    }

    /// Tagged fields: none of Produce's is known, so each is skipped (as kio keeps unknown ones).
    fn tagged_fields(&mut self) -> Option<()> {
        let count = self.uvarint()?;
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()? as usize;
            self.take(size)?;
        }
        Some(())
    }
}

/// One topic of a Produce request to encode: its name, and each partition's index and records.
#[cfg(any(test, fuzzing))]
pub type TopicData<'a> = (&'a str, Vec<PartitionData<'a>>);

/// A Produce request's frame (no size prefix) as a client encodes it, in `version`'s
/// encoding: for the tests and the fuzz target (native/fuzz/fuzz_targets/kafka_conns.rs).
#[cfg(any(test, fuzzing))]
pub fn encode_produce(version: i16, correlation_id: i32, transactional_id: Option<&str>, acks: i16,
                      timeout_ms: i32, topics: &[TopicData<'_>]) -> Vec<u8> {
    let flexible = version >= PRODUCE_FLEXIBLE_FROM;
    let mut out = Vec::new();
    out.extend_from_slice(&PRODUCE.to_be_bytes());
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&correlation_id.to_be_bytes());
    put_bytes(Some(b"cli"), false, 2, &mut out); // the header's client id: int16-sized in every version
    if flexible {
        out.push(0);
    }
    put_bytes(transactional_id.map(str::as_bytes), flexible, 2, &mut out);
    out.extend_from_slice(&acks.to_be_bytes());
    out.extend_from_slice(&timeout_ms.to_be_bytes());
    put_len(topics.len(), flexible, &mut out);
    for (name, partitions) in topics {
        put_bytes(Some(name.as_bytes()), flexible, 2, &mut out);
        put_len(partitions.len(), flexible, &mut out);
        for (index, records) in partitions {
            out.extend_from_slice(&index.to_be_bytes());
            put_bytes(*records, flexible, 4, &mut out);
            if flexible {
                out.push(0);
            }
        }
        if flexible {
            out.push(0);
        }
    }
    if flexible {
        out.push(0);
    }
    out
}

#[cfg(any(test, fuzzing))]
fn put_uvarint(mut n: u32, out: &mut Vec<u8>) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[cfg(any(test, fuzzing))]
fn put_len(n: usize, compact: bool, out: &mut Vec<u8>) {
    if compact { put_uvarint(n as u32 + 1, out) } else { out.extend_from_slice(&(n as i32).to_be_bytes()) }
}

/// A nullable string's or bytes' size (`width` 2 or 4 bytes, or compact) and bytes.
#[cfg(any(test, fuzzing))]
fn put_bytes(b: Option<&[u8]>, compact: bool, width: usize, out: &mut Vec<u8>) {
    match (b, compact) {
        (None, true) => out.push(0),
        (Some(b), true) => put_uvarint(b.len() as u32 + 1, out),
        (None, false) if width == 2 => out.extend_from_slice(&(-1i16).to_be_bytes()),
        (None, false) => out.extend_from_slice(&(-1i32).to_be_bytes()),
        (Some(b), false) if width == 2 => out.extend_from_slice(&(b.len() as i16).to_be_bytes()),
        (Some(b), false) => out.extend_from_slice(&(b.len() as i32).to_be_bytes()),
    }
    out.extend_from_slice(b.unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request with one unknown tagged field at its end where it has them (skipped).
    fn frame(version: i16, txn: Option<&str>, topics: &[TopicData<'_>]) -> Vec<u8> {
        let mut out = encode_produce(version, 7, txn, -1, 30_000, topics);
        if version >= PRODUCE_FLEXIBLE_FROM {
            out.pop();
            out.extend_from_slice(&[1, 5, 2, 0xAA, 0xBB]);
        }
        out
    }

    #[test]
    fn both_encodings_are_read_and_anything_else_is_left_to_python() {
        let records: &[u8] = b"records";
        for version in [3, 8, 9, 12] {
            let bytes = frame(version, Some("tx"), &[("t", vec![(0, Some(records)), (1, None)])]);
            let p = produce(&bytes).expect("read");
            assert_eq!((p.api_version, p.correlation_id, p.acks, p.timeout_ms), (version, 7, -1, 30_000));
            assert_eq!((p.client_id.as_deref(), p.transactional_id.as_deref()), (Some("cli"), Some("tx")));
            assert_eq!(p.topics, vec![("t".to_string(), vec![(0, Some(records)), (1, None)])]);
            for cut in 0..bytes.len() {
                assert!(produce(&bytes[..cut]).is_none(), "v{version} cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(produce(&longer).is_none(), "bytes after the request");
        }
        assert!(produce(&frame(2, None, &[])).is_none(), "a version not read here");
        assert!(produce(&frame(13, None, &[])).is_none());
        let mut not_utf8 = frame(3, None, &[("t", vec![])]);
        let at = not_utf8.len() - 4 - 1; // the topic name's one byte
        not_utf8[at] = 0xFF;
        assert!(produce(&not_utf8).is_none());
    }
}
