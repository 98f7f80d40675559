//! EndpointConns: the connections a partition replica's data plane endpoint serves, once
//! proven, read and written here, driven by the replica's event loop (no thread of its own).
//!
//! What `rayk/dataplane/frame_reader.py` (push mode), the request framing of
//! `rayk/dataplane/endpoint.py` and `rayk/dataplane/answer_writer.py` do in Python, per
//! connection: read the request frames as they come (a size prefix, then the correlation id
//! and kind of `frames.REQUEST_HEADER`), hand each to Python as it is whole, hold back
//! reading while `max_in_flight` requests are handed out and not answered, and write each
//! answer whole, never interleaved with another, as soon as Python gives it, the records
//! of a log slice by `sendfile` (checked against truncation before each call, as
//! answer_writer.py does).
//!
//! Python keeps every decision: it accepts the connection, admits it, does the TLS-free
//! handshake, and hands over the proven socket with what its reader had staged; it serves
//! each request (a task running the replica's handler) and gives the answer back; it
//! watches the descriptors (`on_readable` / `on_writable` are its event loop's callbacks,
//! `Hold` and `WantWrite` say which to watch) and closes one when its connection ends
//! (`End`, then `forget`). A frame whose size is over the bound, or whose header is short or
//! of an unknown kind, ends its connection (the stream cannot be trusted to be in step), as
//! does an answer that cannot be written, or a log slice truncated part way through its send.

use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::time::Instant;

use crate::socket_io::{self, Frame, FrameBuf, ReadEnd};

/// frames.KINDS: FETCH, PRODUCE, SHARE_FETCH, WRITE_SHARE_STATE
const KINDS: [i8; 4] = [1, 2, 3, 4];
const ANSWERED: i8 = 0;
const REQUEST_HEADER_BYTES: usize = 5; // correlation id (int32), kind (int8)

/// A log slice an answer sends from its file: Python's FileSlice, asked before each send.
pub trait Slice: Send + Sync {
    fn fd(&self) -> RawFd;
    fn position(&self) -> i64;
    fn len(&self) -> usize;
    /// False once the log was truncated since the slice was made.
    fn unchanged(&self) -> bool;
    /// An I/O error of the file (not of the socket), for its owner to treat as a failed read.
    fn read_failed(&self, error: &std::io::Error);
    fn close(&self);
}

/// What Python is to do after a call.
pub enum Event {
    /// A request to serve: answer it with `answer`, `answer_frame` or `answer_file`.
    Request { fd: RawFd, correlation_id: i32, kind: i8, body: Vec<u8> },
    /// The connection is over (None: the peer closed it or it broke, nothing to warn of;
    /// Some: why, worth a warning). Python stops watching it, cancels its requests, calls
    /// `forget` and closes the descriptor.
    End { fd: RawFd, why: Option<String> },
    /// Watch the descriptor for writability (true: an answer waits for room) or stop.
    WantWrite { fd: RawFd, on: bool },
    /// Stop watching it for reading (true: `max_in_flight` requests are out) or watch again.
    Hold { fd: RawFd, on: bool },
}

enum Out {
    Bytes { data: Vec<u8>, at: usize, ends_answer: bool },
    /// An answer's head (size prefix and header included), then its records from `slice`;
    /// `stale` is the whole FAILED answer written instead if the log was truncated before
    /// any of it went.
    File { head: Vec<u8>, head_at: usize, slice: Box<dyn Slice>, sent: usize, stale: Vec<u8> },
}

struct Conn {
    frames: FrameBuf,
    out: VecDeque<Out>,
    wants_write: bool,
    in_flight: usize,
    held: bool,
    ended: bool,
    last_active: Instant,
}

pub struct EndpointConns {
    max_in_flight: usize,
    max_frame_bytes: usize,
    conns: HashMap<RawFd, Conn>,
    events: Vec<Event>,
}

fn answer_head(correlation_id: i32, head: &[u8], tail_bytes: usize) -> Vec<u8> {
    let size = REQUEST_HEADER_BYTES + head.len() + tail_bytes;
    let mut out = Vec::with_capacity(4 + REQUEST_HEADER_BYTES + head.len());
    out.extend_from_slice(&(size as u32).to_be_bytes());
    out.extend_from_slice(&correlation_id.to_be_bytes());
    out.push(ANSWERED as u8);
    out.extend_from_slice(head);
    out
}

impl EndpointConns {
    pub fn new(max_in_flight: usize, max_frame_bytes: usize) -> Self {
        assert!(max_in_flight > 0);
        EndpointConns { max_in_flight, max_frame_bytes, conns: HashMap::new(), events: Vec::new() }
    }

