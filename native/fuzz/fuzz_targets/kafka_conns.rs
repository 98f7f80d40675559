//! A listener reads its Kafka clients' connections with `Listener` (kafka_conns.rs): the
//! bytes of any client, cut wherever the socket cuts them, admitted now or later. It never
//! panics or stalls (a panic would end every native connection of the listener), and:
//!
//! - every frame up to the first one over the size bound is served once, natively (only a
//!   Produce that kafka_request.rs reads whole, acks 1 or -1, not transactional) or by
//!   Python (the frame handed over as the client sent it, in the stream's order);
//! - every answer is written in request order, each whole, nothing after the connection's
//!   end: Python's (none to an acks=0 Produce, as Python's is), and the produce path's
//!   (here each partition's endpoint lookup fails, now or turns later, in any order, so
//!   each is answered with that error); after the client's EOF, or a frame over the bound,
//!   the connection ends once what came before is answered;
//! - each native request gives back what it was admitted with (`Freed`, its size).
//!
//! The input is a script: its first byte is how many bytes the socket carries at a time,
//! then ops that build the client's stream (a Produce request in any version, with or
//! without acks and a transactional id, whole or damaged; a frame of any bytes; a size over
//! the bound) and the bytes that decide, for each admission, endpoint lookup and Python
//! answer, whether it comes at once or a turn later.
#![no_main]

#[path = "../../src/dataplane.rs"]
#[allow(dead_code)]
mod dataplane;
#[path = "../../src/kafka_conns.rs"]
#[allow(dead_code)]
mod kafka_conns;
#[path = "../../src/kafka_request.rs"]
#[allow(dead_code)]
mod kafka_request;
#[path = "../../src/produce_path.rs"]
#[allow(dead_code)]
mod produce_path;
#[path = "../../src/produce_response.rs"]
#[allow(dead_code)]
mod produce_response;
#[path = "../../src/socket_io.rs"]
#[allow(dead_code)]
mod socket_io;

use std::collections::{HashMap, VecDeque};
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

use kafka_conns::{Admit, KafkaEvent, Listener};
use kafka_request::TopicData;
use libfuzzer_sys::fuzz_target;
use produce_path::{Completion, Path};

const MAX_FRAME_BYTES: usize = 4096;
/// Turns of the loop beyond writing the stream (a byte a turn at worst) and the script's
/// deferrals (each takes a byte of it) after which the connection has stalled: each frame
/// needs a few (its admissions, its answer).
const TURNS_PER_FRAME: usize = 16;

/// Bytes of the script, read one at a time (zeros once it is spent).
struct Script<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        let b = self.bytes.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn spent(&self) -> bool {
        self.at >= self.bytes.len()
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
}

/// A Produce request's body (no size prefix) in the shape the script picks.
fn produce_request(s: &mut Script, correlation_id: i32) -> Vec<u8> {
    let version = 3 + (s.byte() % 10) as i16; // 3..=12
    let flags = s.byte();
    let acks: i16 = [-1, 1, 0, 2][(flags & 3) as usize];
    let transactional_id = (flags & 4 != 0).then_some("tx");
    let mut records: Vec<Vec<Option<Vec<u8>>>> = Vec::new(); // each topic's partitions' (63: null)
    for _ in 0..(flags >> 3) % 3 {
        let partitions = s.byte() % 3;
        records.push((0..partitions).map(|_| {
            let size = s.byte() as usize % 64;
            (size != 63).then(|| s.take(size))
        }).collect());
    }
    let topics: Vec<TopicData> = ["t", "u"]
        .into_iter()
        .zip(&records)
        .map(|(name, partitions)| (name, partitions.iter().enumerate().map(|(i, r)| (i as i32, r.as_deref())).collect()))
        .collect();
    kafka_request::encode_produce(version, correlation_id, transactional_id, acks, 1000, &topics)
}

