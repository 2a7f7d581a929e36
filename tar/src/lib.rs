//! POSIX TAR (pax interchange format, as written by `tar --format=pax` and read by Python's
//! `tarfile`, GNU tar and WebDataset): a header writer for the streams packrat answers with,
//! and a streaming parser for the archives it is sent or asked to index.
//!
//! Written entries are always a pax extended header (`x`) carrying the entry's attributes
//! (`path` when the name does not fit the ustar fields, `size` past 8 GiB, and packrat's own
//! `packrat.*` records such as the ETag) followed by a ustar header and the data, padded to
//! 512-byte blocks. The parser accepts ustar, pax (`x`, `g`) and GNU long names (`L`, `K`).

pub const BLOCK: usize = 512;

// The header writer runs once per entry of a batch reply (hundreds of thousands a second); its
// helpers are `#[inline]` so they can be inlined into the S3 layer's frame writer as they were
// when this module lived in the gateway crate. Without it, 4 KiB batch GET measured 0.968 of
// before (B below A in all three rounds); with it, 1.022, inside the spread (bench/ab.sh,
// docs/benchmark-log.md).

/// Bytes of padding after `size` bytes of data.
#[inline]
pub fn padding(size: u64) -> usize {
    ((BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64) as usize
}

/// The two zero blocks that end an archive.
pub const END_OF_ARCHIVE: [u8; 2 * BLOCK] = [0; 2 * BLOCK];

/// Largest size the 11 octal digits of a ustar size field hold.
const USTAR_SIZE_MAX: u64 = 0o77777777777;

#[inline]
fn octal(field: &mut [u8], value: u64) {
    // `width - 1` digits and a NUL terminator, as GNU tar and Python write; digits beyond the
    // field's width are dropped (callers keep values in range). Written by hand: this runs
    // several times per entry on the batch read path, where `format!` showed in profiles.
    let digits = field.len() - 1;
    let mut v = value;
    for i in (0..digits).rev() {
        field[i] = b'0' + (v & 7) as u8;
        v >>= 3;
    }
    field[digits] = 0;
}

#[inline]
fn push_decimal(out: &mut Vec<u8>, mut v: usize) {
    let mut digits = [0u8; 20];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (v % 10) as u8;
        n += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    out.extend(digits[..n].iter().rev());
}

#[inline]
fn decimal_len(v: usize) -> usize {
    let mut n = 1;
    let mut v = v / 10;
    while v > 0 {
        n += 1;
        v /= 10;
    }
    n
}

#[inline]
fn pax_record(out: &mut Vec<u8>, key: &str, value: &str) {
    // "<len> <key>=<value>\n", where <len> counts the whole record including its own digits.
    let body = key.len() + value.len() + 3; // space, '=', newline
    let mut len = body + 1;
    while len != body + decimal_len(len) {
        len = body + decimal_len(len);
    }
    push_decimal(out, len);
    out.push(b' ');
    out.extend_from_slice(key.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
    out.push(b'\n');
}

#[inline]
fn ustar_header(name: &[u8], size: u64, mtime: i64, typeflag: u8) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    let n = name.len().min(100);
    h[..n].copy_from_slice(&name[..n]);
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size.min(USTAR_SIZE_MAX));
    octal(&mut h[136..148], mtime.max(0) as u64);
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // The checksum is computed with its own field taken as eight spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum = block_sum(&h);
    octal(&mut h[148..155], u64::from(sum));
    h[155] = b' ';
    h
}

