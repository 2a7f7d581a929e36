//! Request bodies: plain, or `aws-chunked` (signed chunks, unsigned chunks with trailing
//! checksums, signed chunks with a signed trailer). [`BodyReader`] yields the decoded payload
//! piece by piece, verifies chunk and trailer signatures and the `x-amz-content-sha256` of
//! plain bodies, and keeps the trailing headers for the checksum check. Memory is bounded by
//! the largest frame hyper hands over plus one chunk-header line.

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::sigv4;
use bytes::{Buf, Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use sha2::{Digest, Sha256};

/// Longest chunk-size line or trailer line accepted in an aws-chunked body.
const CHUNK_LINE_BYTES_MAX: usize = 4096;
/// Most trailing header lines accepted.
const TRAILER_LINES_MAX: usize = 16;

/// What the signer sent in `x-amz-content-sha256`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadMode {
    Unsigned,
    Sha256(String),
    StreamingSigned { trailer: bool },
    StreamingUnsignedTrailer,
}

impl PayloadMode {
    pub fn from_header(v: Option<&str>) -> S3Result<Self> {
        Ok(match v {
            None | Some(sigv4::UNSIGNED_PAYLOAD) => PayloadMode::Unsigned,
            Some(sigv4::STREAMING_SIGNED) => PayloadMode::StreamingSigned { trailer: false },
            Some(sigv4::STREAMING_SIGNED_TRAILER) => PayloadMode::StreamingSigned { trailer: true },
            Some(sigv4::STREAMING_UNSIGNED_TRAILER) => PayloadMode::StreamingUnsignedTrailer,
            Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()) => {
                PayloadMode::Sha256(h.to_ascii_lowercase())
            }
            Some(_) => {
                return Err(S3Error::new(
                    S3ErrorCode::InvalidArgument,
                    "x-amz-content-sha256 must be a SHA-256 hex digest or a known payload mode",
                ));
            }
        })
    }

    pub fn is_chunked(&self) -> bool {
        matches!(
            self,
            PayloadMode::StreamingSigned { .. } | PayloadMode::StreamingUnsignedTrailer
        )
    }
}

/// What a signed streaming body needs to check its chunks.
#[derive(Clone)]
pub struct ChunkSigning {
    pub signing_key: [u8; 32],
    pub amz_date: String,
    pub scope: String,
    pub seed_signature: String,
}

enum ChunkState {
    Header,
    Data { remaining: u64 },
    DataEnd,
    Trailer,
    Done,
}

/// Where body bytes come from: the HTTP connection, or a list of frames (tests, fuzzing).
pub enum BodySource {
    Hyper(Incoming),
    #[cfg_attr(not(test), allow(dead_code))]
    Frames(std::collections::VecDeque<Bytes>),
}

pub struct BodyReader {
    body: Option<BodySource>,
    mode: PayloadMode,
    signing: Option<ChunkSigning>,
    previous_signature: String,
    buf: BytesMut,
    state: ChunkState,
    chunk_sig: Option<String>,
    chunk_hasher: Option<Sha256>,
    body_hasher: Option<Sha256>,
    decoded_bytes: u64,
    expected_decoded: Option<u64>,
    bytes_max: u64,
    pub trailers: Vec<(String, String)>,
    finished: bool,
    idle_timeout: std::time::Duration,
}

fn incomplete(msg: &str) -> S3Error {
    S3Error::new(S3ErrorCode::IncompleteBody, msg)
}

fn bad_chunk(msg: &str) -> S3Error {
    S3Error::new(
        S3ErrorCode::InvalidRequest,
        format!("malformed aws-chunked body: {msg}"),
    )
}

impl BodyReader {
    /// `expected_decoded` is Content-Length for plain bodies, `x-amz-decoded-content-length`
    /// for chunked ones; `bytes_max` bounds the decoded payload (EntityTooLarge past it).
    pub fn new(
        body: Option<BodySource>,
        mode: PayloadMode,
        signing: Option<ChunkSigning>,
        expected_decoded: Option<u64>,
        bytes_max: u64,
    ) -> Self {
        let body_hasher = matches!(mode, PayloadMode::Sha256(_)).then(Sha256::new);
        let previous_signature = signing
            .as_ref()
            .map(|s| s.seed_signature.clone())
            .unwrap_or_default();
        Self {
            body,
            mode,
            signing,
            previous_signature,
            buf: BytesMut::new(),
            state: ChunkState::Header,
            chunk_sig: None,
            chunk_hasher: None,
            body_hasher,
            decoded_bytes: 0,
            expected_decoded,
            bytes_max,
            trailers: Vec::new(),
            finished: false,
            idle_timeout: std::time::Duration::from_secs(crate::config::BODY_IDLE_TIMEOUT_SECS),
        }
    }

