//! Writing S3 XML responses (a small escaping builder) and reading the few XML request bodies
//! (through quick-xml's serde support).

use super::error::{S3Error, S3ErrorCode, S3Result};

pub const S3_NS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

pub struct Xml(String);

impl Default for Xml {
    fn default() -> Self {
        Self::new()
    }
}

impl Xml {
    pub fn new() -> Self {
        Xml(String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"))
    }

    /// Opens the root element with the S3 namespace.
    pub fn root(&mut self, tag: &str) {
        self.0.push_str(&format!("<{tag} xmlns=\"{S3_NS}\">"));
    }

    pub fn open(&mut self, tag: &str) {
        self.0.push('<');
        self.0.push_str(tag);
        self.0.push('>');
    }

    pub fn close(&mut self, tag: &str) {
        self.0.push_str("</");
        self.0.push_str(tag);
        self.0.push('>');
    }

    pub fn elem(&mut self, tag: &str, text: &str) {
        self.open(tag);
        escape_into(&mut self.0, text);
        self.close(tag);
    }

    /// Escaped character data.
    pub fn text(&mut self, text: &str) {
        escape_into(&mut self.0, text);
    }

    /// Markup written as given (constant fragments only).
    pub fn raw(&mut self, markup: &str) {
        self.0.push_str(markup);
    }

    pub fn finish(self) -> String {
        self.0
    }
}

pub fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 cannot carry literally are written as references.
            c if (c as u32) < 0x20 && c != '\t' && c != '\n' => {
                out.push_str(&format!("&#x{:X};", c as u32))
            }
            '\r' => out.push_str("&#xD;"),
            c => out.push(c),
        }
    }
}

pub fn parse<T: for<'de> serde::Deserialize<'de>>(body: &[u8]) -> S3Result<T> {
    let text = std::str::from_utf8(body).map_err(|_| malformed())?;
    // quick-xml lets characters through that XML 1.0 has no place for (NUL and most C0
    // controls): a document holding one is not well-formed, and a value stored from it could
    // not be written back (found by the xml_bodies fuzz target: a lifecycle prefix with NULs
    // made GetBucketLifecycleConfiguration answer a document no parser reads).
    if !text.chars().all(xml_char) || !char_refs_are_xml_chars(text) {
        return Err(malformed());
    }
    let value: T = quick_xml::de::from_str(text).map_err(|_| malformed())?;
    Ok(value)
}

/// XML 1.0's Char production (surrogates are not `char`s).
fn xml_char(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{FFFD}' | '\u{10000}'..)
}

/// Whether every character reference (`&#N;`, `&#xH;`) names an XML 1.0 character; one that
/// does not is refused as the raw character would be (`&#0;` is not well-formed either).
fn char_refs_are_xml_chars(text: &str) -> bool {
    text.split("&#").skip(1).all(|rest| {
        let Some((num, _)) = rest.split_once(';') else {
            return true; // not a reference: the parser decides
        };
        let code = match num.strip_prefix('x') {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => num.parse::<u32>(),
        };
        code.ok().and_then(char::from_u32).is_none_or(xml_char)
    })
}

fn malformed() -> S3Error {
    S3Error::new(
        S3ErrorCode::MalformedXML,
        "The XML you provided was not well-formed or did not validate against our published schema.",
    )
}

#[derive(Debug, serde::Deserialize)]
pub struct CompleteMultipartUpload {
    #[serde(rename = "Part", default)]
    pub parts: Vec<CompletedPart>,
}

#[derive(Debug, serde::Deserialize)]
pub struct CompletedPart {
    #[serde(rename = "PartNumber")]
    pub part_number: u32,
    #[serde(rename = "ETag")]
    pub etag: String,
    #[serde(rename = "ChecksumCRC32")]
    pub crc32: Option<String>,
    #[serde(rename = "ChecksumCRC32C")]
    pub crc32c: Option<String>,
    #[serde(rename = "ChecksumCRC64NVME")]
    pub crc64nvme: Option<String>,
    #[serde(rename = "ChecksumSHA1")]
    pub sha1: Option<String>,
    #[serde(rename = "ChecksumSHA256")]
    pub sha256: Option<String>,
}

