//! Bucket policies: S3's JSON policy language, checked when a policy is put and evaluated for
//! every request to a bucket that has one.
//!
//! Evaluation follows AWS: a statement applies when its principal, action, resource and every
//! condition match the request; an applying `Deny` decides (explicit deny wins), else an
//! applying `Allow` does, else the policy says nothing and the bucket's ownership and canned ACL
//! decide (see `handlers::bucket_for`). Pure over its inputs, so unit tests drive it directly.
//!
//! What packrat reads of a policy, and refuses (`MalformedPolicy`) rather than ignore:
//! - `Principal`: `"*"` or `{"AWS": "*"}` (anyone, anonymous callers included), a user as
//!   `arn:aws:iam:::user/NAME` (the name its keys were made with), or `{"CanonicalUser": ID}`
//!   (the owner id of ListBuckets and ACLs). `NotPrincipal` is refused.
//! - `Action`/`NotAction`: `*` or `s3:NAME`, with `*` and `?` wildcards, case-insensitive.
//! - `Resource`/`NotResource`: `arn:aws:s3:::BUCKET` or `arn:aws:s3:::BUCKET/KEY`, wildcards
//!   allowed, naming this bucket.
//! - `Condition`: the operators in [`Op`] (each also with `IfExists`) over the keys in
//!   [`CONDITION_KEYS`], the request's `x-amz-*` headers as `s3:x-amz-NAME` (S3's
//!   `s3:x-amz-acl`, `s3:x-amz-server-side-encryption`, `s3:x-amz-storage-class`, ...) and the
//!   tags a request sets as `s3:RequestObjectTag/KEY`, the tags of the object a request acts on
//!   as `s3:ExistingObjectTag/KEY`; a key the request lacks fails a positive operator and
//!   passes a negated one, as AWS has it. Where an object's tags are not known (the many keys
//!   of a batch GET, an epoch stream or DeleteObjects are judged without reading each
//!   object), an `ExistingObjectTag` condition fails closed: it holds in a Deny and fails in
//!   an Allow.

use super::error::{S3Error, S3ErrorCode, S3Result};
use ipnet::IpNet;
use packrat_store_api::Identity;
use serde_json::Value;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// S3's limit on a bucket policy's size.
pub const POLICY_BYTES_MAX: usize = 20 * 1024;
/// Statements a policy may hold (a bound on the work of each request's evaluation).
pub const STATEMENTS_MAX: usize = 100;

/// The condition keys packrat can evaluate, as policies name them (compared case-insensitively,
/// as AWS does), each with the variant it is resolved to when a policy is parsed.
pub const CONDITION_KEYS: &[(&str, CondKey)] = &[
    ("aws:SourceIp", CondKey::SourceIp),
    ("aws:SecureTransport", CondKey::SecureTransport),
    ("aws:username", CondKey::Username),
    ("aws:userid", CondKey::Userid),
    ("aws:PrincipalType", CondKey::PrincipalType),
    ("aws:UserAgent", CondKey::UserAgent),
    ("aws:Referer", CondKey::Referer),
    ("s3:prefix", CondKey::Prefix),
    ("s3:delimiter", CondKey::Delimiter),
    ("s3:max-keys", CondKey::MaxKeys),
];

/// A policy's verdict on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    Deny,
    /// No statement applies.
    Silent,
}

/// What a request is, as a policy sees it.
pub struct RequestContext<'a> {
    /// `None`: an anonymous caller.
    pub principal: Option<&'a Identity>,
    /// `s3:GetObject` and the like.
    pub action: &'a str,
    /// `arn:aws:s3:::bucket` or `arn:aws:s3:::bucket/key`.
    pub resource: &'a str,
    pub source_ip: Option<IpAddr>,
    pub secure_transport: bool,
    pub user_agent: Option<&'a str>,
    pub referer: Option<&'a str>,
    /// A listing's `prefix`, `delimiter` and `max-keys` parameters.
    pub prefix: Option<&'a str>,
    pub delimiter: Option<&'a str>,
    pub max_keys: Option<&'a str>,
    /// The request's headers (`s3:x-amz-*` keys).
    pub headers: Option<&'a http::HeaderMap>,
    /// The tags the request sets (`s3:RequestObjectTag/KEY`): its `x-amz-tagging` header's,
    /// or PutObjectTagging's body's.
    pub request_tags: Option<&'a [(String, String)]>,
    /// The tags of the object the request acts on (`s3:ExistingObjectTag/KEY`; empty when
    /// there is none); `None` when they were not read.
    pub existing_tags: Option<&'a [(String, String)]>,
}

/// A condition key, resolved when the policy is parsed so that evaluating it allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CondKey {
    SourceIp,
    SecureTransport,
    Username,
    Userid,
    PrincipalType,
    UserAgent,
    Referer,
    Prefix,
    Delimiter,
    MaxKeys,
    /// `s3:x-amz-NAME`: the request header NAME (the condition's `arg`, lower case).
    AmzHeader,
    /// `s3:RequestObjectTag/KEY`: the value of tag KEY (the condition's `arg`) the request sets.
    RequestObjectTag,
    /// `s3:ExistingObjectTag/KEY`: the value of tag KEY of the object the request acts on.
    ExistingObjectTag,
}

