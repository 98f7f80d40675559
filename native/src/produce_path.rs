//! ProducePath: a listener's Kafka produce requests on their way to this broker's partition
//! replicas, and their answers back, on a thread of their own with the GIL released.
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
//! endpoint when asked (`NeedEndpoint`: it calls the replica's actor, opens the Unix socket,
//! does the handshake, and hands the proven socket over) or answers why it cannot
//! (`fail_endpoint`). A connection that breaks fails the frame in flight with
//! NOT_LEADER_OR_FOLLOWER, as the Python path does, and the next request asks Python again
//! (Ray may have restarted the replica: a new endpoint, a new secret).
//!
//! Completions go to Python through a queue and an eventfd its event loop watches: this
//! thread never takes the GIL.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::dataplane::{self, ErrorTable, KafkaError, ProduceRequest, ProduceResult};
use crate::produce_response::{self, PartitionAnswer};

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

pub enum Completion {
    /// The request's Produce response frame (size prefix included, throttle time 0), and
    /// whether a partition failed (an acks=0 request then closes its connection).
    Answered { id: u64, frame: Vec<u8>, failed: bool },
    /// Python is to look up this partition's replica endpoint (set_endpoint / fail_endpoint).
    NeedEndpoint { topic: String, partition: i32 },
    /// The thread ended with a panic: every request it held is lost, and Python answers them.
    Died { reason: String },
}

pub enum Stream {
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
}

pub enum Message {
    Submit(Submit),
    Endpoint { key: Key, stream: Stream },
    EndpointFailed { key: Key, code: i16, message: String },
    Answered { key: Key, generation: u64, outcome: Result<Vec<ProduceResult>, KafkaError> },
    Broken { key: Key, generation: u64, reason: String },
    Idle { key: Key, generation: u64 },
    Stop,
    /// Tests' way to see the thread die (ProducePath._crash_for_tests).
    Panic,
}

/// Completions waiting for Python, and the eventfd that wakes its event loop.
pub struct Outbox {
    done: Mutex<Vec<Completion>>,
    event_fd: RawFd,
}

impl Outbox {
    pub fn new(event_fd: RawFd) -> Self {
        Outbox { done: Mutex::new(Vec::new()), event_fd }
    }

    /// Queues `completion`; wakes Python if the queue was empty (Python reads the eventfd
    /// before it drains, so a completion queued after its drain wakes it again).
    pub fn push(&self, completion: Completion) {
        let was_empty = {
            let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
            let was_empty = done.is_empty();
            done.push(completion);
            was_empty
        };
        if was_empty {
            // The eventfd is Python's (it closes it after close()): borrowed, never closed here.
            let mut fd = ManuallyDrop::new(unsafe { File::from_raw_fd(self.event_fd) });
            let _ = fd.write(&1u64.to_ne_bytes());
        }
    }

    pub fn take(&self) -> Vec<Completion> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

struct Waiting {
    id: u64,
    slot: usize,
    request: ProduceRequest,
}

enum Conn {
    None,
    Resolving,
    Ready { frames: UnboundedSender<Vec<ProduceRequest>>, generation: u64 },
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

pub struct State {
    broker_id: i32,
    partitions: HashMap<Key, Partition>,
    requests: HashMap<u64, RequestState>,
    outbox: Arc<Outbox>,
    errors: Arc<ErrorTable>,
    messages: UnboundedSender<Message>,
    next_generation: u64,
}

impl State {
    pub fn new(broker_id: i32, outbox: Arc<Outbox>, errors: Arc<ErrorTable>, messages: UnboundedSender<Message>) -> Self {
        State { broker_id, partitions: HashMap::new(), requests: HashMap::new(), outbox, errors, messages, next_generation: 0 }
    }

    /// Serves messages until Stop (or every sender is gone).
    pub async fn run(mut self, mut inbox: UnboundedReceiver<Message>) {
        while let Some(message) = inbox.recv().await {
            match message {
                Message::Submit(submit) => self.submit(submit),
                Message::Endpoint { key, stream } => self.connected(key, stream),
                Message::EndpointFailed { key, code, message } => self.endpoint_failed(key, code, message),
                Message::Answered { key, generation, outcome } => self.answered(key, generation, outcome),
                Message::Broken { key, generation, reason } => self.broken(key, generation, reason),
                Message::Idle { key, generation } => {
                    if let Some(p) = self.partitions.get_mut(&key) {
                        if matches!(p.conn, Conn::Ready { generation: g, .. } if g == generation) {
                            p.conn = Conn::None;
                            self.dispatch(&key);
                            self.forget_if_unused(&key);
                        }
                    }
                }
                Message::Stop => return,
                Message::Panic => panic!("asked to, by a test"),
            }
        }
    }

    fn partition(&mut self, key: &Key) -> &mut Partition {
        self.partitions
            .entry(key.clone())
            .or_insert_with(|| Partition { conn: Conn::None, waiting: VecDeque::new(), in_flight: None })
    }

    fn submit(&mut self, s: Submit) {
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
        match &p.conn {
            Conn::Resolving => {}
            Conn::None => {
                p.conn = Conn::Resolving;
                self.outbox.push(Completion::NeedEndpoint { topic: key.0.clone(), partition: key.1 });
            }
            Conn::Ready { frames, .. } => {
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
                match frames.send(batch) {
                    Ok(()) => p.in_flight = Some(flights),
                    Err(returned) => {
                        // The connection closed itself (idle) before it took this frame: the
                        // requests go back in front, in order, and the endpoint is asked again.
                        for ((id, slot), request) in flights.into_iter().zip(returned.0).rev() {
                            p.waiting.push_front(Waiting { id, slot, request });
                        }
                        p.conn = Conn::None;
                        self.dispatch(key);
                    }
                }
            }
        }
    }

