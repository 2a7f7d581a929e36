//! Browser form uploads (`POST` to a bucket, `multipart/form-data`): the policy document a
//! form carries, its SigV4 signature, and the check of the form's fields against the policy's
//! conditions. Pure: the handler (`handlers/post_object.rs`) streams the form and stores the
//! file.
//!
//! A policy is base64 JSON: `{"expiration": "...Z", "conditions": [...]}`, each condition
//! `{"field": "value"}` (exact), `["eq", "$field", "value"]`, `["starts-with", "$field",
//! "prefix"]` or `["content-length-range", min, max]`. As in S3, every form field but
//! `policy`, `x-amz-signature`, `file` and `x-ignore-*` must be named by a condition, and every
//! condition must hold; field names compare without regard to case, values exactly. The form
//! is signed by `x-amz-signature`: hex HMAC-SHA256 of the base64 policy under the SigV4 signing
//! key of `x-amz-credential` (access key, date, region, `s3`, `aws4_request`), or, SigV2, by
//! `signature`: base64 HMAC-SHA1 of the base64 policy under `AWSAccessKeyId`'s secret.

use super::error::{S3Error, S3ErrorCode, S3Result};
use base64::Engine as _;

/// S3's limit on the fields before the file, taken together (names and values).
pub const FORM_FIELDS_BYTES_MAX: usize = 20 * 1024;

/// A form's fields before its file, by lower-case name, in the order sent.
#[derive(Debug, Default, Clone)]
pub struct Form {
    pub fields: Vec<(String, String)>,
}

impl Form {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    Eq { field: String, value: String },
    StartsWith { field: String, prefix: String },
    LengthRange { min: u64, max: u64 },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub expiration_ms: i64,
    pub conditions: Vec<Condition>,
}

fn denied(msg: impl Into<String>) -> S3Error {
    S3Error::new(
        S3ErrorCode::AccessDenied,
        format!("Invalid according to Policy: {}", msg.into()),
    )
}

fn bad_policy(msg: impl Into<String>) -> S3Error {
    S3Error::new(
        S3ErrorCode::InvalidPolicyDocument,
        format!("Invalid Policy: {}", msg.into()),
    )
}

/// The field a `$name` reference names, lower-cased.
fn field_ref(v: &serde_json::Value) -> S3Result<String> {
    v.as_str()
        .and_then(|s| s.strip_prefix('$'))
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| bad_policy("a condition names its field as \"$name\""))
}

fn number(v: &serde_json::Value) -> S3Result<u64> {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
        .ok_or_else(|| bad_policy("content-length-range takes two whole numbers"))
}

/// Decodes a form's `policy` field (base64 JSON).
pub fn parse(policy_b64: &str) -> S3Result<Policy> {
    let json = base64::engine::general_purpose::STANDARD
        .decode(policy_b64.trim())
        .map_err(|_| bad_policy("the policy is not base64"))?;
    let doc: serde_json::Value =
        serde_json::from_slice(&json).map_err(|_| bad_policy("the policy is not JSON"))?;
    let expiration = doc
        .get("expiration")
        .and_then(|e| e.as_str())
        .ok_or_else(|| bad_policy("Policy missing expiration."))?;
    let expiration_ms = chrono::DateTime::parse_from_rfc3339(expiration)
        .map_err(|_| bad_policy("expiration is not an ISO 8601 date"))?
        .timestamp_millis();
    let list = doc
        .get("conditions")
        .and_then(|c| c.as_array())
        .ok_or_else(|| bad_policy("Policy missing conditions."))?;
    let mut conditions = Vec::with_capacity(list.len());
    for c in list {
        match c {
            serde_json::Value::Object(m) => {
                if m.len() != 1 {
                    return Err(bad_policy("an exact-match condition names one field"));
                }
                for (k, v) in m {
                    let value = v
                        .as_str()
                        .ok_or_else(|| bad_policy("a condition's value is a string"))?;
                    conditions.push(Condition::Eq {
                        field: k.to_ascii_lowercase(),
                        value: value.to_string(),
                    });
                }
            }
            serde_json::Value::Array(a) if a.len() == 3 => {
                let op = a[0].as_str().unwrap_or("").to_ascii_lowercase();
                match op.as_str() {
                    "eq" | "starts-with" => {
                        let field = field_ref(&a[1])?;
                        let value = a[2]
                            .as_str()
                            .ok_or_else(|| bad_policy("a condition's value is a string"))?
                            .to_string();
                        conditions.push(if op == "eq" {
                            Condition::Eq { field, value }
                        } else {
                            Condition::StartsWith {
                                field,
                                prefix: value,
                            }
                        });
                    }
                    "content-length-range" => {
                        let (min, max) = (number(&a[1])?, number(&a[2])?);
                        if min > max {
                            return Err(bad_policy(
                                "content-length-range's minimum exceeds its maximum",
                            ));
                        }
                        conditions.push(Condition::LengthRange { min, max });
                    }
                    _ => return Err(bad_policy(format!("unknown condition \"{op}\""))),
                }
            }
            _ => return Err(bad_policy("a condition is an object or a 3-element list")),
        }
    }
    Ok(Policy {
        expiration_ms,
        conditions,
    })
}

/// Fields a policy need not name.
fn exempt(name: &str) -> bool {
    matches!(
        name,
        "policy" | "x-amz-signature" | "file" | "awsaccesskeyid" | "signature"
    ) || name.starts_with("x-ignore-")
}

