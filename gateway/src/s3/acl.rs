//! Object ACLs: the grants an object carries of its own, in a bucket whose Object Ownership
//! (PutBucketOwnershipControls) is `ObjectWriter` or `BucketOwnerPreferred`. In a bucket with
//! S3's default, `BucketOwnerEnforced`, objects have none and this module is not asked.
//!
//! An object's ACL is stored with its attributes, as the stored header [`ACL_HEADER`] (JSON of
//! [`Acl`], never shown to clients); an object without one is owned by the bucket's owner and
//! grants nobody else anything. Grants only ever add access: a caller the bucket (its owner,
//! its policy, its canned ACL) already lets in is not asked about the object's ACL, and an
//! explicit Deny in the bucket policy is never overridden by one.
//!
//! This module is the model (parse, store, judge, show); the handlers wire it in
//! (`handlers::object_acl`).

use serde::{Deserialize, Serialize};

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::headers::{Kind, RequestHeaders};
use super::xml::{self, Xml};
use packrat_store_api::Identity;

pub use packrat_store_api::ACL_HEADER;

const ALL_USERS: &str = "http://acs.amazonaws.com/groups/global/AllUsers";
const AUTHENTICATED_USERS: &str = "http://acs.amazonaws.com/groups/global/AuthenticatedUsers";
const XSI: &str = "xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"";

pub use super::ownership::Ownership;

/// What a grant allows. On an object: READ its bytes, READ_ACP and WRITE_ACP its ACL (`WRITE`
/// has no meaning for an object and is refused). On a bucket: READ lists it and reads its
/// objects, WRITE writes and deletes its objects, READ_ACP and WRITE_ACP its ACL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Permission {
    /// GetObject, HeadObject, GetObjectAttributes (of any version); on a bucket, listings too.
    #[serde(rename = "READ")]
    Read,
    /// A bucket's: PutObject, DeleteObject and the multipart steps.
    #[serde(rename = "WRITE")]
    Write,
    /// GetObjectAcl.
    #[serde(rename = "READ_ACP")]
    ReadAcp,
    /// PutObjectAcl.
    #[serde(rename = "WRITE_ACP")]
    WriteAcp,
    #[serde(rename = "FULL_CONTROL")]
    FullControl,
}

/// What an ACL is for: WRITE and some canned ACLs mean something on a bucket only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum On {
    Object,
    Bucket,
}

impl Permission {
    fn parse(s: &str, on: On) -> S3Result<Self> {
        match s {
            "READ" => Ok(Self::Read),
            "READ_ACP" => Ok(Self::ReadAcp),
            "WRITE_ACP" => Ok(Self::WriteAcp),
            "FULL_CONTROL" => Ok(Self::FullControl),
            "WRITE" if on == On::Bucket => Ok(Self::Write),
            "WRITE" => Err(malformed(
                "the permission WRITE does not apply to an object",
            )),
            other => Err(malformed(&format!("unknown permission '{other}'"))),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Read => "READ",
            Self::Write => "WRITE",
            Self::ReadAcp => "READ_ACP",
            Self::WriteAcp => "WRITE_ACP",
            Self::FullControl => "FULL_CONTROL",
        }
    }

    fn includes(self, wanted: Permission) -> bool {
        self == wanted || self == Self::FullControl
    }
}

/// A user: canonical id and display name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    pub id: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Grantee {
    User(Person),
    /// Anyone, signed or not.
    AllUsers,
    /// Anyone holding a key of this server.
    AuthenticatedUsers,
}

impl Grantee {
    fn is_public(&self) -> bool {
        matches!(self, Self::AllUsers | Self::AuthenticatedUsers)
    }

    fn covers(&self, caller: Option<&Identity>) -> bool {
        match self {
            Self::User(p) => caller.is_some_and(|c| c.owner_id == p.id),
            Self::AllUsers => true,
            Self::AuthenticatedUsers => caller.is_some(),
        }
    }
}

/// An object's owner and grants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acl {
    pub owner: Person,
    pub grants: Vec<(Grantee, Permission)>,
}

/// Looks a canonical user id up among the server's users: their display name, `None` if no
/// user has that id.
pub type Users<'a> = &'a dyn Fn(&str) -> Option<String>;

impl Acl {
    /// The owner alone, with full control (the canned ACL `private`).
    pub fn private(owner: Person) -> Self {
        let grants = vec![(Grantee::User(owner.clone()), Permission::FullControl)];
        Self { owner, grants }
    }

