//! Positioned reads through io_uring, on one dedicated thread that owns the ring.
//!
//! Callers hand over (file, offset, length, completion callback); the thread keeps at most
//! [`RING_ENTRIES`] reads in flight, resubmits short reads for the remainder, and calls the
//! callback with the filled buffer or the error. The buffer and the file of a read stay in the
//! thread's slot table until the kernel has completed it, which is what makes the raw pointers
//! handed to the kernel sound.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, channel};

use io_uring::{IoUring, opcode, types};

/// Submission queue size and the bound on reads in flight.
pub const RING_ENTRIES: usize = 256;

pub type ReadDone = Box<dyn FnOnce(io::Result<Vec<u8>>) + Send>;

struct ReadRequest {
    file: Arc<File>,
    offset: u64,
    len: usize,
    done: ReadDone,
}

struct InFlight {
    req: ReadRequest,
    buf: Vec<u8>,
    filled: usize,
}

pub struct UringReader {
    tx: Sender<ReadRequest>,
}

impl UringReader {
    /// Sets up a ring and proves it works with one real read of `probe` (a kernel or seccomp
    /// policy may allow `io_uring_setup` yet refuse operations); then starts the thread.
    pub fn start(probe: &File) -> io::Result<Self> {
        let mut ring = IoUring::new(RING_ENTRIES as u32)?;
        let mut buf = vec![0u8; 16];
        let entry = opcode::Read::new(types::Fd(probe.as_raw_fd()), buf.as_mut_ptr(), 16)
            .offset(0)
            .build()
            .user_data(0);
        // SAFETY: `buf` and `probe` outlive the read, which completes before this function
        // returns (submit_and_wait below).
        unsafe {
            ring.submission()
                .push(&entry)
                .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        }
        ring.submit_and_wait(1)?;
        let result = ring
            .completion()
            .next()
            .map(|c| c.result())
            .ok_or_else(|| io::Error::other("io_uring returned no completion"))?;
        if result < 0 {
            return Err(io::Error::from_raw_os_error(-result));
        }
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("packrat-uring".into())
            .spawn(move || run(ring, rx))?;
        Ok(Self { tx })
    }

    pub fn read(&self, file: Arc<File>, offset: u64, len: usize, done: ReadDone) {
        if let Err(e) = self.tx.send(ReadRequest {
            file,
            offset,
            len,
            done,
        }) {
            (e.0.done)(Err(io::Error::other("the io_uring thread has stopped")));
        }
    }
}

fn push_read(ring: &mut IoUring, slot: usize, f: &mut InFlight) -> io::Result<()> {
    let remaining = f.req.len - f.filled;
    let entry = opcode::Read::new(
        types::Fd(f.req.file.as_raw_fd()),
        f.buf[f.filled..].as_mut_ptr(),
        u32::try_from(remaining).unwrap_or(u32::MAX),
    )
    .offset(f.req.offset + f.filled as u64)
    .build()
    .user_data(slot as u64);
    // SAFETY: the buffer and the file live in the slot table until this entry's completion
    // is reaped; the queue has room because at most RING_ENTRIES reads are in flight and each
    // has at most one entry queued.
    unsafe { ring.submission().push(&entry) }
        .map_err(|_| io::Error::other("io_uring submission queue full"))
}

fn run(mut ring: IoUring, rx: Receiver<ReadRequest>) {
    let mut slots: Vec<Option<InFlight>> = (0..RING_ENTRIES).map(|_| None).collect();
    let mut free: Vec<usize> = (0..RING_ENTRIES).rev().collect();
    let mut backlog: VecDeque<ReadRequest> = VecDeque::new();
    let mut in_flight = 0usize;
    loop {
        // Block for work only when nothing is in flight; otherwise take what has arrived.
        if in_flight == 0 && backlog.is_empty() {
            match rx.recv() {
                Ok(r) => backlog.push_back(r),
                Err(_) => return,
            }
        }
        while let Ok(r) = rx.try_recv() {
            backlog.push_back(r);
        }
        while !backlog.is_empty() {
            let Some(slot) = free.pop() else { break };
            let Some(req) = backlog.pop_front() else {
                free.push(slot);
                break;
            };
            let mut f = InFlight {
                buf: vec![0u8; req.len],
                req,
                filled: 0,
            };
            if f.req.len == 0 {
                free.push(slot);
                (f.req.done)(Ok(f.buf));
                continue;
            }
            match push_read(&mut ring, slot, &mut f) {
                Ok(()) => {
                    slots[slot] = Some(f);
                    in_flight += 1;
                }
                Err(e) => {
                    free.push(slot);
                    (f.req.done)(Err(e));
                }
            }
        }
        if in_flight == 0 {
            continue;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!(error = %e, "io_uring submit failed; failing the reads in flight");
            // Entries already queued may still complete; wait for them before their buffers
            // are dropped, then fail the callers.
            let _ = ring.submit_and_wait(in_flight);
            for s in slots.iter_mut() {
                if let Some(f) = s.take() {
                    (f.req.done)(Err(io::Error::new(e.kind(), e.to_string())));
                }
            }
            free = (0..RING_ENTRIES).rev().collect();
            in_flight = 0;
            continue;
        }
        let done: Vec<(u64, i32)> = ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (id, res) in done {
            let slot = id as usize;
            let Some(mut f) = slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            let outcome = if res < 0 {
                Some(Err(io::Error::from_raw_os_error(-res)))
            } else if res == 0 {
                Some(Err(io::Error::from(io::ErrorKind::UnexpectedEof)))
            } else {
                f.filled += res as usize;
                if f.filled < f.req.len {
                    // A short read: ask for the rest where it stopped.
                    match push_read(&mut ring, slot, &mut f) {
                        Ok(()) => {
                            slots[slot] = Some(f);
                            continue;
                        }
                        Err(e) => Some(Err(e)),
                    }
                } else {
                    None
                }
            };
            in_flight -= 1;
            free.push(slot);
            let InFlight { req, buf, .. } = f;
            (req.done)(outcome.unwrap_or(Ok(buf)));
        }
    }
}
