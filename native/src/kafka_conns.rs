//! Listener: a listener's produce path (produce_path.rs) and the Kafka client connections
//! it reads and writes itself, driven by the listener's event loop (no thread of its own).
//!
//! A client connection handed over (`adopt_client`: a PLAINTEXT listener's, no TLS, no
//! SASL) is read here: each frame's size is admitted by Python first (`Admit`: the
//! listener's `queued.max.requests` slots and `queued.max.request.bytes` pool, or a wait
//! for them, during which the connection is not read), then its body is read, and
//!
//! - a Produce request this can serve alone (kafka_request.rs reads it whole; acks 1 or
//!   -1, not transactional, and the listener allows it: no authorizer, no client quota) is
//!   submitted to the produce path at once, and its response frame written here when every
//!   partition is answered: no Python runs for it but the admission and the release of its
//!   slot (`ClientFreed`);
//! - anything else goes to Python as the frame it is (`ClientRequest`), which serves it as
//!   it serves a connection of its own (socket_server.py) and gives the answer back
//!   (`client_answer`). While any of those is unanswered, every later frame goes to Python
//!   too, so Python's rules of order hold among them; and one for Python waits until every
//!   native request before it is answered (Kafka answers a connection's other requests in
//!   order, one at a time).
//!
//! Answers are written in request order, native and Python's alike. Reading stops while
//! answers wait for the socket to take them, while a frame waits for admission or for the
//! native requests before it, or while STARTED_PER_CONNECTION native or PYTHON_MAX frames
//! for Python are out: the client's TCP window then pushes back. A frame over the size
//! bound, a broken socket, or the client's EOF (once every answer is written) ends the
//! connection (`ClientEnd`); Python stops watching it and closes its descriptor.

use std::collections::{HashMap, VecDeque};
use std::io::ErrorKind;
use std::os::fd::RawFd;
use std::time::Instant;

use crate::kafka_request;
use crate::produce_path::{Completion, PartitionIn, Path, Submit};
use crate::socket_io::{FrameBuf, OutBuf, READ_CHUNK_BYTES};

/// socket_server.STARTED_PER_CONNECTION: native produce requests out at once per connection.
pub const STARTED_PER_CONNECTION: usize = 256;
/// Frames for Python read and not yet answered, per connection: its queue and its started ones.
pub const PYTHON_MAX: usize = 16 + 256;
/// Native requests' ids, apart from the ones Python submits (counted from 0).
const NATIVE_IDS_FROM: u64 = 1 << 62;

/// Python's admission of a frame on `fd`, as its Python reader takes them: the pool bytes
/// of its `size` before its body is read, its slot once the body is whole (and, for a
/// frame `for_python`, room in the connection's queue of frames for Python). True if taken
/// now; false if Python waits for them (and calls `client_admitted` once it has).
pub trait Admit {
    /// Err: the admission failed (a bug): the connection ends.
    fn admit(&mut self, fd: RawFd, size: usize) -> Result<bool, String>;
    fn slot(&mut self, fd: RawFd, for_python: bool) -> Result<bool, String>;
}

/// What Python is to do for a client connection, besides the produce path's completions.
pub enum KafkaEvent {
    /// A frame for Python to serve, and answer with `client_answer`.
    Request { fd: RawFd, frame: Vec<u8> },
    /// The client closed its side: Python serves nothing more of it (the answers to what
    /// it sent are still written, then `End` comes).
    Eof { fd: RawFd },
    /// The connection is over: Python stops watching it and closes it (Some: why, to log).
    End { fd: RawFd, why: Option<String> },
    /// A native request of `bytes`, read `seconds` ago, has its answer written (to the
    /// socket, or queued behind what the socket has not taken yet): its slot and pool
    /// bytes go back and its TotalTimeMs is recorded, as Python's writer does once an
    /// answer's turn comes.
    Freed { fd: RawFd, bytes: usize, seconds: f64 },
    /// Stop watching the descriptor for reading (true) or watch it again.
    Hold { fd: RawFd, on: bool },
    /// Watch it for writability (true: an answer waits for room) or stop.
    WantWrite { fd: RawFd, on: bool },
}

enum Slot {
    Native { id: u64, bytes: usize, read_at: Instant, answer: Option<Vec<u8>> },
    /// A frame for Python: its answer once given (an empty one: no answer, acks=0).
    Python { answer: Option<Vec<u8>> },
}