    /// A canned ACL (`x-amz-acl`) for an object owned by `owner` in a bucket owned by
    /// `bucket_owner`.
    pub fn canned(name: &str, owner: Person, bucket_owner: &Person) -> S3Result<Self> {
        Self::canned_on(name, owner, bucket_owner, On::Object)
    }

    /// A bucket's canned ACL (`x-amz-acl` on CreateBucket and PutBucketAcl).
    pub fn canned_bucket(name: &str, owner: Person) -> S3Result<Self> {
        let same = owner.clone();
        Self::canned_on(name, owner, &same, On::Bucket)
    }

    fn canned_on(name: &str, owner: Person, bucket_owner: &Person, on: On) -> S3Result<Self> {
        let mut acl = Self::private(owner);
        let extra = match name {
            "private" => None,
            "public-read-write" if on == On::Bucket => {
                acl.grants.push((Grantee::AllUsers, Permission::Read));
                Some((Grantee::AllUsers, Permission::Write))
            }
            // READ is all an object takes of public-read-write (WRITE has no meaning for it).
            "public-read" | "public-read-write" => Some((Grantee::AllUsers, Permission::Read)),
            "log-delivery-write" if on == On::Bucket => {
                return Err(S3Error::new(
                    S3ErrorCode::NotImplemented,
                    "packrat does not implement the canned ACL log-delivery-write (server access logging)",
                ));
            }
            "authenticated-read" => Some((Grantee::AuthenticatedUsers, Permission::Read)),
            "bucket-owner-read" => Some((Grantee::User(bucket_owner.clone()), Permission::Read)),
            "bucket-owner-full-control" => {
                Some((Grantee::User(bucket_owner.clone()), Permission::FullControl))
            }
            "aws-exec-read" => {
                return Err(S3Error::new(
                    S3ErrorCode::NotImplemented,
                    "packrat does not implement the canned ACL aws-exec-read (it grants to Amazon EC2)",
                ));
            }
            other => {
                return Err(S3Error::new(
                    S3ErrorCode::InvalidArgument,
                    format!("unknown canned ACL '{other}'"),
                ));
            }
        };
        // A grant to the owner adds nothing to its full control.
        if let Some(g) = extra
            && !matches!(&g.0, Grantee::User(p) if *p == acl.owner)
        {
            acl.grants.push(g);
        }
        Ok(acl)
    }

    /// The ACL an object write's headers ask for (`x-amz-acl`, or `x-amz-grant-*`); `None`
    /// when they name none.
    pub fn from_headers(
        headers: &RequestHeaders,
        owner: Person,
        bucket_owner: &Person,
        users: Users<'_>,
    ) -> S3Result<Option<Self>> {
        Self::from_headers_on(headers, owner, bucket_owner, users, On::Object)
    }

    /// The ACL a CreateBucket's or PutBucketAcl's headers ask for; `None` when they name none.
    pub fn bucket_from_headers(
        headers: &RequestHeaders,
        owner: Person,
        users: Users<'_>,
    ) -> S3Result<Option<Self>> {
        let same = owner.clone();
        Self::from_headers_on(headers, owner, &same, users, On::Bucket)
    }

    fn from_headers_on(
        headers: &RequestHeaders,
        owner: Person,
        bucket_owner: &Person,
        users: Users<'_>,
        on: On,
    ) -> S3Result<Option<Self>> {
        if !headers.has(Kind::Acl) {
            return Ok(None);
        }
        let canned = headers
            .get("x-amz-acl")
            .map(|v| v.to_str().map_err(|_| malformed("x-amz-acl is not text")))
            .transpose()?;
        let mut grants = Vec::new();
        for (name, value) in headers.iter() {
            let Some(which) = name.as_str().strip_prefix("x-amz-grant-") else {
                continue;
            };
            let permission = match which {
                "read" => Permission::Read,
                "read-acp" => Permission::ReadAcp,
                "write-acp" => Permission::WriteAcp,
                "full-control" => Permission::FullControl,
                "write" if on == On::Bucket => Permission::Write,
                "write" => {
                    return Err(S3Error::new(
                        S3ErrorCode::InvalidArgument,
                        "x-amz-grant-write does not apply to an object",
                    ));
                }
                _ => {
                    return Err(S3Error::new(
                        S3ErrorCode::InvalidArgument,
                        format!("unknown grant header {name}"),
                    ));
                }
            };
            let value = value
                .to_str()
                .map_err(|_| malformed(&format!("{name} is not text")))?;
            for grantee in split_grantees(value)? {
                let grantee = grantee_of(grantee.0, grantee.1, users)?;
                grants.push((grantee, permission));
            }
        }
        match (canned, grants.is_empty()) {
            (Some(_), false) => Err(S3Error::new(
                S3ErrorCode::InvalidRequest,
                "Specifying both Canned ACLs and Header Grants is not allowed",
            )),
            (Some(c), true) => Self::canned_on(c, owner, bucket_owner, on).map(Some),
            (None, false) => Ok(Some(Self { owner, grants })),
            (None, true) => Ok(None),
        }
    }

