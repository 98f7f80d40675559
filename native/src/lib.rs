//! rayk._native: the per-request path in native code (see
//! docs/design-notes/2026-12-03-native-request-path.md). So far: the listener's Produce
//! from its decoded request to the Kafka response frame (produce_path.rs), with the data
//! plane's PRODUCE exchange (dataplane.rs) and the Produce response (produce_response.rs).
//! rayk runs without this module (a machine without cargo): the same path is Python's.

mod dataplane;
mod produce_path;
mod produce_response;

use std::collections::HashMap;
use std::os::fd::FromRawFd;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use dataplane::{ErrorTable, ProduceRequest};
use produce_path::{Completion, Message, Outbox, PartitionIn, State, Stream, Submit};
use produce_response::PartitionAnswer;

const ANSWERED: u8 = 0;
const NEED_ENDPOINT: u8 = 1;
const DIED: u8 = 2;

type PartitionArg<'py> = (i32, Option<Bound<'py, PyBytes>>, i16, Option<String>);

/// A listener's produce path (produce_path.rs): one thread, started here, ended by `close`.
#[pyclass(module = "rayk._native", frozen)]
struct ProducePath {
    messages: UnboundedSender<Message>,
    outbox: Arc<Outbox>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn error_table(errors: HashMap<String, (i16, String)>, max_record_errors: i32, max_frame_bytes: usize) -> ErrorTable {
    ErrorTable { by_class: errors, max_record_errors, max_frame_bytes }
}

#[pymethods]
impl ProducePath {
    /// `event_fd`: an eventfd (the caller's, kept open until after `close`) written when
    /// completions wait; `errors`: rayk.errors' class names -> (code, Kafka name).
    #[new]
    fn new(
        event_fd: i32,
        broker_id: i32,
        errors: HashMap<String, (i16, String)>,
        max_record_errors: i32,
        max_frame_bytes: usize,
    ) -> PyResult<Self> {
        let (messages, inbox) = unbounded_channel();
        let outbox = Arc::new(Outbox::new(event_fd));
        let state = State::new(
            broker_id,
            outbox.clone(),
            Arc::new(error_table(errors, max_record_errors, max_frame_bytes)),
            messages.clone(),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("the produce path's runtime: {e}")))?;
        let thread_outbox = outbox.clone();
        let thread = std::thread::Builder::new()
            .name("rayk-produce".into())
            .spawn(move || {
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| runtime.block_on(state.run(inbox))));
                if let Err(panic) = ran {
                    let reason = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a panic".into());
                    thread_outbox.push(Completion::Died { reason });
                }
            })
            .map_err(|e| PyRuntimeError::new_err(format!("the produce path's thread: {e}")))?;
        Ok(ProducePath { messages, outbox, thread: Mutex::new(Some(thread)) })
    }

    /// One decoded Produce request: per topic, per partition (index, records or None,
    /// error code (0: none), error message). Answered by a completion with `id`.
    #[allow(clippy::too_many_arguments)]
    fn submit(
        &self,
        id: u64,
        version: i16,
        correlation_id: i32,
        acks: i16,
        timeout_ms: i32,
        transactional_id: Option<String>,
        transaction_version: i8,
        topics: Vec<(String, Vec<PartitionArg<'_>>)>,
    ) -> PyResult<()> {
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
        let submit = Submit { id, version, correlation_id, acks, timeout_ms, transactional_id, transaction_version, topics };
        self.send(Message::Submit(submit))
    }

    /// Hands over a connected socket to the partition's replica that has passed the data
    /// plane's handshake (`fd` is owned from here on, also if this raises).
    fn set_endpoint(&self, topic: String, partition: i32, fd: i32, unix: bool) -> PyResult<()> {
        let stream = if unix {
            Stream::Unix(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
        } else {
            Stream::Tcp(unsafe { std::net::TcpStream::from_raw_fd(fd) })
        };
        self.send(Message::Endpoint { key: (topic, partition), stream })
    }

    /// The partition's endpoint cannot be had: its waiting requests fail with this error.
    fn fail_endpoint(&self, topic: String, partition: i32, code: i16, message: String) -> PyResult<()> {
        self.send(Message::EndpointFailed { key: (topic, partition), code, message })
    }

    /// What completed since the last call: (0, id, frame, failed), (1, topic, partition)
    /// for an endpoint to look up, (2, reason) if the thread died.
    fn drain<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyTuple>>> {
        self.outbox
            .take()
            .into_iter()
            .map(|completion| match completion {
                Completion::Answered { id, frame, failed } => {
                    (ANSWERED, id, PyBytes::new(py, &frame), failed).into_pyobject(py)
                }
                Completion::NeedEndpoint { topic, partition } => (NEED_ENDPOINT, topic, partition).into_pyobject(py),
                Completion::Died { reason } => (DIED, reason).into_pyobject(py),
            })
            .collect()
    }

    /// Makes the thread panic, as a bug would: tests check that the listener answers and goes on.
    #[doc(hidden)]
    fn _crash_for_tests(&self) -> PyResult<()> {
        self.send(Message::Panic)
    }

    /// Ends the thread (its connections close, requests not answered are dropped) and waits for it.
    fn close(&self, py: Python<'_>) {
        let _ = self.messages.send(Message::Stop);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            py.allow_threads(|| {
                let _ = thread.join();
            });
        }
    }
}

impl ProducePath {
    fn send(&self, message: Message) -> PyResult<()> {
        self.messages
            .send(message)
            .map_err(|_| PyRuntimeError::new_err("the produce path is closed"))
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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ProducePath>()?;
    m.add_function(wrap_pyfunction!(encode_produce_response, m)?)?;
    m.add_function(wrap_pyfunction!(encode_produce_request, m)?)?;
    m.add_function(wrap_pyfunction!(read_produce_answer, m)?)?;
    m.add("ANSWERED", ANSWERED)?;
    m.add("NEED_ENDPOINT", NEED_ENDPOINT)?;
    m.add("DIED", DIED)?;
    Ok(())
}
