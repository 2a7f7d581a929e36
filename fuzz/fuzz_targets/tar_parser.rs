//! The streaming TAR parser (batch PUT bodies, TAR member indexing) on arbitrary bytes, fed in
//! pieces whose sizes come from the input too: it must return an error or events, never panic,
//! and every file's data must add up to its declared size.
#![no_main]

use packrat_tar as tar;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let (cut, data) = match input.split_first() {
        Some((c, rest)) => (usize::from(*c).max(1) * 7, rest),
        None => return,
    };
    let mut p = tar::TarParser::new();
    let mut expected: Option<u64> = None;
    let mut got = 0u64;
    for piece in data.chunks(cut) {
        let r = p.push(piece, &mut |ev| {
            match ev {
                tar::TarEvent::File { size, .. } => {
                    expected = Some(size);
                    got = 0;
                }
                tar::TarEvent::Data(d) => got += d.len() as u64,
                tar::TarEvent::FileEnd => assert_eq!(Some(got), expected),
                tar::TarEvent::Skipped { .. } => {}
            }
            Ok::<(), tar::TarError>(())
        });
        if r.is_err() {
            return;
        }
    }
    let _ = p.finish();
});
