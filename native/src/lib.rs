//! rayk._native: the per-request path in native code (see
//! docs/design-notes/2026-12-03-native-request-path.md). So far: the listener's Produce
//! from its decoded request to the Kafka response frame (produce_path.rs), driven by the
//! listener's event loop, with the data plane's PRODUCE exchange (dataplane.rs) and the
//! Produce response (produce_response.rs), and a PLAINTEXT listener's client connections
//! with their plain Produce requests (kafka_conns.rs, kafka_request.rs); and the
//! connections a replica's data plane
//! endpoint serves (endpoint_conns.rs), driven by the replica's event loop; and a
//! follower's copy loop on a thread of its own (follower_copy.rs).
//! rayk runs without this module (a machine without cargo): the same path is Python's.

mod client_conns;
mod dataplane;
mod endpoint_conns;
mod follower_copy;
mod kafka_conns;
mod kafka_request;
mod produce_path;
mod produce_response;
mod socket_io;

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use client_conns::{ClientConns, ClientEvent};
use dataplane::{ErrorTable, ProduceRequest};
use endpoint_conns::{EndpointConns, Event, Slice};
use kafka_conns::{Admit, KafkaEvent, Listener};
use produce_path::{Completion, PartitionIn, Path, Submit};
use produce_response::PartitionAnswer;

const ANSWERED: u8 = 0;
const NEED_ENDPOINT: u8 = 1;
const RELEASE: u8 = 2;
const WANT_WRITE: u8 = 3;
const REQUEST: u8 = 4;
const END: u8 = 5;
const HOLD: u8 = 6;
const ANSWER: u8 = 7;
const CLIENT_REQUEST: u8 = 8;
const CLIENT_EOF: u8 = 9;
const CLIENT_END: u8 = 10;
const CLIENT_FREED: u8 = 11;
const CLIENT_HOLD: u8 = 12;
const CLIENT_WANT_WRITE: u8 = 13;

type PartitionArg<'py> = (i32, Option<Bound<'py, PyBytes>>, i16, Option<String>);

/// A listener's produce path (produce_path.rs) and the client connections it serves
/// itself (kafka_conns.rs), driven by its event loop's thread: every method returns what
/// Python is to do next, as tuples: (0, id, frame, failed) a request answered, (1, topic,
/// partition) an endpoint to look up, (2, fd) a descriptor to stop watching and close, (3,
/// fd, on) a replica link's descriptor to watch for writability or not; and for client
/// connections (8, fd, frame) a frame for Python to serve, (9, fd) the client's EOF, (10,
/// fd, why) a connection over, (11, fd, bytes, seconds) a native request answered, (12,
/// fd, on) stop reading it or read again, (13, fd, on) watch it for writability or not.
#[pyclass(module = "rayk._native")]
struct ProducePath {
    listener: Listener,
    admission: Option<Py<PyAny>>,
}

/// The listener's admission, asked through Python: `admission(fd, size) -> bool`.
struct PyAdmit<'a, 'py> {
    py: Python<'py>,
    admission: Option<&'a Py<PyAny>>,
}

impl PyAdmit<'_, '_> {
    /// `admission(fd, size)`: size -1 asks for the frame's slot, -2 for a frame for Python.
    fn ask(&mut self, fd: i32, size: i64) -> Result<bool, String> {
        let Some(admission) = self.admission else { return Err("no admission is set".into()) };
        admission.call1(self.py, (fd, size)).and_then(|r| r.extract::<bool>(self.py)).map_err(|e| {
            e.print(self.py); // a bug in Python's admission: its traceback, and the connection ends
            e.to_string()
        })
    }
}

impl Admit for PyAdmit<'_, '_> {
    fn admit(&mut self, fd: i32, size: usize) -> Result<bool, String> {
        self.ask(fd, size as i64)
    }

    fn slot(&mut self, fd: i32, for_python: bool) -> Result<bool, String> {
        self.ask(fd, if for_python { -2 } else { -1 })
    }
}

fn error_table(errors: HashMap<String, (i16, String)>, max_record_errors: i32, max_frame_bytes: usize) -> ErrorTable {
    ErrorTable { by_class: errors, max_record_errors, max_frame_bytes }
}