/// The client's stream from the script's ops: (the stream, its frames' bodies up to the
/// first size over the bound, whether one is).
fn client_stream(s: &mut Script) -> (Vec<u8>, Vec<Vec<u8>>, bool) {
    let (mut stream, mut frames) = (Vec::new(), Vec::new());
    let mut correlation_id = 0i32;
    for _ in 0..s.byte() % 24 {
        correlation_id += 1;
        let body = match s.byte() % 8 {
            0..=3 => produce_request(s, correlation_id),
            4 => {
                // A Produce request damaged: cut short, or a byte changed, or one too many.
                let mut body = produce_request(s, correlation_id);
                let (how, at) = (s.byte(), s.byte() as usize);
                match how % 3 {
                    0 => body.truncate(at % body.len()),
                    1 => {
                        let i = at % body.len();
                        body[i] ^= s.byte() | 1;
                    }
                    _ => body.push(s.byte()),
                }
                body
            }
            5 | 6 => {
                let size = s.byte() as usize;
                let mut body = s.take(size);
                if let Some(id) = body.get_mut(4..8) {
                    id.copy_from_slice(&correlation_id.to_be_bytes());
                }
                body
            }
            _ => {
                // A size over the bound: the connection reads nothing after it.
                stream.extend_from_slice(&((MAX_FRAME_BYTES + 1 + s.byte() as usize) as u32).to_be_bytes());
                let tail = s.byte() as usize % 16;
                stream.extend_from_slice(&s.take(tail));
                return (stream, frames, true);
            }
        };
        stream.extend_from_slice(&(body.len() as u32).to_be_bytes());
        stream.extend_from_slice(&body);
        frames.push(body);
    }
    // A frame's part may follow (the client leaves mid-frame: it is dropped, never served).
    if s.byte() % 4 == 0 {
        stream.extend_from_slice(&20u32.to_be_bytes());
        let part = s.byte() as usize % 20;
        stream.extend_from_slice(&s.take(part));
    }
    (stream, frames, false)
}

/// Python's side of the admissions: each now or a turn later, as the script says.
struct Admission<'a, 'b> {
    script: &'b mut Script<'a>,
    waiting: bool,
}

impl Admission<'_, '_> {
    fn now(&mut self) -> bool {
        let now = self.script.spent() || self.script.byte() % 3 != 0;
        assert!(!self.waiting, "asked to admit while a frame waits for its admission");
        self.waiting = !now;
        now
    }
}

impl Admit for Admission<'_, '_> {
    fn admit(&mut self, _fd: RawFd, size: usize) -> Result<bool, String> {
        assert!(size <= MAX_FRAME_BYTES, "a frame over the bound admitted");
        Ok(self.now())
    }

    fn slot(&mut self, _fd: RawFd, _for_python: bool) -> Result<bool, String> {
        Ok(self.now())
    }
}

/// The correlation id an answer to `body` carries (the harness's answers echo it).
fn correlation_id(body: &[u8]) -> [u8; 4] {
    let mut id = [0xFF; 4];
    if let Some(b) = body.get(4..8) {
        id.copy_from_slice(b);
    }
    id
}

/// Whether Python answers nothing to `body`: a Produce with acks=0.
fn silent(body: &[u8]) -> bool {
    kafka_request::produce(body).is_some_and(|p| p.acks == 0)
}

fn servable(body: &[u8]) -> bool {
    kafka_request::produce(body).is_some_and(|p| p.acks != 0 && p.transactional_id.is_none())
}

