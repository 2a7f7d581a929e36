//! Object tags: the `x-amz-tagging` header (URL-query form, on PutObject, CopyObject and
//! CreateMultipartUpload), the `?tagging` XML body (PutObjectTagging) and answer
//! (GetObjectTagging), and S3's limits on them.

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::xml::Xml;
use serde::Deserialize;

/// S3's limits: tags per object and per bucket, and characters per key and per value.
pub const TAGS_MAX: usize = 10;
pub const BUCKET_TAGS_MAX: usize = 50;
pub const TAG_KEY_CHARS_MAX: usize = 128;
pub const TAG_VALUE_CHARS_MAX: usize = 256;

pub type Tags = Vec<(String, String)>;

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidTag, msg)
}

/// Checks S3's rules: at most [`TAGS_MAX`] tags, keys of 1 to 128 characters and values of at
/// most 256, unique keys, no `aws:` prefix, and only letters, digits, spaces and `+ - = . _ :
/// / @`.
pub fn validate(tags: &Tags) -> S3Result<()> {
    if tags.len() > TAGS_MAX {
        return Err(S3Error::new(
            S3ErrorCode::BadRequest,
            format!("Object tags cannot be greater than {TAGS_MAX}"),
        ));
    }
    validate_each(tags)
}

fn validate_each(tags: &Tags) -> S3Result<()> {
    let allowed = |s: &str| {
        s.chars()
            .all(|c| c.is_alphanumeric() || c == ' ' || "+-=._:/@".contains(c))
    };
    for (i, (k, v)) in tags.iter().enumerate() {
        let n = k.chars().count();
        if n == 0 || n > TAG_KEY_CHARS_MAX {
            return Err(invalid(format!(
                "The TagKey you have provided is invalid: 1 to {TAG_KEY_CHARS_MAX} characters"
            )));
        }
        if v.chars().count() > TAG_VALUE_CHARS_MAX {
            return Err(invalid(format!(
                "The TagValue you have provided is too long, max {TAG_VALUE_CHARS_MAX}"
            )));
        }
        if !allowed(k) || !allowed(v) {
            return Err(invalid(
                "The TagKey or TagValue you have provided contains characters that are not allowed (letters, digits, spaces and + - = . _ : / @)",
            ));
        }
        if k.to_ascii_lowercase().starts_with("aws:") {
            return Err(invalid("Your TagKey cannot be prefixed with aws:"));
        }
        if tags[..i].iter().any(|(other, _)| other == k) {
            return Err(invalid("Cannot provide multiple Tags with the same key"));
        }
    }
    Ok(())
}

/// Parses the `x-amz-tagging` header: `key1=value1&key2=value2`, URL-encoded (`+` is a
/// space); a key without `=` has an empty value.
pub fn parse_header(v: &str) -> S3Result<Tags> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        String::from_utf8(super::encoding::percent_decode(&s))
            .map_err(|_| invalid("The x-amz-tagging header is not valid UTF-8 once decoded"))
    };
    let mut tags = Tags::new();
    for pair in v.split('&').filter(|p| !p.is_empty()) {
        let (k, val) = pair.split_once('=').unwrap_or((pair, ""));
        tags.push((decode(k)?, decode(val)?));
    }
    validate(&tags)?;
    Ok(tags)
}

#[derive(Debug, Deserialize)]
struct TaggingXml {
    #[serde(rename = "TagSet")]
    tag_set: TagSetXml,
}

