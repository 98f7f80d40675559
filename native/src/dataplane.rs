//! The data plane's PRODUCE exchange, in `rayk/dataplane/frames.py`'s format: the request
//! frame a batch of Kafka produce requests makes for one partition replica, and the answer
//! read back. Every number is big-endian. The answer comes from a replica that proved the
//! endpoint's secret, yet it is read as untrusted bytes: anything that does not parse is a
//! `FrameError`, and the connection it came on is dropped (as `connection.py` does).

use std::collections::HashMap;

pub const PRODUCE: i8 = 2;
const ANSWERED: i8 = 0;
const FAILED: i8 = 1;

/// One Kafka produce request's part for this partition.
pub struct ProduceRequest {
    pub records: Vec<u8>,
    pub acks: i16,
    pub timeout_ms: i32,
    pub transactional_id: Option<String>,
    pub transaction_version: i8,
}

/// What the replica answered one request: Ok((base offset, log append time, log start
/// offset)) or the error its class names.
pub type ProduceResult = Result<(i64, i64, i64), KafkaError>;

#[derive(Clone, Debug)]
pub struct KafkaError {
    pub code: i16,
    pub message: String,
    pub record_errors: Vec<(i32, String)>,
}

#[derive(Debug)]
pub struct FrameError(pub String);

/// rayk.errors' classes by name: (Kafka's code, Kafka's name), so that a named error reads as
/// Python's `str(error)` would ("NAME: message", or "NAME" alone).
pub struct ErrorTable {
    pub by_class: HashMap<String, (i16, String)>,
    /// rayk.errors.MAX_RECORD_ERRORS: an answer naming more records at fault does not parse.
    pub max_record_errors: i32,
    /// frames.MAX_FRAME_BYTES: an answer declaring a larger size is not read.
    pub max_frame_bytes: usize,
}

impl ErrorTable {
    pub fn error(&self, class_name: &str, message: &str) -> KafkaError {
        match self.by_class.get(class_name) {
            Some((code, name)) => KafkaError {
                code: *code,
                message: if message.is_empty() { name.clone() } else { format!("{name}: {message}") },
                record_errors: Vec::new(),
            },
            // frames._decode_error: UnknownServerError(f"{name}: {message}")
            None => KafkaError {
                code: -1,
                message: format!("UNKNOWN_SERVER_ERROR: {class_name}: {message}"),
                record_errors: Vec::new(),
            },
        }
    }

    fn decode(&self, encoded: &[u8]) -> Option<KafkaError> {
        if encoded.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(encoded);
        let (name, message) = text.split_once('\0').unwrap_or((&text, ""));
        Some(self.error(name, message))
    }
}

