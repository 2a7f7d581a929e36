//! `packrat_client._native`: the Python client's hot path, built by maturin when the package is
//! installed. One HTTP/1.1 connection sends a request signed in Python and reads its TAR answer
//! (a batch GET's, an epoch stream's) entry by entry: the TAR headers and pax records parsed
//! here, and each sample's bytes read from the socket straight into the Python `bytes` object
//! handed out, with the GIL released while the socket is waited on. The pure-Python reader reads
//! an answer into a buffer and copies each sample out of it, and parses its headers in Python
//! (docs/benchmarks.md, "The Python client's CPU per sample").
//!
//! Signing, retries, resumption and routing stay in Python (`packrat_client/native.py`), which
//! uses this for plain `http` endpoints and the pure-Python reader otherwise (https, or a
//! Python without the extension).

use packrat_tar::{BLOCK, checksum_ok, parse_number, pax_records};
use pyo3::exceptions::{PyConnectionError, PyEOFError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyString, PyTuple};
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// The connection's read buffer: answer heads, chunk lines, TAR headers and pax records come
/// through it; a sample's bytes past what it holds are read straight into the sample.
const BUF_BYTES: usize = 64 * 1024;
/// Reads at least this large go straight to the socket, not through the buffer.
const DIRECT_MIN: usize = 16 * 1024;
/// The most bytes a read of the socket waits for at once (see `Connection::wait_for`).
const LOW_WATER_MAX: usize = 1 << 20;
/// The socket's own read timeout: how long a read waits for a low-water mark at most, and
/// the step in which a read waits for anything (see `Connection::recv`).
const WAIT_SLICE: Duration = Duration::from_millis(20);
/// The longest answer head, and the longest chunk line, taken.
const HEAD_MAX: usize = 32 * 1024;
const LINE_MAX: usize = 4096;
/// The longest pax header taken (packrat writes a few hundred bytes).
const PAX_MAX: u64 = 1 << 20;
/// What is read past an archive's end (its second zero block) to keep the connection.
const TRAILER_MAX: u64 = 64 * 1024;
/// The most of an error answer's body kept.
const ERROR_BODY_MAX: usize = 1 << 20;

/// How the answer under way ends.
#[derive(Clone, Copy)]
enum Body {
    /// No answer under way.
    Idle,
    /// Bytes left.
    Length(u64),
    /// Bytes left in the chunk, whether its CRLF is still to read, whether the last chunk came.
    Chunked { left: u64, crlf: bool, done: bool },
    /// Until the peer closes; whether it has.
    Close { done: bool },
}

fn bad(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

fn cut() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the TAR answer ended inside an entry",
    )
}

/// An I/O error as the Python exception the pure-Python reader raises for it: a timeout, a
/// cut answer (`EOFError`), anything else a `ConnectionError`; malformed data is a
/// `ValueError` (turned into `tarfile.ReadError` by `native.py`).
fn py_err(e: io::Error) -> PyErr {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            PyTimeoutError::new_err(e.to_string())
        }
        io::ErrorKind::UnexpectedEof => PyEOFError::new_err(e.to_string()),
        io::ErrorKind::InvalidData => PyValueError::new_err(e.to_string()),
        _ => PyConnectionError::new_err(e.to_string()),
    }
}

/// Bytes as Python text the way the pure-Python reader decodes them (UTF-8, with undecodable
/// bytes kept as surrogates).
fn text<'py>(py: Python<'py>, b: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match std::str::from_utf8(b) {
        Ok(s) => Ok(PyString::new(py, s).into_any()),
        Err(_) => PyBytes::new(py, b).call_method1("decode", ("utf-8", "surrogateescape")),
    }
}

/// A NUL-ended header field.
fn field(b: &[u8]) -> &[u8] {
    &b[..b.iter().position(|&c| c == 0).unwrap_or(b.len())]
}

#[pyclass(module = "packrat_client._native")]
struct Connection {
    sock: TcpStream,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    body: Body,
    keep_alive: bool,
    /// An error or an early stop left the connection in an unknown state: never reused.
    broken: bool,
    /// The answer's archive ended (its zero block read, or the body ended at an entry's end).
    archive_done: bool,
    /// The socket's receive low-water mark (`SO_RCVLOWAT`) as last set.
    low_water: usize,
    /// How long a read may wait for the server to send anything.
    read_timeout: Duration,
}

