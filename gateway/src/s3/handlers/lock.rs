//! Object Lock: PutObjectLockConfiguration and GetObjectLockConfiguration, Put/GetObjectRetention,
//! Put/GetObjectLegalHold, the `x-amz-object-lock-*` headers of writes (PUT, copy,
//! CreateMultipartUpload) and of GET and HEAD answers, and who may bypass GOVERNANCE retention.
//! What protects a version is decided in the store (`packrat_store_api::lock`); this file reads
//! and writes S3's documents and headers.

use super::*;
use packrat_store_api::lock::{
    DefaultRetention, LOCK_HEADER, LockChange, LockCheck, LockConfig, LockMode, ObjectLock,
    Retention,
};

/// The longest default retention S3 accepts (100 years).
const DEFAULT_RETENTION_DAYS_MAX: i64 = 36_500;
const DEFAULT_RETENTION_YEARS_MAX: i64 = 100;

const MODE: &str = "x-amz-object-lock-mode";
const UNTIL: &str = "x-amz-object-lock-retain-until-date";
const HOLD: &str = "x-amz-object-lock-legal-hold";

fn missing_config() -> S3Error {
    err(
        S3ErrorCode::InvalidRequest,
        "Bucket is missing Object Lock Configuration",
    )
}

fn need_lock(b: &Bucket) -> S3Result<()> {
    b.object_lock.map(drop).ok_or_else(missing_config)
}

fn parse_mode(m: &str) -> S3Result<LockMode> {
    LockMode::parse(m)
        .ok_or_else(|| err(S3ErrorCode::InvalidArgument, "Unknown wormMode directive."))
}

/// A retain-until date (ISO 8601, as S3 writes it) that must lie ahead of `now_ms`.
fn parse_until(s: &str, now_ms: i64) -> S3Result<i64> {
    let ms = DateTime::parse_from_rfc3339(s.trim())
        .map_err(|_| {
            err(
                S3ErrorCode::InvalidArgument,
                "The retain until date must be an ISO 8601 date and time",
            )
        })?
        .timestamp_millis();
    if ms <= now_ms {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "The retain until date must be in the future!",
        ));
    }
    Ok(ms)
}

fn parse_hold(s: &str) -> S3Result<bool> {
    match s {
        "ON" => Ok(true),
        "OFF" => Ok(false),
        _ => Err(err(
            S3ErrorCode::InvalidArgument,
            "Legal Hold must be either of 'ON' or 'OFF'",
        )),
    }
}

/// Who asks, and what a bucket policy's conditions read of the request.
pub(super) struct Caller<'a> {
    pub facts: Facts<'a>,
    pub identity: Option<&'a Identity>,
}

impl<'a> Caller<'a> {
    pub fn of(req: &'a S3Request) -> Self {
        Self {
            facts: Facts::of(req),
            identity: req.identity.as_ref(),
        }
    }

    /// Whether the caller may act on `key` as `action` asks (the root key always may).
    pub async fn may(
        &self,
        state: &AppState,
        b: &Bucket,
        action: Action,
        key: &str,
    ) -> S3Result<bool> {
        if self.identity.is_some_and(|i| i.is_root) {
            return Ok(true);
        }
        let policy = policy_of(state, b).await?;
        let existing = existing_tags(state, b, policy.as_deref(), &self.facts, Some(key)).await?;
        let facts = Facts {
            existing_tags: existing.as_deref().or(self.facts.existing_tags),
            ..self.facts
        };
        Ok(permits(
            &facts,
            self.identity,
            b,
            policy.as_deref(),
            action,
            Some(key),
        ))
    }
}

async fn allowed(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
    action: Action,
    key: &str,
) -> S3Result<bool> {
    Caller::of(req).may(state, b, action, key).await
}