    /// The ACL a PutObjectAcl body (an `AccessControlPolicy` document) gives an object owned
    /// by `owner` (the owner stays whoever it is, whatever the document says).
    pub fn from_xml(body: &[u8], owner: Person, users: Users<'_>) -> S3Result<Self> {
        Self::from_xml_on(body, owner, users, On::Object)
    }

    /// The ACL a PutBucketAcl body gives the bucket of `owner`.
    pub fn bucket_from_xml(body: &[u8], owner: Person, users: Users<'_>) -> S3Result<Self> {
        Self::from_xml_on(body, owner, users, On::Bucket)
    }

    fn from_xml_on(body: &[u8], owner: Person, users: Users<'_>, on: On) -> S3Result<Self> {
        let doc: xml::AccessControlPolicy = xml::parse(body)?;
        let mut grants = Vec::new();
        for g in doc.list.map(|l| l.grants).unwrap_or_default() {
            let grantee = match (&g.grantee.id, &g.grantee.uri, &g.grantee.email) {
                (Some(id), None, None) => grantee_of("id", id, users)?,
                (None, Some(uri), None) => grantee_of("uri", uri, users)?,
                (None, None, Some(email)) => grantee_of("emailAddress", email, users)?,
                _ => return Err(malformed("each Grantee names one ID, URI or EmailAddress")),
            };
            grants.push((grantee, Permission::parse(g.permission.trim(), on)?));
        }
        Ok(Self { owner, grants })
    }

    /// Whether anyone beyond named users gains something (AllUsers, AuthenticatedUsers).
    pub fn is_public(&self) -> bool {
        self.grants.iter().any(|(g, _)| g.is_public())
    }

    /// Whether `caller` holds `wanted` on the object. The owner may always read and change the
    /// ACL (as in S3); public grants count unless `ignore_public` (IgnorePublicAcls).
    pub fn allows(
        &self,
        caller: Option<&Identity>,
        wanted: Permission,
        ignore_public: bool,
    ) -> bool {
        let is_owner = caller.is_some_and(|c| c.owner_id == self.owner.id);
        if is_owner && matches!(wanted, Permission::ReadAcp | Permission::WriteAcp) {
            return true;
        }
        self.grants.iter().any(|(g, p)| {
            p.includes(wanted) && !(ignore_public && g.is_public()) && g.covers(caller)
        })
    }

    /// The object's ACL from its stored headers; `None` when it has none (the bucket's owner
    /// owns it, nobody else is granted anything).
    pub fn of(headers: &[(String, String)]) -> S3Result<Option<Self>> {
        match headers.iter().find(|(k, _)| k == ACL_HEADER) {
            None => Ok(None),
            Some((_, v)) => serde_json::from_str(v)
                .map(Some)
                .map_err(|e| S3Error::internal("stored object ACL", e)),
        }
    }

    /// Puts this ACL among an object's stored headers (replacing one there).
    pub fn store_in(&self, headers: &mut Vec<(String, String)>) -> S3Result<()> {
        let v = serde_json::to_string(self).map_err(|e| S3Error::internal("object ACL", e))?;
        forget(headers);
        headers.push((ACL_HEADER.to_string(), v));
        Ok(())
    }

    /// The AccessControlPolicy document GetObjectAcl answers.
    pub fn to_xml(&self) -> Xml {
        let mut x = Xml::new();
        x.root("AccessControlPolicy");
        x.open("Owner");
        x.elem("ID", &self.owner.id);
        x.elem("DisplayName", &self.owner.name);
        x.close("Owner");
        x.open("AccessControlList");
        for (g, p) in &self.grants {
            x.open("Grant");
            match g {
                Grantee::User(u) => {
                    x.raw(&format!("<Grantee {XSI} xsi:type=\"CanonicalUser\">"));
                    x.elem("ID", &u.id);
                    x.elem("DisplayName", &u.name);
                }
                Grantee::AllUsers | Grantee::AuthenticatedUsers => {
                    x.raw(&format!("<Grantee {XSI} xsi:type=\"Group\">"));
                    let uri = if *g == Grantee::AllUsers {
                        ALL_USERS
                    } else {
                        AUTHENTICATED_USERS
                    };
                    x.elem("URI", uri);
                }
            }
            x.close("Grantee");
            x.elem("Permission", p.name());
            x.close("Grant");
        }
        x.close("AccessControlList");
        x.close("AccessControlPolicy");
        x
    }
}