/// Appends the headers of one entry (`name`, `size` bytes of data to follow, modification
/// time in Unix seconds, and extra pax records) to `out`. The caller then appends the data and
/// [`padding`]`(size)` zero bytes.
pub fn write_entry_header(
    out: &mut impl bytes::BufMut,
    name: &str,
    size: u64,
    mtime: i64,
    extra: &[(&str, &str)],
) {
    let short = name.is_ascii() && name.len() <= 100 && !name.is_empty();
    // ustar name field: the name itself when it fits, else a stand-in (the pax `path` rules).
    let stand_in: Vec<u8>;
    let ustar_name: &[u8] = if short {
        name.as_bytes()
    } else {
        stand_in = name.bytes().filter(u8::is_ascii).take(100).collect();
        &stand_in
    };
    let needs_pax = !short || size > USTAR_SIZE_MAX || !extra.is_empty();
    if needs_pax {
        let mut records = Vec::with_capacity(128);
        if !short {
            pax_record(&mut records, "path", name);
        }
        if size > USTAR_SIZE_MAX {
            pax_record(&mut records, "size", &size.to_string());
        }
        for (k, v) in extra {
            pax_record(&mut records, k, v);
        }
        let mut pax_name = [0u8; 100];
        pax_name[..10].copy_from_slice(b"PaxHeader/");
        let n = ustar_name.len().min(90);
        pax_name[10..10 + n].copy_from_slice(&ustar_name[..n]);
        out.put_slice(&ustar_header(
            &pax_name[..10 + n],
            records.len() as u64,
            mtime,
            b'x',
        ));
        out.put_slice(&records);
        out.put_bytes(0, padding(records.len() as u64));
    }
    out.put_slice(&ustar_header(ustar_name, size, mtime, b'0'));
}

/// What the parser reports while it walks an archive.
#[derive(Debug, PartialEq, Eq)]
pub enum TarEvent<'a> {
    /// A regular file begins; its data starts at byte `offset` of the archive.
    File {
        name: String,
        size: u64,
        offset: u64,
    },
    /// Data of the current file, in order.
    Data(&'a [u8]),
    /// The current file's data is complete.
    FileEnd,
    /// An entry that is not a regular file (directory, link, device) was passed over.
    Skipped { name: String },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TarError(pub String);

enum State {
    /// Collecting a 512-byte header.
    Header,
    /// In the data of a regular file: bytes left, then padding.
    FileData {
        left: u64,
        pad: usize,
    },
    /// In data that is consumed by the parser (pax records, GNU long names) or skipped.
    Meta {
        kind: u8,
        left: u64,
        pad: usize,
    },
    /// After the first zero block.
    Zero,
    Done,
}

/// A streaming TAR parser: feed it the archive in pieces of any size with [`push`](Self::push)
/// and end with [`finish`](Self::finish).
pub struct TarParser {
    state: State,
    header: Vec<u8>,
    meta: Vec<u8>,
    /// Attributes from a pax `x` header or GNU `L` name, for the next entry only.
    next_path: Option<String>,
    next_size: Option<u64>,
    /// Bytes consumed so far.
    offset: u64,
    /// Largest pax/GNU metadata entry accepted.
    meta_bytes_max: u64,
}

impl Default for TarParser {
    fn default() -> Self {
        Self::new()
    }
}

/// A header's number field: octal digits, or GNU base-256.
pub fn parse_number(field: &[u8]) -> Result<u64, TarError> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // GNU base-256: the remaining bits, big-endian.
        if field[0] & 0x40 != 0 {
            return Err(TarError("negative number in header".into()));
        }
        let mut v: u64 = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            v = v
                .checked_mul(256)
                .and_then(|v| v.checked_add(u64::from(b)))
                .ok_or_else(|| TarError("number in header overflows".into()))?;
        }
        return Ok(v);
    }
    // Octal digits, optionally surrounded by spaces and ended by NUL or space; parsed in
    // place (this runs for every header of every archive parsed).
    let mut v: u64 = 0;
    for d in field
        .iter()
        .copied()
        .skip_while(|b| *b == b' ')
        .take_while(|b| *b != 0 && *b != b' ')
    {
        if !(b'0'..=b'7').contains(&d) {
            return Err(TarError(format!(
                "bad octal number {:?}",
                String::from_utf8_lossy(field)
            )));
        }
        v = v
            .checked_mul(8)
            .map(|v| v | u64::from(d - b'0'))
            .ok_or_else(|| TarError("number in header overflows".into()))?;
    }
    Ok(v)
}

