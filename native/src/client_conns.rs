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
use std::fs::File;
use std::io::{ErrorKind, IoSlice, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};

const REQUEST_HEADER_BYTES: usize = 5; // correlation id (int32), kind (int8)
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// A buffer larger than this, once empty, is let go rather than kept for the next frame.
const SHRINK_ABOVE_BYTES: usize = 1 << 20;
/// An answer at least this large is read up to its end at once, not a chunk at a time.
const OWN_BUFFER_FROM_BYTES: usize = 16 * 1024;

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
    inbuf: Vec<u8>,
    in_at: usize,
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

/// A borrowed descriptor: read and written, never closed here.
fn borrowed(fd: RawFd) -> ManuallyDrop<File> {
    ManuallyDrop::new(unsafe { File::from_raw_fd(fd) })
}

fn frame_size(staged: &[u8]) -> Option<usize> {
    staged.get(..4).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
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
        let conn = Conn { inbuf: staged.to_vec(), in_at: 0, out: Vec::new(), out_at: 0, wants_write: false, ended: false };
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
        let total = head.len() + body_bytes;
        let mut written = 0;
        if conn.out_at == conn.out.len() {
            let mut file = borrowed(fd);
            while written < total {
                let slices = remaining(&head, parts, written);
                match file.write_vectored(&slices) {
                    Ok(n) => written += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => return self.end(fd, format!("the connection broke: {e}")),
                }
            }
            if written == total {
                return;
            }
        }
        // What the socket did not take waits, in order, behind what waits already.
        if conn.out_at == conn.out.len() {
            conn.out.clear();
            conn.out_at = 0;
        }
        for slice in remaining(&head, parts, written) {
            conn.out.extend_from_slice(&slice);
        }
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
        let mut file = borrowed(fd);
        let mut failure = None;
        while conn.out_at < conn.out.len() {
            match file.write(&conn.out[conn.out_at..]) {
                Ok(n) => conn.out_at += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    failure = Some(format!("the connection broke: {e}"));
                    break;
                }
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
        let max_frame_bytes = self.max_frame_bytes;
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let failure = loop {
            let staged = conn.inbuf.len() - conn.in_at;
            let want = match frame_size(&conn.inbuf[conn.in_at..]) {
                Some(size) if size <= max_frame_bytes && size >= OWN_BUFFER_FROM_BYTES && staged < 4 + size => 4 + size - staged,
                _ => 0,
            };
            // Into the buffer's spare room, never zero-filled: a large frame whose size is known
            // up to its end (no byte of the next frame lands there), anything else a chunk at a time.
            let result = read_into_spare(fd, &mut conn.inbuf, if want > 0 { want } else { READ_CHUNK_BYTES });
            match result {
                Ok(0) => break Some("the endpoint closed the connection".to_string()),
                Ok(n) => {
                    if want == 0 && n < READ_CHUNK_BYTES {
                        break None;
                    }
                    if let Some(size) = frame_size(&conn.inbuf[conn.in_at..]) {
                        if size > max_frame_bytes || conn.inbuf.len() - conn.in_at - 4 >= size {
                            break None; // a whole answer to hand out (or one over the bound)
                        }
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break None,
                Err(e) => break Some(format!("the connection broke: {e}")),
            }
        };
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
            let staged = &conn.inbuf[conn.in_at..];
            let Some(size) = frame_size(staged) else { break };
            if size > max_frame_bytes {
                bad = Some(format!("an answer frame of {size} bytes, over the limit of {max_frame_bytes}"));
                break;
            }
            if staged.len() - 4 < size {
                break;
            }
            let body = staged[4..4 + size].to_vec();
            conn.in_at += 4 + size;
            self.events.push(ClientEvent::Answer { fd, body });
        }
        if conn.in_at == conn.inbuf.len() {
            conn.inbuf.clear();
            conn.in_at = 0;
            if conn.inbuf.capacity() > SHRINK_ABOVE_BYTES {
                conn.inbuf = Vec::new(); // a large frame's room is not kept for the connection's life
            }
        } else if conn.in_at > READ_CHUNK_BYTES {
            conn.inbuf.drain(..conn.in_at);
            conn.in_at = 0;
        }
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

/// The bytes of `head` then `parts` after the first `written` of them.
fn remaining<'a>(head: &'a [u8], parts: &[&'a [u8]], mut written: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(parts.len() + 1);
    for piece in std::iter::once(head).chain(parts.iter().copied()) {
        if written >= piece.len() {
            written -= piece.len();
            continue;
        }
        out.push(IoSlice::new(&piece[written..]));
        written = 0;
    }
    out
}

/// Reads at most `max` bytes from `fd` into the spare capacity of `buf`, which grows by them.
fn read_into_spare(fd: RawFd, buf: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    // The kernel writes the bytes it reports; only those become part of the vector.
    let n = unsafe { libc::read(fd, spare.as_mut_ptr() as *mut libc::c_void, max.min(spare.len())) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}
