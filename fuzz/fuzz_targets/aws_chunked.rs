//! The request body decoder on bodies a client would send: the fuzzer picks the payload, how it
//! is cut into chunks and network frames, the mode (plain with its SHA-256, aws-chunked signed,
//! signed with a signed trailer, unsigned with a trailer), and optionally one byte to change.
//! The body is encoded and signed with a real signing key, so signed chunks and trailers are
//! parsed and their signatures compared.
//!
//! - Untouched, every mode decodes to the payload (and its trailer).
//! - In a signed mode, an accepted body is exactly the signed payload and trailer, whatever
//!   byte was changed; so is a plain body checked by its SHA-256.
//! - Otherwise bytes or an S3 error, never a panic or a hang.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::body::{BodyReader, BodySource, ChunkSigning, PayloadMode};
use packrat_gateway::s3::sigv4;

const AMZ_DATE: &str = "20130524T000000Z";
const SCOPE: &str = "20130524/us-east-1/s3/aws4_request";
const TRAILER_NAME: &str = "x-amz-checksum-crc32";

fn signing() -> ChunkSigning {
    ChunkSigning {
        signing_key: sigv4::derive_signing_key("fuzz-secret", "20130524", "us-east-1", "s3"),
        amz_date: AMZ_DATE.into(),
        scope: SCOPE.into(),
        seed_signature: "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9".into(),
    }
}

/// The aws-chunked encoding of `chunks`, signed as an SDK signs it when `signing` is given,
/// ending with `trailer` (`name:value`) and, for a signed trailer, its signature.
fn encode(chunks: &[&[u8]], signing: Option<&ChunkSigning>, trailer: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut previous = signing
        .map(|s| s.seed_signature.clone())
        .unwrap_or_default();
    for data in chunks.iter().copied().chain([&b""[..]]) {
        out.extend_from_slice(format!("{:x}", data.len()).as_bytes());
        if let Some(s) = signing {
            let sig = sigv4::chunk_signature(
                &s.signing_key,
                &s.amz_date,
                &s.scope,
                &previous,
                &sigv4::sha256_hex(data),
            );
            out.extend_from_slice(format!(";chunk-signature={sig}").as_bytes());
            previous = sig;
        }
        out.extend_from_slice(b"\r\n");
        if !data.is_empty() {
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
    }
    if let Some(t) = trailer {
        out.extend_from_slice(format!("{t}\r\n").as_bytes());
        if let Some(s) = signing {
            let sig = sigv4::trailer_signature(
                &s.signing_key,
                &s.amz_date,
                &s.scope,
                &previous,
                &format!("{t}\n"),
            );
            out.extend_from_slice(format!("x-amz-trailer-signature:{sig}\r\n").as_bytes());
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let payload: Vec<u8> = u.arbitrary()?;
    let mode = u.int_in_range(0..=3u8)?;
    let mut chunks = Vec::new();
    let mut rest = &payload[..];
    while !rest.is_empty() {
        let n = u.int_in_range(1..=rest.len())?;
        chunks.push(&rest[..n]);
        rest = &rest[n..];
    }
    let value: u32 = u.arbitrary()?;
    let trailer = format!("{TRAILER_NAME}:{value:08x}");
    let key = signing();
    let (mode, signing, wire, signed_trailer) = match mode {
        0 => {
            let mode = PayloadMode::Sha256(sigv4::sha256_hex(&payload));
            (mode, None, payload.clone(), false)
        }
        1 => {
            let wire = encode(&chunks, Some(&key), None);
            (
                PayloadMode::StreamingSigned { trailer: false },
                Some(key),
                wire,
                false,
            )
        }
        2 => {
            let wire = encode(&chunks, Some(&key), Some(&trailer));
            (
                PayloadMode::StreamingSigned { trailer: true },
                Some(key),
                wire,
                true,
            )
        }
        _ => {
            let wire = encode(&chunks, None, Some(&trailer));
            (PayloadMode::StreamingUnsignedTrailer, None, wire, false)
        }
    };
    let mut wire = wire;
    let tampered = u.arbitrary::<bool>()? && !wire.is_empty();
    if tampered {
        let at = u.int_in_range(0..=wire.len() - 1)?;
        wire[at] ^= u.int_in_range(1..=255u8)?;
    }
    let mut frames = std::collections::VecDeque::new();
    let mut rest = &wire[..];
    while !rest.is_empty() {
        let n = u.int_in_range(1..=rest.len())?;
        frames.push_back(bytes::Bytes::copy_from_slice(&rest[..n]));
        rest = &rest[n..];
    }
    let checked = !matches!(mode, PayloadMode::StreamingUnsignedTrailer);
    let trailered = signed_trailer || matches!(mode, PayloadMode::StreamingUnsignedTrailer);
    let mut r = BodyReader::new(
        Some(BodySource::Frames(frames)),
        mode,
        signing,
        Some(payload.len() as u64),
        1 << 20,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let got = rt.block_on(r.read_to_end(1 << 20));
    let want_trailer = format!("{value:08x}");
    if !tampered {
        let got = got.unwrap_or_else(|e| panic!("a well-formed body was refused: {e:?}"));
        assert_eq!(got, payload);
        if trailered {
            assert_eq!(r.trailer(TRAILER_NAME), Some(want_trailer.as_str()));
        }
    } else if checked && let Ok(got) = got {
        assert_eq!(got, payload, "a changed body was accepted with other bytes");
        if signed_trailer {
            assert_eq!(r.trailers, vec![(TRAILER_NAME.to_string(), want_trailer)]);
        } else {
            assert!(
                r.trailers.is_empty(),
                "unsigned trailers were accepted: {:?}",
                r.trailers
            );
        }
    }
    Ok(())
}

fuzz_target!(|input: &[u8]| {
    let _ = run(&mut Unstructured::new(input));
});
