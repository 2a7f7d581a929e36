//! Fault injection for tests (`packrat serve --fault-injection`).

/// Fault injection for tests (`packrat serve --fault-injection`): every segment file operation
/// consults this switchboard first. In normal operation all switches are off and the cost is one
/// relaxed atomic load per operation.
#[derive(Debug, Default)]
pub struct Faults {
    pub(crate) write: std::sync::atomic::AtomicU8,
    pub(crate) sync: std::sync::atomic::AtomicU8,
    pub(crate) read: std::sync::atomic::AtomicU8,
    /// Operations failed on purpose so far.
    pub injected: std::sync::atomic::AtomicU64,
}

/// What an injected fault does to the operation it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    #[default]
    None,
    /// The operation fails with EIO.
    Eio,
    /// The operation fails with ENOSPC (writes only).
    Enospc,
    /// Half of the record is written, then the write fails with EIO (writes only).
    Torn,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::None => 0,
            Fault::Eio => 1,
            Fault::Enospc => 2,
            Fault::Torn => 3,
        }
    }

    fn from_code(c: u8) -> Self {
        match c {
            1 => Fault::Eio,
            2 => Fault::Enospc,
            3 => Fault::Torn,
            _ => Fault::None,
        }
    }
}

impl Faults {
    pub fn set(&self, write: Fault, sync: Fault, read: Fault) {
        use std::sync::atomic::Ordering::Relaxed;
        self.write.store(write.code(), Relaxed);
        self.sync.store(sync.code(), Relaxed);
        self.read.store(read.code(), Relaxed);
    }

    /// (write, sync, read) as set now.
    pub fn get(&self) -> (Fault, Fault, Fault) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            Fault::from_code(self.write.load(Relaxed)),
            Fault::from_code(self.sync.load(Relaxed)),
            Fault::from_code(self.read.load(Relaxed)),
        )
    }

    pub(crate) fn hit(&self, which: &std::sync::atomic::AtomicU8) -> Fault {
        let f = Fault::from_code(which.load(std::sync::atomic::Ordering::Relaxed));
        if f != Fault::None {
            self.injected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        f
    }
}

pub(crate) fn injected_error(f: Fault) -> std::io::Error {
    match f {
        Fault::Enospc => std::io::Error::from_raw_os_error(libc::ENOSPC),
        _ => std::io::Error::from_raw_os_error(libc::EIO),
    }
}