fn completions<'py>(py: Python<'py>, (done, clients): (Vec<Completion>, Vec<KafkaEvent>)) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    let path = done.into_iter().map(|completion| match completion {
        Completion::Answered { id, frame, failed } => (ANSWERED, id, PyBytes::new(py, &frame), failed).into_pyobject(py),
        Completion::NeedEndpoint { topic, partition } => (NEED_ENDPOINT, topic, partition).into_pyobject(py),
        Completion::Release { fd } => (RELEASE, fd).into_pyobject(py),
        Completion::WantWrite { fd, on } => (WANT_WRITE, fd, on).into_pyobject(py),
    });
    let clients = clients.into_iter().map(|event| match event {
        KafkaEvent::Request { fd, frame } => (CLIENT_REQUEST, fd, PyBytes::new(py, &frame)).into_pyobject(py),
        KafkaEvent::Eof { fd } => (CLIENT_EOF, fd).into_pyobject(py),
        KafkaEvent::End { fd, why } => (CLIENT_END, fd, why).into_pyobject(py),
        KafkaEvent::Freed { fd, bytes, seconds } => (CLIENT_FREED, fd, bytes, seconds).into_pyobject(py),
        KafkaEvent::Hold { fd, on } => (CLIENT_HOLD, fd, on).into_pyobject(py),
        KafkaEvent::WantWrite { fd, on } => (CLIENT_WANT_WRITE, fd, on).into_pyobject(py),
    });
    path.chain(clients).collect()
}

impl ProducePath {
    fn done<'py>(&mut self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut admit = PyAdmit { py, admission: self.admission.as_ref() };
        completions(py, self.listener.take(&mut admit))
    }
}

#[pymethods]
impl ProducePath {
    /// `errors`: rayk.errors' class names -> (code, Kafka name).
    #[new]
    fn new(broker_id: i32, errors: HashMap<String, (i16, String)>, max_record_errors: i32, max_frame_bytes: usize) -> Self {
        let path = Path::new(broker_id, error_table(errors, max_record_errors, max_frame_bytes));
        ProducePath { listener: Listener::new(path), admission: None }
    }