impl CondKey {
    /// The key, and what it names (a header, a tag key) where it names one.
    fn parse(key: &str) -> Option<(CondKey, String)> {
        let lower = key.to_ascii_lowercase();
        if let Some(h) = lower
            .strip_prefix("s3:")
            .filter(|h| h.starts_with("x-amz-"))
        {
            return Some((CondKey::AmzHeader, h.to_string()));
        }
        for (prefix, k) in [
            ("s3:requestobjecttag/", CondKey::RequestObjectTag),
            ("s3:existingobjecttag/", CondKey::ExistingObjectTag),
        ] {
            if lower.starts_with(prefix) {
                let tag = &key[prefix.len()..];
                return (!tag.is_empty()).then(|| (k, tag.to_string()));
            }
        }
        CONDITION_KEYS
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .map(|(_, k)| (*k, String::new()))
    }
}

/// A request's value for a condition key.
enum Got<'a> {
    Text(&'a str),
    Ip(IpAddr),
    Flag(bool),
}

impl RequestContext<'_> {
    fn value(&self, key: CondKey, arg: &str) -> Option<Got<'_>> {
        use CondKey::*;
        match key {
            AmzHeader => (self.headers?.get(arg)?.to_str().ok()).map(Got::Text),
            RequestObjectTag => (self.request_tags?.iter())
                .find(|(k, _)| k == arg)
                .map(|(_, v)| Got::Text(v.as_str())),
            ExistingObjectTag => (self.existing_tags?.iter())
                .find(|(k, _)| k == arg)
                .map(|(_, v)| Got::Text(v.as_str())),
            SourceIp => self.source_ip.map(Got::Ip),
            SecureTransport => Some(Got::Flag(self.secure_transport)),
            Username => self.principal.map(|p| Got::Text(&p.name)),
            Userid => self.principal.map(|p| Got::Text(&p.owner_id)),
            PrincipalType => Some(Got::Text(match self.principal {
                None => "Anonymous",
                Some(p) if p.is_root => "Account",
                Some(_) => "User",
            })),
            UserAgent => self.user_agent.map(Got::Text),
            Referer => self.referer.map(Got::Text),
            Prefix => self.prefix.map(Got::Text),
            Delimiter => self.delimiter.map(Got::Text),
            MaxKeys => self.max_keys.map(Got::Text),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Allow,
    Deny,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Principal {
    Anyone,
    User(String),
    CanonicalUser(String),
}

impl Principal {
    fn matches(&self, who: Option<&Identity>) -> bool {
        match (self, who) {
            (Principal::Anyone, _) => true,
            (_, None) => false,
            (Principal::User(name), Some(id)) => *name == id.name,
            (Principal::CanonicalUser(owner), Some(id)) => *owner == id.owner_id,
        }
    }
}

/// Condition operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    StringEquals,
    StringNotEquals,
    StringEqualsIgnoreCase,
    StringNotEqualsIgnoreCase,
    StringLike,
    StringNotLike,
    NumericEquals,
    NumericNotEquals,
    NumericLessThan,
    NumericLessThanEquals,
    NumericGreaterThan,
    NumericGreaterThanEquals,
    Bool,
    IpAddress,
    NotIpAddress,
    Null,
}

impl Op {
    fn parse(name: &str) -> Option<Op> {
        use Op::*;
        Some(match name {
            "StringEquals" => StringEquals,
            "StringNotEquals" => StringNotEquals,
            "StringEqualsIgnoreCase" => StringEqualsIgnoreCase,
            "StringNotEqualsIgnoreCase" => StringNotEqualsIgnoreCase,
            "StringLike" => StringLike,
            "StringNotLike" => StringNotLike,
            "NumericEquals" => NumericEquals,
            "NumericNotEquals" => NumericNotEquals,
            "NumericLessThan" => NumericLessThan,
            "NumericLessThanEquals" => NumericLessThanEquals,
            "NumericGreaterThan" => NumericGreaterThan,
            "NumericGreaterThanEquals" => NumericGreaterThanEquals,
            "Bool" => Bool,
            "IpAddress" => IpAddress,
            "NotIpAddress" => NotIpAddress,
            "Null" => Null,
            _ => return None,
        })
    }

    /// A negated operator holds when none of its values match (and when the key is absent).
    fn negated(self) -> bool {
        matches!(
            self,
            Op::StringNotEquals
                | Op::StringNotEqualsIgnoreCase
                | Op::StringNotLike
                | Op::NumericNotEquals
                | Op::NotIpAddress
        )
    }

    /// Whether one policy value matches the request's value (for a negated operator: the
    /// positive test, negated by the caller).
    fn matches_one(self, want: &str, net: Option<&IpNet>, got: &Got<'_>) -> bool {
        use Op::*;
        let num = |s: &str| s.trim().parse::<f64>().ok();
        let ip_text;
        let got = match got {
            Got::Text(t) => *t,
            Got::Flag(true) => "true",
            Got::Flag(false) => "false",
            Got::Ip(ip) => {
                if matches!(self, IpAddress | NotIpAddress) {
                    return net.is_some_and(|n| n.contains(ip));
                }
                ip_text = ip.to_string();
                ip_text.as_str()
            }
        };
        match self {
            StringEquals | StringNotEquals => want == got,
            StringEqualsIgnoreCase | StringNotEqualsIgnoreCase => want.eq_ignore_ascii_case(got),
            StringLike | StringNotLike => glob(want.as_bytes(), got.as_bytes(), false),
            NumericEquals
            | NumericNotEquals
            | NumericLessThan
            | NumericLessThanEquals
            | NumericGreaterThan
            | NumericGreaterThanEquals => {
                let (Some(g), Some(w)) = (num(got), num(want)) else {
                    return false;
                };
                match self {
                    NumericEquals | NumericNotEquals => g == w,
                    NumericLessThan => g < w,
                    NumericLessThanEquals => g <= w,
                    NumericGreaterThan => g > w,
                    _ => g >= w,
                }
            }
            Bool => want.eq_ignore_ascii_case(got),
            // A textual value against a network: only an address written as text matches.
            IpAddress | NotIpAddress => match (net, got.parse::<IpAddr>()) {
                (Some(n), Ok(ip)) => n.contains(&ip),
                _ => false,
            },
            // Handled by `Condition::holds`.
            Null => false,
        }
    }
}

