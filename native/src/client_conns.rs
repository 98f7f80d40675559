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

use crate::socket_io::{Body, FrameBuf, OutBuf};

const REQUEST_HEADER_BYTES: usize = 5; // correlation id (int32), kind (int8)

/// What Python is to do after a call.
pub enum ClientEvent {
    /// An answer frame's body (correlation id and outcome first, as frames.ANSWER_HEADER).
    Answer { fd: RawFd, body: Body },
    /// The connection is over: why (Python fails its requests, stops watching the
    /// descriptor, calls `forget` and closes it).
    End { fd: RawFd, why: String },
    /// Watch the descriptor for writability (true: a request waits for room) or stop.
    WantWrite { fd: RawFd, on: bool },
}

struct Conn {
    frames: FrameBuf,
    out: OutBuf,
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
        let conn = Conn { frames: FrameBuf::new(staged), out: OutBuf::new(), ended: false };
        assert!(self.conns.insert(fd, conn).is_none(), "descriptor {fd} is connected already");
        self.parse(fd);
    }

    /// Forgets the connection (Python closes its descriptor).
    pub fn forget(&mut self, fd: RawFd) {
        self.conns.remove(&fd);
    }

    /// Whether requests written wait for the socket to take them.
    pub fn queued(&self, fd: RawFd) -> bool {
        self.conns.get(&fd).is_some_and(|c| c.out.waiting())
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
        let sent = conn.out.send(fd, &pieces);
        self.after_write(fd, sent);
    }

    pub fn on_writable(&mut self, fd: RawFd) {
        self.flush(fd);
    }

    fn flush(&mut self, fd: RawFd) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let flushed = conn.out.flush(fd);
        self.after_write(fd, flushed);
    }

    /// Tells Python to watch for writability, or to stop, when that changed; ends a
    /// connection whose write failed.
    fn after_write(&mut self, fd: RawFd, result: std::io::Result<()>) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if let Some(on) = conn.out.watch_change(result.is_err()) {
            self.events.push(ClientEvent::WantWrite { fd, on });
        }
        if let Err(e) = result {
            self.end(fd, format!("the connection broke: {e}"));
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
            match conn.frames.next_owned(max_frame_bytes) {
                Ok(None) => break,
                Err(size) => {
                    bad = Some(format!("an answer frame of {size} bytes, over the limit of {max_frame_bytes}"));
                    break;
                }
                Ok(Some(body)) => self.events.push(ClientEvent::Answer { fd, body }),
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
