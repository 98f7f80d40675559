//! follower_copy: a follower's copy loop for one partition, on a thread of its own, while
//! nothing unusual comes (rayk/replication/native_copy.py drives it).
//!
//! It sends FETCH at the log end, waits for the answer (the leader's long poll), checks the
//! batches as `append_as_follower` does (framing, magic, CRC-32C, record counts, offsets
//! that continue the log) and writes them at the end of the active segment's .log with
//! `pwrite`, then fetches again at once: the leader learns the new position without the
//! follower's Python being woken first. Python is told through an eventfd, at most every
//! `signal_interval_ms` and at the run's end, and brings its Log up to the bytes written
//! (the indexes, producer state, LEO and HW are Python's).
//!
//! Anything else hands the answer back and ends the run, written nothing of it: an error or
//! a FAILED answer, a diverging epoch, aborted transactions, a control batch, a batch of
//! another leader epoch than the log's latest, one that does not continue the log, one that
//! fails a check, and anything that would roll the segment (too big, too old, an index that
//! could fill, an offset too far from the segment's base). Python handles that answer as its
//! own loop would and starts another run.
//!
//! The socket is the run's (closed with it); the .log descriptor is a duplicate, so that no
//! write can land in a file Python closed meanwhile.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::socket_io::{Frame, FrameBuf, ReadEnd};

pub const FETCH: i8 = 1;
const ANSWERED: i8 = 0;
const FAILED: i8 = 1;
const ANSWER_HEADER_BYTES: usize = 5; // correlation_id:i32 outcome:i8
const FETCH_ANSWER_BYTES: usize = 51; // frames._FETCH_ANSWER: >qqqqbiqHi
const BATCH_HEADER_BYTES: usize = 61; // records.HEADER_SIZE_BYTES
const CONTROL_BIT: i16 = 0x20;

/// What a run is given: where the log stands and what may be written before Python must
/// decide (see the module docstring).
#[derive(Clone)]
pub struct Limits {
    pub latest_epoch: i32,
    pub segment_bytes: i64,
    pub max_timestamp_ms: i64,
    pub max_batches: i64,
    pub max_last_offset: i64,
}

/// The FETCH a run sends, but for its offset (the log end, each time).
#[derive(Clone)]
pub struct FetchParams {
    pub max_bytes: i32,
    pub min_bytes: i32,
    pub max_wait_ms: i32,
    pub replica_id: i32,
    pub leader_epoch: i32,
    pub incarnation_id: Vec<u8>,
    pub timeout_ms: u64,
    pub max_frame_bytes: usize,
    /// Python is told of writes at most this often (and at the run's end): each telling is
    /// a wake-up of its event loop, whose taking in is cheaper for many writes at once.
    pub signal_interval_ms: u64,
}

/// Where the log stands as the run wrote it: Python brings its Log up to it.
#[derive(Clone, Copy, Default)]
pub struct Progress {
    pub position: i64,
    pub log_end_offset: i64,
    pub high_watermark: i64,
    pub leader_log_start_offset: i64,
    pub batches: i64,
}

/// How a run ended.
pub enum Outcome {
    /// An answer Python handles (the frame's body after its size); nothing of it written.
    HandBack(Vec<u8>),
    /// The connection failed: broke, timed out, or spoke something else.
    Failed(String),
    /// Writing the log failed (the log is as it was before the write).
    Storage(String),
    /// Python stopped it.
    Stopped,
    /// A bug: the run panicked (its message).
    Panicked(String),
}

/// What one answer means for the log, checked before anything is written.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// Records to append: they end at `log_end_offset`; `batches` of them.
    Append { records_at: usize, log_end_offset: i64, batches: i64, high_watermark: i64, log_start_offset: i64 },
    /// No records: the leader's HW and log start.
    Nothing { high_watermark: i64, log_start_offset: i64 },
    /// Python's to handle.
    HandBack,
    /// Not a FETCH answer to the request in flight.
    Bad(String),
}