#[derive(Debug, Clone)]
struct Condition {
    op: Op,
    if_exists: bool,
    key: CondKey,
    /// What the key names: a header (`AmzHeader`), a tag key (`RequestObjectTag`).
    arg: String,
    values: Vec<String>,
    /// The parsed networks of an `IpAddress`/`NotIpAddress` condition, one per value.
    nets: Vec<IpNet>,
}

impl Condition {
    fn holds(&self, ctx: &RequestContext<'_>, effect: Effect) -> bool {
        if self.key == CondKey::ExistingObjectTag && ctx.existing_tags.is_none() {
            // Tags not read: fail closed.
            return effect == Effect::Deny;
        }
        let got = ctx.value(self.key, &self.arg);
        if self.op == Op::Null {
            // `"Null": {"k": "true"}`: holds when the key is absent.
            let want_absent = self.values.iter().any(|v| v.eq_ignore_ascii_case("true"));
            return want_absent == got.is_none();
        }
        let Some(got) = got else {
            return self.if_exists || self.op.negated();
        };
        let any = self
            .values
            .iter()
            .enumerate()
            .any(|(i, v)| self.op.matches_one(v, self.nets.get(i), &got));
        if self.op.negated() { !any } else { any }
    }
}

#[derive(Debug, Clone)]
struct Statement {
    effect: Effect,
    principals: Vec<Principal>,
    actions: Vec<String>,
    not_action: bool,
    resources: Vec<String>,
    not_resource: bool,
    conditions: Vec<Condition>,
}

impl Statement {
    fn applies(&self, ctx: &RequestContext<'_>) -> bool {
        self.principals.iter().any(|p| p.matches(ctx.principal))
            && (self
                .actions
                .iter()
                .any(|a| glob(a.as_bytes(), ctx.action.as_bytes(), true))
                != self.not_action)
            && (self
                .resources
                .iter()
                .any(|r| glob(r.as_bytes(), ctx.resource.as_bytes(), false))
                != self.not_resource)
            && self.conditions.iter().all(|c| c.holds(ctx, self.effect))
    }
}

/// A bucket's Block Public Access settings (PutPublicAccessBlock), as S3 has them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublicAccessBlock {
    /// PutBucketAcl with a public ACL is refused.
    pub block_public_acls: bool,
    /// A public-read ACL grants anonymous callers nothing.
    pub ignore_public_acls: bool,
    /// PutBucketPolicy with a public policy is refused.
    pub block_public_policy: bool,
    /// While the bucket's policy is public, it grants anonymous callers nothing.
    pub restrict_public_buckets: bool,
}

/// A parsed, checked bucket policy, with the bucket's Block Public Access settings (a bucket
/// with settings and no policy has one of no statements).
#[derive(Debug, Clone)]
pub struct Policy {
    statements: Vec<Statement>,
    pub block: PublicAccessBlock,
    /// The bucket's ACL grants (PutBucketAcl beyond `private` and `public-read`), judged where
    /// the statements are silent; they travel with the policy (one cache, one lookup).
    pub bucket_acl: Option<super::acl::Acl>,
    /// Whether a condition names the tags a request sets (`s3:RequestObjectTag/KEY`), and
    /// the tags of the object it acts on (`s3:ExistingObjectTag/KEY`): found once at parse,
    /// so a request to a bucket whose policy names neither pays no scan of the statements.
    reads_request_tags: bool,
    reads_existing_tags: bool,
}

impl Policy {
    /// No statements: what holds is the bucket's ACL, as `block` lets it.
    pub fn blocking(block: PublicAccessBlock) -> Policy {
        Self::of(Vec::new(), block)
    }

    fn of(statements: Vec<Statement>, block: PublicAccessBlock) -> Policy {
        let names =
            |key: CondKey| (statements.iter()).any(|s| s.conditions.iter().any(|c| c.key == key));
        Policy {
            reads_request_tags: names(CondKey::RequestObjectTag),
            reads_existing_tags: names(CondKey::ExistingObjectTag),
            statements,
            block,
            bucket_acl: None,
        }
    }

    /// Whether the policy is public as S3 judges it: a statement allows anyone (`"*"`)
    /// without holding them to fixed source networks (an `IpAddress` condition on
    /// `aws:SourceIp` none of whose networks is everything).
    pub fn is_public(&self) -> bool {
        self.statements.iter().any(|s| {
            s.effect == Effect::Allow
                && s.principals.iter().any(|p| matches!(p, Principal::Anyone))
                && !s.conditions.iter().any(|c| {
                    c.op == Op::IpAddress
                        && c.key == CondKey::SourceIp
                        && !c.nets.is_empty()
                        && c.nets.iter().all(|n| n.prefix_len() > 0)
                })
        })
    }

