//! A process reads the answer frames of the endpoints it connects to with `ClientConns`:
//! whatever bytes come, cut wherever the socket cuts them, it hands out the stream's frames
//! in order, each whole, and ends the connection at the first whose size is over the bound,
//! handing out nothing after it; it never panics. The input's first byte is how many bytes
//! the socket carries at a time; a request is sent after each piece, so reading and
//! writing interleave.
#![no_main]

#[path = "../../src/client_conns.rs"]
#[allow(dead_code)]
mod client_conns;
#[path = "../../src/socket_io.rs"]
#[allow(dead_code)]
mod socket_io;

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;

use client_conns::{ClientConns, ClientEvent};
use libfuzzer_sys::fuzz_target;

const MAX_FRAME_BYTES: usize = 2048;

/// The frames a stream holds up to its first one over the bound, and whether it has one.
fn reference(stream: &[u8]) -> (Vec<Vec<u8>>, bool) {
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
        out.push(stream[at + 4..at + 4 + size].to_vec());
        at += 4 + size;
    }
    (out, false)
}

fuzz_target!(|data: &[u8]| {
    let Some((&cut, stream)) = data.split_first() else { return };
    let cut = 1 + cut as usize;
    let (mut endpoint, ours) = UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    endpoint.set_nonblocking(true).unwrap();
    let fd = ours.as_raw_fd();
    let mut conns = ClientConns::new(MAX_FRAME_BYTES);
    conns.adopt(fd, &[]);
    let (mut got, mut ended, mut sink) = (Vec::new(), false, vec![0u8; 1 << 16]);
    let take = |conns: &mut ClientConns, got: &mut Vec<Vec<u8>>, ended: &mut bool| {
        for event in conns.take() {
            match event {
                ClientEvent::Answer { body, .. } => {
                    assert!(!*ended, "an answer handed out after its connection ended");
                    got.push(body.to_vec());
                }
                ClientEvent::End { .. } => *ended = true,
                ClientEvent::WantWrite { .. } => {}
            }
        }
    };
    let (mut written, mut stuck, mut correlation_id) = (0, 0, 0);
    while written < stream.len() && stuck < 4 {
        let piece = &stream[written..stream.len().min(written + cut)];
        match endpoint.write(piece) {
            Ok(n) => (written, stuck) = (written + n, 0),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => stuck += 1,
            Err(e) => panic!("{e}"),
        }
        conns.on_readable(fd);
        take(&mut conns, &mut got, &mut ended);
        correlation_id += 1;
        conns.send(fd, correlation_id, 1, &[&piece[..piece.len().min(8)], b"request"]);
        take(&mut conns, &mut got, &mut ended);
        while endpoint.read(&mut sink).map(|n| n > 0).unwrap_or(false) {} // the requests, drained
        conns.on_writable(fd);
        take(&mut conns, &mut got, &mut ended);
    }
    for _ in 0..4 {
        conns.on_readable(fd);
        take(&mut conns, &mut got, &mut ended);
    }
    let (expected, bad) = reference(&stream[..written]);
    assert_eq!(got, expected, "the answers handed out are the stream's frames, in order");
    assert_eq!(ended, bad, "the connection ends at a frame over the bound, and only then");
    conns.forget(fd);
});