fn i16_at(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}
fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// The plan for an answer frame's `body` (after its size) to request `correlation_id`, on a
/// log that ends at `log_end_offset` with `position` bytes in its active segment and
/// `batches` appended to it this run.
pub fn plan(body: &[u8], correlation_id: i32, log_end_offset: i64, position: i64, batches: i64, limits: &Limits) -> Plan {
    if body.len() < ANSWER_HEADER_BYTES {
        return Plan::Bad(format!("an answer frame of {} bytes", body.len()));
    }
    let answered_id = i32_at(body, 0);
    if answered_id != correlation_id {
        return Plan::Bad(format!("an answer to request {answered_id}, which was not the one in flight"));
    }
    match body[4] as i8 {
        ANSWERED => {}
        FAILED => return Plan::HandBack,
        outcome => return Plan::Bad(format!("an answer to request {answered_id} with outcome {outcome}")),
    }
    let answer = &body[ANSWER_HEADER_BYTES..];
    if answer.len() < FETCH_ANSWER_BYTES {
        return Plan::Bad(format!("a FETCH answer of {} bytes is shorter than its header", answer.len()));
    }
    let high_watermark = i64_at(answer, 0);
    let log_start_offset = i64_at(answer, 16);
    let diverging = answer[32];
    let error_size = u16::from_be_bytes(answer[45..47].try_into().unwrap());
    let aborted_count = i32_at(answer, 47);
    if diverging != 0 || error_size != 0 || aborted_count != 0 {
        return Plan::HandBack;
    }
    let records = &answer[FETCH_ANSWER_BYTES..];
    if records.is_empty() {
        return Plan::Nothing { high_watermark, log_start_offset };
    }
    if position + records.len() as i64 > limits.segment_bytes {
        return Plan::HandBack; // the segment rolls first (or the batch can never fit: Python says so)
    }
    let mut at = 0usize;
    let mut expected = log_end_offset;
    let mut count = 0i64;
    while at < records.len() {
        let rest = &records[at..];
        if rest.len() < BATCH_HEADER_BYTES || rest[16] != 2 {
            return Plan::HandBack; // a partial or legacy batch: Python names the error
        }
        let size = 12 + i32_at(rest, 8) as i64;
        if size < BATCH_HEADER_BYTES as i64 || size > rest.len() as i64 {
            return Plan::HandBack;
        }
        let batch = &rest[..size as usize];
        if crc32c::crc32c(&batch[21..]) != u32_at(batch, 17) {
            return Plan::HandBack;
        }
        let base_offset = i64_at(batch, 0);
        let last_offset_delta = i32_at(batch, 23);
        let record_count = i32_at(batch, 57);
        if last_offset_delta < 0 || record_count < 0 || record_count as i64 > last_offset_delta as i64 + 1 {
            return Plan::HandBack;
        }
        let last_offset = base_offset.saturating_add(last_offset_delta as i64);
        if base_offset < expected
            || i16_at(batch, 21) & CONTROL_BIT != 0
            || i32_at(batch, 12) != limits.latest_epoch
            || i64_at(batch, 35) > limits.max_timestamp_ms
            || last_offset > limits.max_last_offset
        {
            return Plan::HandBack;
        }
        expected = last_offset.saturating_add(1);
        count += 1;
        at += size as usize;
    }
    if batches + count > limits.max_batches {
        return Plan::HandBack;
    }
    Plan::Append {
        records_at: ANSWER_HEADER_BYTES + FETCH_ANSWER_BYTES,
        log_end_offset: expected,
        batches: count,
        high_watermark,
        log_start_offset,
    }
}

/// The FETCH request frame at `offset`.
pub fn fetch_frame(correlation_id: i32, offset: i64, last_fetched_epoch: i32, p: &FetchParams) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 5 + 39 + p.incarnation_id.len());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&correlation_id.to_be_bytes());
    out.push(FETCH as u8);
    out.extend_from_slice(&offset.to_be_bytes());
    out.extend_from_slice(&p.max_bytes.to_be_bytes());
    out.extend_from_slice(&p.min_bytes.to_be_bytes());
    out.extend_from_slice(&p.max_wait_ms.to_be_bytes());
    out.extend_from_slice(&p.replica_id.to_be_bytes());
    out.extend_from_slice(&p.leader_epoch.to_be_bytes());
    out.extend_from_slice(&last_fetched_epoch.to_be_bytes());
    out.push(0); // read_uncommitted
    out.extend_from_slice(&(p.incarnation_id.len() as u16).to_be_bytes());
    out.extend_from_slice(&p.incarnation_id);
    let size = (out.len() - 4) as u32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

/// What the run and Python share.
pub struct Shared {
    pub progress: Mutex<Progress>,
    pub outcome: Mutex<Option<Outcome>>,
    pub stop: AtomicBool,
    pub signal_fd: RawFd,
    pub stop_fd: RawFd,
}