/// The whole frame (size prefix included) of a PRODUCE request.
pub fn produce_frame(correlation_id: i32, requests: &[ProduceRequest]) -> Vec<u8> {
    let records: usize = requests.iter().map(|r| r.records.len()).sum();
    let mut out = Vec::with_capacity(4 + 5 + 4 + requests.len() * 13 + records + 64);
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&correlation_id.to_be_bytes());
    out.push(PRODUCE as u8);
    out.extend_from_slice(&(requests.len() as i32).to_be_bytes());
    for r in requests {
        out.extend_from_slice(&r.acks.to_be_bytes());
        out.extend_from_slice(&r.timeout_ms.to_be_bytes());
        out.extend_from_slice(&(r.records.len() as i32).to_be_bytes());
        let txn_id_size: i16 = match &r.transactional_id {
            Some(id) => id.len() as i16,
            None => -1,
        };
        out.extend_from_slice(&txn_id_size.to_be_bytes());
        out.push(r.transaction_version as u8);
    }
    for r in requests {
        if let Some(id) = &r.transactional_id {
            out.extend_from_slice(id.as_bytes());
        }
        out.extend_from_slice(&r.records);
    }
    let size = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], FrameError> {
        if self.body.len() - self.at < n {
            return Err(FrameError(format!("a PRODUCE answer of {} bytes is shorter than its {what}", self.body.len())));
        }
        let out = &self.body[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    fn i8(&mut self, what: &str) -> Result<i8, FrameError> {
        Ok(self.take(1, what)?[0] as i8)
    }
    fn u16(&mut self, what: &str) -> Result<u16, FrameError> {
        Ok(u16::from_be_bytes(self.take(2, what)?.try_into().unwrap()))
    }
    fn i32(&mut self, what: &str) -> Result<i32, FrameError> {
        Ok(i32::from_be_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn i64(&mut self, what: &str) -> Result<i64, FrameError> {
        Ok(i64::from_be_bytes(self.take(8, what)?.try_into().unwrap()))
    }
}

/// What an answer frame's body (after its size) says: Ok(one result per request), or
/// Err(the error of a FAILED answer: the request failed as a whole). `expected_correlation_id`
/// and `expected_count` are the request's: anything else is a FrameError.
pub fn read_produce_answer(
    body: &[u8],
    expected_correlation_id: i32,
    expected_count: usize,
    errors: &ErrorTable,
) -> Result<Result<Vec<ProduceResult>, KafkaError>, FrameError> {
    let mut r = Reader { body, at: 0 };
    let correlation_id = r.i32("header")?;
    let outcome = r.i8("header")?;
    if correlation_id != expected_correlation_id {
        return Err(FrameError(format!("an answer to request {correlation_id}, which was not the one in flight")));
    }
    if outcome == FAILED {
        let size = r.u16("error")? as usize;
        let encoded = r.take(size, "error")?;
        if r.at != body.len() {
            return Err(FrameError("a failed answer has bytes after its error".into()));
        }
        return match errors.decode(encoded) {
            Some(error) => Ok(Err(error)),
            None => Err(FrameError("a failed answer names no error".into())),
        };
    }
    if outcome != ANSWERED {
        return Err(FrameError(format!("an answer to request {correlation_id} with outcome {outcome}")));
    }
    let count = r.i32("count")?;
    if count < 0 || count as usize != expected_count {
        return Err(FrameError(format!("an answer of {count} results to {expected_count} produce requests")));
    }
    let mut results = Vec::with_capacity(expected_count);
    for _ in 0..count {
        let base_offset = r.i64("results")?;
        let log_append_time_ms = r.i64("results")?;
        let log_start_offset = r.i64("results")?;
        let error_size = r.u16("results")? as usize;
        let record_error_count = r.i32("results")?;
        let error = errors.decode(r.take(error_size, "errors")?);
        let result = match error {
            None if record_error_count != 0 => {
                return Err(FrameError(format!("a PRODUCE answer names {record_error_count} records at fault for no error")));
            }
            None => Ok((base_offset, log_append_time_ms, log_start_offset)),
            Some(mut error) => {
                if record_error_count != 0 {
                    if error.code != 87 {
                        return Err(FrameError(format!(
                            "a PRODUCE answer names {record_error_count} records at fault for an error that is not INVALID_RECORD"
                        )));
                    }
                    if !(0 < record_error_count && record_error_count <= errors.max_record_errors) {
                        return Err(FrameError(format!(
                            "a PRODUCE answer names {record_error_count} records at fault, not 1 to {}",
                            errors.max_record_errors
                        )));
                    }
                    for _ in 0..record_error_count {
                        let batch_index = r.i32("record errors")?;
                        let size = r.u16("record errors")? as usize;
                        let message = String::from_utf8_lossy(r.take(size, "record errors' messages")?).into_owned();
                        error.record_errors.push((batch_index, message));
                    }
                }
                Err(error)
            }
        };
        results.push(result);
    }
    if r.at != body.len() {
        return Err(FrameError(format!("a PRODUCE answer has {} bytes after its {count} results", body.len() - r.at)));
    }
    Ok(Ok(results))
}
