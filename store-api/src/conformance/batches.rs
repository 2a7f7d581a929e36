//! packrat's batch extensions: TAR members, batch GET plans and reads, batch PUT, epoch listings.

use super::*;

/// A ustar archive of `files`, written here so the suite needs no TAR crate: a 512-byte
/// header per file (name, octal size, checksum), the bytes padded to 512, two zero blocks.
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in files {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

pub async fn tar_members(store: &dyn Store) {
    let b = new_bucket(store, "tar-members").await;
    let big = payload(100_000, 7);
    let tar = tar_of(&[("a.jpg", &big), ("a.cls", b"7"), ("dir/b.txt", b"hello")]);
    let info = put(store, &b, "shard.tar", &tar).await;
    let names: Vec<String> = ["a.cls", "dir/b.txt", "missing", "a.jpg"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Twice: the second answer comes from the member index the first built.
    for _ in 0..2 {
        let at = store
            .tar_members(&b, "shard.tar", &info, &names)
            .await
            .unwrap();
        assert_eq!(at.len(), 4);
        assert_eq!(at[2], None, "a member the archive lacks");
        assert_eq!(at[3], Some((512, big.len() as u64)));
        for (i, want) in [(0, &b"7"[..]), (1, &b"hello"[..])] {
            let (off, size) = at[i].expect("a member the archive has");
            assert_eq!(read(store, &info, off, off + size).await, want);
        }
    }
    let plain = put(store, &b, "plain.bin", b"not a tar at all").await;
    let r = store
        .tar_members(&b, "plain.bin", &plain, &names[..1])
        .await;
    assert!(
        matches!(&r, Err(StoreError::Invalid(m)) if m.contains("not a TAR")),
        "{r:?}"
    );
}

/// One entry as a batch read gave it: name, tag, and its bytes or what it failed with (`E`).
type Entry<E> = (String, Option<String>, Result<Vec<u8>, E>);

/// An entry as the sink heard it: where its header byte is, name, tag, and its size or error.
type Heard = (usize, String, Option<String>, Result<u64, StoreError>);

/// What a batch read handed its sink: each entry's name, tag and bytes, or the error it became.
#[derive(Default)]
struct Collected {
    /// Every payload byte, entries one after another (a header takes one byte, so a truncation
    /// back to a header drops its entry).
    frame: bytes::BytesMut,
    /// Per entry: where its header byte is, its name, tag and size, or its error.
    entries: Vec<Heard>,
    cut: Option<StoreError>,
    finished: bool,
}

impl Collected {
    /// Name, tag and bytes (or error) of each entry, in the order the store sent them.
    fn read(&self) -> Vec<Entry<StoreError>> {
        self.entries
            .iter()
            .map(|(at, name, tag, body)| {
                let body = match body {
                    Ok(size) => Ok(self.frame[at + 1..at + 1 + *size as usize].to_vec()),
                    Err(e) => Err(e.clone()),
                };
                (name.clone(), tag.clone(), body)
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl crate::batch::EntrySink for Collected {
    fn stopped(&self) -> bool {
        self.cut.is_some() || self.finished
    }
    fn frame_len(&self) -> usize {
        self.frame.len()
    }
    fn frame_full(&self) -> bool {
        false
    }
    fn header(&mut self, e: crate::batch::EntryHead<'_>, size: u64, _: i64, _: &str) {
        let at = self.frame.len();
        self.frame.extend_from_slice(&[0]);
        self.entries
            .push((at, e.name.to_string(), e.tag.map(str::to_string), Ok(size)));
    }
    fn reserve(&mut self, size: u64) -> usize {
        let at = self.frame.len();
        self.frame.resize(at + size as usize, 0);
        at
    }
    fn frame_mut(&mut self) -> &mut bytes::BytesMut {
        &mut self.frame
    }
    fn truncate(&mut self, len: usize) {
        self.frame.truncate(len);
        self.entries.retain(|(at, ..)| *at < len);
    }
    fn extend(&mut self, data: &[u8]) {
        self.frame.extend_from_slice(data);
    }
    fn end_payload(&mut self, _: u64) {}
    async fn flush(&mut self) {}
    async fn send(&mut self, data: Bytes) -> bool {
        self.frame.extend_from_slice(&data);
        true
    }
    async fn error(&mut self, e: crate::batch::EntryHead<'_>, error: &StoreError) -> bool {
        let at = self.frame.len();
        self.frame.extend_from_slice(&[0]);
        self.entries.push((
            at,
            e.name.to_string(),
            e.tag.map(str::to_string),
            Err(error.clone()),
        ));
        true
    }
    async fn cut(&mut self, error: &StoreError) {
        self.cut = Some(error.clone());
    }
    async fn finish(&mut self) {
        self.finished = true;
    }
}

fn item(
    key: &str,
    range: Option<crate::batch::ItemRange>,
    tag: Option<&str>,
) -> crate::batch::BatchItem {
    crate::batch::BatchItem {
        key: key.into(),
        member: None,
        range,
        tag: tag.map(str::to_string),
    }
}

/// A batch GET: entries in the request's order (or all of them in the store's), whole objects,
/// ranges, TAR members and tags as asked, and an error entry for what cannot be read, the
/// stream going on after it.
pub async fn batch_reads(store: &dyn Store) {
    use crate::batch::{BatchOrder, ItemRange};
    let b = new_bucket(store, "batch").await;
    let big = payload(300 * 1024, 7);
    put(store, &b, "s/a", b"first sample").await;
    put(store, &b, "s/b", &big).await;
    let tar = tar_of(&[("x.jpg", b"jpeg bytes"), ("x.cls", b"3")]);
    put(store, &b, "shard.tar", &tar).await;
    let items = vec![
        item("s/a", None, Some("0")),
        item("s/missing", None, Some("1")),
        item("s/b", Some(ItemRange::From(1000, Some(1999))), None),
        crate::batch::BatchItem {
            member: Some("x.cls".into()),
            ..item("shard.tar", None, Some("3"))
        },
        item("s/b", None, None),
        item("s/a", Some(ItemRange::From(100, None)), None),
    ];
    let want: Vec<Entry<&str>> = vec![
        ("s/a".into(), Some("0".into()), Ok(b"first sample".to_vec())),
        ("s/missing".into(), Some("1".into()), Err("NoSuchKey")),
        ("s/b".into(), None, Ok(big[1000..2000].to_vec())),
        (
            "shard.tar/x.cls".into(),
            Some("3".into()),
            Ok(b"3".to_vec()),
        ),
        ("s/b".into(), None, Ok(big.clone())),
        ("s/a".into(), None, Err("RangeNotSatisfiable")),
    ];
    let shown = |got: Vec<Entry<StoreError>>| {
        got.into_iter()
            .map(|(n, t, r)| {
                let r = match r {
                    Ok(v) => Ok(v),
                    Err(StoreError::NoSuchKey) => Err("NoSuchKey"),
                    Err(StoreError::RangeNotSatisfiable { .. }) => Err("RangeNotSatisfiable"),
                    Err(e) => panic!("{n}: {e:?}"),
                };
                (n, t, r)
            })
            .collect::<Vec<_>>()
    };
    let plan = store
        .plan_batch(&b, items.clone(), BatchOrder::Request)
        .await
        .unwrap();
    assert_eq!(plan.entries, items.len());
    let mut sink = Collected::default();
    store.read_batch(plan, &mut sink).await;
    assert!(sink.cut.is_none() && sink.finished);
    let got = shown(sink.read());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "entry {i}: {:?} {:?}", (&g.0, &g.1), (&w.0, &w.1));
    }
    assert_eq!(got.len(), want.len());

    let plan = store
        .plan_batch(&b, items, BatchOrder::Storage)
        .await
        .unwrap();
    let mut sink = Collected::default();
    store.read_batch(plan, &mut sink).await;
    let mut got = shown(sink.read());
    let mut want = want;
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(g == w, "{} {:?}", g.0, g.1);
    }
}

/// A batch PUT: every object begun, written and ended is stored, readable and listed once
/// committed; a key given twice keeps the last one.
pub async fn batch_writes(store: &dyn Store) {
    let b = new_bucket(store, "batchput").await;
    let mut w = store.batch_writer(&b).unwrap();
    let big = payload(200 * 1024, 3);
    for (key, parts) in [
        ("w/one", vec![&b"hello "[..], &b"world"[..]]),
        ("w/two", vec![&big[..100_000], &big[100_000..]]),
        ("w/one", vec![&b"again"[..]]),
    ] {
        w.begin(key.into()).unwrap();
        for p in parts {
            w.write(p).unwrap();
        }
        w.end().unwrap();
    }
    assert_eq!(w.count(), 3);
    w.commit().await.unwrap();
    let one = head(store, &b, "w/one").await.expect("w/one stored");
    assert_eq!(read(store, &one, 0, one.size).await, b"again");
    let two = head(store, &b, "w/two").await.expect("w/two stored");
    assert_eq!(read(store, &two, 0, two.size).await, big);
    let (keys, _) = list_all(store, &b, "w/", None, 1000).await;
    assert_eq!(keys, ["w/one", "w/two"]);
}

/// What an epoch stream is planned from: every key under a prefix, in key order, and a warm-up
/// hint the store may take or ignore.
pub async fn epoch_listing(store: &dyn Store) {
    let b = new_bucket(store, "epoch").await;
    for k in ["e/3", "e/1", "e/2/x", "f/1"] {
        put(store, &b, k, k.as_bytes()).await;
    }
    let keys = store.stream_keys(&b, "e/").await.unwrap();
    let all: Vec<&str> = (0..keys.len()).map(|i| keys.get(i)).collect();
    assert_eq!(all, ["e/1", "e/2/x", "e/3"]);
    store.warm_listing(&b, "e/", vec![2, 0, 1]).await.unwrap();
    assert!(store.stream_keys(&b, "none/").await.unwrap().is_empty());
}

/// The handles a store gives out and takes back (an object's version in its `ObjectInfo`, a
/// batch plan) are the store's own: one of another store's making is refused as an internal
/// error, never read as something else and never a panic.
pub async fn foreign_handles(store: &dyn Store) {
    let b = new_bucket(store, "foreign").await;
    let info = put(store, &b, "k", b"the bytes").await;
    let foreign = ObjectInfo {
        version: ObjectVersion(std::sync::Arc::new("another store's version")),
        ..info
    };
    let read = store.read_object(&foreign, 0, foreign.size);
    assert!(
        matches!(read, Err(StoreError::Internal { .. })),
        "read of a foreign version: {:?}",
        read.err()
    );
    let copy = store
        .copy_object(&foreign, &b, "copy", PutObject::default())
        .await;
    assert!(
        matches!(copy, Err(StoreError::Internal { .. })),
        "copy of a foreign version: {copy:?}"
    );
    assert!(
        head(store, &b, "copy").await.is_none(),
        "the copy was stored"
    );
    let plan = crate::batch::BatchPlan {
        entries: 1,
        bytes: 9,
        plan: Box::new("another store's plan"),
    };
    let mut sink = Collected::default();
    store.read_batch(plan, &mut sink).await;
    assert!(
        matches!(sink.cut, Some(StoreError::Internal { .. })),
        "a foreign batch plan: cut {:?}, entries {:?}",
        sink.cut,
        sink.read()
    );
}