impl Shared {
    fn signal(fd: RawFd) {
        let one: u64 = 1;
        // An eventfd's counter only overflows after 2^64 - 2 unread signals.
        unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
    }
    pub fn signal_python(&self) {
        Shared::signal(self.signal_fd);
    }
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        Shared::signal(self.stop_fd);
    }
}

/// One run: owns the socket and the duplicate of the .log descriptor, closes both at its end.
pub struct Run {
    pub shared: Arc<Shared>,
    pub sock: RawFd,
    pub log_fd: RawFd,
    pub limits: Limits,
    pub fetch: FetchParams,
    pub correlation_id: i32,
    /// When Python was last told, and whether something happened since that it was not.
    pub last_signal: Option<Instant>,
    pub unsignalled: bool,
}

enum Wait {
    Readable,
    Stop,
    TimedOut,
    Failed,
}

/// `copy`'s outcome, or Panicked with the panic's message if it panicked (a bug: Python then
/// copies in its own loop instead of the process ending).
fn caught(copy: impl FnOnce() -> Outcome) -> Outcome {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(copy)).unwrap_or_else(|panic| {
        let message = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
        Outcome::Panicked(message.unwrap_or_else(|| "a panic".into()))
    })
}

/// The mutex's value, also after a panic of the run's thread while it held it (the run
/// reports the panic; Python still reads where the log stands).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Run {
    pub fn run(mut self) {
        let outcome = caught(|| self.copy());
        *lock(&self.shared.outcome) = Some(outcome);
        unsafe {
            libc::close(self.sock);
            libc::close(self.log_fd);
        }
        self.shared.signal_python();
    }

    /// Tells Python of what changed, now or once `signal_interval_ms` passed since it was last told.
    fn progressed(&mut self) {
        self.unsignalled = true;
        self.maybe_signal(Instant::now());
    }

    fn maybe_signal(&mut self, now: Instant) {
        let interval = Duration::from_millis(self.fetch.signal_interval_ms);
        if self.unsignalled && self.last_signal.is_none_or(|at| now >= at + interval) {
            self.shared.signal_python();
            self.last_signal = Some(now);
            self.unsignalled = false;
        }
    }

    fn wait(&mut self, events: i16, deadline: Instant) -> Wait {
        loop {
            if self.shared.stop.load(Ordering::SeqCst) {
                return Wait::Stop;
            }
            let now = Instant::now();
            self.maybe_signal(now);
            if now >= deadline {
                return Wait::TimedOut;
            }
            let mut until = deadline;
            if let (true, Some(at)) = (self.unsignalled, self.last_signal) {
                until = until.min(at + Duration::from_millis(self.fetch.signal_interval_ms));
            }
            let timeout_ms = (until.max(now) - now).as_millis().clamp(1, i32::MAX as u128) as i32;
            let mut fds = [
                libc::pollfd { fd: self.sock, events, revents: 0 },
                libc::pollfd { fd: self.shared.stop_fd, events: libc::POLLIN, revents: 0 },
            ];
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
            if n < 0 {
                if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Wait::Failed;
            }
            if fds[1].revents != 0 {
                return Wait::Stop;
            }
            if fds[0].revents != 0 {
                return Wait::Readable; // or writable, or an error the next call reports
            }
        }
    }

    fn send(&mut self, frame: &[u8], deadline: Instant) -> Result<(), Outcome> {
        let mut written = 0;
        while written < frame.len() {
            let n = unsafe {
                libc::send(self.sock, frame[written..].as_ptr() as *const libc::c_void, frame.len() - written, libc::MSG_NOSIGNAL)
            };
            if n > 0 {
                written += n as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => match self.wait(libc::POLLOUT, deadline) {
                    Wait::Readable => continue,
                    Wait::Stop => return Err(Outcome::Stopped),
                    Wait::TimedOut => return Err(Outcome::Failed("the leader did not take a fetch in time".into())),
                    Wait::Failed => return Err(Outcome::Failed(format!("poll failed: {}", std::io::Error::last_os_error()))),
                },
                _ => return Err(Outcome::Failed(format!("the connection broke: {e}"))),
            }
        }
        Ok(())
    }

    fn write_log(&self, records: &[u8], position: i64) -> Result<(), Outcome> {
        let mut written = 0usize;
        while written < records.len() {
            let n = unsafe {
                libc::pwrite(
                    self.log_fd,
                    records[written..].as_ptr() as *const libc::c_void,
                    records.len() - written,
                    (position + written as i64) as libc::off_t,
                )
            };
            if n > 0 {
                written += n as usize;
                continue;
            }
            let e = std::io::Error::last_os_error();
            if n < 0 && e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // What was written of it goes, so that the file ends where the log does.
            let cut = unsafe { libc::ftruncate(self.log_fd, position as libc::off_t) };
            let also = if cut == 0 { String::new() } else { format!(" (and cutting it back failed: {})", std::io::Error::last_os_error()) };
            let e = if n == 0 { "wrote nothing".to_string() } else { e.to_string() };
            return Err(Outcome::Storage(format!("writing {} bytes at {position} of the log failed: {e}{also}", records.len())));
        }
        Ok(())
    }

    fn copy(&mut self) -> Outcome {
        let mut frames = FrameBuf::new(&[]);
        let timeout = Duration::from_millis(self.fetch.timeout_ms);
        loop {
            let (position, log_end_offset, batches) = {
                let p = lock(&self.shared.progress);
                (p.position, p.log_end_offset, p.batches)
            };
            self.correlation_id = self.correlation_id.wrapping_add(1) & i32::MAX;
            let deadline = Instant::now() + timeout;
            let request = fetch_frame(self.correlation_id, log_end_offset, self.limits.latest_epoch, &self.fetch);
            if let Err(outcome) = self.send(&request, deadline) {
                return outcome;
            }
            let body = loop {
                match frames.next(self.fetch.max_frame_bytes) {
                    Frame::Whole(body) => break body.to_vec(),
                    Frame::Oversized(size) => return Outcome::Failed(format!("an answer frame of {size} bytes")),
                    Frame::Partial => {}
                }
                frames.compact();
                match self.wait(libc::POLLIN, deadline) {
                    Wait::Readable => {}
                    Wait::Stop => return Outcome::Stopped,
                    Wait::TimedOut => {
                        return Outcome::Failed(format!("no answer to a fetch within {} ms", self.fetch.timeout_ms));
                    }
                    Wait::Failed => return Outcome::Failed(format!("poll failed: {}", std::io::Error::last_os_error())),
                }
                match frames.read(self.sock, self.fetch.max_frame_bytes) {
                    ReadEnd::Paused => {}
                    end => return Outcome::Failed(end.why("leader").unwrap_or_default()),
                }
            };
            frames.compact();
            if !frames.is_empty() {
                return Outcome::Failed("the leader sent bytes after the answer to the fetch in flight".into());
            }
            match plan(&body, self.correlation_id, log_end_offset, position, batches, &self.limits) {
                Plan::Bad(why) => return Outcome::Failed(why),
                Plan::HandBack => return Outcome::HandBack(body),
                Plan::Nothing { high_watermark, log_start_offset } => {
                    // Python is told when the HW or the leader's log start moved (its own
                    // log start follows: retention, DeleteRecords, tiered storage).
                    let mut p = lock(&self.shared.progress);
                    let hw = high_watermark.min(p.log_end_offset);
                    if hw > p.high_watermark || log_start_offset > p.leader_log_start_offset {
                        p.high_watermark = p.high_watermark.max(hw);
                        p.leader_log_start_offset = p.leader_log_start_offset.max(log_start_offset);
                        drop(p);
                        self.progressed();
                    }
                }
                Plan::Append { records_at, log_end_offset, batches: count, high_watermark, log_start_offset } => {
                    if let Err(outcome) = self.write_log(&body[records_at..], position) {
                        return outcome;
                    }
                    {
                        let mut p = lock(&self.shared.progress);
                        p.position = position + (body.len() - records_at) as i64;
                        p.log_end_offset = log_end_offset;
                        p.batches += count;
                        p.high_watermark = p.high_watermark.max(high_watermark.min(log_end_offset));
                        p.leader_log_start_offset = p.leader_log_start_offset.max(log_start_offset);
                    }
                    self.progressed();
                }
            }
        }
    }
}