struct Client {
    frames: FrameBuf,
    out: OutBuf,
    max_frame_bytes: usize,
    slots: VecDeque<Slot>,
    native_out: usize,
    python_out: usize,
    admitted: bool,         // the frame staged first has its pool bytes
    slotted: bool,          // ... and its slot
    native: bool,           // ... and is served natively (decided when its slot is asked for)
    awaiting_admission: bool,
    for_python: Option<Vec<u8>>, // a frame waiting for the native requests before it
    eof: bool,
    eof_told: bool,
    end_why: Option<String>, // why it stops reading, if not the client's EOF (logged at its end)
    held: bool,
    body_started: Option<Instant>, // the staged frame's size was admitted then; its body is incomplete
    last_active: Instant,
}

pub struct Listener {
    pub path: Path,
    clients: HashMap<RawFd, Client>,
    native_ids: HashMap<u64, RawFd>,
    next_id: u64,
    /// Whether Produce may be served here: Python's say (no authorizer, no client quota).
    pub produce_natively: bool,
    events: Vec<KafkaEvent>,
}

impl Listener {
    pub fn new(path: Path) -> Self {
        Listener {
            path,
            clients: HashMap::new(),
            native_ids: HashMap::new(),
            next_id: NATIVE_IDS_FROM,
            produce_natively: true,
            events: Vec::new(),
        }
    }

    /// The produce path's completions for Python, and the client connections' events
    /// (native requests' answers are written to their connections first).
    pub fn take(&mut self, admit: &mut dyn Admit) -> (Vec<Completion>, Vec<KafkaEvent>) {
        let done = self.route_answers(admit);
        (done, std::mem::take(&mut self.events))
    }

    /// Native requests' answers go to their connections (dropped if it is gone); the rest
    /// are Python's.
    fn route_answers(&mut self, admit: &mut dyn Admit) -> Vec<Completion> {
        let mut done = self.path.take();
        let mut answered: Vec<(RawFd, u64, Vec<u8>)> = Vec::new();
        done.retain_mut(|c| match c {
            Completion::Answered { id, frame, .. } if *id >= NATIVE_IDS_FROM => {
                if let Some(fd) = self.native_ids.remove(id) {
                    answered.push((fd, *id, std::mem::take(frame)));
                }
                false
            }
            _ => true,
        });
        for (fd, id, frame) in answered {
            self.native_answered(fd, id, frame, admit);
        }
        done
    }

    pub fn is_client(&self, fd: RawFd) -> bool {
        self.clients.contains_key(&fd)
    }

    /// A PLAINTEXT client's non-blocking socket (its descriptor stays Python's, which
    /// watches it for reading) and what was read of it already.
    pub fn adopt_client(&mut self, fd: RawFd, staged: &[u8], max_frame_bytes: usize, admit: &mut dyn Admit) {
        let client = Client {
            frames: FrameBuf::new(staged),
            out: OutBuf::new(),
            max_frame_bytes,
            slots: VecDeque::new(),
            native_out: 0,
            python_out: 0,
            admitted: false,
            slotted: false,
            native: false,
            awaiting_admission: false,
            for_python: None,
            eof: false,
            eof_told: false,
            end_why: None,
            held: false,
            body_started: None,
            last_active: Instant::now(),
        };
        assert!(self.clients.insert(fd, client).is_none(), "descriptor {fd} is served already");
        self.serve_staged(fd, admit);
    }

    /// Forgets a connection (Python closes its descriptor); its native requests' answers,
    /// when they come, are dropped (Python gives back the slots and bytes it held).
    pub fn forget_client(&mut self, fd: RawFd) {
        if let Some(client) = self.clients.remove(&fd) {
            for slot in client.slots {
                if let Slot::Native { id, .. } = slot {
                    self.native_ids.remove(&id);
                }
            }
        }
    }