fn field_str(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Verifies a header's checksum (unsigned sum, or the signed sum some old tars wrote).
pub fn checksum_ok(h: &[u8]) -> bool {
    let Ok(stored) = parse_number(&h[148..156]) else {
        return false;
    };
    // The sums with the checksum field taken as eight spaces (some old writers summed signed
    // bytes).
    let field = &h[148..156];
    let unsigned = unsigned_sum(h) - unsigned_sum(field) + 8 * u32::from(b' ');
    stored == u64::from(unsigned) || {
        let signed = signed_sum(h) - signed_sum(field) + 8 * i32::from(b' ');
        stored as i64 == i64::from(signed)
    }
}

/// Sum of the bytes of a header block, written so the compiler vectorises it with 16-bit
/// lanes (256 bytes of at most 255 cannot overflow one): this runs for every header written
/// and parsed.
fn unsigned_sum(b: &[u8]) -> u32 {
    b.chunks(256)
        .map(|c| u32::from(c.iter().fold(0u16, |a, &x| a.wrapping_add(u16::from(x)))))
        .sum()
}

/// [`unsigned_sum`] of one whole block, inlined into the header writer with its length known:
/// it runs for every entry of a batch GET and was 3% of the server's CPU as a call.
#[inline(always)]
fn block_sum(h: &[u8; BLOCK]) -> u32 {
    let (a, b) = h.split_at(BLOCK / 2);
    let half = |c: &[u8]| u32::from(c.iter().fold(0u16, |a, &x| a.wrapping_add(u16::from(x))));
    half(a) + half(b)
}

fn signed_sum(b: &[u8]) -> i32 {
    b.iter()
        .fold(0i32, |a, &x| a.wrapping_add(i32::from(x as i8)))
}

/// The records of a pax extended header (`LEN key=value\n`), as key and value bytes, up to
/// its end or zero padding.
pub fn pax_records(data: &[u8]) -> impl Iterator<Item = Result<(&[u8], &[u8]), TarError>> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() || rest.iter().all(|&b| b == 0) {
            return None;
        }
        let bad = || TarError("malformed pax header".into());
        let record = (|| {
            let sp = rest.iter().position(|&b| b == b' ').ok_or_else(bad)?;
            let len: usize = std::str::from_utf8(&rest[..sp])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(bad)?;
            if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
                return Err(bad());
            }
            let rec = &rest[sp + 1..len - 1];
            let eq = rec.iter().position(|&b| b == b'=').ok_or_else(bad)?;
            let out = (&rec[..eq], &rec[eq + 1..]);
            rest = &rest[len..];
            Ok(out)
        })();
        if record.is_err() {
            rest = &[];
        }
        Some(record)
    })
}

fn parse_pax(
    data: &[u8],
    path: &mut Option<String>,
    size: &mut Option<u64>,
) -> Result<(), TarError> {
    let bad = || TarError("malformed pax header".into());
    for record in pax_records(data) {
        let (k, v) = record?;
        match k {
            b"path" => {
                *path = Some(
                    String::from_utf8(v.to_vec())
                        .map_err(|_| TarError("pax path is not UTF-8".into()))?,
                )
            }
            b"size" => {
                *size = Some(
                    std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(bad)?,
                )
            }
            _ => {}
        }
    }
    Ok(())
}

impl TarParser {
    pub fn new() -> Self {
        Self {
            state: State::Header,
            header: Vec::with_capacity(BLOCK),
            meta: Vec::new(),
            next_path: None,
            next_size: None,
            offset: 0,
            meta_bytes_max: 1024 * 1024,
        }
    }

