//! Percent-encoding as S3 uses it in paths, queries and signatures.

/// S3's URI encoding: every byte but the unreserved set is %XX (upper-case hex); `/` is kept
/// when `keep_slash` (paths) and encoded otherwise (query components).
pub fn uri_encode(input: &[u8], keep_slash: bool) -> String {
    let mut out = String::with_capacity(input.len() + 8);
    push_uri_encoded(&mut out, input, keep_slash);
    out
}

/// [`uri_encode`] onto the end of `out`.
pub fn push_uri_encoded(out: &mut String, input: &[u8], keep_slash: bool) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in input {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => {
                out.push('%');
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 15)] as char);
            }
        }
    }
}

pub fn percent_decode(s: &str) -> Vec<u8> {
    percent_encoding::percent_decode_str(s).collect()
}