    /// What the last call left for Python to do.
    pub fn take(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.events)
    }

    /// A proven, non-blocking connection, with the bytes its reader had staged: its
    /// requests among them are handed out at once. Python watches it for reading.
    pub fn adopt(&mut self, fd: RawFd, staged: &[u8]) {
        let conn = Conn {
            frames: FrameBuf::new(staged),
            out: VecDeque::new(),
            wants_write: false,
            in_flight: 0,
            held: false,
            ended: false,
            last_active: Instant::now(),
        };
        assert!(self.conns.insert(fd, conn).is_none(), "descriptor {fd} is served already");
        self.parse(fd);
    }

    /// Forgets the connection (Python closes its descriptor); its queued answers' slices are closed.
    pub fn forget(&mut self, fd: RawFd) {
        if let Some(conn) = self.conns.remove(&fd) {
            close_slices(conn.out);
        }
    }

    /// Forgets every connection; returns their descriptors (Python closes them).
    pub fn close(&mut self) -> Vec<RawFd> {
        let fds: Vec<RawFd> = self.conns.keys().copied().collect();
        for fd in &fds {
            self.forget(*fd);
        }
        fds
    }

    /// Seconds since the connection last read a frame or wrote an answer, None while a
    /// request of it is out or it is not served here.
    pub fn idle_s(&self, fd: RawFd) -> Option<f64> {
        let conn = self.conns.get(&fd)?;
        if conn.in_flight > 0 || !conn.out.is_empty() {
            return None;
        }
        Some(conn.last_active.elapsed().as_secs_f64())
    }

    pub fn on_readable(&mut self, fd: RawFd) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended || conn.held {
            return;
        }
        // A closed or broken connection: the peer went away, nothing to warn of.
        let gone = !matches!(conn.frames.read(fd, self.max_frame_bytes), ReadEnd::Paused);
        self.parse(fd);
        if gone {
            self.end(fd, None);
        }
    }

    /// Hands out the whole requests read, while fewer than max_in_flight are out.
    fn parse(&mut self, fd: RawFd) {
        let (max_in_flight, max_frame_bytes) = (self.max_in_flight, self.max_frame_bytes);
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        let mut bad: Option<String> = None;
        while !conn.ended && conn.in_flight < max_in_flight {
            let frame = match conn.frames.next(max_frame_bytes) {
                Frame::Partial => break,
                Frame::Oversized(size) => {
                    bad = Some(format!("a frame of {size} bytes, over the limit of {max_frame_bytes}"));
                    break;
                }
                Frame::Whole(frame) => frame,
            };
            if frame.len() < REQUEST_HEADER_BYTES {
                bad = Some(format!("a request frame of {} bytes has no header", frame.len()));
                break;
            }
            let correlation_id = i32::from_be_bytes(frame[..4].try_into().unwrap());
            let kind = frame[4] as i8;
            if !KINDS.contains(&kind) {
                bad = Some(format!("unknown request kind {kind}"));
                break;
            }
            let body = frame[REQUEST_HEADER_BYTES..].to_vec();
            conn.in_flight += 1;
            conn.last_active = Instant::now();
            self.events.push(Event::Request { fd, correlation_id, kind, body });
        }
        conn.frames.compact();
        let hold = conn.in_flight >= max_in_flight;
        if hold != conn.held && !conn.ended && bad.is_none() {
            conn.held = hold;
            self.events.push(Event::Hold { fd, on: hold });
        }
        if let Some(why) = bad {
            self.end(fd, Some(why));
        }
    }

    fn end(&mut self, fd: RawFd, why: Option<String>) {
        if let Some(conn) = self.conns.get_mut(&fd) {
            if !conn.ended {
                conn.ended = true;
                self.events.push(Event::End { fd, why });
            }
        }
    }

    /// The answer to a request of the connection: `head`, then `tail` (records in memory).
    pub fn answer(&mut self, fd: RawFd, correlation_id: i32, head: &[u8], tail: &[u8]) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let frame_head = answer_head(correlation_id, head, tail.len());
        let pieces = [frame_head.as_slice(), tail];
        if !conn.out.is_empty() {
            // Behind other answers: the records are copied into the queue.
            conn.out.push_back(Out::Bytes { data: socket_io::rest(&pieces, 0), at: 0, ends_answer: true });
            return;
        }
        // Straight to the socket, head and records in one syscall; what it does not take is queued.
        match socket_io::write_now(fd, &pieces) {
            Ok(n) if n == frame_head.len() + tail.len() => self.answered(fd),
            Ok(n) => {
                conn.out.push_back(Out::Bytes { data: socket_io::rest(&pieces, n), at: 0, ends_answer: true });
                self.flush(fd);
            }
            Err(_) => self.end(fd, None),
        }
    }

    /// A whole answer frame built by Python (a FAILED answer).
    pub fn answer_frame(&mut self, fd: RawFd, frame: &[u8]) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        conn.out.push_back(Out::Bytes { data: frame.to_vec(), at: 0, ends_answer: true });
        self.flush(fd);
    }

    /// An answer whose records are `slice` of a log file, sent by sendfile; `stale` is the
    /// FAILED answer to write instead if the log is truncated before any of it goes.
    pub fn answer_file(&mut self, fd: RawFd, correlation_id: i32, head: &[u8], slice: Box<dyn Slice>, stale: Vec<u8>) {
        let Some(conn) = self.conns.get_mut(&fd) else { return slice.close() };
        if conn.ended {
            return slice.close();
        }
        let head = answer_head(correlation_id, head, slice.len());
        conn.out.push_back(Out::File { head, head_at: 0, slice, sent: 0, stale });
        self.flush(fd);
    }

    pub fn on_writable(&mut self, fd: RawFd) {
        self.flush(fd);
    }

    /// Writes the queued answers, in order, as far as the socket takes them.
    fn flush(&mut self, fd: RawFd) {
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        if conn.ended {
            return;
        }
        let mut answers_done = 0;
        let mut failure: Option<Option<String>> = None;
        while let Some(front) = conn.out.front_mut() {
            match front {
                Out::Bytes { data, at, ends_answer } => match socket_io::write_now(fd, &[&data[*at..]]) {
                    Ok(n) => {
                        *at += n;
                        if *at < data.len() {
                            break; // the socket is full
                        }
                        if *ends_answer {
                            answers_done += 1;
                        }
                        conn.out.pop_front();
                    }
                    Err(_) => {
                        failure = Some(None);
                        break;
                    }
                },
                Out::File { head, head_at, slice, sent, stale } => {
                    if *head_at == 0 && !slice.unchanged() {
                        // Truncated before any of it went: the FAILED answer instead.
                        let stale = std::mem::take(stale);
                        if let Some(Out::File { slice, .. }) = conn.out.pop_front() {
                            slice.close();
                        }
                        conn.out.push_front(Out::Bytes { data: stale, at: 0, ends_answer: true });
                        continue;
                    }
                    if *head_at < head.len() {
                        match socket_io::write_now(fd, &[&head[*head_at..]]) {
                            Ok(n) => *head_at += n,
                            Err(_) => {
                                failure = Some(None);
                                break;
                            }
                        }
                        if *head_at < head.len() {
                            break; // the socket is full
                        }
                        continue;
                    }
                    if *sent == slice.len() {
                        slice.close();
                        conn.out.pop_front();
                        answers_done += 1;
                        continue;
                    }
                    if !slice.unchanged() {
                        failure = Some(Some(format!(
                            "sent {} of the {} bytes of a log slice truncated meanwhile",
                            sent,
                            slice.len()
                        )));
                        break;
                    }
                    let mut offset: libc::off_t = slice.position() + *sent as i64;
                    let n = unsafe { libc::sendfile(fd, slice.fd(), &mut offset, slice.len() - *sent) };
                    if n > 0 {
                        *sent += n as usize;
                    } else if n == 0 {
                        failure = Some(Some(format!(
                            "sent {} of the {} bytes of a log slice whose file ends before it",
                            sent,
                            slice.len()
                        )));
                        break;
                    } else {
                        let e = std::io::Error::last_os_error();
                        match e.kind() {
                            ErrorKind::Interrupted => {}
                            ErrorKind::WouldBlock => break,
                            _ => {
                                // The file's I/O error is worth a warning (and its owner's
                                // handling); the peer gone (EPIPE, a reset) is not, as for a write.
                                failure = Some(if e.raw_os_error() == Some(libc::EIO) {
                                    slice.read_failed(&e);
                                    Some(format!("a send from the log file failed: {e}"))
                                } else {
                                    None
                                });
                                break;
                            }
                        }
                    }
                }
            }
        }
        if answers_done > 0 {
            conn.last_active = Instant::now();
        }
        let wants_write = !conn.out.is_empty() && failure.is_none();
        if wants_write != conn.wants_write {
            conn.wants_write = wants_write;
            self.events.push(Event::WantWrite { fd, on: wants_write });
        }
        for _ in 0..answers_done {
            self.answered(fd);
        }
        if let Some(why) = failure {
            self.end(fd, why);
        }
    }

    /// An answer of the connection is written whole: its place is free for another request.
    fn answered(&mut self, fd: RawFd) {
        let max_in_flight = self.max_in_flight;
        let Some(conn) = self.conns.get_mut(&fd) else { return };
        debug_assert!(conn.in_flight > 0, "an answer to a request handed out");
        conn.in_flight = conn.in_flight.saturating_sub(1);
        conn.last_active = Instant::now();
        if conn.held && conn.in_flight < max_in_flight {
            conn.held = false;
            self.events.push(Event::Hold { fd, on: false });
            self.parse(fd);
        }
    }
}

fn close_slices(out: VecDeque<Out>) {
    for item in out {
        if let Out::File { slice, .. } = item {
            slice.close();
        }
    }
}
