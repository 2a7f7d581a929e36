//! Object Lock: write-once-read-many protection of object versions (S3's retention, in
//! GOVERNANCE or COMPLIANCE mode, and legal holds), and a bucket's default retention.
//!
//! A version's lock is kept among its stored headers ([`crate::ObjectAttrs::headers`]) under
//! [`LOCK_HEADER`], as the S3 layer's encryption envelope is: every write, copy and multipart
//! path carries it with the version's other attributes, and no index format changes. Unlike the
//! envelope, a store reads it: removing a version for good ([`crate::ObjectStore::delete_version`])
//! and changing a lock ([`crate::ObjectStore::update_lock`]) are decided here, under the key's
//! lock in the store, so a retention set while a delete is under way cannot be slipped past.
//!
//! The rules are S3's: a version under a legal hold, or whose retention date is ahead, cannot
//! be removed (overwriting the key or deleting it without a version id only stacks a new
//! version or a delete marker on it); COMPLIANCE retention can only be lengthened; GOVERNANCE
//! retention can be lengthened or turned into COMPLIANCE, and shortened or removed only by a
//! caller allowed to bypass governance who says so (`x-amz-bypass-governance-retention`).

/// The stored header holding a version's lock (never shown to clients as such: the S3 layer
/// answers `x-amz-object-lock-*` from it).
pub const LOCK_HEADER: &str = "x-packrat-lock";

const DAY_MS: i64 = 86_400_000;

/// A retention mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockMode {
    /// Removable before its date by a caller allowed to bypass governance retention.
    Governance,
    /// Removable by no one before its date; the date can only move later.
    Compliance,
}

impl LockMode {
    pub fn name(self) -> &'static str {
        match self {
            LockMode::Governance => "GOVERNANCE",
            LockMode::Compliance => "COMPLIANCE",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "GOVERNANCE" => Some(LockMode::Governance),
            "COMPLIANCE" => Some(LockMode::Compliance),
            _ => None,
        }
    }
}

/// A retention: its mode and the instant (ms since the epoch) it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub mode: LockMode,
    pub until_ms: i64,
}

/// A version's lock, as stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectLock {
    pub retention: Option<Retention>,
    /// `None` when no legal hold was ever set (S3 then answers "no configuration"), else
    /// whether it is on.
    pub legal_hold: Option<bool>,
}

/// A change of a version's lock (PutObjectRetention, PutObjectLegalHold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockChange {
    /// A new retention, or none (removing it: GOVERNANCE only, with the bypass).
    Retention(Option<Retention>),
    LegalHold(bool),
}

/// Who judges a version's lock when the version is removed for good or its lock is changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockCheck {
    /// The store judges by S3's rules at its own clock; `bypass_governance` lets a GOVERNANCE
    /// retention go (the caller checked that it may).
    Rules { bypass_governance: bool },
    /// Judged already, once, by whoever orders the key's writes (a cluster chain's head, at
    /// its clock): the store does as asked. A replica that judged again by its own clock could
    /// refuse what its head allowed (a retention ending between the two readings), and its
    /// copy of the key would part from the others'. Never from a client's request.
    Decided,
}

impl LockCheck {
    /// S3's rules, with the bypass or without.
    pub fn rules(bypass_governance: bool) -> Self {
        LockCheck::Rules { bypass_governance }
    }
}

/// Why a lock refuses what was asked (the text is meant for the client).
pub const PROTECTED: &str = "Access Denied because object protected by object lock.";

impl ObjectLock {
    /// The lock among a version's stored headers (none if it has none). A value this code
    /// cannot read is `Err`: the caller must treat the version as protected.
    pub fn of(headers: &[(String, String)]) -> Result<Self, String> {
        match headers.iter().find(|(k, _)| k == LOCK_HEADER) {
            Some((_, v)) => Self::from_stored(v),
            None => Ok(Self::default()),
        }
    }

    /// The lock a stored value (see [`Self::stored_value`]) describes.
    pub fn from_stored(v: &str) -> Result<Self, String> {
        let bad = || format!("unreadable object lock {v:?}");
        let f: Vec<&str> = v.split(' ').collect();
        let [mode, until, hold] = f.as_slice() else {
            return Err(bad());
        };
        let retention = match *mode {
            "-" => None,
            m => Some(Retention {
                mode: LockMode::parse(m).ok_or_else(bad)?,
                until_ms: until.parse().map_err(|_| bad())?,
            }),
        };
        let legal_hold = match *hold {
            "-" => None,
            "ON" => Some(true),
            "OFF" => Some(false),
            _ => return Err(bad()),
        };
        Ok(Self {
            retention,
            legal_hold,
        })
    }