/// Drops an object's stored ACL (a copy starts from its own, never its source's).
pub fn forget(headers: &mut Vec<(String, String)>) {
    headers.retain(|(k, _)| k != ACL_HEADER);
}

fn malformed(what: &str) -> S3Error {
    S3Error::new(
        S3ErrorCode::MalformedACLError,
        format!("The ACL you provided was not well formed or did not validate: {what}"),
    )
}

/// The grantees of one `x-amz-grant-*` header: `id="..."`, `uri="..."` or
/// `emailAddress="..."`, separated by commas (quotes optional).
fn split_grantees(value: &str) -> S3Result<Vec<(&str, &str)>> {
    let mut out = Vec::new();
    for part in value.split(',') {
        let part = part.trim();
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| malformed(&format!("grantee '{part}' is not type=\"value\"")))?;
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        out.push((k.trim(), v));
    }
    Ok(out)
}

fn grantee_of(kind: &str, value: &str, users: Users<'_>) -> S3Result<Grantee> {
    match kind {
        "id" => {
            let name = users(value).ok_or_else(|| {
                S3Error::new(
                    S3ErrorCode::InvalidArgument,
                    format!("Invalid id: no user has the canonical id '{value}'"),
                )
            })?;
            Ok(Grantee::User(Person {
                id: value.to_string(),
                name,
            }))
        }
        "uri" => match value {
            ALL_USERS => Ok(Grantee::AllUsers),
            AUTHENTICATED_USERS => Ok(Grantee::AuthenticatedUsers),
            other => Err(S3Error::new(
                S3ErrorCode::InvalidArgument,
                format!(
                    "Invalid group uri '{other}': packrat knows AllUsers and AuthenticatedUsers"
                ),
            )),
        },
        "emailAddress" => Err(S3Error::new(
            S3ErrorCode::UnresolvableGrantByEmailAddress,
            format!(
                "The e-mail address '{value}' does not match any user: packrat's users have no e-mail addresses; grant by id"
            ),
        )),
        other => Err(malformed(&format!("unknown grantee type '{other}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue};

    fn person(id: &str) -> Person {
        Person {
            id: id.into(),
            name: format!("name-{id}"),
        }
    }

    fn caller(id: &str) -> Identity {
        Identity {
            access_key: "AK".into(),
            secret_key: "SK".into(),
            name: id.into(),
            owner_id: id.into(),
            is_root: false,
        }
    }

    fn known(id: &str) -> Option<String> {
        ["alice", "bob", "carol"]
            .contains(&id)
            .then(|| format!("name-{id}"))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> RequestHeaders {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(*k, HeaderValue::from_str(v).unwrap());
        }
        RequestHeaders::new(m)
    }

    #[test]
    fn canned_acls_grant_what_s3_grants() {
        let (alice, bob) = (person("alice"), person("bob"));
        let acl = Acl::canned("public-read", alice.clone(), &bob).unwrap();
        assert!(acl.allows(None, Permission::Read, false));
        assert!(
            !acl.allows(None, Permission::Read, true),
            "IgnorePublicAcls"
        );
        assert!(!acl.allows(None, Permission::ReadAcp, false));
        assert!(acl.is_public());
        let acl = Acl::canned("authenticated-read", alice.clone(), &bob).unwrap();
        assert!(!acl.allows(None, Permission::Read, false));
        assert!(acl.allows(Some(&caller("carol")), Permission::Read, false));
        let acl = Acl::canned("bucket-owner-read", alice.clone(), &bob).unwrap();
        assert!(acl.allows(Some(&caller("bob")), Permission::Read, false));
        assert!(!acl.allows(Some(&caller("bob")), Permission::ReadAcp, false));
        assert!(!acl.allows(Some(&caller("carol")), Permission::Read, false));
        assert!(!acl.is_public());
        let acl = Acl::canned("bucket-owner-full-control", alice.clone(), &bob).unwrap();
        assert!(acl.allows(Some(&caller("bob")), Permission::WriteAcp, false));
        let acl = Acl::canned("private", alice.clone(), &bob).unwrap();
        assert!(acl.allows(Some(&caller("alice")), Permission::Read, false));
        assert!(!acl.allows(Some(&caller("bob")), Permission::Read, false));
        assert_eq!(acl.grants.len(), 1);
        // The owner's own bucket: bucket-owner-full-control adds nothing.
        let acl = Acl::canned("bucket-owner-full-control", alice.clone(), &alice).unwrap();
        assert_eq!(acl.grants.len(), 1);
        assert_eq!(
            Acl::canned("no-such", alice.clone(), &bob)
                .unwrap_err()
                .code,
            S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn the_owner_keeps_the_acl_but_not_the_bytes_without_a_grant() {
        let acl = Acl {
            owner: person("alice"),
            grants: vec![(Grantee::User(person("bob")), Permission::Read)],
        };
        let alice = caller("alice");
        assert!(acl.allows(Some(&alice), Permission::ReadAcp, false));
        assert!(acl.allows(Some(&alice), Permission::WriteAcp, false));
        assert!(!acl.allows(Some(&alice), Permission::Read, false));
        assert!(acl.allows(Some(&caller("bob")), Permission::Read, false));
        assert!(!acl.allows(Some(&caller("bob")), Permission::WriteAcp, false));
    }

    #[test]
    fn grant_headers() {
        let (alice, bob) = (person("alice"), person("bob"));
        let h = headers(&[
            (
                "x-amz-grant-read",
                "id=\"bob\", uri=\"http://acs.amazonaws.com/groups/global/AllUsers\"",
            ),
            ("x-amz-grant-full-control", "id=carol"),
        ]);
        let acl = Acl::from_headers(&h, alice.clone(), &bob, &known)
            .unwrap()
            .unwrap();
        assert_eq!(acl.grants.len(), 3);
        assert!(acl.allows(None, Permission::Read, false));
        assert!(acl.allows(Some(&caller("carol")), Permission::WriteAcp, false));
        assert!(!acl.allows(Some(&caller("bob")), Permission::WriteAcp, false));
        let refused = |pairs: &[(&'static str, &str)]| {
            Acl::from_headers(&headers(pairs), alice.clone(), &bob, &known)
                .unwrap_err()
                .code
        };
        assert_eq!(
            refused(&[("x-amz-grant-read", "id=\"mallory\"")]),
            S3ErrorCode::InvalidArgument
        );
        assert_eq!(
            refused(&[("x-amz-grant-read", "emailAddress=\"a@b.c\"")]),
            S3ErrorCode::UnresolvableGrantByEmailAddress
        );
        assert_eq!(
            refused(&[("x-amz-grant-write", "id=\"bob\"")]),
            S3ErrorCode::InvalidArgument
        );
        assert_eq!(
            refused(&[("x-amz-grant-read", "id=\"bob\""), ("x-amz-acl", "private")]),
            S3ErrorCode::InvalidRequest
        );
        assert_eq!(
            refused(&[("x-amz-grant-read", "bob")]),
            S3ErrorCode::MalformedACLError
        );
        assert_eq!(
            refused(&[(
                "x-amz-grant-read",
                "uri=\"http://acs.amazonaws.com/groups/s3/LogDelivery\""
            )]),
            S3ErrorCode::InvalidArgument
        );
        assert!(
            Acl::from_headers(&headers(&[]), alice, &bob, &known)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn stored_and_shown() {
        let acl = Acl {
            owner: person("alice"),
            grants: vec![
                (Grantee::User(person("bob")), Permission::ReadAcp),
                (Grantee::AuthenticatedUsers, Permission::Read),
            ],
        };
        let mut h = vec![("content-type".to_string(), "x".to_string())];
        acl.store_in(&mut h).unwrap();
        acl.store_in(&mut h).unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(Acl::of(&h).unwrap(), Some(acl.clone()));
        let doc = acl.to_xml().finish();
        let back = Acl::from_xml(doc.as_bytes(), person("alice"), &known).unwrap();
        assert_eq!(back, acl);
        forget(&mut h);
        assert_eq!(Acl::of(&h).unwrap(), None);
        let bad = br#"<AccessControlPolicy><AccessControlList><Grant><Grantee><ID>bob</ID></Grantee><Permission>WRITE</Permission></Grant></AccessControlList></AccessControlPolicy>"#;
        assert_eq!(
            Acl::from_xml(bad, person("alice"), &known)
                .unwrap_err()
                .code,
            S3ErrorCode::MalformedACLError
        );
    }
}