/// A batch of `count` 7-byte records with its CRC right: what the unit tests and the fuzz
/// target (native/fuzz, built with `--cfg fuzzing`) feed `plan`.
#[cfg(any(test, fuzzing))]
pub fn test_batch(base_offset: i64, epoch: i32, count: i32, attributes: i16, max_timestamp: i64) -> Vec<u8> {
    let mut b = vec![0u8; 61 + 7 * count as usize];
    b[0..8].copy_from_slice(&base_offset.to_be_bytes());
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    b[12..16].copy_from_slice(&epoch.to_be_bytes());
    b[16] = 2;
    b[21..23].copy_from_slice(&attributes.to_be_bytes());
    b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
    b[35..43].copy_from_slice(&max_timestamp.to_be_bytes());
    b[43..51].copy_from_slice(&(-1i64).to_be_bytes());
    b[57..61].copy_from_slice(&count.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::test_batch as batch;

    fn limits() -> Limits {
        Limits { latest_epoch: 3, segment_bytes: 1 << 30, max_timestamp_ms: i64::MAX, max_batches: 1000, max_last_offset: i64::MAX }
    }

    fn answer(correlation_id: i32, hw: i64, records: &[u8]) -> Vec<u8> {
        let mut out = correlation_id.to_be_bytes().to_vec();
        out.push(0);
        for v in [hw, 0, 5, 0] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.push(0);
        out.extend_from_slice(&(-1i32).to_be_bytes());
        out.extend_from_slice(&(-1i64).to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes());
        out.extend_from_slice(records);
        out
    }

    #[test]
    fn plans_an_append_of_batches_that_continue_the_log() {
        let mut records = batch(10, 3, 2, 0, 100);
        records.extend(batch(12, 3, 1, 0, 100));
        let plan = plan(&answer(7, 11, &records), 7, 10, 500, 0, &limits());
        assert_eq!(plan, Plan::Append { records_at: 56, log_end_offset: 13, batches: 2, high_watermark: 11, log_start_offset: 5 });
    }

    #[test]
    fn hands_back_what_python_decides() {
        let l = limits();
        assert_eq!(plan(&answer(7, 0, &batch(9, 3, 2, 0, 100)), 7, 10, 0, 0, &l), Plan::HandBack); // below the LEO
        assert_eq!(plan(&answer(7, 0, &batch(10, 4, 2, 0, 100)), 7, 10, 0, 0, &l), Plan::HandBack); // a new epoch
        assert_eq!(plan(&answer(7, 0, &batch(10, 3, 1, CONTROL_BIT, 100)), 7, 10, 0, 0, &l), Plan::HandBack);
        let mut corrupt = batch(10, 3, 2, 0, 100);
        corrupt[70] ^= 1;
        assert_eq!(plan(&answer(7, 0, &corrupt), 7, 10, 0, 0, &l), Plan::HandBack);
        let old = Limits { max_timestamp_ms: 99, ..limits() };
        assert_eq!(plan(&answer(7, 0, &batch(10, 3, 2, 0, 100)), 7, 10, 0, 0, &old), Plan::HandBack);
        let full = Limits { segment_bytes: 100, ..limits() };
        assert_eq!(plan(&answer(7, 0, &batch(10, 3, 2, 0, 100)), 7, 10, 50, 0, &full), Plan::HandBack);
        let mut failed = 7i32.to_be_bytes().to_vec();
        failed.push(1);
        assert_eq!(plan(&failed, 7, 10, 0, 0, &l), Plan::HandBack);
    }

    #[test]
    fn a_panic_is_an_outcome_with_its_message() {
        let message = |outcome: Outcome| match outcome {
            Outcome::Panicked(message) => message,
            _ => panic!("not a panic's outcome"),
        };
        assert_eq!(message(caught(|| panic!("a {} message", "formatted"))), "a formatted message");
        assert_eq!(message(caught(|| panic!("a plain message"))), "a plain message");
        assert_eq!(message(caught(|| std::panic::panic_any(7))), "a panic");
        assert!(matches!(caught(|| Outcome::Stopped), Outcome::Stopped));
    }

    #[test]
    fn refuses_what_is_not_the_answer() {
        assert!(matches!(plan(&answer(6, 0, &[]), 7, 10, 0, 0, &limits()), Plan::Bad(_)));
        assert!(matches!(plan(&[0, 0, 0, 7], 7, 10, 0, 0, &limits()), Plan::Bad(_)));
        assert_eq!(plan(&answer(7, 9, &[]), 7, 10, 0, 0, &limits()), Plan::Nothing { high_watermark: 9, log_start_offset: 5 });
    }
}
