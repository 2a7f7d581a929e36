//! The request body decoder (plain, aws-chunked signed and unsigned, with trailers) on
//! arbitrary bytes cut at an arbitrary point: bytes or an S3 error, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::body::{BodyReader, BodySource, ChunkSigning, PayloadMode};

fuzz_target!(|input: &[u8]| {
    if input.len() < 3 {
        return;
    }
    let mode = match input[0] % 5 {
        0 => PayloadMode::StreamingUnsignedTrailer,
        1 => PayloadMode::Unsigned,
        2 => PayloadMode::Sha256("0".repeat(64)),
        3 => PayloadMode::StreamingSigned { trailer: true },
        _ => PayloadMode::StreamingSigned { trailer: false },
    };
    let body = &input[2..];
    let cut = usize::from(input[1]).min(body.len());
    let signing = matches!(mode, PayloadMode::StreamingSigned { .. }).then(|| ChunkSigning {
        signing_key: [7; 32],
        amz_date: "20130524T000000Z".into(),
        scope: "20130524/us-east-1/s3/aws4_request".into(),
        seed_signature: "0".repeat(64),
    });
    let frames: std::collections::VecDeque<bytes::Bytes> = [
        bytes::Bytes::copy_from_slice(&body[..cut]),
        bytes::Bytes::copy_from_slice(&body[cut..]),
    ]
    .into();
    let mut r = BodyReader::new(
        Some(BodySource::Frames(frames)),
        mode,
        signing,
        Some(body.len() as u64),
        1 << 20,
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _ = rt.block_on(r.read_to_end(1 << 20));
});
