//! A replica endpoint reads the request frames of its peers with `EndpointConns`: whatever
//! bytes come, cut wherever the socket cuts them, it hands out the stream's requests in
//! order, each whole, and ends the connection at the first frame that does not parse,
//! handing out nothing after it; it never panics (a panic would end every native
//! connection of the endpoint). The input's first byte bounds the requests in flight, its
//! second how many bytes the socket carries at a time; each request is answered as it is
//! handed out (its body echoed), so held-back frames are handed out as answers free places.
#![no_main]

#[path = "../../src/endpoint_conns.rs"]
#[allow(dead_code)]
mod endpoint_conns;
#[path = "../../src/socket_io.rs"]
#[allow(dead_code)]
mod socket_io;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use endpoint_conns::{EndpointConns, Event};
use libfuzzer_sys::fuzz_target;

const MAX_FRAME_BYTES: usize = 2048;

/// The requests a stream holds up to its first frame that does not parse, and whether it has one.
fn reference(stream: &[u8]) -> (Vec<(i32, i8, Vec<u8>)>, bool) {
    let mut out = Vec::new();
    let mut at = 0;
    while stream.len() - at >= 4 {
        let size = u32::from_be_bytes(stream[at..at + 4].try_into().unwrap()) as usize;
        if size > MAX_FRAME_BYTES {
            return (out, true);
        }
        if stream.len() - at - 4 < size {
            break;
        }
        let frame = &stream[at + 4..at + 4 + size];
        if frame.len() < 5 || !(1..=4).contains(&(frame[4] as i8)) {
            return (out, true);
        }
        out.push((i32::from_be_bytes(frame[..4].try_into().unwrap()), frame[4] as i8, frame[5..].to_vec()));
        at += 4 + size;
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&[in_flight, cut], stream)) = data.split_first_chunk::<2>() else { return };
    let max_in_flight = 1 + (in_flight as usize % 16);
    let cut = 1 + cut as usize;
    let (mut peer, ours) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    peer.set_nonblocking(true).unwrap();
    let fd = ours.as_raw_fd();
    let mut conns = EndpointConns::new(max_in_flight, MAX_FRAME_BYTES);
    conns.adopt(fd, &[]);
    let mut got = Vec::new();
    let mut ended = false;
    let mut sink = vec![0u8; 1 << 16];
    let take = |conns: &mut EndpointConns, got: &mut Vec<(i32, i8, Vec<u8>)>, ended: &mut bool| loop {
        let events = conns.take();
        if events.is_empty() {
            break;
        }
        for event in events {
            match event {
                Event::Request { correlation_id, kind, body, .. } => {
                    assert!(!*ended, "a request handed out after its connection ended");
                    got.push((correlation_id, kind, body.clone()));
                    conns.answer(fd, correlation_id, b"", &body);
                }
                Event::End { .. } => *ended = true,
                Event::WantWrite { .. } | Event::Hold { .. } => {}
            }
        }
    };
    let (mut written, mut stuck) = (0, 0);
    while written < stream.len() && stuck < 4 {
        let piece = &stream[written..stream.len().min(written + cut)];
        match peer.write(piece) {
            Ok(n) => (written, stuck) = (written + n, 0),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => stuck += 1, // nothing reads it (ended)
            Err(e) => panic!("{e}"),
        }
        conns.on_readable(fd);
        take(&mut conns, &mut got, &mut ended);
        while peer.read(&mut sink).map(|n| n > 0).unwrap_or(false) {} // the answers, drained
        conns.on_writable(fd);
        take(&mut conns, &mut got, &mut ended);
    }
    for _ in 0..4 {
        // What the socket still holds (each call stops at a whole frame to hand it out).
        conns.on_readable(fd);
        take(&mut conns, &mut got, &mut ended);
        while peer.read(&mut sink).map(|n| n > 0).unwrap_or(false) {}
    }
    let (expected, bad) = reference(&stream[..written]);
    assert_eq!(got, expected, "the requests handed out are the stream's, in order");
    assert_eq!(ended, bad, "the connection ends at a frame that does not parse, and only then");
    conns.forget(fd);
});