/// PutBucketVersioning's body.
#[derive(Debug, serde::Deserialize)]
pub struct VersioningConfiguration {
    #[serde(rename = "Status")]
    pub status: Option<String>,
    #[serde(rename = "MfaDelete")]
    pub mfa_delete: Option<String>,
}

/// PutBucketEncryption's body.
#[derive(Debug, serde::Deserialize)]
pub struct ServerSideEncryptionConfiguration {
    #[serde(rename = "Rule", default)]
    pub rules: Vec<EncryptionRule>,
}

#[derive(Debug, serde::Deserialize)]
pub struct EncryptionRule {
    #[serde(rename = "ApplyServerSideEncryptionByDefault")]
    pub by_default: Option<ApplyByDefault>,
    #[serde(rename = "BucketKeyEnabled")]
    pub bucket_key_enabled: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
pub struct ApplyByDefault {
    #[serde(rename = "SSEAlgorithm")]
    pub algorithm: Option<String>,
    #[serde(rename = "KMSMasterKeyID")]
    pub kms_key_id: Option<String>,
}

/// PutObjectLockConfiguration's body.
#[derive(Debug, serde::Deserialize)]
pub struct ObjectLockConfiguration {
    #[serde(rename = "ObjectLockEnabled")]
    pub enabled: Option<String>,
    #[serde(rename = "Rule")]
    pub rule: Option<LockRule>,
}

#[derive(Debug, serde::Deserialize)]
pub struct LockRule {
    #[serde(rename = "DefaultRetention")]
    pub default_retention: Option<LockDefaultRetention>,
}

#[derive(Debug, serde::Deserialize)]
pub struct LockDefaultRetention {
    #[serde(rename = "Mode")]
    pub mode: Option<String>,
    #[serde(rename = "Days")]
    pub days: Option<i64>,
    #[serde(rename = "Years")]
    pub years: Option<i64>,
}

/// PutObjectRetention's body.
#[derive(Debug, serde::Deserialize)]
pub struct Retention {
    #[serde(rename = "Mode")]
    pub mode: Option<String>,
    #[serde(rename = "RetainUntilDate")]
    pub retain_until: Option<String>,
}

/// PutObjectLegalHold's body.
#[derive(Debug, serde::Deserialize)]
pub struct LegalHold {
    #[serde(rename = "Status")]
    pub status: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
pub struct Delete {
    #[serde(rename = "Object", default)]
    pub objects: Vec<DeleteObject>,
    #[serde(rename = "Quiet", default)]
    pub quiet: Option<bool>,
}

#[derive(Debug, serde::Deserialize)]
pub struct DeleteObject {
    #[serde(rename = "Key")]
    pub key: String,
    #[serde(rename = "VersionId")]
    pub version_id: Option<String>,
}

/// A PutPublicAccessBlock body: four settings, each false when absent.
#[derive(Debug, serde::Deserialize)]
pub struct PublicAccessBlockConfiguration {
    #[serde(rename = "BlockPublicAcls", default)]
    pub block_public_acls: Option<String>,
    #[serde(rename = "IgnorePublicAcls", default)]
    pub ignore_public_acls: Option<String>,
    #[serde(rename = "BlockPublicPolicy", default)]
    pub block_public_policy: Option<String>,
    #[serde(rename = "RestrictPublicBuckets", default)]
    pub restrict_public_buckets: Option<String>,
}

/// A PutBucketOwnershipControls body: one rule naming the bucket's Object Ownership.
#[derive(Debug, serde::Deserialize)]
pub struct OwnershipControls {
    #[serde(rename = "Rule", default)]
    pub rules: Vec<OwnershipRule>,
}

#[derive(Debug, serde::Deserialize)]
pub struct OwnershipRule {
    #[serde(rename = "ObjectOwnership")]
    pub object_ownership: String,
}

/// A PutObjectAcl body: only its grants are read (the owner is the bucket's, whatever it says).
#[derive(Debug, serde::Deserialize)]
pub struct AccessControlPolicy {
    #[serde(rename = "AccessControlList", default)]
    pub list: Option<AccessControlList>,
}

#[derive(Debug, serde::Deserialize)]
pub struct AccessControlList {
    #[serde(rename = "Grant", default)]
    pub grants: Vec<Grant>,
}

#[derive(Debug, serde::Deserialize)]
pub struct Grant {
    #[serde(rename = "Grantee")]
    pub grantee: Grantee,
    #[serde(rename = "Permission")]
    pub permission: String,
}

#[derive(Debug, serde::Deserialize)]
pub struct Grantee {
    #[serde(rename = "ID")]
    pub id: Option<String>,
    #[serde(rename = "URI")]
    pub uri: Option<String>,
    #[serde(rename = "EmailAddress")]
    pub email: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
pub struct CreateBucketConfiguration {
    #[serde(rename = "LocationConstraint")]
    pub location_constraint: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes() {
        let mut s = String::new();
        escape_into(&mut s, "a<b>&\"'\u{1}");
        assert_eq!(s, "a&lt;b&gt;&amp;&quot;&apos;&#x1;");
    }

