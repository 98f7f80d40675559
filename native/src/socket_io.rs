//! socket_io: what every native connection does with its non-blocking socket, whichever end
//! it is (endpoint_conns.rs, client_conns.rs, produce_path.rs): read size-prefixed frames
//! into a buffer that grows without being zero-filled and stops at a whole frame, and write
//! bytes as far as the socket takes them now. The descriptors are Python's: nothing here
//! closes one.

use std::fs::File;
use std::io::{ErrorKind, IoSlice, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};

pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// A buffer larger than this, once empty, is let go rather than kept for the next frame.
const SHRINK_ABOVE_BYTES: usize = 1 << 20;
/// A frame at least this large is read up to its end at once, not a chunk at a time.
const OWN_BUFFER_FROM_BYTES: usize = 16 * 1024;

/// How reading a socket stopped.
pub enum ReadEnd {
    /// Nothing more to read now, or a whole frame (or a size over the bound) is staged.
    Paused,
    /// The peer closed the connection.
    Closed,
    /// It broke (a reset, ...).
    Broke(std::io::Error),
}

impl ReadEnd {
    /// Why the connection is over, for the logs (None: it is not).
    pub fn why(self, peer: &str) -> Option<String> {
        match self {
            ReadEnd::Paused => None,
            ReadEnd::Closed => Some(format!("the {peer} closed the connection")),
            ReadEnd::Broke(e) => Some(format!("the connection broke: {e}")),
        }
    }
}

/// The next frame staged.
pub enum Frame<'a> {
    /// Not all of it is read yet.
    Partial,
    /// Its size prefix declares more than the bound (nothing is consumed).
    Oversized(usize),
    /// Its bytes after the size prefix (consumed).
    Whole(&'a [u8]),
}

/// The bytes read from one socket and not yet handed out as frames.
pub struct FrameBuf {
    buf: Vec<u8>,
    at: usize,
}

impl FrameBuf {
    /// With what a reader had staged before the socket came here.
    pub fn new(staged: &[u8]) -> Self {
        FrameBuf { buf: staged.to_vec(), at: 0 }
    }

