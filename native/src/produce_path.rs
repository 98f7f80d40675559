//! ProducePath: a listener's Kafka produce requests on their way to this broker's partition
//! replicas, and their answers back, driven by the listener's event loop: no thread of its
//! own, so a request costs no wake-up beyond the client's and the replica's, as in Python.
//!
//! What `rayk/net/produce_coalescer.py` and `rayk/dataplane/replica_link.py` do in Python,
//! per request: per partition, one PRODUCE frame in flight on the replica's data plane
//! connection at a time; requests that arrive meanwhile (from any client connection) wait and
//! go together in the next frame (at most CALL_MAX_BYTES of records, one request at least),
//! appended in the order they were submitted. When every partition of a Kafka request is
//! answered, its whole Produce response frame is written here and handed to Python.
//!
//! Python keeps every decision: it decodes the request (kio), checks the ACLs, and submits
//! each partition's records or the error it already decided; it looks up a replica's
//! endpoint when asked (`NeedEndpoint`: it calls the replica's actor, opens the socket, does
//! the handshake, and hands the proven, non-blocking socket over) or answers why it cannot
//! (`fail_endpoint`). Python owns the sockets' descriptors: it watches them
//! (`on_readable` / `on_writable` are its event loop's callbacks) and closes one when told
//! (`Release`); this module only reads and writes them. A connection that breaks fails the
//! frame in flight with NOT_LEADER_OR_FOLLOWER, as the Python path does, and the next
//! request asks Python again (Ray may have restarted the replica: a new endpoint, a new
//! secret). One idle for IDLE_TIMEOUT is released before it is used again, before the
//! endpoint's own idle close could meet a frame.

use std::collections::{HashMap, VecDeque};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::dataplane::{self, ErrorTable, KafkaError, ProduceRequest, ProduceResult};
use crate::produce_response::{self, PartitionAnswer};
use crate::socket_io::{Frame, FrameBuf, OutBuf};

/// produce_coalescer.CALL_MAX_BYTES
pub const CALL_MAX_BYTES: usize = 8 << 20;
/// connection.IDLE_TIMEOUT_S: below the endpoint's 10 minutes, so no frame meets its close.
const IDLE_TIMEOUT: Duration = Duration::from_secs(540);
const NOT_LEADER_OR_FOLLOWER: i16 = 6;
const NETWORK_EXCEPTION: i16 = 13;
const INVALID_REQUEST: i16 = 42;

pub type Key = (String, i32);

/// One partition of a submitted Kafka request: its records, or the error Python decided.
pub struct PartitionIn {
    pub index: i32,
    pub records: Option<Vec<u8>>,
    pub error: Option<(i16, String)>,
}

pub struct Submit {
    pub id: u64,
    pub version: i16,
    pub correlation_id: i32,
    pub acks: i16,
    pub timeout_ms: i32,
    pub transactional_id: Option<String>,
    pub transaction_version: i8,
    pub topics: Vec<(String, Vec<PartitionIn>)>,
}

/// What Python is to do after a call.
pub enum Completion {
    /// The request's Produce response frame (size prefix included, throttle time 0), and
    /// whether a partition failed (an acks=0 request then closes its connection).
    Answered { id: u64, frame: Vec<u8>, failed: bool },
    /// Look up this partition's replica endpoint (set_endpoint / fail_endpoint).
    NeedEndpoint { topic: String, partition: i32 },
    /// Stop watching this descriptor and close it: its connection is done with.
    Release { fd: RawFd },
    /// Watch this descriptor for writability (true: a frame waits for room) or stop (false).
    WantWrite { fd: RawFd, on: bool },
}

struct Waiting {
    id: u64,
    slot: usize,
    request: ProduceRequest,
}

/// A proven connection to one partition replica's endpoint (its descriptor is Python's).
struct Link {
    fd: RawFd,
    out: OutBuf,
    frames: FrameBuf,
    correlation_id: i32,
    last_active: Instant,
}

enum Conn {
    None,
    Resolving,
    Ready(Box<Link>),
}

struct Partition {
    conn: Conn,
    waiting: VecDeque<Waiting>,
    in_flight: Option<Vec<(u64, usize)>>, // (request id, slot) of the frame on the wire
}

struct RequestState {
    version: i16,
    correlation_id: i32,
    topics: Vec<(String, usize)>, // names, and how many of the slots are each topic's
    answers: Vec<Option<PartitionAnswer>>,
    indexes: Vec<i32>,
    remaining: usize,
}