    /// One decoded Produce request: per topic, per partition (index, records or None,
    /// error code (0: none), error message), answered by a completion with `id`.
    #[allow(clippy::too_many_arguments)]
    fn submit<'py>(
        &mut self,
        py: Python<'py>,
        id: u64,
        version: i16,
        correlation_id: i32,
        acks: i16,
        timeout_ms: i32,
        transactional_id: Option<String>,
        transaction_version: i8,
        topics: Vec<(String, Vec<PartitionArg<'py>>)>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        if !(produce_response::MIN_VERSION..=produce_response::MAX_VERSION).contains(&version) {
            return Err(PyValueError::new_err(format!("Produce v{version} is not answered here")));
        }
        let topics = topics
            .into_iter()
            .map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|(index, records, code, message)| PartitionIn {
                        index,
                        records: records.map(|r| r.as_bytes().to_vec()),
                        error: if code != 0 { Some((code, message.unwrap_or_default())) } else { None },
                    })
                    .collect();
                (name, partitions)
            })
            .collect();
        self.listener.path.submit(Submit { id, version, correlation_id, acks, timeout_ms, transactional_id, transaction_version, topics });
        self.done(py)
    }

    /// A connected, non-blocking socket to the partition's replica that has passed the data
    /// plane's handshake. The descriptor stays Python's: it watches it and closes it when a
    /// completion releases it (also at once, if the partition has a connection already).
    fn set_endpoint<'py>(&mut self, py: Python<'py>, topic: String, partition: i32, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.listener.path.set_endpoint((topic, partition), fd);
        self.done(py)
    }

    /// The partition's endpoint cannot be had: its waiting requests fail with this error.
    fn fail_endpoint<'py>(
        &mut self,
        py: Python<'py>,
        topic: String,
        partition: i32,
        code: i16,
        message: String,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.listener.path.fail_endpoint((topic, partition), code, message);
        self.done(py)
    }

    fn on_readable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.listener.path.on_readable(fd);
        self.done(py)
    }

    fn on_writable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.listener.path.on_writable(fd);
        self.done(py)
    }

    /// Forgets every request and connection; returns the descriptors it held (Python closes them).
    fn close(&mut self) -> Vec<i32> {
        self.listener.close()
    }

    /// The listener's admission of client frames: `admission(fd, size) -> bool` takes a
    /// frame's pool bytes (before its body is read), `admission(fd, -1)` its slot (once
    /// the body is whole; -2: a frame for Python, which also needs room in the
    /// connection's queue), now (True), or starts waiting for them and calls
    /// `client_admitted(fd)` once it has (False). It must not call this object.
    fn set_admission(&mut self, admission: Py<PyAny>) {
        self.admission = Some(admission);
    }

    /// Whether Produce requests of client connections may be served natively (no
    /// authorizer, no client quota): else every frame goes to Python.
    fn set_produce_natively(&mut self, on: bool) {
        self.listener.produce_natively = on;
    }

    /// A PLAINTEXT client's connected, non-blocking socket (the descriptor stays Python's:
    /// it watches it for reading until told otherwise, and closes it after its end), with
    /// what was read of it already.
    fn adopt_client<'py>(&mut self, py: Python<'py>, fd: i32, staged: &[u8], max_frame_bytes: usize) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        if self.listener.is_client(fd) {
            return Err(PyValueError::new_err(format!("descriptor {fd} is served already")));
        }
        let mut admit = PyAdmit { py, admission: self.admission.as_ref() };
        self.listener.adopt_client(fd, staged, max_frame_bytes, &mut admit);
        self.done(py)
    }

    fn on_client_readable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut admit = PyAdmit { py, admission: self.admission.as_ref() };
        self.listener.on_client_readable(fd, &mut admit);
        self.done(py)
    }

    fn on_client_writable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut admit = PyAdmit { py, admission: self.admission.as_ref() };
        self.listener.on_client_writable(fd, &mut admit);
        self.done(py)
    }

    /// Python's answer to its oldest unanswered frame of the connection (b"": none is written).
    fn client_answer<'py>(&mut self, py: Python<'py>, fd: i32, frame: &[u8]) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut admit = PyAdmit { py, admission: self.admission.as_ref() };
        self.listener.client_answer(fd, frame.to_vec(), &mut admit);
        self.done(py)
    }

    /// Reads nothing more of the connection (`why`, logged at its end): what it sent before
    /// is answered, then it ends; with `abandon`, only what is written already is flushed.
    fn client_shutdown<'py>(&mut self, py: Python<'py>, fd: i32, why: String, abandon: bool) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.listener.shutdown(fd, why, abandon);
        self.done(py)
    }

    /// The frame that waited for admission has its slot and pool bytes now.
    fn client_admitted<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut admit = PyAdmit { py, admission: self.admission.as_ref() };
        self.listener.client_admitted(fd, &mut admit);
        self.done(py)
    }

    /// (seconds idle with nothing out, seconds a frame's body has taken so far), for
    /// connections.max.idle.ms.
    fn client_idle_s(&self, fd: i32) -> (Option<f64>, Option<f64>) {
        self.listener.client_idle_s(fd)
    }

    /// Forgets a connection that ended (Python closes its descriptor).
    fn forget_client(&mut self, fd: i32) {
        self.listener.forget_client(fd);
    }

    /// Panics, as a bug would: tests check that the listener answers and goes on.
    #[doc(hidden)]
    fn _crash_for_tests(&mut self) {
        panic!("asked to, by a test");
    }
}

/// A replica endpoint's proven connections (endpoint_conns.rs), driven by its event loop's
/// thread: every method returns what Python is to do next, as tuples: (4, fd,
/// correlation id, kind, body) a request to serve, (5, fd, why or None) a connection over,
/// (3, fd, on) a descriptor to watch for writability or not, (6, fd, on) one to stop
/// watching for reading (on) or to watch again.
#[pyclass(module = "rayk._native")]
struct EndpointConnections {
    conns: EndpointConns,
}

/// rayk.storage.file_slice.FileSlice, asked through Python (the loop's thread holds the GIL).
struct PySlice {
    slice: Py<PyAny>,
    fd: i32,
    position: i64,
    len: usize,
}

impl Slice for PySlice {
    fn fd(&self) -> i32 {
        self.fd
    }
    fn position(&self) -> i64 {
        self.position
    }
    fn len(&self) -> usize {
        self.len
    }
    fn unchanged(&self) -> bool {
        Python::with_gil(|py| {
            self.slice.bind(py).call_method0("unchanged").and_then(|r| r.is_truthy()).unwrap_or(false)
        })
    }
    fn read_failed(&self, error: &std::io::Error) {
        Python::with_gil(|py| {
            let code = error.raw_os_error().unwrap_or(0);
            let exc = pyo3::exceptions::PyOSError::new_err((code, error.to_string()));
            if let Ok(callback) = self.slice.bind(py).getattr("read_failed") {
                if let Err(e) = callback.call1((exc.value(py),)) {
                    e.print(py);
                }
            }
        })
    }
    fn close(&self) {
        Python::with_gil(|py| {
            if let Err(e) = self.slice.bind(py).call_method0("close") {
                e.print(py);
            }
        })
    }
}