fuzz_target!(|data: &[u8]| {
    let mut script = Script { bytes: data, at: 0 };
    let cut = 1 + script.byte() as usize;
    let (stream, frames, oversized) = client_stream(&mut script);

    let (mut client, ours) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    client.set_nonblocking(true).unwrap();
    let fd = ours.as_raw_fd();
    let mut by_class = HashMap::new();
    by_class.insert("NotLeaderOrFollowerError".to_string(), (6i16, "NOT_LEADER_OR_FOLLOWER".to_string()));
    let errors = dataplane::ErrorTable { by_class, max_record_errors: 100, max_frame_bytes: 1 << 20 };
    let mut listener = Listener::new(Path::new(0, errors));
    let mut admission = Admission { script: &mut script, waiting: false };
    listener.adopt_client(fd, &[], MAX_FRAME_BYTES, &mut admission);

    let mut to_python: Vec<Vec<u8>> = Vec::new(); // frames handed to Python, in order
    let mut unanswered: VecDeque<Option<[u8; 4]>> = VecDeque::new(); // Python's, oldest first (None: acks=0)
    let mut freed = Vec::new();
    let mut resolving: Vec<(String, i32)> = Vec::new(); // partitions whose endpoint Python looks up
    let (mut written, mut read) = (0usize, Vec::new());
    let (mut eof_told, mut ended, mut want_write, mut sent_eof) = (false, false, false, false);
    let mut sink = vec![0u8; 1 << 16];
    let turns = stream.len() + data.len() + TURNS_PER_FRAME * (frames.len() + 2);
    for turn in 0.. {
        assert!(turn < turns, "the connection stalled: {} of {} bytes written, {} read", written, stream.len(), read.len());
        if written < stream.len() {
            let end = (written + cut).min(stream.len());
            match client.write(&stream[written..end]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => written = stream.len(), // the listener ended the connection
            }
        } else if !sent_eof {
            let _ = client.shutdown(Shutdown::Write);
            sent_eof = true;
        }
        if !ended {
            listener.on_client_readable(fd, &mut admission);
            if want_write {
                listener.on_client_writable(fd, &mut admission);
            }
        }
        // What the produce path and the connection leave for Python.
        loop {
            let (completions, events) = listener.take(&mut admission);
            if completions.is_empty() && events.is_empty() {
                break;
            }
            for completion in completions {
                match completion {
                    Completion::NeedEndpoint { topic, partition } => resolving.push((topic, partition)),
                    Completion::Answered { .. } => panic!("a native request's answer left to Python"),
                    Completion::Release { .. } | Completion::WantWrite { .. } => panic!("no replica link was opened"),
                }
            }
            for event in events {
                match event {
                    KafkaEvent::Request { fd: f, frame } => {
                        assert_eq!(f, fd);
                        assert!(!eof_told && !ended, "a frame handed to Python after the EOF or the end");
                        unanswered.push_back((!silent(&frame)).then(|| correlation_id(&frame)));
                        to_python.push(frame);
                    }
                    KafkaEvent::Eof { .. } => {
                        assert!(!eof_told, "the EOF told twice");
                        eof_told = true;
                    }
                    KafkaEvent::End { .. } => {
                        assert!(!ended, "ended twice");
                        ended = true;
                    }
                    KafkaEvent::Freed { bytes, .. } => freed.push(bytes),
                    KafkaEvent::Hold { .. } => {}
                    KafkaEvent::WantWrite { on, .. } => want_write = on,
                }
            }
        }
        // Python's side: a lookup of a partition's endpoint fails (any of them, so that native
        // requests are answered out of their order), a wait for admission ends, and its
        // oldest frame is answered, each now or later.
        if !resolving.is_empty() && (admission.script.spent() || admission.script.byte() % 2 == 0) {
            let which = admission.script.byte() as usize % resolving.len();
            let key = resolving.swap_remove(which);
            listener.path.fail_endpoint(key, 6, "NOT_LEADER_OR_FOLLOWER: no endpoint in this test".into());
            continue; // (its answers are taken at the next turn's start)
        }
        if admission.waiting && !ended && (admission.script.spent() || admission.script.byte() % 2 == 0) {
            admission.waiting = false;
            listener.client_admitted(fd, &mut admission);
        }
        if !ended && (admission.script.spent() || admission.script.byte() % 2 == 0) {
            match unanswered.pop_front() {
                Some(Some(id)) => {
                    let mut answer = 4u32.to_be_bytes().to_vec();
                    answer.extend_from_slice(&id);
                    listener.client_answer(fd, answer, &mut admission);
                }
                Some(None) => listener.client_answer(fd, Vec::new(), &mut admission), // nothing to write
                None => {}
            }
        }
        loop {
            match client.read(&mut sink) {
                Ok(0) => break,
                Ok(n) => read.extend_from_slice(&sink[..n]),
                Err(_) => break,
            }
        }
        if ended && unanswered.is_empty() {
            break;
        }
        if ended {
            unanswered.clear(); // (the connection is gone: Python drops its answers)
        }
    }
    drop(ours);
    loop {
        match client.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => read.extend_from_slice(&sink[..n]),
        }
    }

    // Python was handed exactly the frames not served natively, in order; those were servable.
    let mut python = to_python.iter();
    let mut natively = Vec::new(); // the sizes of the frames served natively
    for body in &frames {
        if python.as_slice().first() == Some(body) {
            python.next();
        } else {
            assert!(servable(body), "a frame neither handed to Python nor servable natively");
            natively.push(body.len());
        }
    }
    assert!(python.next().is_none(), "Python was handed a frame the client did not send");
    freed.sort_unstable();
    natively.sort_unstable();
    assert_eq!(freed, natively, "each native request gives back the bytes it was admitted with, once");

    // Every frame's answer, in request order, each whole (natively served ones start with
    // their correlation id as Python's do).
    let mut answers: Vec<[u8; 4]> = Vec::new();
    let mut at = 0;
    while read.len() - at >= 4 {
        let size = u32::from_be_bytes(read[at..at + 4].try_into().unwrap()) as usize;
        assert!(read.len() - at - 4 >= size, "an answer written in part");
        answers.push(read[at + 4..at + 8].try_into().unwrap());
        at += 4 + size;
    }
    assert_eq!(at, read.len(), "bytes after the last answer");
    let expected: Vec<[u8; 4]> = frames.iter().filter(|body| !silent(body)).map(|body| correlation_id(body)).collect();
    assert_eq!(answers, expected, "every frame answered, in order (oversized: {oversized})");
});
