//! The access log: one line per request on stderr, as text or JSON like the rest of the log
//! (`--log-format`), on the target `packrat::access`.
//!
//! Written by hand rather than through `tracing`: an access line per request formatted by
//! `tracing-subscriber` and written from the request's thread cost a 4 KiB GET a sixth of its
//! throughput (server CPU per GET 23.6 -> 31.4 µs, `LOG=info bench/ab.sh`); moving only the
//! write to another thread did not help (33.3 µs), and handing each line to a writer thread
//! over a channel was worse (39.1 µs: a wake-up per line). Here a request formats its line
//! (about a microsecond) and appends it to a shared buffer under a lock held for a copy; a
//! writer thread takes the whole buffer every 100 ms, or sooner when it passes 64 KiB, and
//! writes it in one go. No line is dropped; lines reach stderr at most about 100 ms late, and
//! `flush` (at a clean stop) and dropping the log write out the rest.

use std::cell::RefCell;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// What one line says.
pub struct Entry<'a> {
    pub method: &'a str,
    pub op: &'a str,
    pub bucket: &'a str,
    pub key: &'a str,
    pub status: u16,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// False when the reply was cut before its end (the client went away).
    pub complete: bool,
    pub duration_ms: f64,
    pub request_id: &'a str,
    pub access_key: &'a str,
}

/// Buffered lines past which the writer is woken before its next round.
const WAKE_BYTES: usize = 64 * 1024;
/// The writer's round.
const ROUND: Duration = Duration::from_millis(100);

struct Shared {
    lines: Mutex<Vec<u8>>,
    wake: Condvar,
    stop: AtomicBool,
    /// Held while a taken buffer is written, so buffers reach stderr in the order taken.
    io: Mutex<()>,
}

impl Shared {
    /// Writes out what is buffered now.
    fn write_out(&self) {
        let _io = self.io.lock().unwrap_or_else(|p| p.into_inner());
        let lines = std::mem::take(&mut *self.lines.lock().unwrap_or_else(|p| p.into_inner()));
        if !lines.is_empty() {
            let _ = std::io::stderr().write_all(&lines);
        }
    }
}

pub struct AccessLog {
    shared: Arc<Shared>,
    writer: Option<std::thread::JoinHandle<()>>,
    json: bool,
}

thread_local! {
    /// A thread's line being formatted, kept between requests.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl AccessLog {
    /// Starts the writer thread. `json`: lines as JSON objects, else as text.
    pub fn start(json: bool) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            lines: Mutex::new(Vec::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            io: Mutex::new(()),
        });
        let s = shared.clone();
        let writer = std::thread::Builder::new()
            .name("access-log".into())
            .spawn(move || {
                while !s.stop.load(Ordering::Acquire) {
                    {
                        let lines = s.lines.lock().unwrap_or_else(|p| p.into_inner());
                        if lines.len() < WAKE_BYTES {
                            let _ = s.wake.wait_timeout(lines, ROUND);
                        }
                    }
                    s.write_out();
                }
                s.write_out();
            })?;
        Ok(Self {
            shared,
            writer: Some(writer),
            json,
        })
    }

    pub fn log(&self, e: &Entry) {
        SCRATCH.with(|scratch| {
            let mut line = scratch.borrow_mut();
            line.clear();
            let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
            if self.json {
                write_json(&mut line, &now, e);
            } else {
                write_text(&mut line, &now, e);
            }
            let mut lines = self.shared.lines.lock().unwrap_or_else(|p| p.into_inner());
            lines.extend_from_slice(&line);
            if lines.len() >= WAKE_BYTES {
                self.shared.wake.notify_one();
            }
        });
    }

    /// Writes out every line logged so far.
    pub fn flush(&self) {
        self.shared.write_out();
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_one();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

fn write_json(out: &mut Vec<u8>, now: &str, e: &Entry) {
    let s = |out: &mut Vec<u8>, v: &str| {
        let _ = serde_json::to_writer(&mut *out, v);
    };
    out.extend_from_slice(b"{\"timestamp\":");
    s(out, now);
    out.extend_from_slice(b",\"level\":\"INFO\",\"message\":\"request\",\"method\":");
    s(out, e.method);
    out.extend_from_slice(b",\"op\":");
    s(out, e.op);
    out.extend_from_slice(b",\"bucket\":");
    s(out, e.bucket);
    out.extend_from_slice(b",\"key\":");
    s(out, e.key);
    let _ = write!(
        out,
        ",\"status\":{},\"bytes_in\":{},\"bytes_out\":{},\"complete\":{},\"duration_ms\":{:.3},\"request_id\":",
        e.status, e.bytes_in, e.bytes_out, e.complete, e.duration_ms
    );
    s(out, e.request_id);
    out.extend_from_slice(b",\"access_key\":");
    s(out, e.access_key);
    out.extend_from_slice(b",\"target\":\"packrat::access\"}\n");
}

fn write_text(out: &mut Vec<u8>, now: &str, e: &Entry) {
    let _ = writeln!(
        out,
        "{now}  INFO packrat::access: request method={} op={} bucket={:?} key={:?} status={} bytes_in={} bytes_out={} complete={} duration_ms={:.3} request_id={} access_key={:?}",
        e.method,
        e.op,
        e.bucket,
        e.key,
        e.status,
        e.bytes_in,
        e.bytes_out,
        e.complete,
        e.duration_ms,
        e.request_id,
        e.access_key
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(key: &'a str) -> Entry<'a> {
        Entry {
            method: "PUT",
            op: "PutObject",
            bucket: "b",
            key,
            status: 200,
            bytes_in: 5,
            bytes_out: 0,
            complete: true,
            duration_ms: 1.25,
            request_id: "0001",
            access_key: "AK",
        }
    }

    #[test]
    fn a_json_line_is_one_object_whatever_the_key_holds() {
        let key = "a \"quoted\"\nkey\\with\u{1}control";
        let mut out = Vec::new();
        write_json(&mut out, "2026-01-01T00:00:00.000000Z", &entry(key));
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(v["key"], key);
        assert_eq!(v["status"], 200);
        assert_eq!(v["duration_ms"], 1.25);
        assert_eq!(v["target"], "packrat::access");
    }

    #[test]
    fn a_text_line_is_one_line_whatever_the_key_holds() {
        let mut out = Vec::new();
        write_text(&mut out, "t", &entry("two\nlines"));
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(text.lines().count(), 1);
        assert!(text.contains("key=\"two\\nlines\""), "{text}");
    }
}