fn events<'py>(py: Python<'py>, done: Vec<Event>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    done.into_iter()
        .map(|event| match event {
            Event::Request { fd, correlation_id, kind, body } => {
                (REQUEST, fd, correlation_id, kind, PyBytes::new(py, &body)).into_pyobject(py)
            }
            Event::End { fd, why } => (END, fd, why).into_pyobject(py),
            Event::WantWrite { fd, on } => (WANT_WRITE, fd, on).into_pyobject(py),
            Event::Hold { fd, on } => (HOLD, fd, on).into_pyobject(py),
        })
        .collect()
}

#[pymethods]
impl EndpointConnections {
    #[new]
    fn new(max_in_flight: usize, max_frame_bytes: usize) -> PyResult<Self> {
        if max_in_flight == 0 {
            return Err(PyValueError::new_err("max_in_flight must be at least 1"));
        }
        Ok(EndpointConnections { conns: EndpointConns::new(max_in_flight, max_frame_bytes) })
    }

    /// A proven, non-blocking socket (its descriptor stays Python's) and what its reader staged.
    fn adopt<'py>(&mut self, py: Python<'py>, fd: i32, staged: &[u8]) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.adopt(fd, staged);
        events(py, self.conns.take())
    }

    fn on_readable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.on_readable(fd);
        events(py, self.conns.take())
    }

    fn on_writable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.on_writable(fd);
        events(py, self.conns.take())
    }

    /// The answer to request `correlation_id`: `head` then the records `tail`.
    fn answer<'py>(
        &mut self,
        py: Python<'py>,
        fd: i32,
        correlation_id: i32,
        head: &[u8],
        tail: &[u8],
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.answer(fd, correlation_id, head, tail);
        events(py, self.conns.take())
    }

    /// A whole answer frame (a FAILED one).
    fn answer_frame<'py>(&mut self, py: Python<'py>, fd: i32, frame: &[u8]) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.answer_frame(fd, frame);
        events(py, self.conns.take())
    }

    /// An answer whose records are `slice` (a FileSlice), sent by sendfile and closed once
    /// sent; `stale` (a FAILED answer) goes instead if its log is truncated before any of it does.
    fn answer_file<'py>(
        &mut self,
        py: Python<'py>,
        fd: i32,
        correlation_id: i32,
        head: &[u8],
        slice: Bound<'py, PyAny>,
        stale: Vec<u8>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let slice = PySlice {
            fd: slice.getattr("fd")?.extract()?,
            position: slice.getattr("position")?.extract()?,
            len: slice.len()?,
            slice: slice.unbind(),
        };
        self.conns.answer_file(fd, correlation_id, head, Box::new(slice), stale);
        events(py, self.conns.take())
    }

    /// Seconds since the connection last read a frame or wrote an answer; None while a
    /// request of it is out (or it is not served here).
    fn idle_s(&self, fd: i32) -> Option<f64> {
        self.conns.idle_s(fd)
    }

    /// Forgets a connection that ended (Python closes its descriptor).
    fn forget(&mut self, fd: i32) {
        self.conns.forget(fd);
    }

    /// Forgets every connection; returns their descriptors (Python closes them).
    fn close(&mut self) -> Vec<i32> {
        self.conns.close()
    }

    #[doc(hidden)]
    fn _crash_for_tests(&mut self) {
        panic!("asked to, by a test");
    }
}

/// A process's connections to data plane endpoints (client_conns.rs), driven by its event
/// loop's thread: every method returns what Python is to do next, as tuples: (7, fd, body)
/// an answer frame's body, (5, fd, why) a connection over, (3, fd, on) a descriptor to
/// watch for writability or not.
#[pyclass(module = "rayk._native")]
struct ClientConnections {
    conns: ClientConns,
}

