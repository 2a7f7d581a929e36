//! Read-only mappings of segment files, for copying hot records out of the page cache without a
//! system call per record.
//!
//! A `preadv2` of one random 4 KiB record costs about 1.9 µs more than copying the same bytes
//! out of a mapping on the machines packrat was measured on (`bench/copy_paths.sh`): most of a
//! batch GET sample's read cost is the system call, not the copy. Two hazards come with a
//! mapping, and this module owns both:
//!
//! - **A page that cannot be read** (an I/O error behind a page fault, a file shorter than the
//!   mapping) raises `SIGBUS`, which would kill the process. [`Mapping::copy_to`] runs with a
//!   per-thread guard; the `SIGBUS` handler, seeing the guard, maps a zero page over the
//!   failing page and lets the copy finish, and the copy reports the fault. The caller drops
//!   the mapping and reads that record another way (where the error surfaces as an `EIO`).
//!   Every byte copied is crc-checked by the caller anyway, so a zero page is never served.
//!   Faults outside a guarded copy go to the handler that was installed before (Rust's
//!   stack-overflow handler), or get the default action.
//! - **A page that is not in the page cache** makes the copying thread wait for the disk, which
//!   an async worker must never do. [`thread_waits`] tells callers whether a copy slept, so
//!   they can stop using mappings for data that is not hot.

use std::cell::Cell;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, Ordering, compiler_fence};

/// A shared, read-only mapping of the first `len` bytes of a file (possibly past its end: only
/// bytes that exist may be copied, see [`copy_to`](Self::copy_to)).
pub(crate) struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is read-only and owned; the pointer is only read through `copy_to`.
unsafe impl Send for Mapping {}
// SAFETY: as above; concurrent reads of a read-only mapping are fine.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `file` from its start, read-only and shared with the page cache.
    pub(crate) fn new(file: &File, len: usize) -> std::io::Result<Self> {
        install_handler();
        if len == 0 {
            return Err(std::io::Error::other("empty mapping"));
        }
        // SAFETY: a fresh mapping chosen by the kernel; nothing else is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { ptr, len })
    }

    /// Copies `dst.len()` bytes at `offset` of the file into `dst`. False if part of them lies
    /// outside the mapping or could not be read (then `dst` holds zeros in its place, and this
    /// mapping has a zero page where the file had an unreadable one: drop it).
    pub(crate) fn copy_to(&self, offset: u64, dst: &mut [u8]) -> bool {
        let Ok(offset) = usize::try_from(offset) else {
            return false;
        };
        if offset
            .checked_add(dst.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        GUARDED.with(|g| g.set(true));
        FAULTED.with(|f| f.set(false));
        compiler_fence(Ordering::SeqCst);
        // SAFETY: in bounds of the mapping (checked above), which lives as long as `self`;
        // `dst` is exclusively borrowed. The bytes of a stored record are not written while
        // they are indexed (segments are append-only), so the copy reads stable memory; a page
        // that faults is replaced by zeros by the handler and the copy resumes.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.cast::<u8>().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            );
        }
        compiler_fence(Ordering::SeqCst);
        GUARDED.with(|g| g.set(false));
        !FAULTED.with(Cell::get)
    }
}

impl Mapping {
    /// Asks the CPU to start loading the first `len` bytes at `offset` (rounded to cache
    /// lines) so that a copy a little later finds them on their way: a hint, which never
    /// faults (a page not mapped yet, or past the file's end, is simply not fetched).
    pub(crate) fn prefetch(&self, offset: u64, len: usize) {
        let Ok(offset) = usize::try_from(offset) else {
            return;
        };
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        for line in (0..len).step_by(64) {
            // SAFETY: SSE is part of the x86_64 baseline; a prefetch reads nothing the program
            // sees and never faults, not even on an unreadable page.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    self.ptr.cast::<i8>().wrapping_add(offset + line),
                )
            };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once (zero pages mapped over parts of it
        // by the handler are unmapped with it).
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// How many times the calling thread has waited so far: major page faults plus voluntary
/// context switches (a page fault that waits for the disk sleeps; some are not counted as
/// major, when the page was already being read in). Preemption is not counted.
pub(crate) fn thread_waits() -> u64 {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, u.as_mut_ptr()) } != 0 {
        return u64::MAX;
    }
    // SAFETY: initialised by the successful call above.
    let u = unsafe { u.assume_init() };
    (u.ru_majflt as u64).wrapping_add(u.ru_nvcsw as u64)
}