    /// Whether a condition names the tags a request sets (`s3:RequestObjectTag/KEY`): only
    /// then are a request's `x-amz-tagging` tags parsed for it.
    pub fn reads_request_tags(&self) -> bool {
        self.reads_request_tags
    }

    /// Whether a condition names the tags of the object a request acts on: only then are
    /// they read before the request is judged.
    pub fn reads_existing_tags(&self) -> bool {
        self.reads_existing_tags
    }

    /// Explicit deny wins, then allow; [`Decision::Silent`] when no statement applies.
    pub fn evaluate(&self, ctx: &RequestContext<'_>) -> Decision {
        let mut allowed = false;
        for s in &self.statements {
            if s.applies(ctx) {
                match s.effect {
                    Effect::Deny => return Decision::Deny,
                    Effect::Allow => allowed = true,
                }
            }
        }
        if allowed {
            Decision::Allow
        } else {
            Decision::Silent
        }
    }
}

fn malformed(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::MalformedPolicy, msg)
}

/// A JSON value that may be one string or a list of them (numbers and booleans as text, as
/// condition values are written either way).
fn strings(v: &Value, what: &str) -> S3Result<Vec<String>> {
    let one = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(malformed(format!(
            "{what} must be a string or a list of them"
        ))),
    };
    let out = match v {
        Value::Array(a) => a.iter().map(one).collect::<S3Result<Vec<_>>>()?,
        v => vec![one(v)?],
    };
    if out.is_empty() {
        return Err(malformed(format!("{what} is empty")));
    }
    Ok(out)
}

fn principals(v: &Value) -> S3Result<Vec<Principal>> {
    const ARN_USER: &str = "arn:aws:iam:::user/";
    let aws = |s: String| {
        if s == "*" {
            Ok(Principal::Anyone)
        } else if let Some(name) = s.strip_prefix(ARN_USER).filter(|n| !n.is_empty()) {
            Ok(Principal::User(name.to_string()))
        } else {
            Err(malformed(format!(
                "Invalid principal in policy: '{s}' (packrat has no accounts: name a user as \
                 arn:aws:iam:::user/NAME, an owner as {{\"CanonicalUser\": ID}}, or anyone as \"*\")"
            )))
        }
    };
    match v {
        Value::String(s) if s == "*" => Ok(vec![Principal::Anyone]),
        Value::Object(m) if !m.is_empty() => {
            let mut out = Vec::new();
            for (kind, ids) in m {
                for id in strings(ids, "Principal")? {
                    out.push(match kind.as_str() {
                        "AWS" => aws(id)?,
                        "CanonicalUser" => Principal::CanonicalUser(id),
                        other => {
                            return Err(malformed(format!(
                                "Invalid principal in policy: the principal type '{other}' is not one packrat has (AWS, CanonicalUser)"
                            )));
                        }
                    });
                }
            }
            Ok(out)
        }
        _ => Err(malformed("Invalid principal in policy")),
    }
}

fn check_action(a: &str) -> S3Result<()> {
    let ok = a == "*"
        || a.strip_prefix("s3:").is_some_and(|n| {
            !n.is_empty()
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'*' || b == b'?')
        });
    if ok {
        Ok(())
    } else {
        Err(malformed(format!("Policy has invalid action: '{a}'")))
    }
}

fn check_resource(r: &str, bucket: &str) -> S3Result<()> {
    let names_bucket = r.strip_prefix("arn:aws:s3:::").is_some_and(|rest| {
        let b = rest.split('/').next().unwrap_or("");
        glob(b.as_bytes(), bucket.as_bytes(), false)
    });
    if r == "*" || names_bucket {
        Ok(())
    } else {
        Err(malformed(format!(
            "Policy has invalid resource: '{r}' (a bucket policy names arn:aws:s3:::{bucket} or arn:aws:s3:::{bucket}/KEY)"
        )))
    }
}