pub struct Path {
    broker_id: i32,
    partitions: HashMap<Key, Partition>,
    by_fd: HashMap<RawFd, Key>,
    requests: HashMap<u64, RequestState>,
    errors: ErrorTable,
    done: Vec<Completion>,
}


impl Path {
    pub fn new(broker_id: i32, errors: ErrorTable) -> Self {
        Path { broker_id, partitions: HashMap::new(), by_fd: HashMap::new(), requests: HashMap::new(), errors, done: Vec::new() }
    }

    /// What the last call left for Python to do.
    pub fn take(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.done)
    }

    /// Every descriptor held (Python closes them): the path is closing.
    pub fn close(&mut self) -> Vec<RawFd> {
        let fds = self.by_fd.keys().copied().collect();
        self.by_fd.clear();
        self.partitions.clear();
        self.requests.clear();
        fds
    }

    fn partition(&mut self, key: &Key) -> &mut Partition {
        self.partitions
            .entry(key.clone())
            .or_insert_with(|| Partition { conn: Conn::None, waiting: VecDeque::new(), in_flight: None })
    }

    pub fn submit(&mut self, s: Submit) {
        let total: usize = s.topics.iter().map(|(_, ps)| ps.len()).sum();
        // The data plane carries a transactional id's size as an int16 (frames.py): a longer
        // one is refused here, as the Python path's frame encoder refuses it.
        let refused = match &s.transactional_id {
            Some(id) if id.len() > i16::MAX as usize => Some((
                INVALID_REQUEST,
                format!("INVALID_REQUEST: a data plane request out of range: a transactional id of {} bytes", id.len()),
            )),
            _ => None,
        };
        let mut state = RequestState {
            version: s.version,
            correlation_id: s.correlation_id,
            topics: Vec::with_capacity(s.topics.len()),
            answers: Vec::with_capacity(total),
            indexes: Vec::with_capacity(total),
            remaining: 0,
        };
        let mut touched: Vec<Key> = Vec::new();
        for (name, partitions) in s.topics {
            state.topics.push((name.clone(), partitions.len()));
            for p in partitions {
                let slot = state.answers.len();
                state.indexes.push(p.index);
                match (p.error.or_else(|| refused.clone()), p.records) {
                    (Some((code, message)), _) => state.answers.push(Some(PartitionAnswer::failed(p.index, code, message, Vec::new()))),
                    (None, None) => state.answers.push(Some(PartitionAnswer::failed(
                        p.index,
                        2,
                        "CORRUPT_MESSAGE: a produce request without records".into(),
                        Vec::new(),
                    ))),
                    (None, Some(records)) => {
                        state.answers.push(None);
                        state.remaining += 1;
                        let key = (name.clone(), p.index);
                        let request = ProduceRequest {
                            records,
                            acks: s.acks,
                            timeout_ms: s.timeout_ms,
                            transactional_id: s.transactional_id.clone(),
                            transaction_version: s.transaction_version,
                        };
                        self.partition(&key).waiting.push_back(Waiting { id: s.id, slot, request });
                        touched.push(key);
                    }
                }
            }
        }
        let remaining = state.remaining;
        self.requests.insert(s.id, state);
        if remaining == 0 {
            self.finish(s.id);
        }
        for key in touched {
            self.dispatch(&key);
        }
    }

    /// Sends the partition's next frame if none is in flight and requests wait.
    fn dispatch(&mut self, key: &Key) {
        let Some(p) = self.partitions.get_mut(key) else { return };
        if p.in_flight.is_some() || p.waiting.is_empty() {
            return;
        }
        if let Conn::Ready(link) = &p.conn {
            if link.last_active.elapsed() >= IDLE_TIMEOUT {
                // Idle past the client's bound: closed before the endpoint's close could meet a frame.
                let fd = link.fd;
                p.conn = Conn::None;
                self.by_fd.remove(&fd);
                self.done.push(Completion::Release { fd });
            }
        }
        let Some(p) = self.partitions.get_mut(key) else { return };
        match &mut p.conn {
            Conn::Resolving => {}
            Conn::None => {
                p.conn = Conn::Resolving;
                self.done.push(Completion::NeedEndpoint { topic: key.0.clone(), partition: key.1 });
            }
            Conn::Ready(link) => {
                let mut size = 0usize;
                let mut batch = Vec::new();
                let mut flights = Vec::new();
                while let Some(front) = p.waiting.front() {
                    if !batch.is_empty() && size + front.request.records.len() > CALL_MAX_BYTES {
                        break;
                    }
                    let w = p.waiting.pop_front().unwrap();
                    size += w.request.records.len();
                    flights.push((w.id, w.slot));
                    batch.push(w.request);
                }
                link.correlation_id = link.correlation_id.wrapping_add(1) & 0x7FFF_FFFF;
                let frame = dataplane::produce_frame(link.correlation_id, &batch);
                link.last_active = Instant::now();
                p.in_flight = Some(flights);
                let (fd, sent) = (link.fd, link.out.send(link.fd, &[&frame]));
                self.after_write(key, fd, sent);
            }
        }
    }

    /// Writes what the partition's link has to write, as far as the socket takes it.
    fn flush(&mut self, key: &Key, fd: RawFd) {
        let Some(Partition { conn: Conn::Ready(link), .. }) = self.partitions.get_mut(key) else { return };
        let flushed = link.out.flush(fd);
        self.after_write(key, fd, flushed);
    }

    /// Tells Python to watch for writability, or to stop, when that changed; breaks a link
    /// whose write failed.
    fn after_write(&mut self, key: &Key, fd: RawFd, result: std::io::Result<()>) {
        let Some(Partition { conn: Conn::Ready(link), .. }) = self.partitions.get_mut(key) else { return };
        if let Err(e) = result {
            return self.broken(key.clone(), format!("the connection broke: {e}"));
        }
        if let Some(on) = link.out.watch_change(false) {
            self.done.push(Completion::WantWrite { fd, on });
        }
    }

    pub fn on_writable(&mut self, fd: RawFd) {
        if let Some(key) = self.by_fd.get(&fd).cloned() {
            self.flush(&key, fd);
        }
    }

    /// Reads the socket up to a whole answer (or what it holds); an answer read whole
    /// settles its frame's requests. Bytes the endpoint sent after it are read on the next
    /// call, as the start of another answer: one to no request in flight, or with another
    /// correlation id than the frame in flight, breaks the connection.
    pub fn on_readable(&mut self, fd: RawFd) {
        let Some(key) = self.by_fd.get(&fd).cloned() else { return };
        let Some(Partition { conn: Conn::Ready(link), .. }) = self.partitions.get_mut(&key) else { return };
        let failure = link.frames.read(fd, self.errors.max_frame_bytes).why("endpoint");
        let answer = self.take_answer(&key);
        if let Some(answer) = answer {
            match answer {
                Ok(outcome) => self.answered(&key, outcome),
                Err(reason) => return self.broken(key, reason),
            }
        }
        if let Some(reason) = failure {
            self.broken(key, reason);
        }
    }

    /// The answer to the frame in flight, once its bytes are all read (Err: the connection
    /// is broken: an answer too large, to nothing in flight, or that does not parse).
    fn take_answer(&mut self, key: &Key) -> Option<Result<Result<Vec<ProduceResult>, KafkaError>, String>> {
        let Some(Partition { conn: Conn::Ready(link), in_flight, .. }) = self.partitions.get_mut(key) else { return None };
        let body = match link.frames.next(self.errors.max_frame_bytes) {
            Frame::Partial => return None,
            Frame::Oversized(size) => return Some(Err(format!("an answer frame of {size} bytes"))),
            Frame::Whole(body) => body.to_vec(), // a few bytes a partition
        };
        link.frames.release_if_empty();
        let Some(flights) = in_flight.as_ref() else {
            return Some(Err("an answer to a request that was not sent".into()));
        };
        if !link.frames.is_empty() {
            return Some(Err("bytes after the answer to the one request in flight".into()));
        }
        link.last_active = Instant::now();
        let read = dataplane::read_produce_answer(&body, link.correlation_id, flights.len(), &self.errors);
        Some(match read {
            Err(e) => Err(format!("an answer that does not parse: {}", e.0)),
            // A FAILED answer naming NETWORK_EXCEPTION: the replica's side broke; the
            // connection is dropped, as ReplicaLink does.
            Ok(Err(e)) if e.code == NETWORK_EXCEPTION => Err(format!("the replica answered {}", e.message)),
            Ok(outcome) => Ok(outcome),
        })
    }

    /// Hands over a proven, non-blocking socket to the partition's replica (Python watches it).
    pub fn set_endpoint(&mut self, key: Key, fd: RawFd) {
        if matches!(self.partition(&key).conn, Conn::Ready(_)) {
            self.done.push(Completion::Release { fd }); // one is open already: the new one goes
            return;
        }
        let link = Link {
            fd,
            out: OutBuf::new(),
            frames: FrameBuf::new(&[]),
            correlation_id: 0,
            last_active: Instant::now(),
        };
        self.partition(&key).conn = Conn::Ready(Box::new(link));
        self.by_fd.insert(fd, key.clone());
        self.dispatch(&key);
    }

    pub fn fail_endpoint(&mut self, key: Key, code: i16, message: String) {
        let p = self.partition(&key);
        if !matches!(p.conn, Conn::Resolving) {
            return;
        }
        p.conn = Conn::None;
        let failed: Vec<(u64, usize)> = p.waiting.drain(..).map(|w| (w.id, w.slot)).collect();
        let error = KafkaError { code, message, record_errors: Vec::new() };
        for (id, slot) in failed {
            self.settle(id, slot, Err(error.clone()));
        }
        self.forget_if_unused(&key);
    }

    /// Drops a partition's entry once it has no connection and nothing waits or is in
    /// flight (a client naming partitions that do not exist does not grow the table).
    fn forget_if_unused(&mut self, key: &Key) {
        if let Some(p) = self.partitions.get(key) {
            if matches!(p.conn, Conn::None) && p.waiting.is_empty() && p.in_flight.is_none() {
                self.partitions.remove(key);
            }
        }
    }

    fn answered(&mut self, key: &Key, outcome: Result<Vec<ProduceResult>, KafkaError>) {
        let Some(p) = self.partitions.get_mut(key) else { return };
        let flights = p.in_flight.take().unwrap_or_default();
        match outcome {
            Ok(results) => {
                debug_assert_eq!(results.len(), flights.len());
                for ((id, slot), result) in flights.into_iter().zip(results) {
                    self.settle(id, slot, result);
                }
            }
            Err(error) => {
                for (id, slot) in flights {
                    self.settle(id, slot, Err(error.clone()));
                }
            }
        }
        self.dispatch(key);
    }

    fn broken(&mut self, key: Key, reason: String) {
        let Some(p) = self.partitions.get_mut(&key) else { return };
        let Conn::Ready(link) = std::mem::replace(&mut p.conn, Conn::None) else { return };
        self.by_fd.remove(&link.fd);
        self.done.push(Completion::Release { fd: link.fd });
        let flights = p.in_flight.take().unwrap_or_default();
        let (topic, partition) = &key;
        let error = KafkaError {
            code: NOT_LEADER_OR_FOLLOWER,
            message: format!(
                "NOT_LEADER_OR_FOLLOWER: the replica of {topic}-{partition} on broker {} is restarting \
                 (NETWORK_EXCEPTION: data plane connection to the replica of {topic}-{partition}: {reason})",
                self.broker_id
            ),
            record_errors: Vec::new(),
        };
        for (id, slot) in flights {
            self.settle(id, slot, Err(error.clone()));
        }
        self.dispatch(&key);
        self.forget_if_unused(&key);
    }

    fn settle(&mut self, id: u64, slot: usize, result: ProduceResult) {
        let Some(state) = self.requests.get_mut(&id) else { return };
        let index = state.indexes[slot];
        state.answers[slot] = Some(match result {
            Ok((base_offset, log_append_time_ms, log_start_offset)) => PartitionAnswer {
                index,
                error_code: 0,
                error_message: None,
                base_offset,
                log_append_time_ms,
                log_start_offset,
                record_errors: Vec::new(),
            },
            Err(e) => PartitionAnswer::failed(index, e.code, e.message, e.record_errors),
        });
        state.remaining -= 1;
        if state.remaining == 0 {
            self.finish(id);
        }
    }

    fn finish(&mut self, id: u64) {
        let state = self.requests.remove(&id).expect("a request finishes once");
        let mut answers = state.answers.into_iter().map(|a| a.expect("every partition is answered"));
        let mut failed = false;
        let topics: Vec<(String, Vec<PartitionAnswer>)> = state
            .topics
            .into_iter()
            .map(|(name, n)| {
                let partitions: Vec<PartitionAnswer> = answers.by_ref().take(n).collect();
                failed |= partitions.iter().any(|p| p.error_code != 0);
                (name, partitions)
            })
            .collect();
        let frame = produce_response::encode(state.version, state.correlation_id, &topics);
        self.done.push(Completion::Answered { id, frame, failed });
    }
}