    /// (seconds idle, with nothing of it out and no frame part read; seconds since a frame
    /// whose body is not all read was admitted), for `connections.max.idle.ms`.
    pub fn client_idle_s(&self, fd: RawFd) -> (Option<f64>, Option<f64>) {
        let Some(c) = self.clients.get(&fd) else { return (None, None) };
        // Waiting for a frame's size (a part of it may be here, as Python's reader waits in
        // its read of the 4 bytes) with nothing out.
        let idle = (c.slots.is_empty() && c.frames.next_size().is_none() && c.for_python.is_none() && !c.eof)
            .then(|| c.last_active.elapsed().as_secs_f64());
        (idle, c.body_started.map(|t| t.elapsed().as_secs_f64()))
    }

    pub fn on_client_readable(&mut self, fd: RawFd, admit: &mut dyn Admit) {
        loop {
            let Some(c) = self.clients.get_mut(&fd) else { return };
            if c.held || c.eof {
                return;
            }
            // A frame whose size is admitted is read up to its end; else a chunk, which may
            // hold the next size (no body of a frame not admitted beyond one chunk is read).
            let want = match (c.frames.next_size(), c.admitted) {
                (Some(size), true) => (4 + size).saturating_sub(c.frames.staged_len()).max(1),
                (Some(_), false) => return self.serve_staged(fd, admit), // (admitted there, or held)
                (None, _) => READ_CHUNK_BYTES,
            };
            match c.frames.read_at_most(fd, want) {
                Ok(0) => {
                    c.eof = true;
                    self.serve_staged(fd, admit);
                    self.end_if_done(fd);
                    return;
                }
                Ok(n) => {
                    self.serve_staged(fd, admit);
                    if n < want {
                        return; // the socket is empty for now (the loop calls again when it is not)
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) => return self.end(fd, Some(format!("the connection broke: {e}"))),
            }
        }
    }

    pub fn on_client_writable(&mut self, fd: RawFd, admit: &mut dyn Admit) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        let flushed = c.out.flush(fd);
        self.after_write(fd, flushed, admit);
    }

