//! The byte streams of server-side encryption: a write's plaintext sealed block by block as
//! it arrives (checking its Content-MD5 and checksum on the way), and a read's blocks opened,
//! whole objects, ranges and objects sealed part by part.

use super::*;
/// What a sealed write checks of its plaintext, as a store checks a plain one's bytes.
#[derive(Default)]
pub struct PlainChecks {
    pub content_md5: Option<[u8; 16]>,
    pub checksum: Option<ChecksumAlgorithm>,
    /// Sent up front; one sent as a trailer comes from the inner source at the end.
    pub expected_checksum: Option<Vec<u8>>,
}

/// A byte source that seals another's plaintext block by block, checking its Content-MD5 and
/// flexible checksum as it goes (the store sees only ciphertext, so it cannot).
pub struct Sealing<'a> {
    inner: &'a mut dyn ByteSource,
    cipher: ObjectCipher,
    buf: BytesMut,
    block: u64,
    ended: bool,
    md5: Option<Md5>,
    hasher: Option<Hasher>,
    checks: PlainChecks,
    /// The plaintext's checksum (raw bytes) once it has ended.
    pub computed_checksum: Option<Vec<u8>>,
    /// The plaintext's MD5 once it has ended, when it is computed.
    plain_md5: Option<[u8; 16]>,
    /// Bytes handed out before the first block (a part's salt).
    prefix: Option<Bytes>,
}

impl<'a> Sealing<'a> {
    pub fn new(inner: &'a mut dyn ByteSource, cipher: ObjectCipher, checks: PlainChecks) -> Self {
        let is_sse_s3 = cipher.is_sse_s3();
        Self {
            inner,
            cipher,
            buf: BytesMut::new(),
            block: 0,
            ended: false,
            // SSE-S3 shows the plaintext's MD5 as its ETag, so it is always computed then.
            md5: (checks.content_md5.is_some() || is_sse_s3).then(Md5::new),
            hasher: checks.checksum.map(Hasher::new),
            checks,
            computed_checksum: None,
            plain_md5: None,
            prefix: None,
        }
    }

    /// A source that seals one part of an upload whose object cipher is `upload`: a new salt,
    /// then the part's blocks under the part's key.
    pub fn part(inner: &'a mut dyn ByteSource, upload: &ObjectCipher, checks: PlainChecks) -> Self {
        let salt: [u8; sealed::PART_SALT as usize] = rand::random();
        let mut s = Self::new(inner, upload.part(&salt), checks);
        s.prefix = Some(Bytes::copy_from_slice(&salt));
        s
    }

    /// Seals the first `n` buffered bytes as the next block.
    fn seal(&mut self, n: usize, last: bool) -> Bytes {
        let mut blk = self.buf.split_to(n);
        let nonce = ObjectCipher::nonce(self.block, last);
        self.block += 1;
        let tag = self
            .cipher
            .cipher
            .seal_in_place_separate_tag(nonce, Aad::empty(), &mut blk)
            .expect("AES-GCM seals any block shorter than 64 GiB");
        blk.extend_from_slice(tag.as_ref());
        blk.freeze()
    }

    fn finish_checks(&mut self) -> StoreResult<()> {
        if let Some(m) = self.md5.take() {
            let got: [u8; 16] = m.finalize().into();
            if self.checks.content_md5.is_some_and(|want| want != got) {
                return Err(StoreError::BadDigest(Digest::ContentMd5));
            }
            self.plain_md5 = Some(got);
        }
        if let (Some(h), Some(alg)) = (self.hasher.take(), self.checks.checksum) {
            let (got, _) = h.finish();
            let want = match self.checks.expected_checksum.take() {
                Some(w) => Some(w),
                None => self.inner.trailing_checksum(alg)?,
            };
            if want.is_some_and(|w| w != got) {
                return Err(StoreError::BadDigest(Digest::Checksum(alg)));
            }
            self.computed_checksum = Some(got);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ByteSource for Sealing<'_> {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        if let Some(p) = self.prefix.take() {
            return Ok(Some(p));
        }
        let block = BLOCK as usize;
        loop {
            // A full block is sealed only once more follows: the last block is marked.
            if self.buf.len() > block {
                let mut out = BytesMut::new();
                while self.buf.len() > block {
                    out.extend_from_slice(&self.seal(block, false));
                }
                return Ok(Some(out.freeze()));
            }
            if self.ended {
                return Ok(None);
            }
            match self.inner.next_piece().await? {
                Some(p) => {
                    if let Some(m) = self.md5.as_mut() {
                        m.update(&p);
                    }
                    if let Some(h) = self.hasher.as_mut() {
                        h.update(&p);
                    }
                    self.buf.extend_from_slice(&p);
                }
                None => {
                    self.ended = true;
                    self.finish_checks()?;
                    let n = self.buf.len();
                    return Ok(Some(self.seal(n, true)));
                }
            }
        }
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        // The store is asked for no checksum of the ciphertext.
        Ok(None)
    }

