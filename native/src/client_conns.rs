//! ClientConns: a process's connections to data plane endpoints, read and written here,
//! driven by the process's event loop (no thread of its own).
//!
//! What `rayk/dataplane/frame_reader.py` (push mode) and the writing side of
//! `rayk/dataplane/connection.py` do in Python, per connection: write each request frame
//! whole (its size prefix and header, then its body's parts, in one writev where the socket
//! takes it; what it does not take waits, in order, for the socket to be writable), and read
//! the answer frames as they come, handing each to Python whole. Python keeps the rest of
//! a Connection: the requests in flight by correlation id, their futures, the bound on them,
//! what an answer means (ANSWERED, FAILED, or one that breaks the connection), the idle
//! close. It owns the descriptors: it watches them (`on_readable` / `on_writable`, and
//! `WantWrite` says when to watch for writability) and closes one when its connection ends
//! (`End`, then `forget`). An answer frame whose size is over the bound ends the connection.

use std::collections::HashMap;
use std::os::fd::RawFd;

use crate::socket_io::{self, Frame, FrameBuf};

const REQUEST_HEADER_BYTES: usize = 5; // correlation id (int32), kind (int8)

/// What Python is to do after a call.
pub enum ClientEvent {
    /// An answer frame's body (correlation id and outcome first, as frames.ANSWER_HEADER).
    Answer { fd: RawFd, body: Vec<u8> },
    /// The connection is over: why (Python fails its requests, stops watching the
    /// descriptor, calls `forget` and closes it).
    End { fd: RawFd, why: String },
    /// Watch the descriptor for writability (true: a request waits for room) or stop.
    WantWrite { fd: RawFd, on: bool },
}

struct Conn {
    frames: FrameBuf,
    out: Vec<u8>,
    out_at: usize,
    wants_write: bool,
    ended: bool,
}

pub struct ClientConns {
    max_frame_bytes: usize,
    conns: HashMap<RawFd, Conn>,
    events: Vec<ClientEvent>,
}

impl ClientConns {
    pub fn new(max_frame_bytes: usize) -> Self {
        ClientConns { max_frame_bytes, conns: HashMap::new(), events: Vec::new() }
    }

    /// What the last call left for Python to do.
    pub fn take(&mut self) -> Vec<ClientEvent> {
        std::mem::take(&mut self.events)
    }

    /// A proven, non-blocking connection, with what its reader had staged (answers among
    /// them are handed out at once).
    pub fn adopt(&mut self, fd: RawFd, staged: &[u8]) {
        let conn = Conn { frames: FrameBuf::new(staged), out: Vec::new(), out_at: 0, wants_write: false, ended: false };
        assert!(self.conns.insert(fd, conn).is_none(), "descriptor {fd} is connected already");
        self.parse(fd);
    }

    /// Forgets the connection (Python closes its descriptor).
    pub fn forget(&mut self, fd: RawFd) {
        self.conns.remove(&fd);
    }

    /// Whether requests written wait for the socket to take them.
    pub fn queued(&self, fd: RawFd) -> bool {
        self.conns.get(&fd).is_some_and(|c| c.out_at < c.out.len())
    }

    /// A request frame: its size prefix and header, then `parts` (its body).
    pub fn send(&mut self, fd: RawFd, correlation_id: i32, kind: i8, parts: &[&[u8]]) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let body_bytes: usize = parts.iter().map(|p| p.len()).sum();
        let mut head = Vec::with_capacity(4 + REQUEST_HEADER_BYTES);
        head.extend_from_slice(&((REQUEST_HEADER_BYTES + body_bytes) as u32).to_be_bytes());
        head.extend_from_slice(&correlation_id.to_be_bytes());
        head.push(kind as u8);
        let mut pieces = Vec::with_capacity(parts.len() + 1);
        pieces.push(head.as_slice());
        pieces.extend_from_slice(parts);
        let mut written = 0;
        if conn.out_at == conn.out.len() {
            match socket_io::write_now(fd, &pieces) {
                Ok(n) if n == head.len() + body_bytes => return,
                Ok(n) => written = n,
                Err(e) => return self.end(fd, format!("the connection broke: {e}")),
            }
            conn.out.clear();
            conn.out_at = 0;
        }
        // What the socket did not take waits, in order, behind what waits already.
        conn.out.extend_from_slice(&socket_io::rest(&pieces, written));
        self.flush(fd);
    }

    pub fn on_writable(&mut self, fd: RawFd) {
        self.flush(fd);
    }

    fn flush(&mut self, fd: RawFd) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let mut failure = None;
        if conn.out_at < conn.out.len() {
            match socket_io::write_now(fd, &[&conn.out[conn.out_at..]]) {
                Ok(n) => conn.out_at += n,
                Err(e) => failure = Some(format!("the connection broke: {e}")),
            }
        }
        if conn.out_at == conn.out.len() {
            conn.out = Vec::new();
            conn.out_at = 0;
        }
        let wants_write = conn.out_at < conn.out.len() && failure.is_none();
        if wants_write != conn.wants_write {
            conn.wants_write = wants_write;
            self.events.push(ClientEvent::WantWrite { fd, on: wants_write });
        }
        if let Some(why) = failure {
            self.end(fd, why);
        }
    }

    pub fn on_readable(&mut self, fd: RawFd) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let failure = conn.frames.read(fd, self.max_frame_bytes).why("endpoint");
        self.parse(fd);
        if let Some(why) = failure {
            self.end(fd, why);
        }
    }

    fn parse(&mut self, fd: RawFd) {
        let max_frame_bytes = self.max_frame_bytes;
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        let mut bad = None;
        while !conn.ended {
            match conn.frames.next(max_frame_bytes) {
                Frame::Partial => break,
                Frame::Oversized(size) => {
                    bad = Some(format!("an answer frame of {size} bytes, over the limit of {max_frame_bytes}"));
                    break;
                }
                Frame::Whole(body) => self.events.push(ClientEvent::Answer { fd, body: body.to_vec() }),
            }
        }
        conn.frames.compact();
        if let Some(why) = bad {
            self.end(fd, why);
        }
    }

    fn end(&mut self, fd: RawFd, why: String) {
        if let Some(conn) = self.conns.get_mut(&fd) {
            if !conn.ended {
                conn.ended = true;
                self.events.push(ClientEvent::End { fd, why });
            }
        }
    }
}