fn says_bypass(req: &S3Request) -> bool {
    req.header("x-amz-bypass-governance-retention")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// Whether a request asks to bypass GOVERNANCE retention and may (`s3:BypassGovernanceRetention`:
/// the owner unless a policy denies it, or whoever a policy allows).
pub(super) async fn bypass_governance(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
    key: &str,
) -> S3Result<bool> {
    if !says_bypass(req) {
        return Ok(false);
    }
    allowed(state, req, b, Action::BYPASS_GOVERNANCE_RETENTION, key).await
}

/// [`bypass_governance`] for one key of a DeleteObjects, whose bucket was judged already.
pub(super) fn bypass_for_key(
    req: &S3Request,
    b: &Bucket,
    policy: Option<&crate::s3::policy::Policy>,
    key: &str,
) -> bool {
    says_bypass(req) && check_key(req, b, policy, Action::BYPASS_GOVERNANCE_RETENTION, key).is_ok()
}

/// Sets the lock of a version being written (PUT, copy, CreateMultipartUpload, form upload)
/// among its stored headers: what the `x-amz-object-lock-*` headers `sent` say (a form
/// upload's fields), else the bucket's default retention. A copy never takes its source's lock.
pub(super) async fn lock_new_version(
    state: &AppState,
    caller: &Caller<'_>,
    sent: &http::HeaderMap,
    b: &Bucket,
    key: &str,
    stored: &mut Vec<(String, String)>,
) -> S3Result<()> {
    stored.retain(|(k, _)| k != LOCK_HEADER);
    let header = |n: &str| sent.get(n).and_then(|v| v.to_str().ok());
    let (mode, until, hold) = (header(MODE), header(UNTIL), header(HOLD));
    let now = state.clock.now_ms();
    let Some(config) = b.object_lock else {
        if mode.is_some() || until.is_some() || hold.is_some() {
            return Err(missing_config());
        }
        return Ok(());
    };
    let retention = match (mode, until) {
        (Some(m), Some(u)) => {
            if !caller
                .may(state, b, Action::PUT_OBJECT_RETENTION, key)
                .await?
            {
                return Err(access_denied());
            }
            Some(Retention {
                mode: parse_mode(m)?,
                until_ms: parse_until(u, now)?,
            })
        }
        (None, None) => config.default_retention.map(|d| d.from(now)),
        _ => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "x-amz-object-lock-retain-until-date and x-amz-object-lock-mode must both be supplied",
            ));
        }
    };
    let legal_hold = match hold {
        None => None,
        Some(h) => {
            if !caller
                .may(state, b, Action::PUT_OBJECT_LEGAL_HOLD, key)
                .await?
            {
                return Err(access_denied());
            }
            Some(parse_hold(h)?)
        }
    };
    ObjectLock {
        retention,
        legal_hold,
    }
    .store(stored);
    Ok(())
}

/// The `x-amz-object-lock-*` headers of a GET or HEAD of a locked version, for a caller allowed
/// to read its retention (and legal hold), as S3 shows them.
pub(super) async fn answer_headers(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
    key: &str,
    obj: &ObjectInfo,
) -> S3Result<Vec<(&'static str, String)>> {
    let Ok(lock) = ObjectLock::of(&obj.attrs.headers) else {
        return Ok(Vec::new());
    };
    let mut h = Vec::new();
    if let Some(r) = lock.retention
        && allowed(state, req, b, Action::GET_OBJECT_RETENTION, key).await?
    {
        h.push((MODE, r.mode.name().to_string()));
        h.push((UNTIL, iso8601(r.until_ms)));
    }
    if let Some(on) = lock.legal_hold
        && allowed(state, req, b, Action::GET_OBJECT_LEGAL_HOLD, key).await?
    {
        h.push((HOLD, if on { "ON" } else { "OFF" }.to_string()));
    }
    Ok(h)
}

/// Whether a version's stored headers hold a lock (a cheap test before [`answer_headers`]).
pub(super) fn has_lock(obj: &ObjectInfo) -> bool {
    obj.attrs.headers.iter().any(|(k, _)| k == LOCK_HEADER)
}

pub(super) async fn handle_put_lock_config(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_OBJECT_LOCK).await?;
    let body = read_xml_body(req).await?;
    let c: xml::ObjectLockConfiguration = xml::parse(&body)?;
    if c.enabled.as_deref() != Some("Enabled") {
        return Err(err(
            S3ErrorCode::MalformedXML,
            "ObjectLockEnabled must be Enabled",
        ));
    }
    let default_retention = match c.rule {
        None => None,
        Some(rule) => {
            let d = rule.default_retention.ok_or_else(|| {
                err(
                    S3ErrorCode::MalformedXML,
                    "A Rule must hold a DefaultRetention",
                )
            })?;
            let mode = d.mode.as_deref().ok_or_else(|| {
                err(
                    S3ErrorCode::MalformedXML,
                    "A DefaultRetention must have a Mode",
                )
            })?;
            let mode = LockMode::parse(mode).ok_or_else(|| {
                err(
                    S3ErrorCode::MalformedXML,
                    "Mode must be GOVERNANCE or COMPLIANCE",
                )
            })?;
            let (days, years) = match (d.days, d.years) {
                (Some(n), None) => (n, 0),
                (None, Some(n)) => (0, n),
                _ => {
                    return Err(err(
                        S3ErrorCode::MalformedXML,
                        "A DefaultRetention has either Days or Years",
                    ));
                }
            };
            if days < 0 || years < 0 || days + years == 0 {
                return Err(err(
                    S3ErrorCode::InvalidRetentionPeriod,
                    "Default retention period must be a positive integer value",
                ));
            }
            if days > DEFAULT_RETENTION_DAYS_MAX || years > DEFAULT_RETENTION_YEARS_MAX {
                return Err(err(
                    S3ErrorCode::InvalidRetentionPeriod,
                    "Default retention period is too large (at most 36500 days or 100 years)",
                ));
            }
            Some(DefaultRetention {
                mode,
                days: days as u32,
                years: years as u32,
            })
        }
    };
    state
        .store
        .set_lock_config(&b, LockConfig { default_retention })
        .await?;
    Ok(Response::new(empty()))
}