impl Connection {
    fn buffered(&self) -> usize {
        self.end - self.pos
    }

    /// Sets how many bytes a read of the socket waits for (`SO_RCVLOWAT`), if it changed.
    ///
    /// A sample read straight from the socket waits for all of its bytes (they are sure to
    /// come: they are in the entry, in the chunk), not for each piece the server sends: a
    /// reader ahead of its server was woken several times per 110 KiB sample, and each wake-up
    /// cost it more than the copy this path saves. Reads through the buffer wait for any byte
    /// (an answer's last chunk line is a few bytes long).
    fn wait_for(&mut self, n: usize) -> io::Result<()> {
        let n = n.clamp(1, LOW_WATER_MAX);
        if n == self.low_water {
            return Ok(());
        }
        let v = n as libc::c_int;
        // SAFETY: a valid socket descriptor and an option value of the size given.
        let r = unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        self.low_water = n;
        Ok(())
    }

    /// A read of the socket. The socket's own timeout is a short slice ([`WAIT_SLICE`]): a
    /// read that waits for a low-water mark returns what came when a slice ends (the mark
    /// is a hint, never a stall: a server sending tiny segments can fill the receive buffer
    /// before the mark is reached), and one that got nothing waits on, up to the read
    /// timeout.
    fn recv(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let mut since: Option<std::time::Instant> = None;
        loop {
            match self.sock.read(dst) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    let start = *since.get_or_insert_with(std::time::Instant::now);
                    if start.elapsed() + WAIT_SLICE >= self.read_timeout {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!(
                                "the server sent nothing for {:.1} s",
                                self.read_timeout.as_secs_f64()
                            ),
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    /// Reads more into the buffer (its unread bytes moved to the front first when needed);
    /// answers how many, 0 at the peer's end.
    fn fill(&mut self) -> io::Result<usize> {
        self.wait_for(1)?;
        if self.pos == self.end {
            self.pos = 0;
            self.end = 0;
        } else if self.end == self.buf.len() {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
        }
        let mut buf = std::mem::take(&mut self.buf);
        let n = self.recv(&mut buf[self.end..]);
        self.buf = buf;
        let n = n?;
        self.end += n;
        Ok(n)
    }

    /// Bytes of the connection (whatever framing), from the buffer, else straight from the
    /// socket for a large read, else through the buffer.
    fn raw_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.end {
            if dst.len() >= DIRECT_MIN {
                self.wait_for(dst.len())?;
                return self.recv(dst);
            }
            if self.fill()? == 0 {
                return Ok(0);
            }
        }
        let n = dst.len().min(self.buffered());
        dst[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }

    /// One line (a chunk's size, a trailer), without its CRLF.
    fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(at) = self.buf[self.pos..self.end]
                .iter()
                .position(|&b| b == b'\n')
            {
                let line = &self.buf[self.pos..self.pos + at];
                let line = line.strip_suffix(b"\r").unwrap_or(line).to_vec();
                self.pos += at + 1;
                return Ok(line);
            }
            if self.buffered() > LINE_MAX {
                return Err(bad("a chunk line of the answer is too long"));
            }
            if self.fill()? == 0 {
                return Err(cut());
            }
        }
    }

    /// Sends a request and reads its answer's head: the status and the headers.
    fn exchange(&mut self, head: &[u8], body: &[u8]) -> io::Result<(u16, Vec<(String, String)>)> {
        self.sock.write_all(head)?;
        if !body.is_empty() {
            self.sock.write_all(body)?;
        }
        loop {
            let parsed = {
                let mut slots = [httparse::EMPTY_HEADER; 64];
                let mut resp = httparse::Response::new(&mut slots);
                match resp.parse(&self.buf[self.pos..self.end]) {
                    Ok(httparse::Status::Complete(n)) => {
                        let headers: Vec<(String, String)> = resp
                            .headers
                            .iter()
                            .map(|h| {
                                (
                                    h.name.to_ascii_lowercase(),
                                    String::from_utf8_lossy(h.value).into_owned(),
                                )
                            })
                            .collect();
                        Some((n, resp.code.unwrap_or(0), resp.version == Some(1), headers))
                    }
                    Ok(httparse::Status::Partial) => None,
                    Err(e) => return Err(bad(format!("a bad answer head: {e}"))),
                }
            };
            let Some((n, status, http11, headers)) = parsed else {
                if self.buffered() >= HEAD_MAX {
                    return Err(bad("the answer's head is too long"));
                }
                if self.fill()? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the connection closed before an answer",
                    ));
                }
                continue;
            };
            self.pos += n;
            if (100..200).contains(&status) {
                continue;
            }
            let value = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.to_ascii_lowercase())
            };
            let close = value("connection").is_some_and(|v| v.contains("close"));
            self.keep_alive = http11 && !close;
            self.body = if status == 204 || status == 304 {
                Body::Length(0)
            } else if value("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
                Body::Chunked {
                    left: 0,
                    crlf: false,
                    done: false,
                }
            } else if let Some(len) = value("content-length") {
                Body::Length(
                    len.trim()
                        .parse()
                        .map_err(|_| bad("a bad content-length"))?,
                )
            } else {
                self.keep_alive = false;
                Body::Close { done: false }
            };
            self.archive_done = false;
            return Ok((status, headers));
        }
    }

    /// Bytes of the answer's body; 0 at its end.
    fn body_read(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.body {
                Body::Idle | Body::Close { done: true } | Body::Chunked { done: true, .. } => {
                    return Ok(0);
                }
                Body::Length(0) => return Ok(0),
                Body::Length(left) => {
                    let n = dst.len().min(left.min(usize::MAX as u64) as usize);
                    let got = self.raw_read(&mut dst[..n])?;
                    if got == 0 {
                        return Err(cut());
                    }
                    self.body = Body::Length(left - got as u64);
                    return Ok(got);
                }
                Body::Close { done: false } => {
                    let got = self.raw_read(dst)?;
                    if got == 0 {
                        self.body = Body::Close { done: true };
                    }
                    return Ok(got);
                }
                Body::Chunked { left, crlf, .. } if left > 0 => {
                    let n = dst.len().min(left.min(usize::MAX as u64) as usize);
                    let got = self.raw_read(&mut dst[..n])?;
                    if got == 0 {
                        return Err(cut());
                    }
                    let left = left - got as u64;
                    self.body = Body::Chunked {
                        left,
                        crlf: crlf || left == 0,
                        done: false,
                    };
                    return Ok(got);
                }
                Body::Chunked { crlf, .. } => {
                    if crlf && !self.line()?.is_empty() {
                        return Err(bad("a chunk of the answer does not end in CRLF"));
                    }
                    let line = self.line()?;
                    let size = line.split(|&b| b == b';').next().unwrap_or(&[]);
                    let size = std::str::from_utf8(size)
                        .ok()
                        .and_then(|s| u64::from_str_radix(s.trim(), 16).ok())
                        .ok_or_else(|| bad("a bad chunk size in the answer"))?;
                    if size == 0 {
                        // The trailers, up to the empty line.
                        while !self.line()?.is_empty() {}
                    }
                    self.body = Body::Chunked {
                        left: size,
                        crlf: false,
                        done: size == 0,
                    };
                }
            }
        }
    }

    /// Fills `dst` from the body; an end before is a cut answer.
    fn body_exact(&mut self, dst: &mut [u8]) -> io::Result<()> {
        let mut at = 0;
        while at < dst.len() {
            match self.body_read(&mut dst[at..])? {
                0 => return Err(cut()),
                n => at += n,
            }
        }
        Ok(())
    }

    /// Passes over `n` bytes of the body; with `at_end`, the body may end first.
    fn body_skip(&mut self, mut n: u64, at_end: bool) -> io::Result<()> {
        let mut scratch = [0u8; 4096];
        while n > 0 {
            let want = scratch.len().min(n.min(usize::MAX as u64) as usize);
            match self.body_read(&mut scratch[..want])? {
                0 if at_end => return Ok(()),
                0 => return Err(cut()),
                got => n -= got as u64,
            }
        }
        Ok(())
    }

    /// The next 512-byte block, or `false` if the body ends where it would start.
    fn block(&mut self, out: &mut [u8; BLOCK]) -> io::Result<bool> {
        let first = self.body_read(out)?;
        if first == 0 {
            return Ok(false);
        }
        self.body_exact(&mut out[first..])?;
        Ok(true)
    }

    /// Whether the next `n` bytes of body can come from the buffer alone (then the GIL is
    /// kept: releasing it costs more than the copy); never for 0 (an unknown amount).
    fn in_buffer(&self, n: usize) -> bool {
        if n == 0 {
            return false;
        }
        match self.body {
            Body::Length(left) => self.buffered() >= n && left >= n as u64,
            Body::Chunked {
                left, crlf: false, ..
            } => self.buffered() >= n && left >= n as u64,
            _ => false,
        }
    }

    /// Runs `f` on this connection, without the GIL unless what it reads is buffered; an error
    /// leaves the connection broken.
    fn io<T: Send>(
        &mut self,
        py: Python<'_>,
        need: usize,
        f: impl FnOnce(&mut Self) -> io::Result<T> + Send,
    ) -> PyResult<T> {
        let r = if self.in_buffer(need) {
            f(self)
        } else {
            py.detach(|| f(self))
        };
        r.map_err(|e| {
            self.broken = true;
            py_err(e)
        })
    }

    /// The next regular file of the archive: its name, its bytes and its pax records, or
    /// `None` at the archive's end.
    fn entry<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let mut pax: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        loop {
            let mut hdr = [0u8; BLOCK];
            if !self.io(py, BLOCK, |c| c.block(&mut hdr))? {
                return Ok(None);
            }
            if hdr.iter().all(|&b| b == 0) {
                return Ok(None);
            }
            if !checksum_ok(&hdr) {
                self.broken = true;
                return Err(PyValueError::new_err(
                    "a TAR header of the answer has a bad checksum",
                ));
            }
            let size = parse_number(&hdr[124..136]).map_err(|e| {
                self.broken = true;
                PyValueError::new_err(e.0)
            })?;
            let pad = packrat_tar::padding(size) as u64;
            match hdr[156] {
                b'x' => {
                    if size > PAX_MAX {
                        self.broken = true;
                        return Err(PyValueError::new_err(
                            "a pax header of the answer is too long",
                        ));
                    }
                    let mut data = vec![0u8; size as usize];
                    self.io(py, data.len() + pad as usize, |c| {
                        c.body_exact(&mut data)?;
                        c.body_skip(pad, false)
                    })?;
                    pax.clear();
                    for record in pax_records(&data) {
                        let (k, v) = record.map_err(|e| {
                            self.broken = true;
                            PyValueError::new_err(e.0)
                        })?;
                        pax.push((k.to_vec(), v.to_vec()));
                    }
                    continue;
                }
                b'0' | 0 | b'7' => {}
                _ => {
                    self.io(py, 0, |c| c.body_skip(size + pad, false))?;
                    pax.clear();
                    continue;
                }
            }
            let name = match pax.iter().rev().find(|(k, _)| k == b"path") {
                Some((_, v)) => text(py, v)?,
                None => {
                    let name = field(&hdr[..100]);
                    let prefix = field(&hdr[345..500]);
                    if &hdr[257..262] == b"ustar" && !prefix.is_empty() {
                        text(py, &[prefix, b"/", name].concat())?
                    } else {
                        text(py, name)?
                    }
                }
            };
            let len =
                usize::try_from(size).map_err(|_| PyValueError::new_err("an entry too large"))?;
            let data = PyBytes::new_with(py, len, |dst| {
                self.io(py, len.saturating_add(pad as usize), |c| {
                    c.body_exact(dst)?;
                    c.body_skip(pad, false)
                })
            })?;
            let records = PyDict::new(py);
            for (k, v) in &pax {
                records.set_item(text(py, k)?, text(py, v)?)?;
            }
            return Ok(Some(PyTuple::new(
                py,
                [name, data.into_any(), records.into_any()],
            )?));
        }
    }
}