#[derive(Debug, Deserialize, Default)]
struct TagSetXml {
    #[serde(rename = "Tag", default)]
    tags: Vec<TagXml>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TagXml {
    #[serde(rename = "Key")]
    pub(crate) key: String,
    #[serde(rename = "Value", default)]
    pub(crate) value: String,
}

fn tags_of(body: &[u8]) -> S3Result<Tags> {
    let t: TaggingXml = super::xml::parse(body)?;
    Ok(t.tag_set
        .tags
        .into_iter()
        .map(|t| (t.key, t.value))
        .collect())
}

/// Parses a PutObjectTagging body (`<Tagging><TagSet><Tag><Key/><Value/></Tag>...`).
pub fn parse_xml(body: &[u8]) -> S3Result<Tags> {
    let tags = tags_of(body)?;
    validate(&tags)?;
    Ok(tags)
}

/// Parses a PutBucketTagging body: the same document, up to [`BUCKET_TAGS_MAX`] tags.
pub fn parse_bucket_xml(body: &[u8]) -> S3Result<Tags> {
    let tags = tags_of(body)?;
    if tags.len() > BUCKET_TAGS_MAX {
        return Err(invalid(format!(
            "Bucket tag count cannot be greater than {BUCKET_TAGS_MAX}"
        )));
    }
    validate_each(&tags)?;
    Ok(tags)
}

/// The GetObjectTagging answer.
pub fn to_xml(tags: &Tags) -> Xml {
    let mut x = Xml::new();
    x.root("Tagging");
    x.open("TagSet");
    for (k, v) in tags {
        x.open("Tag");
        x.elem("Key", k);
        x.elem("Value", v);
        x.close("Tag");
    }
    x.close("TagSet");
    x.close("Tagging");
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_form_is_url_encoded() {
        let t = parse_header("project=alpha&split=train%2Fval&note=a+b&empty=").unwrap();
        assert_eq!(
            t,
            vec![
                ("project".into(), "alpha".into()),
                ("split".into(), "train/val".into()),
                ("note".into(), "a b".into()),
                ("empty".into(), "".into()),
            ]
        );
        assert!(parse_header("").unwrap().is_empty());
    }

    #[test]
    fn limits_and_rules() {
        let many = (0..11)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join("&");
        assert_eq!(
            parse_header(&many).unwrap_err().code,
            S3ErrorCode::BadRequest
        );
        let bad = |h: &str| parse_header(h).unwrap_err().code;
        assert_eq!(bad("a=1&a=2"), S3ErrorCode::InvalidTag);
        assert_eq!(bad("aws%3Aname=x"), S3ErrorCode::InvalidTag);
        assert_eq!(bad("=x"), S3ErrorCode::InvalidTag);
        assert_eq!(
            bad(&format!("{}=x", "k".repeat(129))),
            S3ErrorCode::InvalidTag
        );
        assert_eq!(
            bad(&format!("k={}", "v".repeat(257))),
            S3ErrorCode::InvalidTag
        );
        assert_eq!(bad("k=%3Cscript%3E"), S3ErrorCode::InvalidTag);
        assert!(parse_header(&format!("{}={}", "k".repeat(128), "v".repeat(256))).is_ok());
        assert!(parse_header("caf%C3%A9=%C3%BCber").is_ok());
    }

    #[test]
    fn xml_roundtrip() {
        let tags: Tags = vec![("a".into(), "1".into()), ("b c".into(), "".into())];
        assert_eq!(parse_xml(to_xml(&tags).finish().as_bytes()).unwrap(), tags);
        let empty = b"<Tagging><TagSet></TagSet></Tagging>";
        assert!(parse_xml(empty).unwrap().is_empty());
        assert_eq!(
            parse_xml(b"<Tagging><TagSet><Tag><Key>x").unwrap_err().code,
            S3ErrorCode::MalformedXML
        );
        // A bucket holds up to 50 tags, an object 10.
        let n = |count: usize| -> Tags {
            (0..count)
                .map(|i| (format!("k{i}"), "v".to_string()))
                .collect()
        };
        let doc = |t: &Tags| to_xml(t).finish();
        assert_eq!(parse_bucket_xml(doc(&n(50)).as_bytes()).unwrap(), n(50));
        assert!(parse_xml(doc(&n(11)).as_bytes()).is_err());
        assert_eq!(
            parse_bucket_xml(doc(&n(51)).as_bytes()).unwrap_err().code,
            S3ErrorCode::InvalidTag
        );
    }
}