thread_local! {
    /// Set while this thread copies out of a mapping.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
    /// Set by the handler when a guarded copy on this thread faulted.
    static FAULTED: Cell<bool> = const { Cell::new(false) };
}

/// The `SIGBUS` action that was installed before ours (`sa_sigaction` as a pointer).
static PREVIOUS: AtomicPtr<libc::sigaction> = AtomicPtr::new(std::ptr::null_mut());

fn install_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain sigaction calls with initialised structs; the previous action is
        // leaked on purpose so the handler can always reach it.
        unsafe {
            let prev: &'static mut libc::sigaction = Box::leak(Box::new(std::mem::zeroed()));
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(libc::SIGBUS, &act, prev) == 0 {
                PREVIOUS.store(prev, Ordering::Release);
            }
        }
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Only const-initialised thread-locals without destructors are read here: plain TLS
    // loads, safe in a signal handler.
    if GUARDED.with(Cell::get) {
        // SAFETY: `info` is the kernel's siginfo for this SIGBUS.
        let addr = unsafe { (*info).si_addr() } as usize;
        let page = page_size();
        let at = addr & !(page - 1);
        // SAFETY: replaces one page of a mapping this thread is copying from (the faulting
        // address lies in a `Mapping`, the only memory a guarded copy reads that can raise
        // SIGBUS) with a private zero page; mmap is a plain system call.
        let r = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if r != libc::MAP_FAILED {
            FAULTED.with(|f| f.set(true));
            return;
        }
    }
    // Not ours: hand it to the previous handler, or let the default action happen.
    let prev = PREVIOUS.load(Ordering::Acquire);
    // SAFETY: `prev` is null or the leaked, initialised previous action.
    unsafe {
        if !prev.is_null() {
            let handler = (*prev).sa_sigaction;
            if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
                if (*prev).sa_flags & libc::SA_SIGINFO != 0 {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        std::mem::transmute(handler);
                    f(sig, info, ctx);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
                    f(sig);
                }
                return;
            }
        }
        // Default action: returning re-runs the faulting access, which now kills the process
        // as it would have without this handler.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn copies_what_the_file_holds() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
        f.write_all(&data).unwrap();
        let m = Mapping::new(&f, 1 << 20).unwrap();
        let mut dst = vec![0u8; 5000];
        assert!(m.copy_to(1234, &mut dst));
        assert_eq!(dst, data[1234..6234]);
        // Outside the mapping: refused, nothing read.
        assert!(!m.copy_to((1 << 20) - 10, &mut dst[..11]));
        assert!(!m.copy_to(u64::MAX, &mut dst[..1]));
    }

    /// A page past the end of the file raises SIGBUS, as a page with an I/O error does: the
    /// copy reports it instead of killing the process, and other pages still read.
    #[test]
    fn a_page_that_cannot_be_read_is_reported_not_fatal() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![0xabu8; 3 * 4096]).unwrap();
        let m = Mapping::new(&f, 16 * 4096).unwrap();
        let mut dst = vec![0u8; 4096];
        assert!(m.copy_to(4096, &mut dst));
        assert!(dst.iter().all(|&b| b == 0xab));
        // Shrink the file under the mapping: its third page is now past the end.
        f.set_len(2 * 4096).unwrap();
        let mut dst = vec![0x55u8; 2 * 4096];
        assert!(!m.copy_to(4096, &mut dst));
        assert!(dst[..4096].iter().all(|&b| b == 0xab));
        assert!(dst[4096..].iter().all(|&b| b == 0));
        // Asking for the lines of pages past the file's end, or past the mapping's, is a
        // hint that is dropped: no fault.
        m.prefetch(2 * 4096, 4096);
        m.prefetch(15 * 4096, 2 * 4096);
        m.prefetch(u64::MAX, 64);
        // The thread goes on; a later copy of a good page succeeds.
        let mut one = [0u8; 16];
        assert!(m.copy_to(0, &mut one));
        assert_eq!(one, [0xab; 16]);
    }
}
