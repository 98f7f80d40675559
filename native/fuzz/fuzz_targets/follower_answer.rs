//! A follower's native copy loop decides from the leader's answer alone what to write to
//! its log (follower_copy.rs, `plan`): whatever bytes come, it never panics, and what it
//! plans to append is exactly the answer's records, whole batches back to back, each with
//! its CRC-32C right, magic 2, the log's leader epoch, not a control batch, offsets that
//! continue the log and stay within the limits. The input's first 16 bytes are the log
//! end offset and the position (the first byte's low bit: make the CRCs right); the
//! limits are small so that every rule is met.
//!
//! A quarter of the inputs (the first byte's second bit) are not taken as the answer but
//! describe one: up to four valid batches that continue the log, one byte of it flipped or
//! none. Random bytes almost never make a valid answer, so without these the append's own
//! checks would rarely be reached; and an answer left whole must be planned as an append
//! of all its batches (a valid answer the loop hands back would cost a Python wake-up each).
#![no_main]

#[path = "../../src/follower_copy.rs"]
#[allow(dead_code)]
mod follower_copy;
#[path = "../../src/socket_io.rs"]
#[allow(dead_code)]
mod socket_io;

use follower_copy::{plan, test_batch, Limits, Plan};
use libfuzzer_sys::fuzz_target;

/// The answer an input describes (see the module docstring), and where the log ends after
/// its batches, with how many there are.
fn described_answer(log_end_offset: i64, d: &[u8]) -> (Vec<u8>, i64, i64) {
    let at = |i: usize| d.get(i).copied().unwrap_or(0);
    let mut body = vec![0, 0, 0, 0, 0]; // correlation id 0, ANSWERED
    for v in [log_end_offset, log_end_offset + 40, 0, log_end_offset] {
        body.extend_from_slice(&v.to_be_bytes()); // HW, LEO, log start, LSO
    }
    body.push(0); // no diverging epoch
    body.extend_from_slice(&(-1i32).to_be_bytes());
    body.extend_from_slice(&(-1i64).to_be_bytes());
    body.extend_from_slice(&0u16.to_be_bytes()); // no error
    body.extend_from_slice(&0i32.to_be_bytes()); // no aborted transactions
    let batches = 1 + at(0) as i64 % 4;
    let mut next = log_end_offset;
    for i in 0..batches as usize {
        let count = 1 + at(1 + i) as i32 % 5;
        let base = next + at(5 + i) as i64 % 3; // gaps, as a compacted log's
        body.extend(test_batch(base, 0, count, 0, 100 + at(9 + i) as i64));
        next = base + count as i64;
    }
    if at(13) & 1 == 1 {
        let flip = u16::from_be_bytes([at(14), at(15)]) as usize % body.len();
        body[flip] ^= at(16) | 1;
    }
    (body, next, batches)
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let log_end_offset = i64::from_be_bytes(data[..8].try_into().unwrap()) & 0xFFFF;
    let mut position = i64::from_be_bytes(data[8..16].try_into().unwrap()) & 0xFFFF;
    let mut body = data[16..].to_vec();
    let mut whole: Option<(i64, i64)> = None; // a described answer left whole: where it ends, its batches
    if data[0] & 2 == 2 {
        let (described, end, batches) = described_answer(log_end_offset, &data[16..]);
        if data.get(16 + 13).copied().unwrap_or(0) & 1 == 0 {
            whole = Some((end, batches));
        }
        body = described;
        position &= 0x3FF; // room in the segment for what is described
    } else if data[0] & 1 == 1 {
        // Half the other inputs get their batches' CRCs made right, so that what follows
        // the CRC check is reached too (a random CRC almost never matches).
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
    let planned = plan(body, 0, log_end_offset, position, 0, &limits);
    if let Some((end, batches)) = whole {
        assert!(matches!(planned, Plan::Append { log_end_offset: e, batches: b, .. } if e == end && b == batches),
                "a valid answer was not planned as an append of all its batches: {planned:?}");
    }
    if let Plan::Append { records_at, log_end_offset: end, batches, .. } = planned {
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
