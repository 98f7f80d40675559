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

/// A frame's bytes after its size prefix, owned: the buffer it was read into when that held
/// the frame alone (a large frame, read up to its end: handed over, not copied), else a copy.
pub struct Body {
    buf: Vec<u8>,
    start: usize,
}

impl Body {
    /// The body as a vector of its own: the buffer itself (its size prefix, if it holds
    /// one, moved out of the way in place; no second buffer is made).
    pub fn into_vec(mut self) -> Vec<u8> {
        self.buf.drain(..self.start);
        self.buf
    }
}

impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.buf[self.start..]
    }
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

    /// The size prefix of the next frame, once staged.
    pub fn next_size(&self) -> Option<usize> {
        self.staged().get(..4).map(|b| u32::from_be_bytes(b.try_into().unwrap()) as usize)
    }

    /// The next frame's body if it is all staged (not consumed).
    pub fn peek_whole(&self) -> Option<&[u8]> {
        let size = self.next_size()?;
        self.staged().get(4..4 + size)
    }

    /// Bytes read and not yet handed out.
    pub fn staged_len(&self) -> usize {
        self.buf.len() - self.at
    }

    /// One read of at most `max` bytes (a Kafka connection's: it decides how far to read,
    /// never past a frame it has not admitted); 0: the peer closed the connection.
    pub fn read_at_most(&mut self, fd: RawFd, max: usize) -> std::io::Result<usize> {
        read_into_spare(fd, &mut self.buf, max)
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

    /// The next frame, consumed if whole, as bytes of its own (`next`, with the frame's
    /// buffer handed over when it holds nothing else): Ok(None) while it is partial,
    /// Err(size) for a size over the bound. Call `compact` once done.
    pub fn next_owned(&mut self, max_frame_bytes: usize) -> Result<Option<Body>, usize> {
        let alone = self.at == 0
            && self.next_size().is_some_and(|size| {
                size >= OWN_BUFFER_FROM_BYTES && size <= max_frame_bytes && self.buf.len() == 4 + size
            });
        if alone {
            return Ok(Some(Body { buf: std::mem::take(&mut self.buf), start: 4 }));
        }
        match self.next(max_frame_bytes) {
            Frame::Partial => Ok(None),
            Frame::Oversized(size) => Err(size),
            Frame::Whole(body) => Ok(Some(Body { buf: body.to_vec(), start: 0 })),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    fn framed(body: &[u8]) -> Vec<u8> {
        let mut out = (body.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn a_large_frame_read_alone_is_handed_over_and_the_others_are_copied() {
        let (mut peer, ours) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        let fd = ours.as_raw_fd();
        let big: Vec<u8> = (0..20 * 1024).map(|i| i as u8).collect();
        let mut frames = FrameBuf::new(&[]);

        peer.write_all(&framed(&big)).unwrap();
        assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused));
        let body = frames.next_owned(1 << 20).unwrap().unwrap();
        assert_eq!(&*body, &big[..]);
        assert_eq!((body.start, frames.buf.capacity()), (4, 0), "the buffer itself, not a copy");
        let at = body.buf.as_ptr();
        let vec = body.into_vec();
        assert_eq!((&vec[..], vec.as_ptr()), (&big[..], at), "as a vector: the body alone, in the same buffer");
        assert!(frames.is_empty() && frames.next_owned(1 << 20).unwrap().is_none());
        frames.compact();

        // two frames in one read, a large one behind a small one: neither is alone
        peer.write_all(&[framed(b"tiny"), framed(&big)].concat()).unwrap();
        assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused));
        let mut got = Vec::new();
        while !frames.is_empty() {
            match frames.next_owned(1 << 20) {
                Ok(Some(body)) => {
                    assert_eq!(body.start, 0, "copied out of a buffer that holds more");
                    got.push(body.into_vec());
                }
                Ok(None) => assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused)),
                Err(size) => panic!("oversized {size}"),
            }
        }
        assert_eq!(got, vec![b"tiny".to_vec(), big.clone()]);

        // a large frame that comes over several reads is alone in its buffer once whole
        frames.compact();
        let whole = framed(&big);
        peer.write_all(&whole[..5000]).unwrap();
        assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused));
        assert!(frames.next_owned(1 << 20).unwrap().is_none(), "partial");
        peer.write_all(&whole[5000..]).unwrap();
        assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused));
        let body = frames.next_owned(1 << 20).unwrap().unwrap();
        assert_eq!((&*body, body.start), (&big[..], 4));

        // staged with the start of the next frame behind it: copied, and the rest kept
        let mut staged = framed(&big);
        staged.extend_from_slice(&framed(b"next")[..3]);
        let mut frames = FrameBuf::new(&staged);
        let body = frames.next_owned(1 << 20).unwrap().unwrap();
        assert_eq!((&*body, body.start), (&big[..], 0));
        assert!(frames.next_owned(1 << 20).unwrap().is_none() && !frames.is_empty());
        peer.write_all(&framed(b"next")[3..]).unwrap();
        assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused));
        assert_eq!(&*frames.next_owned(1 << 20).unwrap().unwrap(), b"next");

        // a size over the bound is reported, not consumed, even alone in its buffer
        frames.compact();
        peer.write_all(&framed(&big)).unwrap();
        assert!(matches!(frames.read(fd, 1 << 20), ReadEnd::Paused));
        assert_eq!(frames.next_owned(1024).err(), Some(big.len()));
        assert!(!frames.is_empty());
    }
}