impl Policy {
    /// Checks the policy against the form (with `key` already substituted, and `bucket` the
    /// bucket posted to) at `now_ms`; answers the allowed size range of the file.
    pub fn check(&self, form: &Form, bucket: &str, key: &str, now_ms: i64) -> S3Result<(u64, u64)> {
        if now_ms >= self.expiration_ms {
            return Err(denied("Policy expired."));
        }
        let value = |field: &str| -> String {
            match field {
                "bucket" => bucket.to_string(),
                "key" => key.to_string(),
                f => form.get(f).unwrap_or("").to_string(),
            }
        };
        let mut range = (0, u64::MAX);
        for c in &self.conditions {
            match c {
                Condition::Eq { field, value: want } => {
                    if value(field) != *want {
                        return Err(denied(format!(
                            "Policy Condition failed: [\"eq\", \"${field}\", \"{want}\"]"
                        )));
                    }
                }
                Condition::StartsWith { field, prefix } => {
                    if !value(field).starts_with(prefix.as_str()) {
                        return Err(denied(format!(
                            "Policy Condition failed: [\"starts-with\", \"${field}\", \"{prefix}\"]"
                        )));
                    }
                }
                Condition::LengthRange { min, max } => range = (*min, *max),
            }
        }
        let named = |f: &str| {
            self.conditions.iter().any(|c| match c {
                Condition::Eq { field, .. } | Condition::StartsWith { field, .. } => field == f,
                Condition::LengthRange { .. } => false,
            })
        };
        for (name, _) in &form.fields {
            if !exempt(name) && !named(name) {
                return Err(denied(format!("Extra input fields: {name}")));
            }
        }
        Ok(range)
    }
}

/// The parts of `x-amz-credential`: access key, date (`yyyymmdd`), region.
pub fn credential(v: &str) -> S3Result<(&str, &str, &str)> {
    let parts: Vec<&str> = v.split('/').collect();
    match parts.as_slice() {
        [ak, date, region, "s3", "aws4_request"] if date.len() == 8 => Ok((ak, date, region)),
        _ => Err(S3Error::new(
            S3ErrorCode::InvalidArgument,
            "x-amz-credential is not ACCESSKEY/yyyymmdd/region/s3/aws4_request",
        )),
    }
}

/// Whether `signature_hex` signs `policy_b64` under `signing_key`, compared in constant time.
pub fn signature_matches(signing_key: &[u8; 32], policy_b64: &str, signature_hex: &str) -> bool {
    let want = hex::encode(super::sigv4::hmac(signing_key, policy_b64.as_bytes()));
    equal_in_constant_time(&want, &signature_hex.trim().to_ascii_lowercase())
}

pub fn equal_in_constant_time(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn form(fields: &[(&str, &str)]) -> Form {
        Form {
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn conditions_hold_or_say_which_failed() {
        let p = parse(&b64(
            r#"{"expiration": "2030-01-01T00:00:00.000Z", "conditions": [
            {"bucket": "b"}, ["starts-with", "$key", "uploads/"],
            ["eq", "$Content-Type", "text/plain"], ["content-length-range", 1, "100"],
            {"x-amz-algorithm": "AWS4-HMAC-SHA256"}]}"#,
        ))
        .unwrap();
        let ok = form(&[
            ("key", "uploads/${filename}"),
            ("content-type", "text/plain"),
            ("x-amz-algorithm", "AWS4-HMAC-SHA256"),
            ("policy", "..."),
            ("x-amz-signature", "..."),
            ("x-ignore-note", "anything"),
        ]);
        assert_eq!(p.check(&ok, "b", "uploads/a.txt", NOW).unwrap(), (1, 100));
        let e = p.check(&ok, "other", "uploads/a.txt", NOW).unwrap_err();
        assert_eq!(e.code, S3ErrorCode::AccessDenied);
        assert!(p.check(&ok, "b", "elsewhere/a.txt", NOW).is_err());
        let mut extra = ok.clone();
        extra.fields.push(("x-amz-meta-who".into(), "me".into()));
        let e = p.check(&extra, "b", "uploads/a.txt", NOW).unwrap_err();
        assert!(
            e.message.contains("Extra input fields: x-amz-meta-who"),
            "{}",
            e.message
        );
        let e = p
            .check(&ok, "b", "uploads/a.txt", 1_900_000_000_000)
            .unwrap_err();
        assert!(e.message.contains("expired"));
    }

    #[test]
    fn malformed_policies_are_refused() {
        for bad in [
            "not base64 !",
            &b64("not json"),
            &b64(r#"{"conditions": []}"#),
            &b64(r#"{"expiration": "tomorrow", "conditions": []}"#),
            &b64(r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["in", "$key", "a"]]}"#),
            &b64(r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["eq", "key", "a"]]}"#),
            &b64(
                r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": [["content-length-range", 5, 1]]}"#,
            ),
        ] {
            assert_eq!(
                parse(bad).unwrap_err().code,
                S3ErrorCode::InvalidPolicyDocument,
                "{bad}"
            );
        }
    }

    #[test]
    fn signature_is_hmac_of_the_base64_policy() {
        let key = super::super::sigv4::derive_signing_key("secret", "20300101", "us-east-1", "s3");
        let policy = b64(r#"{"expiration": "2030-01-01T00:00:00Z", "conditions": []}"#);
        let sig = hex::encode(super::super::sigv4::hmac(&key, policy.as_bytes()));
        assert!(signature_matches(&key, &policy, &sig));
        assert!(signature_matches(&key, &policy, &sig.to_ascii_uppercase()));
        assert!(!signature_matches(&key, &policy, &sig[1..]));
        let other =
            super::super::sigv4::derive_signing_key("secret", "20300102", "us-east-1", "s3");
        assert!(!signature_matches(&other, &policy, &sig));
        assert_eq!(
            credential("AK/20300101/us-east-1/s3/aws4_request").unwrap(),
            ("AK", "20300101", "us-east-1")
        );
        assert!(credential("AK/20300101/us-east-1/ec2/aws4_request").is_err());
    }
}
