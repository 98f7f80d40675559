//! A follower's native copy loop decides from the leader's answer alone what to write to
//! its log (follower_copy.rs, `plan`): whatever bytes come, it never panics, and what it
//! plans to append is exactly the answer's records, whole batches back to back, each with
//! its CRC-32C right, magic 2, the log's leader epoch, not a control batch, offsets that
//! continue the log and stay within the limits. The input's first 16 bytes are the log
//! end offset and the position (the first byte's low bit: make the CRCs right); the
//! limits are small so that every rule is met.
#![no_main]

#[path = "../../src/follower_copy.rs"]
#[allow(dead_code)]
mod follower_copy;
#[path = "../../src/socket_io.rs"]
#[allow(dead_code)]
mod socket_io;

use follower_copy::{plan, Limits, Plan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let log_end_offset = i64::from_be_bytes(data[..8].try_into().unwrap()) & 0xFFFF;
    let position = i64::from_be_bytes(data[8..16].try_into().unwrap()) & 0xFFFF;
    let mut body = data[16..].to_vec();
    // Half the inputs get their batches' CRCs made right, so that what follows the CRC
    // check is reached too (a random CRC almost never matches).
    if data[0] & 1 == 1 {
        let mut at = 5 + 51;
        while body.len() >= at + 61 {
            let size = 12 + i32::from_be_bytes(body[at + 8..at + 12].try_into().unwrap()) as i64;
            if size < 61 || at as i64 + size > body.len() as i64 {
                break;
            }
            let end = at + size as usize;
            let crc = crc32c::crc32c(&body[at + 21..end]);
            body[at + 17..at + 21].copy_from_slice(&crc.to_be_bytes());
            at = end;
        }
    }
    let body = &body[..];
    let limits = Limits { latest_epoch: 0, segment_bytes: 1 << 16, max_timestamp_ms: 1 << 40, max_batches: 8, max_last_offset: 1 << 20 };
    if let Plan::Append { records_at, log_end_offset: end, batches, .. } = plan(body, 0, log_end_offset, position, 0, &limits) {
        let records = &body[records_at..];
        assert!(!records.is_empty() && position + records.len() as i64 <= limits.segment_bytes);
        let (mut at, mut expected, mut count) = (0usize, log_end_offset, 0);
        while at < records.len() {
            let size = 12 + i32::from_be_bytes(records[at + 8..at + 12].try_into().unwrap()) as usize;
            let batch = &records[at..at + size];
            assert_eq!(batch[16], 2);
            assert_eq!(crc32c::crc32c(&batch[21..]), u32::from_be_bytes(batch[17..21].try_into().unwrap()));
            assert_eq!(i32::from_be_bytes(batch[12..16].try_into().unwrap()), 0);
            assert_eq!(batch[22] & 0x20, 0);
            let base = i64::from_be_bytes(batch[..8].try_into().unwrap());
            assert!(base >= expected);
            expected = base + i32::from_be_bytes(batch[23..27].try_into().unwrap()) as i64 + 1;
            assert!(expected - 1 <= limits.max_last_offset);
            count += 1;
            at += size;
        }
        assert_eq!((at, expected, count), (records.len(), end, batches));
        assert!(batches <= limits.max_batches);
    }
});