    fn connected(&mut self, key: Key, stream: Stream) {
        if matches!(self.partition(&key).conn, Conn::Ready { .. }) {
            return; // one is open already (an endpoint handed over twice): the new one is dropped
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        let (frames, inbox) = unbounded_channel();
        let (messages, errors) = (self.messages.clone(), self.errors.clone());
        let spawned = match stream {
            Stream::Unix(s) => s
                .set_nonblocking(true)
                .and_then(|()| tokio::net::UnixStream::from_std(s))
                .map(|s| supervised(key.clone(), generation, serve(key.clone(), generation, s, inbox, messages.clone(), errors), messages)),
            Stream::Tcp(s) => s
                .set_nonblocking(true)
                .and_then(|()| tokio::net::TcpStream::from_std(s))
                .map(|s| supervised(key.clone(), generation, serve(key.clone(), generation, s, inbox, messages.clone(), errors), messages)),
        };
        if let Err(e) = spawned {
            self.partition(&key).conn = Conn::Resolving;
            let message = format!("NOT_LEADER_OR_FOLLOWER: the replica of {}-{} is unreachable: {e}", key.0, key.1);
            self.endpoint_failed(key, NOT_LEADER_OR_FOLLOWER, message);
            return;
        }
        self.partition(&key).conn = Conn::Ready { frames, generation };
        self.dispatch(&key);
    }

    fn endpoint_failed(&mut self, key: Key, code: i16, message: String) {
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

    fn answered(&mut self, key: Key, generation: u64, outcome: Result<Vec<ProduceResult>, KafkaError>) {
        let Some(p) = self.partitions.get_mut(&key) else { return };
        if !matches!(p.conn, Conn::Ready { generation: g, .. } if g == generation) {
            return;
        }
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
        self.dispatch(&key);
    }

    fn broken(&mut self, key: Key, generation: u64, reason: String) {
        let Some(p) = self.partitions.get_mut(&key) else { return };
        if !matches!(p.conn, Conn::Ready { generation: g, .. } if g == generation) {
            return;
        }
        p.conn = Conn::None;
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
        self.outbox.push(Completion::Answered { id, frame, failed });
    }
}

/// Runs a connection's task; if it panics (a bug), its partition hears of a broken
/// connection, so the frame in flight is answered and the next request connects again.
fn supervised<F: std::future::Future<Output = ()> + Send + 'static>(
    key: Key,
    generation: u64,
    task: F,
    messages: UnboundedSender<Message>,
) {
    let handle = tokio::spawn(task);
    tokio::spawn(async move {
        if let Err(e) = handle.await {
            if e.is_panic() {
                let _ = messages.send(Message::Broken { key, generation, reason: "its task failed".into() });
            }
        }
    });
}

/// One partition replica's connection: a frame at a time, its answer read before the next.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    key: Key,
    generation: u64,
    mut stream: S,
    mut frames: UnboundedReceiver<Vec<ProduceRequest>>,
    messages: UnboundedSender<Message>,
    errors: Arc<ErrorTable>,
) {
    let mut correlation_id: i32 = 0;
    let mut closing = false;
    loop {
        let batch = if closing {
            match frames.recv().await {
                Some(batch) => batch,
                None => {
                    let _ = messages.send(Message::Idle { key, generation });
                    return;
                }
            }
        } else {
            match tokio::time::timeout(IDLE_TIMEOUT, frames.recv()).await {
                Ok(Some(batch)) => batch,
                Ok(None) => return, // the path stopped
                Err(_) => {
                    // Idle: no frame is taken after this, but one sent before it still is.
                    frames.close();
                    closing = true;
                    continue;
                }
            }
        };
        correlation_id = correlation_id.wrapping_add(1) & 0x7FFF_FFFF;
        let count = batch.len();
        let frame = dataplane::produce_frame(correlation_id, &batch);
        drop(batch);
        let outcome = exchange(&mut stream, &frame, correlation_id, count, &errors).await;
        drop(frame);
        let outcome = match outcome {
            Ok(Err(e)) if e.code == NETWORK_EXCEPTION => Err(format!("the replica answered {}", e.message)),
            other => other,
        };
        match outcome {
            Ok(outcome) => {
                if messages.send(Message::Answered { key: key.clone(), generation, outcome }).is_err() {
                    return;
                }
            }
            Err(reason) => {
                let _ = messages.send(Message::Broken { key, generation, reason });
                return;
            }
        }
    }
}

async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    frame: &[u8],
    correlation_id: i32,
    count: usize,
    errors: &ErrorTable,
) -> Result<Result<Vec<ProduceResult>, KafkaError>, String> {
    stream.write_all(frame).await.map_err(|e| format!("the connection broke: {e}"))?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "the endpoint closed the connection".to_string(),
        _ => format!("the connection broke: {e}"),
    })?;
    let size = u32::from_be_bytes(size) as usize;
    if size > errors.max_frame_bytes {
        return Err(format!("an answer frame of {size} bytes"));
    }
    let mut body = vec![0u8; size];
    stream.read_exact(&mut body).await.map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "the endpoint closed the connection".to_string(),
        _ => format!("the connection broke: {e}"),
    })?;
    dataplane::read_produce_answer(&body, correlation_id, count, errors).map_err(|e| format!("an answer that does not parse: {}", e.0))
}