fn client_events<'py>(py: Python<'py>, done: Vec<ClientEvent>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
    done.into_iter()
        .map(|event| match event {
            ClientEvent::Answer { fd, body } => (ANSWER, fd, PyBytes::new(py, &body)).into_pyobject(py),
            ClientEvent::End { fd, why } => (END, fd, why).into_pyobject(py),
            ClientEvent::WantWrite { fd, on } => (WANT_WRITE, fd, on).into_pyobject(py),
        })
        .collect()
}

#[pymethods]
impl ClientConnections {
    #[new]
    fn new(max_frame_bytes: usize) -> Self {
        ClientConnections { conns: ClientConns::new(max_frame_bytes) }
    }

    /// A proven, non-blocking socket (its descriptor stays Python's) and what its reader staged.
    fn adopt<'py>(&mut self, py: Python<'py>, fd: i32, staged: &[u8]) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.adopt(fd, staged);
        client_events(py, self.conns.take())
    }

    /// A request frame of `kind` whose body is `parts` (bytes-like objects, written as they are).
    fn send<'py>(
        &mut self,
        py: Python<'py>,
        fd: i32,
        correlation_id: i32,
        kind: i8,
        parts: Vec<PyBuffer<u8>>,
    ) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        let mut slices: Vec<&[u8]> = Vec::with_capacity(parts.len());
        for part in &parts {
            if !part.is_c_contiguous() {
                return Err(PyValueError::new_err("a request's parts must be contiguous buffers"));
            }
            // The buffers are held (and the GIL) for the whole call: nothing frees or resizes them.
            slices.push(unsafe { std::slice::from_raw_parts(part.buf_ptr() as *const u8, part.len_bytes()) });
        }
        self.conns.send(fd, correlation_id, kind, &slices);
        client_events(py, self.conns.take())
    }

    /// Whether requests written wait for the socket to take them.
    fn queued(&self, fd: i32) -> bool {
        self.conns.queued(fd)
    }

    fn on_readable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.on_readable(fd);
        client_events(py, self.conns.take())
    }

    fn on_writable<'py>(&mut self, py: Python<'py>, fd: i32) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.conns.on_writable(fd);
        client_events(py, self.conns.take())
    }

    /// Forgets a connection that ended (Python closes its descriptor).
    fn forget(&mut self, fd: i32) {
        self.conns.forget(fd);
    }

    #[doc(hidden)]
    fn _crash_for_tests(&mut self) {
        panic!("asked to, by a test");
    }
}

type AnswerArg = (i32, i16, Option<String>, i64, i64, i64, Vec<(i32, String)>);

/// The Produce response frame (tests hold it to data_responses.produce_frame).
#[pyfunction]
fn encode_produce_response<'py>(
    py: Python<'py>,
    version: i16,
    correlation_id: i32,
    topics: Vec<(String, Vec<AnswerArg>)>,
) -> PyResult<Bound<'py, PyBytes>> {
    if !(produce_response::MIN_VERSION..=produce_response::MAX_VERSION).contains(&version) {
        return Err(PyValueError::new_err(format!("Produce v{version} is not answered here")));
    }
    let topics: Vec<(String, Vec<PartitionAnswer>)> = topics
        .into_iter()
        .map(|(name, ps)| {
            let ps = ps
                .into_iter()
                .map(|(index, error_code, error_message, base_offset, log_append_time_ms, log_start_offset, record_errors)| {
                    PartitionAnswer { index, error_code, error_message, base_offset, log_append_time_ms, log_start_offset, record_errors }
                })
                .collect();
            (name, ps)
        })
        .collect();
    Ok(PyBytes::new(py, &produce_response::encode(version, correlation_id, &topics)))
}

/// A PRODUCE request frame (tests hold it to frames.encode_produce_request).
#[pyfunction]
fn encode_produce_request<'py>(
    py: Python<'py>,
    correlation_id: i32,
    requests: Vec<(Bound<'py, PyBytes>, i16, i32, Option<String>, i8)>,
) -> Bound<'py, PyBytes> {
    let requests: Vec<ProduceRequest> = requests
        .into_iter()
        .map(|(records, acks, timeout_ms, transactional_id, transaction_version)| ProduceRequest {
            records: records.as_bytes().to_vec(),
            acks,
            timeout_ms,
            transactional_id,
            transaction_version,
        })
        .collect();
    PyBytes::new(py, &dataplane::produce_frame(correlation_id, &requests))
}

