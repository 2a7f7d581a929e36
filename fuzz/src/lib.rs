//! What the fuzz targets share: turning fuzz text into a header map as a client would send it.

use http::{HeaderMap, HeaderName, HeaderValue};

/// One header per `name: value` line (names lowercased by `http`); a line that is not a valid
/// header is left out, as hyper would refuse it before any parser saw it.
pub fn header_map(text: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in text.lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim_start()),
        ) {
            headers.append(n, v);
        }
    }
    headers
}