fn conditions(v: &Value) -> S3Result<Vec<Condition>> {
    let Value::Object(ops) = v else {
        return Err(malformed("Condition must be an object"));
    };
    let mut out = Vec::new();
    for (op_name, keys) in ops {
        if op_name.starts_with("ForAnyValue:") || op_name.starts_with("ForAllValues:") {
            return Err(malformed(format!(
                "Condition operator '{op_name}': set operators are not supported (every key packrat evaluates has one value)"
            )));
        }
        let (base, if_exists) = match op_name.strip_suffix("IfExists") {
            Some(b) => (b, true),
            None => (op_name.as_str(), false),
        };
        let op = Op::parse(base)
            .filter(|op| !(if_exists && *op == Op::Null))
            .ok_or_else(|| malformed(format!("Invalid Condition type: '{op_name}'")))?;
        let Value::Object(keys) = keys else {
            return Err(malformed(format!(
                "Condition '{op_name}' must map keys to values"
            )));
        };
        for (key, values) in keys {
            let Some((cond_key, arg)) = CondKey::parse(key) else {
                return Err(malformed(format!(
                    "Policy has an invalid condition key: '{key}' (packrat evaluates {}, s3:x-amz-* request headers and s3:RequestObjectTag/KEY)",
                    CONDITION_KEYS
                        .iter()
                        .map(|(name, _)| *name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            };
            let values = strings(values, "a condition value")?;
            let nets = if matches!(op, Op::IpAddress | Op::NotIpAddress) {
                values
                    .iter()
                    .map(|v| {
                        v.parse::<IpNet>()
                            .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
                            .map_err(|_| malformed(format!("Invalid IP address: '{v}'")))
                    })
                    .collect::<S3Result<Vec<_>>>()?
            } else {
                Vec::new()
            };
            out.push(Condition {
                op,
                if_exists,
                key: cond_key,
                arg,
                values,
                nets,
            });
        }
    }
    Ok(out)
}

/// Parses and checks a policy for `bucket`, as PutBucketPolicy receives it.
pub fn parse(doc: &[u8], bucket: &str) -> S3Result<Policy> {
    if doc.len() > POLICY_BYTES_MAX {
        return Err(malformed(format!(
            "Policies must be at most {POLICY_BYTES_MAX} bytes"
        )));
    }
    let v: Value = serde_json::from_slice(doc)
        .map_err(|e| malformed(format!("This policy contains invalid Json: {e}")))?;
    let Value::Object(top) = v else {
        return Err(malformed("A policy is a JSON object"));
    };
    for k in top.keys() {
        if !matches!(k.as_str(), "Version" | "Id" | "Statement") {
            return Err(malformed(format!("Unknown field {k}")));
        }
    }
    match top.get("Version").and_then(Value::as_str) {
        None | Some("2012-10-17") | Some("2008-10-17") => {}
        Some(v) => {
            return Err(malformed(format!(
                "The policy language version '{v}' is not 2012-10-17"
            )));
        }
    }
    let stmts = match top.get("Statement") {
        Some(Value::Array(a)) => a.clone(),
        Some(o @ Value::Object(_)) => vec![o.clone()],
        _ => return Err(malformed("Missing required field Statement")),
    };
    if stmts.is_empty() || stmts.len() > STATEMENTS_MAX {
        return Err(malformed(format!(
            "A policy holds 1 to {STATEMENTS_MAX} statements"
        )));
    }
    let mut statements = Vec::with_capacity(stmts.len());
    for s in &stmts {
        let Value::Object(s) = s else {
            return Err(malformed("A statement is a JSON object"));
        };
        for k in s.keys() {
            match k.as_str() {
                "Sid" | "Effect" | "Principal" | "Action" | "NotAction" | "Resource"
                | "NotResource" | "Condition" => {}
                "NotPrincipal" => {
                    return Err(malformed("NotPrincipal is not supported by packrat"));
                }
                other => return Err(malformed(format!("Unknown field {other}"))),
            }
        }
        let effect = match s.get("Effect").and_then(Value::as_str) {
            Some("Allow") => Effect::Allow,
            Some("Deny") => Effect::Deny,
            _ => return Err(malformed("Invalid effect: Effect must be Allow or Deny")),
        };
        let principals = principals(
            s.get("Principal")
                .ok_or_else(|| malformed("Missing required field Principal"))?,
        )?;
        let (actions, not_action) = match (s.get("Action"), s.get("NotAction")) {
            (Some(a), None) => (strings(a, "Action")?, false),
            (None, Some(a)) => (strings(a, "NotAction")?, true),
            _ => return Err(malformed("A statement has one of Action or NotAction")),
        };
        for a in &actions {
            check_action(a)?;
        }
        let (resources, not_resource) = match (s.get("Resource"), s.get("NotResource")) {
            (Some(r), None) => (strings(r, "Resource")?, false),
            (None, Some(r)) => (strings(r, "NotResource")?, true),
            _ => return Err(malformed("A statement has one of Resource or NotResource")),
        };
        for r in &resources {
            check_resource(r, bucket)?;
        }
        let conditions = match s.get("Condition") {
            None => Vec::new(),
            Some(c) => conditions(c)?,
        };
        statements.push(Statement {
            effect,
            principals,
            actions,
            not_action,
            resources,
            not_resource,
            conditions,
        });
    }
    Ok(Policy::of(statements, PublicAccessBlock::default()))
}

/// How long a gateway trusts the policy it read for a bucket. A policy put or deleted through
/// this gateway applies at once here; another gateway of a cluster sees it within this time
/// (AWS also applies policy changes eventually).
pub const POLICY_CACHE_TTL: Duration = Duration::from_secs(1);
/// Buckets whose policies a gateway keeps; past it the cache starts over (a bound on memory).
pub const POLICY_CACHE_BUCKETS_MAX: usize = 100_000;

/// Each bucket's parsed configuration of one kind (or that it has none), by bucket id: one
/// read lock and a map probe per request, so a bucket without a policy (or default
/// encryption) pays for no store read or parse on its requests. Ids are never reused, so a
/// bucket made again under an old name never finds the old bucket's configuration.
pub struct ConfigCache<T> {
    entries: RwLock<HashMap<u64, Cached<T>>>,
    /// Bumped by every [`ConfigCache::forget`]: a read that began before a change does not
    /// put the older configuration back.
    generation: AtomicU64,
}

/// A bucket's configuration (`None`: it has none) and when it was read.
type Cached<T> = (Instant, Option<Arc<T>>);

/// The bucket policies a gateway keeps.
pub type PolicyCache = ConfigCache<Policy>;

impl<T> Default for ConfigCache<T> {
    fn default() -> Self {
        Self {
            entries: RwLock::default(),
            generation: AtomicU64::new(0),
        }
    }
}

impl<T> ConfigCache<T> {
    /// The cached configuration of a bucket, if still fresh; `Err` when it must be read
    /// again, with the generation to hand back to [`ConfigCache::store`].
    pub fn fresh(&self, bucket_id: u64) -> Result<Option<Arc<T>>, u64> {
        let generation = self.generation.load(Ordering::Acquire);
        let map = self.entries.read().unwrap_or_else(|p| p.into_inner());
        match map.get(&bucket_id) {
            Some((at, p)) if at.elapsed() < POLICY_CACHE_TTL => Ok(p.clone()),
            _ => Err(generation),
        }
    }

    pub fn store(&self, bucket_id: u64, policy: Option<Arc<T>>, generation: u64) {
        let mut map = self.entries.write().unwrap_or_else(|p| p.into_inner());
        if self.generation.load(Ordering::Acquire) != generation {
            return;
        }
        if map.len() >= POLICY_CACHE_BUCKETS_MAX {
            map.clear();
        }
        map.insert(bucket_id, (Instant::now(), policy));
    }

    /// After a bucket's configuration changed (or the bucket went) through this gateway.
    pub fn forget(&self, bucket_id: u64) {
        let mut map = self.entries.write().unwrap_or_else(|p| p.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        map.remove(&bucket_id);
    }
}

/// AWS's wildcard match: `*` any run of characters (none too), `?` any one; iterative, with
/// one backtrack point, so a pattern costs O(pattern × text) at worst.
fn glob(pattern: &[u8], text: &[u8], ignore_case: bool) -> bool {
    let eq = |a: u8, b: u8| {
        if ignore_case {
            a.eq_ignore_ascii_case(&b)
        } else {
            a == b
        }
    };
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || eq(pattern[p], text[t])) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str, owner: &str) -> Identity {
        Identity {
            access_key: format!("AK{name}"),
            secret_key: "s".into(),
            name: name.into(),
            owner_id: owner.into(),
            is_root: false,
        }
    }

    fn ctx<'a>(
        who: Option<&'a Identity>,
        action: &'a str,
        resource: &'a str,
    ) -> RequestContext<'a> {
        RequestContext {
            principal: who,
            action,
            resource,
            source_ip: Some("127.0.0.1".parse().unwrap()),
            secure_transport: false,
            user_agent: None,
            referer: None,
            prefix: None,
            delimiter: None,
            max_keys: None,
            headers: None,
            request_tags: None,
            existing_tags: None,
        }
    }

    /// A policy is public when a statement allows anyone from anywhere; a named principal, a
    /// Deny, or networks that are not everything make it not public (Block Public Access).
    #[test]
    fn public_policies_are_told_apart() {
        let statement = |effect: &str, principal: &str, condition: &str| {
            format!(
                r#"{{"Statement":[{{"Effect":"{effect}","Principal":{principal},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"{condition}}}]}}"#
            )
        };
        let public = |doc: String| parse(doc.as_bytes(), "b").unwrap().is_public();
        assert!(public(statement("Allow", r#""*""#, "")));
        assert!(public(statement("Allow", r#"{"AWS":"*"}"#, "")));
        let anywhere = r#","Condition":{"IpAddress":{"aws:SourceIp":["10.0.0.0/8","0.0.0.0/0"]}}"#;
        assert!(public(statement("Allow", r#""*""#, anywhere)));
        let agent = r#","Condition":{"StringLike":{"aws:UserAgent":"x*"}}"#;
        assert!(public(statement("Allow", r#""*""#, agent)));
        let fenced = r#","Condition":{"IpAddress":{"aws:SourceIp":"10.0.0.0/8"}}"#;
        assert!(!public(statement("Allow", r#""*""#, fenced)));
        assert!(!public(statement("Deny", r#""*""#, "")));
        let named = r#"{"AWS":"arn:aws:iam:::user/bob"}"#;
        assert!(!public(statement("Allow", named, "")));
    }

    #[test]
    fn every_condition_key_resolves_to_its_own_variant() {
        let keys: Vec<CondKey> = CONDITION_KEYS
            .iter()
            .map(|(name, k)| {
                assert_eq!(
                    CondKey::parse(&name.to_uppercase()),
                    Some((*k, String::new())),
                    "{name}"
                );
                *k
            })
            .collect();
        for (i, a) in keys.iter().enumerate() {
            assert!(!keys[i + 1..].contains(a), "{}", CONDITION_KEYS[i].0);
        }
        let plain = |k| Some((k, String::new()));
        assert_eq!(CondKey::parse("aws:sourceip"), plain(CondKey::SourceIp));
        assert_eq!(CondKey::parse("s3:max-keys"), plain(CondKey::MaxKeys));
        // Headers by their lower-case name; tag keys as written (they are case-sensitive).
        assert_eq!(
            CondKey::parse("s3:X-Amz-Server-Side-Encryption"),
            Some((CondKey::AmzHeader, "x-amz-server-side-encryption".into()))
        );
        assert_eq!(
            CondKey::parse("s3:RequestObjectTag/Project"),
            Some((CondKey::RequestObjectTag, "Project".into()))
        );
        assert_eq!(
            CondKey::parse("s3:ExistingObjectTag/Class"),
            Some((CondKey::ExistingObjectTag, "Class".into()))
        );
        for refused in [
            "s3:RequestObjectTag/",
            "s3:ExistingObjectTag/",
            "s3:other",
            "x-amz-acl",
        ] {
            assert_eq!(CondKey::parse(refused), None, "{refused}");
        }
    }

    #[test]
    fn existing_tag_conditions_fail_closed_when_not_read() {
        let p = parse(
            br#"{"Statement":[
              {"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*",
               "Condition":{"StringEquals":{"s3:ExistingObjectTag/share":"yes"}}},
              {"Effect":"Deny","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*",
               "Condition":{"StringEquals":{"s3:ExistingObjectTag/class":"secret"}}}]}"#,
            "b",
        )
        .unwrap();
        assert!(p.reads_existing_tags() && !p.reads_request_tags());
        let judge = |tags: Option<&[(String, String)]>| {
            let mut c = ctx(None, "s3:GetObject", "arn:aws:s3:::b/k");
            c.existing_tags = tags;
            p.evaluate(&c)
        };
        let t = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(judge(Some(&t(&[("share", "yes")]))), Decision::Allow);
        assert_eq!(judge(Some(&t(&[]))), Decision::Silent);
        let secret = t(&[("share", "yes"), ("class", "secret")]);
        assert_eq!(judge(Some(&secret)), Decision::Deny);
        assert_eq!(judge(None), Decision::Deny, "not read: the Deny holds");
    }

    #[test]
    fn header_and_request_tag_conditions() {
        let p = parse(
            br#"{"Statement":[
              {"Effect":"Deny","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*",
               "Condition":{"StringNotEquals":{"s3:x-amz-server-side-encryption":"AES256"}}},
              {"Effect":"Allow","Principal":"*","Action":"s3:PutObject","Resource":"arn:aws:s3:::b/*",
               "Condition":{"StringEquals":{"s3:RequestObjectTag/team":"ml"}}},
              {"Effect":"Deny","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*",
               "Condition":{"StringEquals":{"s3:x-amz-acl":"public-read"}}}]}"#,
            "b",
        )
        .unwrap();
        assert!(p.reads_request_tags());
        let mut h = http::HeaderMap::new();
        let put = |h: &http::HeaderMap, tags: Option<&[(String, String)]>| {
            let mut c = ctx(None, "s3:PutObject", "arn:aws:s3:::b/k");
            c.headers = Some(h);
            c.request_tags = tags;
            p.evaluate(&c)
        };
        assert_eq!(put(&h, None), Decision::Deny, "no encryption header");
        h.insert("x-amz-server-side-encryption", "AES256".parse().unwrap());
        assert_eq!(put(&h, None), Decision::Silent, "encrypted, untagged");
        let ml = [("team".to_string(), "ml".to_string())];
        let other = [("team".to_string(), "web".to_string())];
        assert_eq!(put(&h, Some(&ml)), Decision::Allow);
        assert_eq!(put(&h, Some(&other)), Decision::Silent);
        let mut get = ctx(None, "s3:GetObject", "arn:aws:s3:::b/k");
        assert_eq!(p.evaluate(&get), Decision::Silent, "no x-amz-acl header");
        h.insert("x-amz-acl", "public-read".parse().unwrap());
        get.headers = Some(&h);
        assert_eq!(p.evaluate(&get), Decision::Deny);
    }

    #[test]
    fn glob_matches_as_aws_wildcards() {
        assert!(glob(b"arn:aws:s3:::b/*", b"arn:aws:s3:::b/x/y", false));
        assert!(glob(b"*", b"", false));
        assert!(glob(b"a?c", b"abc", false));
        assert!(!glob(b"a?c", b"ac", false));
        assert!(glob(b"s3:get*", b"s3:GetObject", true));
        assert!(!glob(b"s3:get*", b"s3:GetObject", false));
        assert!(glob(b"*a*b*c", b"xxaxxbxxbc", false));
        assert!(!glob(b"b/*", b"c/x", false));
        // A pathological pattern stays quick.
        let text = vec![b'a'; 5000];
        assert!(!glob(b"*a*a*a*a*a*b", &text, false));
    }

    #[test]
    fn deny_wins_over_allow_and_silence_falls_through() {
        let p = parse(
            br#"{"Version":"2012-10-17","Statement":[
              {"Effect":"Allow","Principal":{"AWS":["arn:aws:iam:::user/alice"]},
               "Action":["s3:GetObject","s3:ListBucket"],"Resource":["arn:aws:s3:::b","arn:aws:s3:::b/*"]},
              {"Effect":"Deny","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/secret/*"}]}"#,
            "b",
        )
        .unwrap();
        let alice = id("alice", "o-alice");
        let carol = id("carol", "o-carol");
        let r = |who, a, res| p.evaluate(&ctx(who, a, res));
        assert_eq!(
            r(Some(&alice), "s3:GetObject", "arn:aws:s3:::b/x"),
            Decision::Allow
        );
        assert_eq!(
            r(Some(&alice), "s3:GetObject", "arn:aws:s3:::b/secret/x"),
            Decision::Deny
        );
        assert_eq!(
            r(None, "s3:GetObject", "arn:aws:s3:::b/secret/x"),
            Decision::Deny
        );
        assert_eq!(
            r(Some(&carol), "s3:GetObject", "arn:aws:s3:::b/x"),
            Decision::Silent
        );
        assert_eq!(
            r(Some(&alice), "s3:PutObject", "arn:aws:s3:::b/x"),
            Decision::Silent
        );
        assert_eq!(
            r(Some(&alice), "s3:ListBucket", "arn:aws:s3:::b"),
            Decision::Allow
        );
    }

    #[test]
    fn conditions_follow_aws_rules_for_missing_keys() {
        let p = parse(
            br#"{"Statement":[{"Effect":"Deny","Principal":"*","Action":"s3:*","Resource":"arn:aws:s3:::b/*",
                 "Condition":{"Bool":{"aws:SecureTransport":"false"}}},
               {"Effect":"Allow","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b",
                 "Condition":{"StringLike":{"s3:prefix":["public/*",""]}}},
               {"Effect":"Deny","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b",
                 "Condition":{"NotIpAddress":{"aws:SourceIp":["127.0.0.0/8","::1"]}}}]}"#,
            "b",
        )
        .unwrap();
        let mut c = ctx(None, "s3:GetObject", "arn:aws:s3:::b/k");
        assert_eq!(p.evaluate(&c), Decision::Deny, "plain http is refused");
        c.secure_transport = true;
        assert_eq!(p.evaluate(&c), Decision::Silent);
        let mut l = ctx(None, "s3:ListBucket", "arn:aws:s3:::b");
        // s3:prefix absent: StringLike fails, the allow does not apply.
        assert_eq!(p.evaluate(&l), Decision::Silent);
        l.prefix = Some("public/a");
        assert_eq!(p.evaluate(&l), Decision::Allow);
        l.prefix = Some("private/");
        assert_eq!(p.evaluate(&l), Decision::Silent);
        l.prefix = Some("public/a");
        l.source_ip = Some("10.1.2.3".parse().unwrap());
        assert_eq!(
            p.evaluate(&l),
            Decision::Deny,
            "outside the allowed networks"
        );
        l.source_ip = Some("::1".parse().unwrap());
        assert_eq!(p.evaluate(&l), Decision::Allow);
        // A key the request lacks passes a negated operator.
        l.source_ip = None;
        assert_eq!(p.evaluate(&l), Decision::Deny);
    }

    #[test]
    fn numeric_null_and_if_exists() {
        let p = parse(
            br#"{"Statement":[{"Effect":"Deny","Principal":"*","Action":"s3:ListBucket","Resource":"arn:aws:s3:::b",
                 "Condition":{"NumericGreaterThanIfExists":{"s3:max-keys":"10"}}},
               {"Effect":"Deny","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*",
                 "Condition":{"Null":{"aws:username":"true"}}}]}"#,
            "b",
        )
        .unwrap();
        let mut l = ctx(None, "s3:ListBucket", "arn:aws:s3:::b");
        assert_eq!(p.evaluate(&l), Decision::Deny, "IfExists holds when absent");
        l.max_keys = Some("5");
        assert_eq!(p.evaluate(&l), Decision::Silent);
        l.max_keys = Some("1000");
        assert_eq!(p.evaluate(&l), Decision::Deny);
        assert_eq!(
            p.evaluate(&ctx(None, "s3:GetObject", "arn:aws:s3:::b/k")),
            Decision::Deny,
            "anonymous callers have no user name"
        );
        let bob = id("bob", "o-bob");
        assert_eq!(
            p.evaluate(&ctx(Some(&bob), "s3:GetObject", "arn:aws:s3:::b/k")),
            Decision::Silent
        );
    }

    #[test]
    fn canonical_user_and_not_action() {
        let p = parse(
            br#"{"Statement":{"Effect":"Deny","Principal":{"CanonicalUser":"o-bob"},
                 "NotAction":["s3:Get*","s3:List*"],"NotResource":"arn:aws:s3:::b/scratch/*"}}"#,
            "b",
        )
        .unwrap();
        let bob = id("bob", "o-bob");
        let e = |a, r| p.evaluate(&ctx(Some(&bob), a, r));
        assert_eq!(e("s3:PutObject", "arn:aws:s3:::b/data/x"), Decision::Deny);
        assert_eq!(
            e("s3:PutObject", "arn:aws:s3:::b/scratch/x"),
            Decision::Silent
        );
        assert_eq!(e("s3:GetObject", "arn:aws:s3:::b/data/x"), Decision::Silent);
    }

    #[test]
    fn malformed_policies_are_refused_with_a_reason() {
        let bad: &[(&str, &str)] = &[
            ("not json", "invalid Json"),
            (r#"[]"#, "JSON object"),
            (r#"{"Statement":[]}"#, "statements"),
            (r#"{"Version":"2000-01-01","Statement":[]}"#, "version"),
            (
                r#"{"Statement":[{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}]}"#,
                "Principal",
            ),
            (
                r#"{"Statement":[{"Effect":"Maybe","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}]}"#,
                "effect",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"iam:CreateUser","Resource":"arn:aws:s3:::b/*"}]}"#,
                "invalid action",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::other/*"}]}"#,
                "invalid resource",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","Principal":{"AWS":"arn:aws:iam::123456789012:root"},"Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}]}"#,
                "Invalid principal",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","NotPrincipal":"*","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}]}"#,
                "NotPrincipal",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{"StringEquals":{"aws:CurrentTime":"x"}}}]}"#,
                "condition key",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{"DateEquals":{"aws:username":"x"}}}]}"#,
                "Condition type",
            ),
            (
                r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*","Condition":{"IpAddress":{"aws:SourceIp":"not-an-ip"}}}]}"#,
                "IP address",
            ),
        ];
        for (doc, why) in bad {
            let e = parse(doc.as_bytes(), "b").expect_err(doc);
            assert_eq!(e.code, S3ErrorCode::MalformedPolicy, "{doc}");
            assert!(
                e.message.to_lowercase().contains(&why.to_lowercase()),
                "{doc}: {}",
                e.message
            );
        }
        let big = format!(
            r#"{{"Id":"{}","Statement":[{{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::b/*"}}]}}"#,
            "x".repeat(POLICY_BYTES_MAX)
        );
        assert_eq!(
            parse(big.as_bytes(), "b").unwrap_err().code,
            S3ErrorCode::MalformedPolicy
        );
    }
}