/// A PRODUCE answer's body read as the path reads it (tests hold it to
/// frames.decode_produce_answer): a list of (base offset, log append time, log start, None)
/// or (code, message, record errors) per request, or the (code, message) of a FAILED
/// answer; ValueError for one that does not parse.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn read_produce_answer<'py>(
    py: Python<'py>,
    body: &[u8],
    correlation_id: i32,
    count: usize,
    errors: HashMap<String, (i16, String)>,
    max_record_errors: i32,
) -> PyResult<Bound<'py, PyAny>> {
    let table = error_table(errors, max_record_errors, usize::MAX);
    match dataplane::read_produce_answer(body, correlation_id, count, &table) {
        Err(e) => Err(PyValueError::new_err(e.0)),
        Ok(Err(e)) => Ok((e.code, e.message).into_pyobject(py)?.into_any()),
        Ok(Ok(results)) => {
            let items: Vec<Bound<'py, PyAny>> = results
                .into_iter()
                .map(|r| match r {
                    Ok((base, time, start)) => (base, time, start, py.None()).into_pyobject(py).map(|t| t.into_any()),
                    Err(e) => (e.code, e.message, e.record_errors).into_pyobject(py).map(|t| t.into_any()),
                })
                .collect::<PyResult<_>>()?;
            Ok(pyo3::types::PyList::new(py, items)?.into_any())
        }
    }
}

/// A follower's copy loop for one run (follower_copy.rs), on a thread it starts at once.
/// Python watches `signal_fd` (an eventfd), reads `progress` to bring its Log up to what
/// was written, and once `outcome` is not None, `join`s it: (0, answer) an answer to
/// handle, (1, why) the connection failed, (2, why) writing the log failed, (3, None)
/// stopped, (4, why) it panicked (a bug). The socket becomes the run's; the .log
/// descriptor is duplicated.
#[pyclass(module = "rayk._native")]
struct FollowerCopy {
    shared: std::sync::Arc<follower_copy::Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn new_eventfd() -> PyResult<i32> {
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    Ok(fd)
}

#[pymethods]
impl FollowerCopy {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        sock: i32, log_fd: i32, position: i64, log_end_offset: i64, high_watermark: i64, latest_epoch: i32,
        segment_bytes: i64, max_timestamp_ms: i64, max_batches: i64, max_last_offset: i64, max_bytes: i32,
        min_bytes: i32, max_wait_ms: i32, replica_id: i32, leader_epoch: i32, incarnation_id: Vec<u8>,
        timeout_ms: u64, max_frame_bytes: usize, correlation_id: i32, signal_interval_ms: u64,
    ) -> PyResult<Self> {
        let log_dup = unsafe { libc::fcntl(log_fd, libc::F_DUPFD_CLOEXEC, 0) };
        if log_dup < 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        let (signal_fd, stop_fd) = match (new_eventfd(), new_eventfd()) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                for fd in [a.as_ref().ok(), b.as_ref().ok(), Some(&log_dup)].into_iter().flatten() {
                    unsafe { libc::close(*fd) };
                }
                return Err(a.and(b).unwrap_err());
            }
        };
        let progress = follower_copy::Progress {
            position, log_end_offset, high_watermark, leader_log_start_offset: i64::MIN, batches: 0,
        };
        let shared = std::sync::Arc::new(follower_copy::Shared {
            progress: std::sync::Mutex::new(progress),
            outcome: std::sync::Mutex::new(None),
            stop: std::sync::atomic::AtomicBool::new(false),
            signal_fd,
            stop_fd,
        });
        let run = follower_copy::Run {
            shared: shared.clone(),
            sock,
            log_fd: log_dup,
            limits: follower_copy::Limits { latest_epoch, segment_bytes, max_timestamp_ms, max_batches, max_last_offset },
            fetch: follower_copy::FetchParams {
                max_bytes, min_bytes, max_wait_ms, replica_id, leader_epoch, incarnation_id, timeout_ms, max_frame_bytes,
                signal_interval_ms,
            },
            correlation_id,
            last_signal: None,
            unsignalled: false,
        };
        match std::thread::Builder::new().name("rayk-follower-copy".into()).spawn(move || run.run()) {
            Ok(thread) => Ok(FollowerCopy { shared, thread: Some(thread) }),
            Err(e) => {
                // The run never started: its socket stays the caller's, the rest goes.
                for fd in [log_dup, signal_fd, stop_fd] {
                    unsafe { libc::close(fd) };
                }
                Err(e.into())
            }
        }
    }

    fn signal_fd(&self) -> i32 {
        self.shared.signal_fd
    }

    /// (position, log end offset, high watermark, the leader's largest log start offset
    /// seen (i64 min: none), batches written), as of the last write.
    fn progress(&self) -> (i64, i64, i64, i64, i64) {
        let p = *follower_copy::lock(&self.shared.progress);
        (p.position, p.log_end_offset, p.high_watermark, p.leader_log_start_offset, p.batches)
    }

    fn outcome<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let outcome = follower_copy::lock(&self.shared.outcome);
        Ok(match &*outcome {
            None => None,
            Some(follower_copy::Outcome::HandBack(body)) => Some((0u8, PyBytes::new(py, body)).into_pyobject(py)?),
            Some(follower_copy::Outcome::Failed(why)) => Some((1u8, why.as_str()).into_pyobject(py)?),
            Some(follower_copy::Outcome::Storage(why)) => Some((2u8, why.as_str()).into_pyobject(py)?),
            Some(follower_copy::Outcome::Stopped) => Some((3u8, py.None()).into_pyobject(py)?),
            Some(follower_copy::Outcome::Panicked(why)) => Some((4u8, why.as_str()).into_pyobject(py)?),
        })
    }

    /// Asks the run to end; it does within a poll's wake-up (or the write under way).
    fn stop(&self) {
        self.shared.request_stop();
    }

    /// Waits for the thread (after `stop`, or once `outcome` is set), the GIL released.
    fn join(&mut self, py: Python<'_>) {
        if let Some(thread) = self.thread.take() {
            py.allow_threads(|| {
                let _ = thread.join();
            });
        }
    }
}

