//! The frame answering a Kafka Produce request (v3-v12), as `rayk/net/data_responses.py`'s
//! `produce_frame` writes it: Kafka's ProduceResponse.json, flexible from v9 (compact
//! arrays and strings, a response header v1 and empty tagged-field sections). The throttle
//! time is written as 0: the listener's Python sets it afterwards (`throttle_offset`).
//! tests/test_native_produce.py holds the bytes to `produce_frame`'s for every version.

/// One partition's answer.
#[derive(Clone, Debug)]
pub struct PartitionAnswer {
    pub index: i32,
    pub error_code: i16,
    pub error_message: Option<String>,
    pub base_offset: i64,
    pub log_append_time_ms: i64,
    pub log_start_offset: i64,
    /// KIP-467: (batch index, message) of the records an INVALID_RECORD names.
    pub record_errors: Vec<(i32, String)>,
}

impl PartitionAnswer {
    /// The answer of a partition that failed: -1 for the offsets and the time, as Kafka answers.
    pub fn failed(index: i32, error_code: i16, error_message: String, record_errors: Vec<(i32, String)>) -> Self {
        PartitionAnswer {
            index,
            error_code,
            error_message: Some(error_message),
            base_offset: -1,
            log_append_time_ms: -1,
            log_start_offset: -1,
            record_errors,
        }
    }
}

pub const MIN_VERSION: i16 = 3;
pub const MAX_VERSION: i16 = 12;

fn uvarint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7F) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn array_length(out: &mut Vec<u8>, n: usize, flexible: bool) {
    if flexible {
        uvarint(out, n as u64 + 1);
    } else {
        out.extend_from_slice(&(n as i32).to_be_bytes());
    }
}

fn string(out: &mut Vec<u8>, text: Option<&str>, flexible: bool) {
    match text {
        None if flexible => out.push(0),
        None => out.extend_from_slice(&(-1i16).to_be_bytes()),
        Some(text) => {
            let data = text.as_bytes();
            if flexible {
                uvarint(out, data.len() as u64 + 1);
                out.extend_from_slice(data);
            } else {
                // A non-flexible string's length is an int16: a longer message is cut (at a
                // character's boundary), where Python's struct.pack would raise.
                let mut end = data.len().min(i16::MAX as usize);
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                out.extend_from_slice(&(end as i16).to_be_bytes());
                out.extend_from_slice(&data[..end]);
            }
        }
    }
}

/// The size-prefixed frame; `version` must be MIN_VERSION..=MAX_VERSION (the listener serves no other).
pub fn encode(version: i16, correlation_id: i32, topics: &[(String, Vec<PartitionAnswer>)]) -> Vec<u8> {
    assert!((MIN_VERSION..=MAX_VERSION).contains(&version), "Produce v{version} has no layout here");
    let flexible = version >= 9;
    let mut out = Vec::with_capacity(64 + topics.iter().map(|(name, ps)| name.len() + 48 * ps.len()).sum::<usize>());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&correlation_id.to_be_bytes());
    if flexible {
        out.push(0);
    }
    array_length(&mut out, topics.len(), flexible);
    for (name, partitions) in topics {
        string(&mut out, Some(name), flexible);
        array_length(&mut out, partitions.len(), flexible);
        for p in partitions {
            out.extend_from_slice(&p.index.to_be_bytes());
            out.extend_from_slice(&p.error_code.to_be_bytes());
            out.extend_from_slice(&p.base_offset.to_be_bytes());
            out.extend_from_slice(&p.log_append_time_ms.to_be_bytes());
            if version >= 5 {
                out.extend_from_slice(&p.log_start_offset.to_be_bytes());
            }
            if version >= 8 {
                array_length(&mut out, p.record_errors.len(), flexible);
                for (batch_index, message) in &p.record_errors {
                    out.extend_from_slice(&batch_index.to_be_bytes());
                    string(&mut out, Some(message), flexible);
                    if flexible {
                        out.push(0);
                    }
                }
                string(&mut out, p.error_message.as_deref(), flexible);
            }
            if flexible {
                out.push(0);
            }
        }
        if flexible {
            out.push(0);
        }
    }
    out.extend_from_slice(&0i32.to_be_bytes()); // throttle_time_ms
    if flexible {
        out.push(0);
    }
    let size = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}
