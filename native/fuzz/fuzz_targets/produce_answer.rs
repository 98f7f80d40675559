//! The native produce path reads each replica's PRODUCE answer with
//! `dataplane::read_produce_answer`: whatever the bytes, it returns a result or a
//! FrameError, never panics (a panic would stop the listener's native path). The input's
//! first byte is how many requests the frame answered; its answers' results are encoded
//! again with `produce_response::encode` for every Produce version, which must not panic
//! either, and whose frame's size prefix must be its length.
#![no_main]

#[path = "../../src/dataplane.rs"]
#[allow(dead_code)]
mod dataplane;
#[path = "../../src/produce_response.rs"]
#[allow(dead_code)]
mod produce_response;

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&count, body)) = data.split_first() else { return };
    let mut by_class = HashMap::new();
    by_class.insert("InvalidRecordError".to_string(), (87i16, "INVALID_RECORD".to_string()));
    by_class.insert("NotLeaderOrFollowerError".to_string(), (6i16, "NOT_LEADER_OR_FOLLOWER".to_string()));
    let errors = dataplane::ErrorTable { by_class, max_record_errors: 10_000, max_frame_bytes: 1 << 27 };
    let correlation_id = body.get(..4).map(|b| i32::from_be_bytes(b.try_into().unwrap())).unwrap_or(0);
    let Ok(Ok(results)) = dataplane::read_produce_answer(body, correlation_id, count as usize, &errors) else { return };
    assert_eq!(results.len(), count as usize);
    let partitions: Vec<produce_response::PartitionAnswer> = results
        .into_iter()
        .enumerate()
        .map(|(i, r)| match r {
            Ok((base, time, start)) => produce_response::PartitionAnswer {
                index: i as i32,
                error_code: 0,
                error_message: None,
                base_offset: base,
                log_append_time_ms: time,
                log_start_offset: start,
                record_errors: Vec::new(),
            },
            Err(e) => produce_response::PartitionAnswer::failed(i as i32, e.code, e.message, e.record_errors),
        })
        .collect();
    let topics = vec![("t".to_string(), partitions)];
    for version in produce_response::MIN_VERSION..=produce_response::MAX_VERSION {
        let frame = produce_response::encode(version, correlation_id, &topics);
        assert_eq!(u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize, frame.len() - 4);
    }
});