    #[test]
    fn parses_complete_and_delete() {
        let c: CompleteMultipartUpload = parse(
            br#"<CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Part><ETag>"a"</ETag><PartNumber>1</PartNumber><ChecksumCRC32>AAAAAA==</ChecksumCRC32></Part><Part><PartNumber>2</PartNumber><ETag>b</ETag></Part></CompleteMultipartUpload>"#,
        )
        .unwrap();
        assert_eq!(c.parts.len(), 2);
        assert_eq!(c.parts[0].crc32.as_deref(), Some("AAAAAA=="));
        let d: Delete =
            parse(b"<Delete><Quiet>true</Quiet><Object><Key>a&amp;b</Key></Object></Delete>")
                .unwrap();
        assert_eq!(d.objects[0].key, "a&b");
        assert_eq!(d.quiet, Some(true));
        assert!(parse::<Delete>(b"<Delete><Object>").is_err());
        // Characters XML 1.0 has no place for, raw or as references, are not well-formed.
        for bad in [
            &b"<Delete><Object><Key>a\0b</Key></Object></Delete>"[..],
            b"<Delete><Object><Key>a\x01b</Key></Object></Delete>",
            b"<Delete><Object><Key>a&#0;b</Key></Object></Delete>",
            b"<Delete><Object><Key>a&#x1F;b</Key></Object></Delete>",
            b"<Delete><Object><Key>a&#xFFFE;b</Key></Object></Delete>",
        ] {
            assert_eq!(
                parse::<Delete>(bad).unwrap_err().code,
                S3ErrorCode::MalformedXML
            );
        }
        let d: Delete =
            parse(b"<Delete><Object><Key>tab&#9;&#x41;\t\xc3\xa9</Key></Object></Delete>").unwrap();
        assert_eq!(d.objects[0].key, "tab\tA\t\u{e9}");
        assert!(parse::<CompleteMultipartUpload>(b"not xml").is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// Any body is MalformedXML or a parsed document, never a panic.
        #[test]
        fn xml_bodies_never_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), text in "\\PC{0,300}") {
            let _ = parse::<Delete>(&body);
            let _ = parse::<CompleteMultipartUpload>(&body);
            let _ = parse::<CreateBucketConfiguration>(&body);
            let wrapped = format!("<Delete><Object><Key>{text}</Key></Object></Delete>");
            let _ = parse::<Delete>(wrapped.as_bytes());
            let wrapped = format!("<CompleteMultipartUpload><Part><PartNumber>{text}</PartNumber><ETag>x</ETag></Part></CompleteMultipartUpload>");
            let _ = parse::<CompleteMultipartUpload>(wrapped.as_bytes());
        }
    }
}