impl Drop for FollowerCopy {
    fn drop(&mut self) {
        self.shared.request_stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        unsafe {
            libc::close(self.shared.signal_fd);
            libc::close(self.shared.stop_fd);
        }
    }
}

type ReadProduce<'py> = (i16, i32, Option<String>, Option<String>, i16, i32, Vec<(String, Vec<(i32, Option<Bound<'py, PyBytes>>)>)>);

/// A Kafka Produce request frame (after its size prefix) as a client connection reads it
/// (kafka_request.rs): (version, correlation id, client id, transactional id, acks,
/// timeout ms, [(topic, [(partition, records)])]), or None where Python reads it instead.
/// For the tests that hold it to kio's decoder.
#[pyfunction]
fn read_kafka_produce<'py>(py: Python<'py>, frame: &[u8]) -> Option<ReadProduce<'py>> {
    let p = kafka_request::produce(frame)?;
    let topics = p
        .topics
        .into_iter()
        .map(|(name, partitions)| (name, partitions.into_iter().map(|(i, r)| (i, r.map(|r| PyBytes::new(py, r)))).collect()))
        .collect();
    Some((p.api_version, p.correlation_id, p.client_id, p.transactional_id, p.acks, p.timeout_ms, topics))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ProducePath>()?;
    m.add_class::<EndpointConnections>()?;
    m.add_class::<ClientConnections>()?;
    m.add_class::<FollowerCopy>()?;
    m.add_function(wrap_pyfunction!(encode_produce_response, m)?)?;
    m.add_function(wrap_pyfunction!(encode_produce_request, m)?)?;
    m.add_function(wrap_pyfunction!(read_produce_answer, m)?)?;
    m.add("ANSWERED", ANSWERED)?;
    m.add("NEED_ENDPOINT", NEED_ENDPOINT)?;
    m.add("RELEASE", RELEASE)?;
    m.add("WANT_WRITE", WANT_WRITE)?;
    m.add("REQUEST", REQUEST)?;
    m.add("END", END)?;
    m.add("HOLD", HOLD)?;
    m.add("ANSWER", ANSWER)?;
    m.add("CLIENT_REQUEST", CLIENT_REQUEST)?;
    m.add("CLIENT_EOF", CLIENT_EOF)?;
    m.add("CLIENT_END", CLIENT_END)?;
    m.add("CLIENT_FREED", CLIENT_FREED)?;
    m.add("CLIENT_HOLD", CLIENT_HOLD)?;
    m.add("CLIENT_WANT_WRITE", CLIENT_WANT_WRITE)?;
    m.add_function(wrap_pyfunction!(read_kafka_produce, m)?)?;
    Ok(())
}