#[pymethods]
impl Connection {
    /// A connection to `host:port`; a read waits at most `read_timeout` seconds for the server
    /// to send something, a write as long for room.
    #[new]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        connect_timeout: f64,
        read_timeout: f64,
    ) -> PyResult<Self> {
        let sock = py
            .detach(move || -> io::Result<TcpStream> {
                let mut last = io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host}:{port} names no address"),
                );
                for addr in (host.as_str(), port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(
                        &addr,
                        Duration::from_secs_f64(connect_timeout),
                    ) {
                        Ok(s) => return Ok(s),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            })
            .map_err(py_err)?;
        let read_timeout = Duration::from_secs_f64(read_timeout);
        sock.set_nodelay(true)
            .and_then(|()| sock.set_read_timeout(Some(WAIT_SLICE.min(read_timeout))))
            .and_then(|()| sock.set_write_timeout(Some(read_timeout)))
            .map_err(py_err)?;
        Ok(Self {
            sock,
            buf: vec![0u8; BUF_BYTES].into_boxed_slice(),
            pos: 0,
            end: 0,
            body: Body::Idle,
            keep_alive: false,
            broken: false,
            archive_done: false,
            low_water: 1,
            read_timeout,
        })
    }

    /// Sends a request (its head, CRLFs included, and its body) and reads the answer's head:
    /// `(status, [(name in lower case, value)])`. The body is then read with `entries` or
    /// `read_body`.
    fn send(
        &mut self,
        py: Python<'_>,
        head: Vec<u8>,
        body: Vec<u8>,
    ) -> PyResult<(u16, Vec<(String, String)>)> {
        if self.broken || !matches!(self.body, Body::Idle) {
            return Err(PyConnectionError::new_err(
                "the connection is not free for a request",
            ));
        }
        self.io(py, usize::MAX, |c| c.exchange(&head, &body))
    }

    /// Up to `max` entries of the answer's TAR archive, each `(name, data, pax records)`,
    /// fewer once they hold `max_bytes`; an empty list once the archive ended (the rest of the
    /// body is then read, so the connection can be reused). An answer cut inside an entry
    /// raises `EOFError`, a malformed one `ValueError`.
    ///
    /// Keep `max_bytes` small (a few samples): samples the caller drops before the next call
    /// leave their memory to the next ones, while a long list of large samples makes the
    /// allocator give memory back and fault it in again (a page fault per 4 KiB: 64 samples of
    /// 110 KiB a call cost more than the copy the native path saves).
    fn entries<'py>(
        &mut self,
        py: Python<'py>,
        max: usize,
        max_bytes: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        let mut bytes = 0usize;
        while out.len() < max && bytes < max_bytes && !self.archive_done {
            match self.entry(py)? {
                Some(e) => {
                    bytes += e.get_item(1)?.len()?;
                    out.append(e)?
                }
                None => {
                    self.archive_done = true;
                    self.io(py, 0, |c| c.body_skip(TRAILER_MAX, true))?;
                    if self.io(py, 0, |c| c.body_read(&mut [0u8; 1]))? != 0 {
                        // More than an archive's trailer: not ours to read.
                        self.broken = true;
                    }
                    self.body = Body::Idle;
                }
            }
        }
        Ok(out)
    }

    /// The rest of the answer's body (an error's, a small document's), up to 1 MiB.
    fn read_body<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = Vec::new();
        let mut piece = vec![0u8; 64 * 1024];
        loop {
            let n = self.io(py, 0, |c| c.body_read(&mut piece))?;
            if n == 0 {
                break;
            }
            if out.len() + n > ERROR_BODY_MAX {
                self.broken = true;
                break;
            }
            out.extend_from_slice(&piece[..n]);
        }
        self.body = Body::Idle;
        Ok(PyBytes::new(py, &out))
    }

    /// Whether the connection can carry another request: its last answer was read to the end
    /// and the server keeps it open.
    #[getter]
    fn reusable(&self) -> bool {
        matches!(self.body, Body::Idle) && self.keep_alive && !self.broken
    }

    /// Closes the connection (an answer not read to its end: its bytes would be taken for the
    /// next answer's).
    fn close(&mut self) {
        self.broken = true;
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Connection>()?;
    Ok(())
}