    /// Python's answer to its oldest unanswered frame of the connection (empty: none to write).
    pub fn client_answer(&mut self, fd: RawFd, frame: Vec<u8>, admit: &mut dyn Admit) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        let slot = c.slots.iter_mut().find(|s| matches!(s, Slot::Python { answer: None }));
        let Some(Slot::Python { answer }) = slot else {
            return self.end(fd, Some("an answer from Python to no request of it (a bug)".into()));
        };
        *answer = Some(frame);
        c.python_out -= 1;
        self.write_answers(fd, admit);
    }

    /// Python took what the frame waited for: its pool bytes, or (those had) its slot.
    pub fn client_admitted(&mut self, fd: RawFd, admit: &mut dyn Admit) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        if !c.awaiting_admission {
            return; // shut down meanwhile: the frame was dropped
        }
        c.awaiting_admission = false;
        if c.admitted {
            c.slotted = true;
        } else {
            c.admitted = true;
            c.body_started = Some(Instant::now());
        }
        self.serve_staged(fd, admit);
    }

    fn native_answered(&mut self, fd: RawFd, id: u64, frame: Vec<u8>, admit: &mut dyn Admit) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        for slot in c.slots.iter_mut() {
            if let Slot::Native { id: slot_id, answer, .. } = slot {
                if *slot_id == id {
                    *answer = Some(frame);
                    c.native_out -= 1;
                    break;
                }
            }
        }
        self.write_answers(fd, admit);
    }

    /// Hands out every whole frame staged that may be, admitting each first; then holds
    /// reading or watches again as the connection's state says.
    fn serve_staged(&mut self, fd: RawFd, admit: &mut dyn Admit) {
        loop {
            let Some(c) = self.clients.get_mut(&fd) else { return };
            if c.awaiting_admission || c.for_python.is_some() || c.native_out >= STARTED_PER_CONNECTION
                || c.python_out >= PYTHON_MAX {
                break;
            }
            let Some(size) = c.frames.next_size() else { break };
            if size > c.max_frame_bytes {
                let (size, limit) = (size as i32, c.max_frame_bytes);
                let why = format!("request size {size} is outside 0..{limit} (socket.request.max.bytes)");
                self.shutdown(fd, why, false);
                return;
            }
            if !c.admitted {
                let admitted = match admit.admit(fd, size) {
                    Ok(admitted) => admitted,
                    Err(e) => return self.end(fd, Some(format!("its admission failed: {e}"))),
                };
                if !admitted {
                    let c = self.clients.get_mut(&fd).expect("served");
                    c.awaiting_admission = true;
                    break;
                }
                let c = self.clients.get_mut(&fd).expect("served");
                c.admitted = true;
                c.body_started = Some(Instant::now());
            }
            let c = self.clients.get_mut(&fd).expect("served");
            if c.frames.staged_len() < 4 + size {
                break; // its body is not all here yet
            }
            c.body_started = None; // (a wait for its slot is not the client's slowness)
            if !c.slotted {
                // Where it goes is decided now (no later frame is handed out before it, so
                // nothing makes a native frame Python's meanwhile).
                c.native = c.python_out == 0 && self.produce_natively
                    && c.frames.peek_whole().and_then(kafka_request::produce).is_some_and(servable);
                let for_python = !c.native;
                let slotted = match admit.slot(fd, for_python) {
                    Ok(slotted) => slotted,
                    Err(e) => return self.end(fd, Some(format!("its admission failed: {e}"))),
                };
                if !slotted {
                    let c = self.clients.get_mut(&fd).expect("served");
                    c.awaiting_admission = true;
                    break;
                }
                self.clients.get_mut(&fd).expect("served").slotted = true;
            }
            let c = self.clients.get_mut(&fd).expect("served");
            let body = match c.frames.next_owned(c.max_frame_bytes) {
                Ok(Some(body)) => body,
                _ => unreachable!("a whole frame, of a size within the bound"),
            };
            let native = c.native;
            c.admitted = false;
            c.slotted = false;
            c.body_started = None;
            c.last_active = Instant::now();
            if native {
                self.submit(fd, &body, size); // (its records are copied there, the frame is not)
            } else if self.clients[&fd].native_out > 0 {
                self.clients.get_mut(&fd).expect("served").for_python = Some(body.into_vec());
            } else {
                self.to_python(fd, body.into_vec());
            }
        }
        if let Some(c) = self.clients.get_mut(&fd) {
            c.frames.compact();
            // The EOF, once every whole frame before it is handed out (a part of one is dropped).
            let whole_staged = c.frames.next_size().is_some_and(|size| c.frames.staged_len() >= 4 + size);
            if c.eof && !c.eof_told && !c.awaiting_admission && c.for_python.is_none() && !whole_staged {
                c.eof_told = true;
                self.events.push(KafkaEvent::Eof { fd });
            }
        }
        self.hold_as_needed(fd);
    }

    /// A Produce request served natively (`servable`): submitted to the produce path, its
    /// place in the connection's order kept for its answer.
    fn submit(&mut self, fd: RawFd, body: &[u8], size: usize) {
        let p = kafka_request::produce(body).expect("read when its slot was asked for");
        let c = self.clients.get_mut(&fd).expect("served");
        let id = self.next_id;
        self.next_id += 1;
        c.slots.push_back(Slot::Native { id, bytes: size, read_at: Instant::now(), answer: None });
        c.native_out += 1;
        self.native_ids.insert(id, fd);
        let topics = p
            .topics
            .into_iter()
            .map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|(index, records)| PartitionIn { index, records: records.map(<[u8]>::to_vec), error: None })
                    .collect();
                (name, partitions)
            })
            .collect();
        self.path.submit(Submit {
            id,
            version: p.api_version,
            correlation_id: p.correlation_id,
            acks: p.acks,
            timeout_ms: p.timeout_ms,
            transactional_id: None,
            // rayk/net/api_versions.transaction_version_of, as the Python listener passes it
            transaction_version: if p.api_version >= 12 { 2 } else { 1 },
            topics,
        });
    }

    fn to_python(&mut self, fd: RawFd, frame: Vec<u8>) {
        let c = self.clients.get_mut(&fd).expect("served");
        c.slots.push_back(Slot::Python { answer: None });
        c.python_out += 1;
        self.events.push(KafkaEvent::Request { fd, frame });
    }

    /// Writes the answers at the front of the connection's order that are ready.
    fn write_answers(&mut self, fd: RawFd, admit: &mut dyn Admit) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        let mut ready: Vec<Vec<u8>> = Vec::new();
        while let Some(front) = c.slots.front_mut() {
            let answer = match front {
                Slot::Native { answer, .. } | Slot::Python { answer } => answer.take(),
            };
            let Some(answer) = answer else { break };
            if let Some(Slot::Native { bytes, read_at, .. }) = c.slots.pop_front() {
                self.events.push(KafkaEvent::Freed { fd, bytes, seconds: read_at.elapsed().as_secs_f64() });
            }
            if !answer.is_empty() {
                ready.push(answer);
            }
        }
        if ready.is_empty() {
            return self.after_write(fd, Ok(()), admit);
        }
        c.last_active = Instant::now();
        let pieces: Vec<&[u8]> = ready.iter().map(Vec::as_slice).collect();
        let sent = c.out.send(fd, &pieces);
        self.after_write(fd, sent, admit);
    }

    fn after_write(&mut self, fd: RawFd, result: std::io::Result<()>, admit: &mut dyn Admit) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        if let Err(e) = result {
            return self.end(fd, Some(format!("the connection broke: {e}")));
        }
        if let Some(on) = c.out.watch_change(false) {
            self.events.push(KafkaEvent::WantWrite { fd, on });
        }
        if c.native_out == 0 {
            if let Some(frame) = c.for_python.take() {
                self.to_python(fd, frame);
            }
        }
        if self.end_if_done(fd) {
            return;
        }
        self.serve_staged(fd, admit); // room again, perhaps: frames staged meanwhile are handed out
    }

    /// Ends a connection that reads no more once every answer is written.
    fn end_if_done(&mut self, fd: RawFd) -> bool {
        let Some(c) = self.clients.get_mut(&fd) else { return true };
        if c.eof_told && c.slots.is_empty() && !c.out.waiting() {
            let why = c.end_why.take();
            self.end(fd, why);
            return true;
        }
        false
    }

    /// Reads nothing more of the connection (`why` is logged at its end): what was read
    /// before is answered and written, then it ends, as after the client's EOF; with
    /// `abandon`, nothing not yet written is (Python's processing failed: its tasks are
    /// gone), and it ends once what is written is flushed.
    pub fn shutdown(&mut self, fd: RawFd, why: String, abandon: bool) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        c.eof = true;
        c.end_why.get_or_insert(why);
        c.frames = FrameBuf::new(&[]); // a frame not yet handed out is dropped, as a cancelled read
        c.awaiting_admission = false; // (its slot and bytes go back with the connection's)
        c.admitted = false;
        c.slotted = false;
        c.body_started = None;
        if abandon {
            for slot in std::mem::take(&mut c.slots) {
                if let Slot::Native { id, .. } = slot {
                    self.native_ids.remove(&id);
                }
            }
            let c = self.clients.get_mut(&fd).expect("served");
            c.for_python = None;
            c.native_out = 0;
            c.python_out = 0;
            c.eof_told = true; // Python wants no more of it
        }
        self.serve_staged_after_shutdown(fd);
    }

    fn serve_staged_after_shutdown(&mut self, fd: RawFd) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        if !c.eof_told && c.for_python.is_none() {
            c.eof_told = true;
            self.events.push(KafkaEvent::Eof { fd });
        }
        self.hold_as_needed(fd);
        self.end_if_done(fd);
    }

    fn hold_as_needed(&mut self, fd: RawFd) {
        let Some(c) = self.clients.get_mut(&fd) else { return };
        let hold = c.awaiting_admission || c.for_python.is_some() || c.native_out >= STARTED_PER_CONNECTION
            || c.python_out >= PYTHON_MAX || c.eof;
        if hold != c.held {
            c.held = hold;
            self.events.push(KafkaEvent::Hold { fd, on: hold });
        }
    }

    fn end(&mut self, fd: RawFd, why: Option<String>) {
        if self.clients.contains_key(&fd) {
            self.forget_client(fd);
            self.events.push(KafkaEvent::End { fd, why });
        }
    }

    /// Every descriptor held, replica links and clients (Python closes them): the listener closes.
    pub fn close(&mut self) -> Vec<RawFd> {
        let mut fds = self.path.close();
        fds.extend(self.clients.keys().copied());
        self.clients.clear();
        self.native_ids.clear();
        fds
    }
}

/// Whether a Produce request is served natively: acks 1 or -1 (acks=0 closes its connection
/// on a failure, Python's way) and not transactional (its id's ACL and verification).
fn servable(p: kafka_request::Produce<'_>) -> bool {
    p.acks != 0 && p.transactional_id.is_none()
}