    /// An SSE-S3 object's ETag is its plaintext's MD5, as in S3; an SSE-C object's stays the
    /// stored bytes' (S3's is not the plaintext's MD5 either); the same for a part. A cluster
    /// store takes it for whole objects (its nodes keep the stored bytes' MD5 beside it for
    /// the checks of their copies), not for parts.
    fn shown_md5(&self) -> Option<[u8; 16]> {
        if self.cipher.is_sse_s3() {
            self.plain_md5
        } else {
            None
        }
    }
}

/// Plaintext bytes `[start, end)` of a sealed object (`size` is the plaintext's), reading and
/// authenticating only the blocks they fall in.
pub fn read_plain(
    store: &dyn Store,
    obj: &ObjectInfo,
    cipher: ObjectCipher,
    start: u64,
    end: u64,
) -> StoreResult<Box<dyn ObjectRead>> {
    if is_sealed_by_part(obj) {
        return read_plain_parts(store, obj, cipher, start, end);
    }
    let size = shown_size(obj);
    let last_block = sealed::blocks(size) - 1;
    let first = if end > start { start / BLOCK } else { 0 };
    let last = if end > start { (end - 1) / BLOCK } else { 0 };
    let cstart = first * (BLOCK + TAG);
    let cend = ((last + 1) * (BLOCK + TAG)).min(obj.size);
    let inner = store.read_object(obj, cstart, cend)?;
    Ok(Box::new(Opening {
        inner,
        cipher,
        buf: BytesMut::new(),
        block: first,
        last_block,
        object_size: size,
        skip: (start - first * BLOCK) as usize,
        remaining: end - start,
    }))
}

struct Opening {
    inner: Box<dyn ObjectRead>,
    cipher: ObjectCipher,
    buf: BytesMut,
    /// The next block to open.
    block: u64,
    last_block: u64,
    object_size: u64,
    /// Plaintext bytes still to drop from the front (the start of the first block).
    skip: usize,
    /// Plaintext bytes still to hand out.
    remaining: u64,
}

impl Opening {
    /// The sealed length of block `b`.
    fn sealed_block_len(&self, b: u64) -> usize {
        let plain = if b == self.last_block {
            self.object_size - b * BLOCK
        } else {
            BLOCK
        };
        (plain + TAG) as usize
    }