    /// Writes the lock into stored headers (removing the header when there is nothing to keep).
    pub fn store(&self, headers: &mut Vec<(String, String)>) {
        headers.retain(|(k, _)| k != LOCK_HEADER);
        if let Some(v) = self.stored_value() {
            headers.push((LOCK_HEADER.to_string(), v));
        }
    }

    /// The value stored under [`LOCK_HEADER`]; `None` when there is nothing to keep.
    pub fn stored_value(&self) -> Option<String> {
        if *self == Self::default() {
            return None;
        }
        let (mode, until) = match self.retention {
            Some(r) => (r.mode.name(), r.until_ms.to_string()),
            None => ("-", "0".to_string()),
        };
        let hold = match self.legal_hold {
            None => "-",
            Some(true) => "ON",
            Some(false) => "OFF",
        };
        Some(format!("{mode} {until} {hold}"))
    }

    /// The retention in force at `now_ms` (one whose date has passed protects nothing).
    pub fn active_retention(&self, now_ms: i64) -> Option<Retention> {
        self.retention.filter(|r| r.until_ms > now_ms)
    }

    /// `Err` with the reason when the version may not be removed for good at `now_ms`.
    pub fn check_removal(&self, now_ms: i64, bypass_governance: bool) -> Result<(), &'static str> {
        if self.legal_hold == Some(true) {
            return Err(PROTECTED);
        }
        match self.active_retention(now_ms) {
            Some(r) if r.mode == LockMode::Compliance => Err(PROTECTED),
            Some(_) if !bypass_governance => Err(PROTECTED),
            _ => Ok(()),
        }
    }

    /// Applies `change` at `now_ms` if `check` allows it; `Err` with the reason if not.
    pub fn apply_by(
        &mut self,
        change: LockChange,
        now_ms: i64,
        check: LockCheck,
    ) -> Result<(), &'static str> {
        match check {
            LockCheck::Rules { bypass_governance } => self.apply(change, now_ms, bypass_governance),
            LockCheck::Decided => {
                match change {
                    LockChange::LegalHold(on) => self.legal_hold = Some(on),
                    LockChange::Retention(new) => self.retention = new,
                }
                Ok(())
            }
        }
    }

    /// Applies `change` at `now_ms` if S3's rules allow it; `Err` with the reason if not.
    pub fn apply(
        &mut self,
        change: LockChange,
        now_ms: i64,
        bypass_governance: bool,
    ) -> Result<(), &'static str> {
        match change {
            LockChange::LegalHold(on) => self.legal_hold = Some(on),
            LockChange::Retention(new) => {
                if let Some(cur) = self.active_retention(now_ms) {
                    let keeps = new.is_some_and(|n| {
                        n.until_ms >= cur.until_ms
                            && (cur.mode == LockMode::Governance || n.mode == LockMode::Compliance)
                    });
                    let allowed = keeps || (cur.mode == LockMode::Governance && bypass_governance);
                    if !allowed {
                        return Err(PROTECTED);
                    }
                }
                self.retention = new;
            }
        }
        Ok(())
    }
}

/// A bucket's default retention: applied to each new version written without one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultRetention {
    pub mode: LockMode,
    /// The period, in days or in years (exactly one of them is nonzero), as it was set.
    pub days: u32,
    pub years: u32,
}

impl DefaultRetention {
    /// The retention of a version written at `now_ms` (a year is 365 days).
    pub fn from(&self, now_ms: i64) -> Retention {
        let days = i64::from(self.days) + 365 * i64::from(self.years);
        Retention {
            mode: self.mode,
            until_ms: now_ms.saturating_add(days * DAY_MS),
        }
    }
}