    /// Whether the end-of-archive marker has been seen; later input is ignored.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Feeds the next piece of the archive, reporting what it completes to `sink`. A sink
    /// error stops the parse and is returned.
    pub fn push<E: From<TarError>>(
        &mut self,
        mut input: &[u8],
        sink: &mut impl FnMut(TarEvent<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        while !input.is_empty() {
            match &mut self.state {
                State::Done => return Ok(()),
                State::Header | State::Zero => {
                    let take = (BLOCK - self.header.len()).min(input.len());
                    self.header.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    self.offset += take as u64;
                    if self.header.len() == BLOCK {
                        let h = std::mem::take(&mut self.header);
                        self.header_complete(&h, sink)?;
                        self.header = h;
                        self.header.clear();
                    }
                }
                State::FileData { left, pad } => {
                    if *left > 0 {
                        let take = (*left).min(input.len() as u64) as usize;
                        *left -= take as u64;
                        self.offset += take as u64;
                        let (data, rest) = input.split_at(take);
                        input = rest;
                        let finished = *left == 0;
                        sink(TarEvent::Data(data))?;
                        if finished {
                            sink(TarEvent::FileEnd)?;
                        }
                    } else {
                        let take = (*pad).min(input.len());
                        *pad -= take;
                        self.offset += take as u64;
                        input = &input[take..];
                    }
                    if let State::FileData { left: 0, pad: 0 } = self.state {
                        self.state = State::Header;
                    }
                }
                State::Meta { kind, left, pad } => {
                    let kind = *kind;
                    if *left > 0 {
                        let take = (*left).min(input.len() as u64) as usize;
                        *left -= take as u64;
                        if matches!(kind, b'x' | b'L') {
                            self.meta.extend_from_slice(&input[..take]);
                        }
                        self.offset += take as u64;
                        input = &input[take..];
                    } else {
                        let take = (*pad).min(input.len());
                        *pad -= take;
                        self.offset += take as u64;
                        input = &input[take..];
                    }
                    if let State::Meta {
                        left: 0, pad: 0, ..
                    } = self.state
                    {
                        let meta = std::mem::take(&mut self.meta);
                        match kind {
                            b'x' => parse_pax(&meta, &mut self.next_path, &mut self.next_size)
                                .map_err(E::from)?,
                            b'L' => {
                                let end = meta.iter().position(|&b| b == 0).unwrap_or(meta.len());
                                self.next_path =
                                    Some(String::from_utf8(meta[..end].to_vec()).map_err(
                                        |_| E::from(TarError("GNU long name is not UTF-8".into())),
                                    )?);
                            }
                            _ => {}
                        }
                        self.state = State::Header;
                    }
                }
            }
        }
        Ok(())
    }

    fn header_complete<E: From<TarError>>(
        &mut self,
        h: &[u8],
        sink: &mut impl FnMut(TarEvent<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let at = self.offset - BLOCK as u64;
        if h.iter().all(|&b| b == 0) {
            self.state = match self.state {
                State::Zero => State::Done,
                _ => State::Zero,
            };
            return Ok(());
        }
        if matches!(self.state, State::Zero) {
            return Err(E::from(TarError(format!(
                "a lone zero block before a header at byte {at}"
            ))));
        }
        if !checksum_ok(h) {
            return Err(E::from(TarError(format!(
                "bad header checksum at byte {at} (not a TAR archive, or corrupt)"
            ))));
        }
        let typeflag = h[156];
        let header_size = parse_number(&h[124..136]).map_err(E::from)?;
        let header_name = || {
            let name = field_str(&h[0..100]);
            if &h[257..262] == b"ustar" {
                let prefix = field_str(&h[345..500]);
                if !prefix.is_empty() {
                    return format!("{prefix}/{name}");
                }
            }
            name
        };
        match typeflag {
            b'x' | b'g' | b'L' | b'K' => {
                if header_size > self.meta_bytes_max {
                    return Err(E::from(TarError(format!(
                        "extended header of {header_size} bytes at byte {at} is too large"
                    ))));
                }
                self.meta.clear();
                self.state = State::Meta {
                    kind: typeflag,
                    left: header_size,
                    pad: padding(header_size),
                };
                if header_size == 0 {
                    self.state = State::Header;
                }
                Ok(())
            }
            _ => {
                let name = self.next_path.take().unwrap_or_else(header_name);
                let size = self.next_size.take().unwrap_or(header_size);
                let regular = matches!(typeflag, b'0' | 0 | b'7');
                // Links, directories and devices carry no data in practice; a size is honoured
                // anyway so the walk stays in step.
                let data_size = match typeflag {
                    b'1' | b'2' | b'3' | b'4' | b'5' | b'6' => 0,
                    _ => size,
                };
                if regular {
                    sink(TarEvent::File {
                        name,
                        size,
                        offset: self.offset,
                    })?;
                    if size == 0 {
                        sink(TarEvent::FileEnd)?;
                    }
                } else {
                    sink(TarEvent::Skipped { name })?;
                }
                self.state = if data_size == 0 {
                    State::Header
                } else if regular {
                    State::FileData {
                        left: data_size,
                        pad: padding(data_size),
                    }
                } else {
                    State::Meta {
                        kind: typeflag,
                        left: data_size,
                        pad: padding(data_size),
                    }
                };
                Ok(())
            }
        }
    }

    /// Ends the parse: the archive must end at an entry boundary (the end-of-archive blocks
    /// are optional, as for Python's `tarfile`).
    pub fn finish(&self) -> Result<(), TarError> {
        match &self.state {
            State::Done | State::Zero => Ok(()),
            State::Header if self.header.is_empty() => {
                if self.offset == 0 {
                    Err(TarError("empty input is not a TAR archive".into()))
                } else {
                    Ok(())
                }
            }
            State::Header => Err(TarError(format!(
                "truncated header at byte {}",
                self.offset - self.header.len() as u64
            ))),
            State::FileData { .. } | State::Meta { .. } => Err(TarError(format!(
                "archive truncated inside an entry at byte {}",
                self.offset
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in entries {
            write_entry_header(
                &mut out,
                name,
                data.len() as u64,
                1_700_000_000,
                &[("packrat.etag", "abc")],
            );
            out.extend_from_slice(data);
            out.resize(out.len() + padding(data.len() as u64), 0);
        }
        out.extend_from_slice(&END_OF_ARCHIVE);
        out
    }

    fn parse_all(bytes: &[u8], piece: usize) -> Result<Vec<(String, u64, Vec<u8>)>, TarError> {
        let mut p = TarParser::new();
        let mut files: Vec<(String, u64, Vec<u8>)> = Vec::new();
        for c in bytes.chunks(piece.max(1)) {
            p.push(c, &mut |ev| {
                match ev {
                    TarEvent::File { name, offset, .. } => files.push((name, offset, Vec::new())),
                    TarEvent::Data(d) => files.last_mut().unwrap().2.extend_from_slice(d),
                    TarEvent::FileEnd | TarEvent::Skipped { .. } => {}
                }
                Ok::<(), TarError>(())
            })?;
        }
        p.finish()?;
        Ok(files)
    }

    #[test]
    fn pax_record_lengths_count_themselves() {
        for n in [0usize, 1, 5, 6, 7, 90, 95, 96, 97, 995, 996, 1000] {
            let mut out = Vec::new();
            pax_record(&mut out, "k", &"v".repeat(n));
            let sp = out.iter().position(|&b| b == b' ').unwrap();
            let len: usize = std::str::from_utf8(&out[..sp]).unwrap().parse().unwrap();
            assert_eq!(len, out.len(), "value length {n}");
        }
    }

    #[test]
    fn roundtrip_any_piece_size() {
        let long = "d/".repeat(80) + "long-name-ü.bin";
        let big = vec![7u8; 3000];
        let entries: Vec<(&str, &[u8])> = vec![
            ("a.txt", b"hello"),
            ("empty", b""),
            (&long, &big),
            ("z", b"x"),
        ];
        let bytes = archive(&entries);
        for piece in [1, 7, 511, 512, 513, 4096, bytes.len()] {
            let files = parse_all(&bytes, piece).unwrap();
            assert_eq!(files.len(), 4);
            for ((name, offset, data), (want_name, want)) in files.iter().zip(&entries) {
                assert_eq!(name, want_name);
                assert_eq!(&data[..], *want);
                let o = *offset as usize;
                assert_eq!(&bytes[o..o + want.len()], *want);
            }
        }
    }

    #[test]
    fn octal_and_decimal_helpers() {
        let mut f = [0u8; 8];
        octal(&mut f, 0o644);
        assert_eq!(&f, b"0000644\0");
        let mut out = Vec::new();
        for v in [0usize, 9, 10, 99, 100, 12345] {
            out.clear();
            push_decimal(&mut out, v);
            assert_eq!(out, v.to_string().as_bytes());
            assert_eq!(decimal_len(v), v.to_string().len());
        }
    }

    #[test]
    fn header_fields_match_ustar() {
        let mut out = Vec::new();
        write_entry_header(&mut out, "n", 1234, 5, &[]);
        assert_eq!(out.len(), BLOCK, "no pax header when nothing needs one");
        assert_eq!(&out[124..136], b"00000002322\0");
        assert!(checksum_ok(&out));
    }

    #[test]
    fn corrupt_and_truncated_archives_are_refused() {
        let bytes = archive(&[("a", b"0123456789")]);
        let mut bad_header = bytes.clone();
        bad_header[3] ^= 0x20;
        assert!(parse_all(&bad_header, 100).is_err());
        // Truncated in the data.
        let data_start = 3 * BLOCK;
        assert!(parse_all(&bytes[..data_start + 4], 64).is_err());
        // Truncated in a header.
        assert!(parse_all(&bytes[..100], 64).is_err());
        // Not a TAR at all.
        assert!(parse_all(&[b'x'; 2048], 512).is_err());
        assert!(parse_all(&[], 512).is_err());
        // Ending at an entry boundary without the end blocks is accepted.
        let cut = bytes.len() - 2 * BLOCK;
        assert_eq!(parse_all(&bytes[..cut], 512).unwrap().len(), 1);
    }

    #[test]
    fn signed_checksums_prefixes_and_octal_fields() {
        // A name with bytes >= 0x80, so the signed and unsigned sums differ; the ustar prefix
        // field holds the directory.
        let mut h = ustar_header(b"caf\xc3\xa9.txt", 3, 0, b'0');
        h[345..350].copy_from_slice(b"a/b/c");
        h[148..156].copy_from_slice(b"        ");
        let signed: i32 = h.iter().map(|&b| i32::from(b as i8)).sum();
        let unsigned: u32 = h.iter().map(|&b| u32::from(b)).sum();
        assert_ne!(i64::from(signed), i64::from(unsigned));
        for sum in [u64::from(unsigned), signed as u64] {
            let mut out = h;
            octal(&mut out[148..155], sum);
            out[155] = b' ';
            let mut bytes = out.to_vec();
            bytes.extend_from_slice(b"xyz");
            bytes.resize(2 * BLOCK, 0);
            bytes.extend_from_slice(&END_OF_ARCHIVE);
            let files = parse_all(&bytes, 100).unwrap();
            assert_eq!(files[0].0, "a/b/c/caf\u{e9}.txt");
            assert_eq!(files[0].2, b"xyz");
        }
        assert_eq!(parse_number(b" 0000017 ").unwrap(), 15);
        assert_eq!(parse_number(b"\0\0\0").unwrap(), 0);
        assert!(parse_number(b"00000009").is_err());
        assert!(parse_number(b"7777777777777777777777777").is_err());
    }

    #[test]
    fn directories_and_gnu_long_names() {
        let mut out = Vec::new();
        out.extend_from_slice(&ustar_header(b"dir/", 0, 0, b'5'));
        let long = "x".repeat(150);
        let mut name_data = long.as_bytes().to_vec();
        name_data.push(0);
        out.extend_from_slice(&ustar_header(
            b"././@LongLink",
            name_data.len() as u64,
            0,
            b'L',
        ));
        out.extend_from_slice(&name_data);
        out.resize(out.len() + padding(name_data.len() as u64), 0);
        out.extend_from_slice(&ustar_header(b"trunc", 3, 0, b'0'));
        out.extend_from_slice(b"abc");
        out.resize(out.len() + padding(3), 0);
        let files = parse_all(&out, 100).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, long);
        assert_eq!(files[0].2, b"abc");
    }

    proptest::proptest! {
        #[test]
        fn parser_never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096), piece in 1usize..700) {
            let _ = parse_all(&data, piece);
        }
    }
}
