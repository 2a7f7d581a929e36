//! Non-ASCII user metadata as S3 carries it in HTTP headers: a value sent as RFC 2047
//! encoded words (`=?UTF-8?B?...?=`, `=?UTF-8?Q?...?=`) is stored decoded, and a stored value
//! that is not printable ASCII is answered as one `=?UTF-8?B?...?=` word, so every value a
//! header can carry round-trips.
//!
//! Hand-written: S3 reads and writes only the UTF-8 (and US-ASCII) forms, a few lines each; a
//! MIME decoder's other charsets would store bytes S3 itself would not.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use std::borrow::Cow;

/// The text of `value` when it is wholly UTF-8 or US-ASCII encoded words (separated by
/// spaces or tabs, which are dropped between words as RFC 2047 says); `None` for any other
/// value, which is stored as sent.
pub fn decode(value: &str) -> Option<String> {
    let mut out = Vec::new();
    let mut rest = value.trim_matches([' ', '\t']);
    if !rest.starts_with("=?") {
        return None;
    }
    while !rest.is_empty() {
        let word = rest.strip_prefix("=?")?;
        let (charset, word) = word.split_once('?')?;
        let charset = charset.split('*').next()?;
        if !charset.eq_ignore_ascii_case("utf-8") && !charset.eq_ignore_ascii_case("us-ascii") {
            return None;
        }
        let (encoding, word) = word.split_once('?')?;
        let (text, after) = word.split_once("?=")?;
        match encoding {
            "B" | "b" => out.extend(B64.decode(text).ok()?),
            "Q" | "q" => q_decode(text, &mut out)?,
            _ => return None,
        }
        rest = after.trim_start_matches([' ', '\t']);
    }
    String::from_utf8(out).ok()
}

/// RFC 2047's Q encoding: `_` is a space, `=XX` a byte, any other printable character itself.
fn q_decode(text: &str, out: &mut Vec<u8>) -> Option<()> {
    let mut bytes = text.bytes();
    while let Some(c) = bytes.next() {
        match c {
            b'_' => out.push(b' '),
            b'=' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b'!'..=b'~' => out.push(c),
            _ => return None,
        }
    }
    Some(())
}

/// `value` as an HTTP header carries it: as it is when printable ASCII, else one encoded word.
pub fn encode(value: &str) -> Cow<'_, str> {
    if value
        .bytes()
        .all(|c| c == b'\t' || (b' '..=b'~').contains(&c))
    {
        return Cow::Borrowed(value);
    }
    Cow::Owned(format!("=?UTF-8?B?{}?=", B64.encode(value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_decode_and_other_values_stay() {
        assert_eq!(decode("=?UTF-8?B?Y2Fmw6k=?=").as_deref(), Some("café"));
        assert_eq!(
            decode("=?utf-8?q?caf=C3=A9_au_lait?=").as_deref(),
            Some("café au lait")
        );
        // Whitespace between adjacent words is dropped; a charset's language suffix is allowed.
        assert_eq!(
            decode(" =?UTF-8?Q?a?= =?UTF-8*en?B?Yg==?=").as_deref(),
            Some("ab")
        );
        for kept in [
            "plain",
            "=?ISO-8859-1?Q?caf=E9?=",
            "=?UTF-8?X?abc?=",
            "text =?UTF-8?Q?a?=",
            "=?UTF-8?Q?a?= text",
            "=?UTF-8?B?not base64?=",
            "=?UTF-8?Q?=ZZ?=",
            "=?UTF-8?B?/w==?=",
            "=?UTF-8?Q?unclosed",
        ] {
            assert_eq!(decode(kept), None, "{kept}");
        }
    }

    #[test]
    fn non_ascii_is_encoded_and_round_trips() {
        assert_eq!(encode("plain value"), "plain value");
        for v in ["café", "日本語", "tab\tand\u{7f}"] {
            let e = encode(v);
            assert!(e.starts_with("=?UTF-8?B?") && e.is_ascii(), "{e}");
            assert_eq!(decode(&e).as_deref(), Some(v));
        }
    }
}