/// A bucket's Object Lock configuration (its presence means Object Lock is enabled, which
/// cannot be undone).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LockConfig {
    pub default_retention: Option<DefaultRetention>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ret(mode: LockMode, until_ms: i64) -> Option<Retention> {
        Some(Retention { mode, until_ms })
    }

    #[test]
    fn stored_form_round_trips_and_leaves_other_headers() {
        let mut h = vec![("cache-control".to_string(), "no-cache".to_string())];
        assert_eq!(ObjectLock::of(&h).unwrap(), ObjectLock::default());
        let lock = ObjectLock {
            retention: ret(LockMode::Compliance, 1_800_000_000_000),
            legal_hold: Some(false),
        };
        lock.store(&mut h);
        assert_eq!(h.len(), 2);
        assert_eq!(h[1].1, "COMPLIANCE 1800000000000 OFF");
        assert_eq!(ObjectLock::of(&h).unwrap(), lock);
        ObjectLock::default().store(&mut h);
        assert_eq!(h.len(), 1, "an empty lock leaves no header");
        for bad in ["", "X 1 -", "GOVERNANCE x -", "- 0 MAYBE", "- 0"] {
            let h = vec![(LOCK_HEADER.to_string(), bad.to_string())];
            assert!(ObjectLock::of(&h).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn removal_is_refused_while_held_or_retained() {
        let now = 1_000;
        let free = ObjectLock::default();
        assert!(free.check_removal(now, false).is_ok());
        let held = ObjectLock {
            legal_hold: Some(true),
            ..Default::default()
        };
        assert!(
            held.check_removal(now, true).is_err(),
            "bypass never lifts a hold"
        );
        let gov = ObjectLock {
            retention: ret(LockMode::Governance, now + 1),
            legal_hold: Some(false),
        };
        assert!(gov.check_removal(now, false).is_err());
        assert!(gov.check_removal(now, true).is_ok());
        let comp = ObjectLock {
            retention: ret(LockMode::Compliance, now + 1),
            legal_hold: None,
        };
        assert!(comp.check_removal(now, true).is_err());
        assert!(
            comp.check_removal(now + 1, false).is_ok(),
            "expired at its date"
        );
    }

    #[test]
    fn retention_changes_follow_s3() {
        let now = 1_000;
        let mut comp = ObjectLock {
            retention: ret(LockMode::Compliance, now + 100),
            legal_hold: None,
        };
        let shorter = LockChange::Retention(ret(LockMode::Compliance, now + 50));
        let longer = LockChange::Retention(ret(LockMode::Compliance, now + 200));
        let to_gov = LockChange::Retention(ret(LockMode::Governance, now + 300));
        assert!(comp.apply(shorter, now, true).is_err());
        assert!(comp.apply(to_gov, now, true).is_err());
        assert!(comp.apply(LockChange::Retention(None), now, true).is_err());
        assert!(comp.apply(longer, now, false).is_ok());
        assert_eq!(comp.retention.unwrap().until_ms, now + 200);

        let mut gov = ObjectLock {
            retention: ret(LockMode::Governance, now + 100),
            legal_hold: None,
        };
        let gov_shorter = LockChange::Retention(ret(LockMode::Governance, now + 50));
        assert!(gov.apply(gov_shorter, now, false).is_err());
        assert!(gov.apply(LockChange::Retention(None), now, false).is_err());
        assert!(gov.apply(gov_shorter, now, true).is_ok());
        assert!(gov.apply(LockChange::Retention(None), now, true).is_ok());
        assert_eq!(gov.retention, None);
        // Lengthening or hardening needs no bypass; an expired retention is no obstacle.
        let mut gov = ObjectLock {
            retention: ret(LockMode::Governance, now + 100),
            legal_hold: None,
        };
        assert!(
            gov.apply(
                LockChange::Retention(ret(LockMode::Compliance, now + 100)),
                now,
                false
            )
            .is_ok()
        );
        assert!(
            gov.apply(LockChange::Retention(None), now + 100, false)
                .is_ok()
        );
        assert!(gov.apply(LockChange::LegalHold(true), now, false).is_ok());
        assert_eq!(gov.legal_hold, Some(true));
    }

    #[test]
    fn default_retention_counts_days_or_years() {
        let d = DefaultRetention {
            mode: LockMode::Governance,
            days: 2,
            years: 0,
        };
        assert_eq!(d.from(10).until_ms, 10 + 2 * DAY_MS);
        let y = DefaultRetention {
            mode: LockMode::Compliance,
            days: 0,
            years: 1,
        };
        assert_eq!(y.from(0).until_ms, 365 * DAY_MS);
    }
}