    /// Opens every whole block buffered, handing out the plaintext asked for.
    fn open_buffered(&mut self, out: &mut BytesMut) -> StoreResult<()> {
        while self.remaining > 0 {
            let n = self.sealed_block_len(self.block);
            if self.buf.len() < n {
                break;
            }
            let mut blk = self.buf.split_to(n);
            let tag = blk.split_off(n - TAG as usize);
            let nonce = ObjectCipher::nonce(self.block, self.block == self.last_block);
            let tag = Tag::try_from(&tag[..]).expect("a tag is TAG bytes");
            self.cipher
                .cipher
                .open_in_place_separate_tag(nonce, Aad::empty(), tag, &mut blk, 0..)
                .map_err(|_| {
                    StoreError::Corrupt(format!(
                        "encrypted block {} fails its authentication tag",
                        self.block
                    ))
                })?;
            self.block += 1;
            let from = self.skip.min(blk.len());
            self.skip -= from;
            let take = ((blk.len() - from) as u64).min(self.remaining) as usize;
            out.extend_from_slice(&blk[from..from + take]);
            self.remaining -= take as u64;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ObjectRead for Opening {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        loop {
            if self.remaining == 0 {
                return Ok(None);
            }
            // What is buffered first (a part's blocks may come with its salt).
            let mut out = BytesMut::new();
            self.open_buffered(&mut out)?;
            if !out.is_empty() {
                return Ok(Some(out.freeze()));
            }
            match self.inner.next().await? {
                Some(p) => self.buf.extend_from_slice(&p),
                None => {
                    return Err(StoreError::Corrupt(
                        "an encrypted object shorter than its blocks".into(),
                    ));
                }
            }
        }
    }

    fn is_single_piece(&self) -> bool {
        self.inner.is_single_piece()
    }
}

/// [`read_plain`] of an object sealed part by part: for each part the range touches, its salt
/// (read with the blocks when the range starts in the part's first block, else on its own)
/// and the blocks the range falls in.
fn read_plain_parts(
    store: &dyn Store,
    obj: &ObjectInfo,
    cipher: ObjectCipher,
    start: u64,
    end: u64,
) -> StoreResult<Box<dyn ObjectRead>> {
    let mut plans = std::collections::VecDeque::new();
    let (mut stored_at, mut plain_at) = (0u64, 0u64);
    for &stored in &obj.part_sizes {
        let plain = sealed::plain_part_len(stored).ok_or_else(|| {
            StoreError::Corrupt("an encrypted part of a size no plaintext seals to".into())
        })?;
        let (a, z) = (start.max(plain_at), end.min(plain_at + plain));
        if a < z {
            let (a, z) = (a - plain_at, z - plain_at);
            let (first, last) = (a / BLOCK, (z - 1) / BLOCK);
            let blocks_at = stored_at + sealed::PART_SALT;
            let cend = (blocks_at + (last + 1) * (BLOCK + TAG)).min(stored_at + stored);
            let (salt, blocks) = if first == 0 {
                (None, store.read_object(obj, stored_at, cend)?)
            } else {
                (
                    Some(store.read_object(obj, stored_at, blocks_at)?),
                    store.read_object(obj, blocks_at + first * (BLOCK + TAG), cend)?,
                )
            };
            plans.push_back(PartPlan {
                salt,
                blocks,
                first,
                last_block: sealed::blocks(plain) - 1,
                plain,
                skip: (a - first * BLOCK) as usize,
                remaining: z - a,
            });
        }
        stored_at += stored;
        plain_at += plain;
    }
    Ok(Box::new(OpeningParts {
        cipher,
        plans,
        current: None,
    }))
}

/// What [`OpeningParts`] reads of one part.
struct PartPlan {
    /// The part's salt, when it is not in front of `blocks`.
    salt: Option<Box<dyn ObjectRead>>,
    blocks: Box<dyn ObjectRead>,
    first: u64,
    last_block: u64,
    plain: u64,
    skip: usize,
    remaining: u64,
}

struct OpeningParts {
    /// The object's cipher (each part's is derived from it and the part's salt).
    cipher: ObjectCipher,
    plans: std::collections::VecDeque<PartPlan>,
    current: Option<Opening>,
}

#[async_trait::async_trait]
impl ObjectRead for OpeningParts {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                if let Some(p) = cur.next().await? {
                    return Ok(Some(p));
                }
                self.current = None;
            }
            let Some(mut plan) = self.plans.pop_front() else {
                return Ok(None);
            };
            let salt_len = sealed::PART_SALT as usize;
            let mut buf = BytesMut::new();
            let mut blocks = plan.blocks;
            let from: &mut Box<dyn ObjectRead> = match plan.salt.as_mut() {
                Some(s) => s,
                None => &mut blocks,
            };
            while buf.len() < salt_len {
                match from.next().await? {
                    Some(p) => buf.extend_from_slice(&p),
                    None => {
                        return Err(StoreError::Corrupt(
                            "an encrypted part shorter than its salt".into(),
                        ));
                    }
                }
            }
            let salt = buf.split_to(salt_len);
            if plan.salt.is_some() {
                buf.clear();
            }
            self.current = Some(Opening {
                inner: blocks,
                cipher: self.cipher.part(&salt),
                buf,
                block: plan.first,
                last_block: plan.last_block,
                object_size: plan.plain,
                skip: plan.skip,
                remaining: plan.remaining,
            });
        }
    }

    fn is_single_piece(&self) -> bool {
        false
    }
}

/// A byte source of an object's plaintext (a copy's source), decrypted if it is sealed.
pub struct PlainSource {
    reader: Box<dyn ObjectRead>,
}

impl PlainSource {
    pub fn new(
        store: &dyn Store,
        obj: &ObjectInfo,
        cipher: Option<ObjectCipher>,
    ) -> StoreResult<Self> {
        Self::range(store, obj, cipher, 0, shown_size(obj))
    }

    /// Plaintext bytes `[start, end)` (an UploadPartCopy's source range).
    pub fn range(
        store: &dyn Store,
        obj: &ObjectInfo,
        cipher: Option<ObjectCipher>,
        start: u64,
        end: u64,
    ) -> StoreResult<Self> {
        let reader = match cipher {
            Some(c) => read_plain(store, obj, c, start, end)?,
            None => store.read_object(obj, start, end)?,
        };
        Ok(Self { reader })
    }
}

#[async_trait::async_trait]
impl ByteSource for PlainSource {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        self.reader.next().await
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of fixed pieces.
    struct Pieces(std::collections::VecDeque<Bytes>);