    /// Sets the longest pause allowed between two pieces of the body.
    pub fn with_idle_timeout(mut self, idle_timeout: std::time::Duration) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    /// Reads the next raw frame of the HTTP body; `None` at its end.
    async fn raw_frame(&mut self) -> S3Result<Option<Bytes>> {
        let body = match self.body.as_mut() {
            None => return Ok(None),
            Some(BodySource::Frames(f)) => return Ok(f.pop_front()),
            Some(BodySource::Hyper(b)) => b,
        };
        loop {
            // A client that stops sending mid-body must not hold its connection and task
            // forever (slowloris): each frame has to arrive within the idle limit.
            let frame = tokio::time::timeout(self.idle_timeout, body.frame())
            .await
            .map_err(|_| {
                S3Error::new(
                    S3ErrorCode::RequestTimeout,
                    "Your socket connection to the server was not read from or written to within the timeout period.",
                )
            })?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => {
                    return Err(incomplete(&format!("the request body was cut short: {e}")));
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data()
                        && !data.is_empty()
                    {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    fn account(&mut self, n: u64) -> S3Result<()> {
        self.decoded_bytes += n;
        if self.decoded_bytes > self.bytes_max {
            return Err(S3Error::new(
                S3ErrorCode::EntityTooLarge,
                format!(
                    "Your proposed upload exceeds the maximum allowed size of {} bytes",
                    self.bytes_max
                ),
            ));
        }
        if let Some(exp) = self.expected_decoded
            && self.decoded_bytes > exp
        {
            return Err(incomplete("the body is longer than its declared length"));
        }
        Ok(())
    }

    /// The next piece of decoded payload, or `None` once the body ended and verified.
    pub async fn next(&mut self) -> S3Result<Option<Bytes>> {
        if self.finished {
            return Ok(None);
        }
        let piece = if self.mode.is_chunked() {
            self.next_chunked().await?
        } else {
            let f = self.raw_frame().await?;
            if let Some(d) = &f {
                self.account(d.len() as u64)?;
                if let Some(h) = self.body_hasher.as_mut() {
                    h.update(d);
                }
            }
            f
        };
        if piece.is_none() {
            self.finish()?;
        }
        Ok(piece)
    }

    fn finish(&mut self) -> S3Result<()> {
        self.finished = true;
        if let Some(exp) = self.expected_decoded
            && self.decoded_bytes != exp
        {
            return Err(incomplete(&format!(
                "the body has {} bytes but {} were declared",
                self.decoded_bytes, exp
            )));
        }
        if let (PayloadMode::Sha256(want), Some(h)) = (&self.mode, self.body_hasher.take()) {
            let got = hex::encode(h.finalize());
            if &got != want {
                return Err(S3Error::new(
                    S3ErrorCode::XAmzContentSHA256Mismatch,
                    "The provided 'x-amz-content-sha256' header does not match what was computed.",
                ));
            }
        }
        Ok(())
    }

    /// Takes one CRLF-terminated line from the buffer, reading more of the body as needed.
    /// Returns `None` if the body ended first.
    async fn line(&mut self) -> S3Result<Option<String>> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf.split_to(pos);
                self.buf.advance(2);
                return String::from_utf8(line.to_vec())
                    .map(Some)
                    .map_err(|_| bad_chunk("a chunk line is not UTF-8"));
            }
            if self.buf.len() > CHUNK_LINE_BYTES_MAX {
                return Err(bad_chunk("a chunk line is too long"));
            }
            match self.raw_frame().await? {
                Some(d) => self.buf.extend_from_slice(&d),
                None => return Ok(None),
            }
        }
    }

    fn verify_chunk(&mut self, data_hash_hex: &str) -> S3Result<()> {
        let Some(s) = &self.signing else {
            return Ok(());
        };
        let sent = self
            .chunk_sig
            .take()
            .ok_or_else(|| bad_chunk("a chunk of a signed body carries no chunk-signature"))?;
        let want = sigv4::chunk_signature(
            &s.signing_key,
            &s.amz_date,
            &s.scope,
            &self.previous_signature,
            data_hash_hex,
        );
        if !sigv4::signatures_equal(&sent, &want) {
            return Err(S3Error::new(
                S3ErrorCode::SignatureDoesNotMatch,
                "A chunk signature of the streaming body does not match",
            ));
        }
        self.previous_signature = want;
        Ok(())
    }

    async fn next_chunked(&mut self) -> S3Result<Option<Bytes>> {
        loop {
            match self.state {
                ChunkState::Header => {
                    let Some(line) = self.line().await? else {
                        return Err(incomplete(
                            "the aws-chunked body ended inside a chunk header",
                        ));
                    };
                    let (size_hex, ext) = line.split_once(';').unwrap_or((&line, ""));
                    let size = u64::from_str_radix(size_hex.trim(), 16)
                        .map_err(|_| bad_chunk("bad chunk size"))?;
                    self.chunk_sig = ext
                        .trim()
                        .strip_prefix("chunk-signature=")
                        .map(|s| s.trim().to_string());
                    if size == 0 {
                        self.verify_chunk(sigv4::EMPTY_SHA256)?;
                        self.state = ChunkState::Trailer;
                    } else {
                        self.chunk_hasher = self.signing.as_ref().map(|_| Sha256::new());
                        self.state = ChunkState::Data { remaining: size };
                    }
                }
                ChunkState::Data { remaining } => {
                    if self.buf.is_empty() {
                        match self.raw_frame().await? {
                            Some(d) => self.buf.extend_from_slice(&d),
                            None => {
                                return Err(incomplete(
                                    "the aws-chunked body ended inside a chunk",
                                ));
                            }
                        }
                    }
                    let n = remaining.min(self.buf.len() as u64) as usize;
                    let data = self.buf.split_to(n).freeze();
                    if let Some(h) = self.chunk_hasher.as_mut() {
                        h.update(&data);
                    }
                    let left = remaining - n as u64;
                    self.state = if left == 0 {
                        ChunkState::DataEnd
                    } else {
                        ChunkState::Data { remaining: left }
                    };
                    self.account(n as u64)?;
                    return Ok(Some(data));
                }
                ChunkState::DataEnd => {
                    match self.line().await? {
                        Some(l) if l.is_empty() => {}
                        _ => return Err(bad_chunk("chunk data is not followed by CRLF")),
                    }
                    if let Some(h) = self.chunk_hasher.take() {
                        let hash = hex::encode(h.finalize());
                        self.verify_chunk(&hash)?;
                    }
                    self.state = ChunkState::Header;
                }
                ChunkState::Trailer => {
                    let mut trailer_sig = None;
                    let mut canonical = String::new();
                    loop {
                        let line = match self.line().await? {
                            None => {
                                // Some clients end the body right after the last trailer line.
                                let rest = std::mem::take(&mut self.buf);
                                if rest.is_empty() {
                                    break;
                                }
                                String::from_utf8(rest.to_vec())
                                    .map_err(|_| bad_chunk("a trailer is not UTF-8"))?
                            }
                            Some(l) => l,
                        };
                        if line.is_empty() {
                            break;
                        }
                        // Without a signed trailer nothing after the last chunk is signed: a
                        // trailing header there could be anything a middlebox added.
                        if self.mode == (PayloadMode::StreamingSigned { trailer: false }) {
                            return Err(bad_chunk(
                                "a signed body without a signed trailer ends after its last chunk",
                            ));
                        }
                        if self.trailers.len() >= TRAILER_LINES_MAX {
                            return Err(bad_chunk("too many trailing headers"));
                        }
                        let (k, v) = line
                            .split_once(':')
                            .ok_or_else(|| bad_chunk("a trailer line has no ':'"))?;
                        let k = k.trim().to_ascii_lowercase();
                        let v = v.trim().to_string();
                        if k == "x-amz-trailer-signature" {
                            trailer_sig = Some(v);
                        } else {
                            canonical.push_str(&format!("{k}:{v}\n"));
                            self.trailers.push((k, v));
                        }
                    }
                    if matches!(self.mode, PayloadMode::StreamingSigned { trailer: true })
                        && let Some(s) = &self.signing
                    {
                        let sent = trailer_sig.ok_or_else(|| {
                            bad_chunk("a signed trailer carries no x-amz-trailer-signature")
                        })?;
                        let want = sigv4::trailer_signature(
                            &s.signing_key,
                            &s.amz_date,
                            &s.scope,
                            &self.previous_signature,
                            &canonical,
                        );
                        if !sigv4::signatures_equal(&sent, &want) {
                            return Err(S3Error::new(
                                S3ErrorCode::SignatureDoesNotMatch,
                                "The trailer signature of the streaming body does not match",
                            ));
                        }
                    }
                    self.state = ChunkState::Done;
                }
                ChunkState::Done => return Ok(None),
            }
        }
    }

    /// Reads and drops what is left of the raw body, up to `limit` bytes and for at most
    /// `within`; true once the body has ended (its connection can carry the next request).
    /// A body already read to its end, or an empty one, costs no wait.
    pub async fn discard_rest(&mut self, limit: u64, within: std::time::Duration) -> bool {
        use http_body::Body as _;
        if self.finished {
            return true;
        }
        match &self.body {
            None => return true,
            Some(BodySource::Hyper(b)) if b.is_end_stream() => return true,
            Some(BodySource::Frames(f)) if f.is_empty() => return true,
            _ => {}
        }
        let mut seen = 0u64;
        let drained = tokio::time::timeout(within, async {
            loop {
                match self.raw_frame().await {
                    Ok(Some(d)) => {
                        seen += d.len() as u64;
                        if seen > limit {
                            return false;
                        }
                    }
                    Ok(None) => return true,
                    Err(_) => return false,
                }
            }
        })
        .await;
        self.finished = true;
        matches!(drained, Ok(true))
    }

    /// Reads the whole (small) body into memory, refusing more than `limit` bytes.
    pub async fn read_to_end(&mut self, limit: usize) -> S3Result<Vec<u8>> {
        let mut out = Vec::new();
        while let Some(d) = self.next().await? {
            if out.len() + d.len() > limit {
                return Err(S3Error::new(
                    S3ErrorCode::InvalidRequest,
                    format!("the request body exceeds the {limit}-byte limit for this operation"),
                ));
            }
            out.extend_from_slice(&d);
        }
        Ok(out)
    }

    pub fn trailer(&self, name: &str) -> Option<&str> {
        self.trailers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A request body is what a write streams into the store. Its errors (a bad chunk signature,
/// an incomplete body, a timeout) travel through the store unchanged, as `StoreError::Source`.
#[async_trait::async_trait]
impl packrat_store_api::ByteSource for BodyReader {
    async fn next_piece(&mut self) -> packrat_store_api::StoreResult<Option<Bytes>> {
        self.next()
            .await
            .map_err(|e| packrat_store_api::StoreError::Source(std::sync::Arc::new(e)))
    }

    fn trailing_checksum(
        &self,
        alg: packrat_store_api::checksum::ChecksumAlgorithm,
    ) -> packrat_store_api::StoreResult<Option<Vec<u8>>> {
        use super::checksum::ChecksumWire;
        match self.trailer(alg.header()) {
            Some(v) => super::checksum::decode_sent(alg, v)
                .map(Some)
                .map_err(|e| packrat_store_api::StoreError::Source(std::sync::Arc::new(e))),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader(
        frames: &[&[u8]],
        mode: PayloadMode,
        signing: Option<ChunkSigning>,
        len: u64,
    ) -> BodyReader {
        let f = frames.iter().map(|f| Bytes::copy_from_slice(f)).collect();
        BodyReader::new(
            Some(BodySource::Frames(f)),
            mode,
            signing,
            Some(len),
            1 << 30,
        )
    }

    async fn drain(r: &mut BodyReader) -> S3Result<Vec<u8>> {
        r.read_to_end(1 << 20).await
    }

    #[tokio::test]
    async fn unsigned_trailer_body_split_anywhere() {
        let body = b"5\r\nhello\r\n6\r\n world\r\n0\r\nx-amz-checksum-crc32:DUoRhQ==\r\n\r\n";
        for cut in 1..body.len() {
            let mut r = reader(
                &[&body[..cut], &body[cut..]],
                PayloadMode::StreamingUnsignedTrailer,
                None,
                11,
            );
            assert_eq!(drain(&mut r).await.unwrap(), b"hello world");
            assert_eq!(r.trailer("x-amz-checksum-crc32"), Some("DUoRhQ=="));
        }
    }

    #[tokio::test]
    async fn aws_documented_signed_chunks() {
        let key = sigv4::derive_signing_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "20130524",
            "us-east-1",
            "s3",
        );
        let signing = ChunkSigning {
            signing_key: key,
            amz_date: "20130524T000000Z".into(),
            scope: "20130524/us-east-1/s3/aws4_request".into(),
            seed_signature: "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
                .into(),
        };
        let mut body = Vec::new();
        body.extend_from_slice(b"10000;chunk-signature=ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648\r\n");
        body.extend_from_slice(&[b'a'; 65536]);
        body.extend_from_slice(b"\r\n400;chunk-signature=0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497\r\n");
        body.extend_from_slice(&[b'a'; 1024]);
        body.extend_from_slice(b"\r\n0;chunk-signature=b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9\r\n\r\n");
        let mode = PayloadMode::StreamingSigned { trailer: false };
        let mut r = reader(&[&body], mode.clone(), Some(signing.clone()), 66560);
        assert_eq!(drain(&mut r).await.unwrap().len(), 66560);
        // Trailing headers after the last chunk are outside every signature: refused.
        let mut trailed = body.clone();
        trailed.truncate(trailed.len() - 2);
        trailed.extend_from_slice(b"x-amz-checksum-crc32:AAAAAA==\r\n\r\n");
        let mut r = reader(&[&trailed], mode.clone(), Some(signing.clone()), 66560);
        assert_eq!(
            drain(&mut r).await.unwrap_err().code,
            S3ErrorCode::InvalidRequest
        );
        // One flipped payload byte breaks the chunk signature.
        body[200] = b'b';
        let mut r = reader(&[&body], mode, Some(signing), 66560);
        assert_eq!(
            drain(&mut r).await.unwrap_err().code,
            S3ErrorCode::SignatureDoesNotMatch
        );
    }

    #[tokio::test]
    async fn truncated_and_mismatched_bodies_fail() {
        let mut r = reader(
            &[b"5\r\nhel"],
            PayloadMode::StreamingUnsignedTrailer,
            None,
            5,
        );
        assert_eq!(
            drain(&mut r).await.unwrap_err().code,
            S3ErrorCode::IncompleteBody
        );
        let mut r = reader(&[b"abc"], PayloadMode::Unsigned, None, 4);
        assert_eq!(
            drain(&mut r).await.unwrap_err().code,
            S3ErrorCode::IncompleteBody
        );
        let mut r = reader(
            &[b"abc"],
            PayloadMode::Sha256(sigv4::EMPTY_SHA256.into()),
            None,
            3,
        );
        assert_eq!(
            drain(&mut r).await.unwrap_err().code,
            S3ErrorCode::XAmzContentSHA256Mismatch
        );
        let mut r = reader(&[b"zz\r\n"], PayloadMode::StreamingUnsignedTrailer, None, 5);
        assert_eq!(
            drain(&mut r).await.unwrap_err().code,
            S3ErrorCode::InvalidRequest
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Hostile aws-chunked bodies, cut anywhere, in every mode: an error or bytes, never
        /// a panic or a hang.
        #[test]
        fn chunked_decoder_never_panics(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
            cut in 0usize..600,
            len in 0u64..700,
            mode in 0u8..5,
        ) {
            let mode = match mode {
                0 => PayloadMode::StreamingUnsignedTrailer,
                1 => PayloadMode::Unsigned,
                2 => PayloadMode::Sha256("0".repeat(64)),
                3 => PayloadMode::StreamingSigned { trailer: true },
                _ => PayloadMode::StreamingSigned { trailer: false },
            };
            let cut = cut.min(body.len());
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let signing = matches!(mode, PayloadMode::StreamingSigned { .. }).then(|| ChunkSigning {
                signing_key: [7; 32],
                amz_date: "20130524T000000Z".into(),
                scope: "20130524/us-east-1/s3/aws4_request".into(),
                seed_signature: "0".repeat(64),
            });
            let mut r = reader(&[&body[..cut], &body[cut..]], mode, signing, len);
            let _ = rt.block_on(drain(&mut r));
        }
    }
}