pub(super) async fn handle_get_lock_config(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::GET_BUCKET_OBJECT_LOCK).await?;
    let Some(config) = b.object_lock else {
        return Err(err(
            S3ErrorCode::NotConfigured("ObjectLockConfigurationNotFoundError"),
            "Object Lock configuration does not exist for this bucket",
        ));
    };
    let mut x = Xml::new();
    x.root("ObjectLockConfiguration");
    x.elem("ObjectLockEnabled", "Enabled");
    if let Some(d) = config.default_retention {
        x.open("Rule");
        x.open("DefaultRetention");
        x.elem("Mode", d.mode.name());
        if d.years > 0 {
            x.elem("Years", &d.years.to_string());
        } else {
            x.elem("Days", &d.days.to_string());
        }
        x.close("DefaultRetention");
        x.close("Rule");
    }
    x.close("ObjectLockConfiguration");
    xml_ok(x)
}

/// The version a retention or legal-hold request acts on, resolved to its id (S3's errors for
/// a missing key, a missing version or a delete marker).
async fn target(state: &AppState, req: &S3Request, b: &Bucket, key: &str) -> S3Result<ObjectInfo> {
    versions::read_target(state, b, key, versions::version_id(req)?).await
}

async fn change_lock(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
    key: &str,
    change: LockChange,
) -> R {
    let obj = target(state, req, b, key).await?;
    let bypass = match change {
        LockChange::Retention(_) => bypass_governance(state, req, b, key).await?,
        LockChange::LegalHold(_) => false,
    };
    let version = obj.version_id.as_deref().unwrap_or("null");
    match state
        .store
        .update_lock(b, key, Some(version), change, LockCheck::rules(bypass))
        .await?
    {
        Some(_) => Ok(Response::new(empty())),
        // Removed since it was read.
        None => Err(versions::no_such_version()),
    }
}

pub(super) async fn handle_put_retention(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_OBJECT_RETENTION).await?;
    need_lock(&b)?;
    let body = read_xml_body(req).await?;
    let r: xml::Retention = xml::parse(&body)?;
    let retention = match (r.mode.as_deref(), r.retain_until.as_deref()) {
        (Some(m), Some(u)) => Some(Retention {
            mode: parse_mode(m)?,
            until_ms: parse_until(u, state.clock.now_ms())?,
        }),
        // An empty Retention removes it (GOVERNANCE only, with the bypass).
        (None, None) => None,
        _ => {
            return Err(err(
                S3ErrorCode::MalformedXML,
                "A Retention has both a Mode and a RetainUntilDate, or neither",
            ));
        }
    };
    change_lock(state, req, &b, key, LockChange::Retention(retention)).await
}

pub(super) async fn handle_put_legal_hold(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_OBJECT_LEGAL_HOLD).await?;
    need_lock(&b)?;
    let body = read_xml_body(req).await?;
    let h: xml::LegalHold = xml::parse(&body)?;
    let on = parse_hold(h.status.as_deref().unwrap_or(""))
        .map_err(|e| err(S3ErrorCode::MalformedXML, e.message))?;
    change_lock(state, req, &b, key, LockChange::LegalHold(on)).await
}

fn no_lock_of_object() -> S3Error {
    err(
        S3ErrorCode::NotConfigured("NoSuchObjectLockConfiguration"),
        "The specified object does not have a ObjectLock configuration",
    )
}

/// The lock of the version a GetObjectRetention or GetObjectLegalHold reads.
async fn lock_of_target(
    state: &AppState,
    req: &S3Request,
    name: &str,
    key: &str,
    action: Action,
) -> S3Result<ObjectLock> {
    let b = load_bucket(state, req, name, action).await?;
    need_lock(&b)?;
    let obj = target(state, req, &b, key).await?;
    ObjectLock::of(&obj.attrs.headers).map_err(|e| S3Error::internal("object lock", e))
}

pub(super) async fn handle_get_retention(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
    key: &str,
) -> R {
    let lock = lock_of_target(state, req, name, key, Action::GET_OBJECT_RETENTION).await?;
    let r = lock.retention.ok_or_else(no_lock_of_object)?;
    let mut x = Xml::new();
    x.root("Retention");
    x.elem("Mode", r.mode.name());
    x.elem("RetainUntilDate", &iso8601(r.until_ms));
    x.close("Retention");
    xml_ok(x)
}

pub(super) async fn handle_get_legal_hold(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
    key: &str,
) -> R {
    let lock = lock_of_target(state, req, name, key, Action::GET_OBJECT_LEGAL_HOLD).await?;
    let on = lock.legal_hold.ok_or_else(no_lock_of_object)?;
    let mut x = Xml::new();
    x.root("LegalHold");
    x.elem("Status", if on { "ON" } else { "OFF" });
    x.close("LegalHold");
    xml_ok(x)
}