    #[async_trait::async_trait]
    impl ByteSource for Pieces {
        async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
            Ok(self.0.pop_front())
        }
        fn trailing_checksum(&self, _: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
            Ok(None)
        }
    }

    struct Reader(std::collections::VecDeque<Bytes>);

    #[async_trait::async_trait]
    impl ObjectRead for Reader {
        async fn next(&mut self) -> StoreResult<Option<Bytes>> {
            Ok(self.0.pop_front())
        }
        fn is_single_piece(&self) -> bool {
            false
        }
    }

    fn cipher(key: [u8; 32]) -> ObjectCipher {
        ObjectCipher::new(key, None)
    }

    fn seal_all(plain: &[u8], piece: usize) -> Vec<u8> {
        let pieces = plain
            .chunks(piece.max(1))
            .map(Bytes::copy_from_slice)
            .collect();
        let mut src = Pieces(pieces);
        let mut s = Sealing::new(&mut src, cipher([7; 32]), PlainChecks::default());
        let mut out = Vec::new();
        futures_executor_block_on(async {
            while let Some(p) = s.next_piece().await.unwrap() {
                out.extend_from_slice(&p);
            }
        });
        out
    }

    fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn open_range(sealed_bytes: &[u8], size: u64, start: u64, end: u64) -> StoreResult<Vec<u8>> {
        let first = if end > start { start / BLOCK } else { 0 };
        let last = if end > start { (end - 1) / BLOCK } else { 0 };
        let cstart = (first * (BLOCK + TAG)) as usize;
        let cend = (((last + 1) * (BLOCK + TAG)) as usize).min(sealed_bytes.len());
        // Hand the sealed bytes over in odd-sized pieces.
        let pieces = sealed_bytes[cstart..cend]
            .chunks(10_007)
            .map(Bytes::copy_from_slice)
            .collect();
        let mut r = Opening {
            inner: Box::new(Reader(pieces)),
            cipher: cipher([7; 32]),
            buf: BytesMut::new(),
            block: first,
            last_block: sealed::blocks(size) - 1,
            object_size: size,
            skip: (start - first * BLOCK) as usize,
            remaining: end - start,
        };
        futures_executor_block_on(async {
            let mut out = Vec::new();
            while let Some(p) = r.next().await? {
                out.extend_from_slice(&p);
            }
            Ok(out)
        })
    }

    #[test]
    fn sealed_sizes_follow_the_layout_and_ranges_round_trip() {
        let b = BLOCK as usize;
        for size in [0usize, 1, 100, b - 1, b, b + 1, 3 * b + 77] {
            let plain: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
            for piece in [1000, b, 3 * b] {
                let s = seal_all(&plain, piece);
                assert_eq!(
                    s.len() as u64,
                    sealed::sealed_len(size as u64),
                    "{size}/{piece}"
                );
                assert_eq!(open_range(&s, size as u64, 0, size as u64).unwrap(), plain);
            }
            let s = seal_all(&plain, 4096);
            for (a, z) in [(0, 1), (5, 70_000), (b - 3, b + 3), (size / 2, size)] {
                if a < z && z <= size {
                    let got = open_range(&s, size as u64, a as u64, z as u64).unwrap();
                    assert_eq!(got, &plain[a..z], "{size} {a}-{z}");
                }
            }
        }
    }

    #[test]
    fn a_changed_moved_or_cut_block_fails() {
        let b = BLOCK as usize;
        let plain = vec![9u8; 2 * b + 10];
        let s = seal_all(&plain, b);
        let n = plain.len() as u64;
        let mut flipped = s.clone();
        flipped[5] ^= 1;
        assert!(open_range(&flipped, n, 0, n).is_err());
        // Blocks 0 and 1 swapped (same length).
        let bl = b + TAG as usize;
        let mut swapped = s[bl..2 * bl].to_vec();
        swapped.extend_from_slice(&s[..bl]);
        swapped.extend_from_slice(&s[2 * bl..]);
        assert!(open_range(&swapped, n, 0, n).is_err());
        // Cut after two whole blocks: block 1 read as the last one fails.
        let cut = &s[..2 * bl];
        assert!(open_range(cut, 2 * BLOCK, 0, 2 * BLOCK).is_err());
    }

    #[test]
    fn plaintext_checks_run_on_the_plaintext() {
        let plain = b"hello world".to_vec();
        let md5: [u8; 16] = Md5::digest(&plain).into();
        for (sent, ok) in [(md5, true), ([0u8; 16], false)] {
            let mut src = Pieces([Bytes::from(plain.clone())].into());
            let checks = PlainChecks {
                content_md5: Some(sent),
                ..Default::default()
            };
            let mut s = Sealing::new(&mut src, cipher([1; 32]), checks);
            let r = futures_executor_block_on(async {
                while s.next_piece().await?.is_some() {}
                Ok::<_, StoreError>(())
            });
            assert_eq!(r.is_ok(), ok);
        }
    }
}