    fn staged(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    fn next_size(&self) -> Option<usize> {
        self.staged().get(..4).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
    }

    /// Whether every byte read was handed out.
    pub fn is_empty(&self) -> bool {
        self.at == self.buf.len()
    }

    /// Reads `fd` until it has nothing more, or a whole frame (or a size over the bound) is
    /// staged: the caller hands it out, and the socket is read again on the loop's next
    /// turn, unless the caller holds reading back meanwhile (what the peer sends then waits
    /// in the kernel's buffers, pushing back on it).
    pub fn read(&mut self, fd: RawFd, max_frame_bytes: usize) -> ReadEnd {
        loop {
            let staged = self.buf.len() - self.at;
            // A large frame whose size is known is read up to its end (no byte of the next
            // frame lands there), anything else a chunk at a time.
            let want = match self.next_size() {
                Some(size) if size <= max_frame_bytes && size >= OWN_BUFFER_FROM_BYTES && staged < 4 + size => {
                    4 + size - staged
                }
                _ => 0,
            };
            match read_into_spare(fd, &mut self.buf, if want > 0 { want } else { READ_CHUNK_BYTES }) {
                Ok(0) => return ReadEnd::Closed,
                Ok(n) => {
                    if (want == 0 && n < READ_CHUNK_BYTES) || self.frame_ready(max_frame_bytes) {
                        return ReadEnd::Paused;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return ReadEnd::Paused,
                Err(e) => return ReadEnd::Broke(e),
            }
        }
    }

    /// Whether a whole frame, or a size over the bound, is staged: either way there is
    /// something for `next` to say.
    fn frame_ready(&self, max_frame_bytes: usize) -> bool {
        self.next_size().is_some_and(|size| size > max_frame_bytes || self.staged().len() - 4 >= size)
    }

    /// The next frame, consumed if whole. Call `compact` once done handing frames out.
    pub fn next(&mut self, max_frame_bytes: usize) -> Frame<'_> {
        let Some(size) = self.next_size() else { return Frame::Partial };
        if size > max_frame_bytes {
            return Frame::Oversized(size);
        }
        if self.buf.len() - self.at - 4 < size {
            return Frame::Partial;
        }
        let start = self.at + 4;
        self.at = start + size;
        Frame::Whole(&self.buf[start..start + size])
    }

    /// Lets the buffer go if every byte was handed out: for a connection that reads one
    /// answer now and then (the produce path's link), no room kept between them.
    pub fn release_if_empty(&mut self) {
        if self.is_empty() {
            *self = FrameBuf::new(&[]);
        }
    }

    /// Drops the bytes handed out; a large frame's room is not kept for the connection's life.
    pub fn compact(&mut self) {
        if self.is_empty() {
            self.buf.clear();
            self.at = 0;
            if self.buf.capacity() > SHRINK_ABOVE_BYTES {
                self.buf = Vec::new();
            }
        } else if self.at > READ_CHUNK_BYTES {
            self.buf.drain(..self.at);
            self.at = 0;
        }
    }
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

/// What one connection has to write, in order: written straight to the socket while
/// nothing waits, queued (whatever the socket did not take) while something does.
pub struct OutBuf {
    data: Vec<u8>,
    at: usize,
    watching: bool,
}

impl OutBuf {
    pub fn new() -> Self {
        OutBuf { data: Vec::new(), at: 0, watching: false }
    }

    /// Whether bytes wait for the socket to take them.
    pub fn waiting(&self) -> bool {
        self.at < self.data.len()
    }

    /// `pieces` after whatever waits: as much as the socket takes now if nothing waits,
    /// the rest queued.
    pub fn send(&mut self, fd: RawFd, pieces: &[&[u8]]) -> std::io::Result<()> {
        let written = if self.waiting() { 0 } else { write_now(fd, pieces)? };
        let total: usize = pieces.iter().map(|p| p.len()).sum();
        if written < total {
            if !self.waiting() {
                self.data.clear();
                self.at = 0;
            }
            self.data.extend_from_slice(&rest(pieces, written));
        }
        self.flush(fd)
    }

    /// Writes what waits, as far as the socket takes it (a buffer emptied is let go).
    pub fn flush(&mut self, fd: RawFd) -> std::io::Result<()> {
        if self.waiting() {
            self.at += write_now(fd, &[&self.data[self.at..]])?;
        }
        if !self.waiting() {
            self.data = Vec::new();
            self.at = 0;
        }
        Ok(())
    }

    /// Whether the socket is now to be watched for writability, if that changed since
    /// the last call (Python is told only of changes); never after a failed write.
    pub fn watch_change(&mut self, failed: bool) -> Option<bool> {
        let watch = self.waiting() && !failed;
        (watch != self.watching).then(|| {
            self.watching = watch;
            watch
        })
    }
}

/// Writes `pieces`, in order, as far as the socket takes them now (writev, again until all
/// went or the socket is full): how many bytes went. Fewer than all of them: the socket is
/// full (watch it for writing).
pub fn write_now(fd: RawFd, pieces: &[&[u8]]) -> std::io::Result<usize> {
    // A borrowed descriptor: written, never closed here.
    let mut file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    let mut written = 0;
    while written < total {
        match file.write_vectored(&remaining(pieces, written)) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()), // never for a socket: not a loop forever
            Ok(n) => written += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// The bytes of `pieces` after the first `written` of them, in one buffer (to queue).
pub fn rest(pieces: &[&[u8]], written: usize) -> Vec<u8> {
    let slices = remaining(pieces, written);
    let mut out = Vec::with_capacity(slices.iter().map(|s| s.len()).sum());
    for slice in slices {
        out.extend_from_slice(&slice);
    }
    out
}

fn remaining<'a>(pieces: &[&'a [u8]], mut written: usize) -> Vec<IoSlice<'a>> {
    let mut out = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if written >= piece.len() {
            written -= piece.len();
            continue;
        }
        out.push(IoSlice::new(&piece[written..]));
        written = 0;
    }
    out
}
