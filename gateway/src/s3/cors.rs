//! Cross-origin resource sharing: a bucket's `?cors` configuration (parsed, checked against
//! S3's rules, written back as S3 writes it), and the matching of a browser's request (its
//! `Origin`, method and, for a preflight, the headers it will send) against the rules, which
//! gives the `Access-Control-*` headers of the answer.
//!
//! Matching follows S3: rules are tried in order and the first whose origin and method (and,
//! for a preflight, every requested header) match decides. An origin or header pattern may
//! hold one `*`, matching any run of characters; origins compare exactly, header names without
//! regard to case.

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::xml::Xml;
use serde::Deserialize;

/// S3's limits: rules per configuration, and bytes of the whole document.
pub const RULES_MAX: usize = 100;
pub const CONFIG_BYTES_MAX: usize = 64 * 1024;
const METHODS: [&str; 5] = ["GET", "PUT", "POST", "DELETE", "HEAD"];

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub id: Option<String>,
    pub origins: Vec<String>,
    pub methods: Vec<String>,
    pub headers: Vec<String>,
    pub expose: Vec<String>,
    pub max_age_secs: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct ConfigXml {
    #[serde(rename = "CORSRule", default)]
    rules: Vec<RuleXml>,
}

#[derive(Debug, Deserialize)]
struct RuleXml {
    #[serde(rename = "ID")]
    id: Option<String>,
    #[serde(rename = "AllowedOrigin", default)]
    origins: Vec<String>,
    #[serde(rename = "AllowedMethod", default)]
    methods: Vec<String>,
    #[serde(rename = "AllowedHeader", default)]
    headers: Vec<String>,
    #[serde(rename = "ExposeHeader", default)]
    expose: Vec<String>,
    #[serde(rename = "MaxAgeSeconds")]
    max_age_secs: Option<String>,
}

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidRequest, msg)
}

/// Parses and checks a PutBucketCors body.
pub fn parse(body: &[u8]) -> S3Result<Vec<Rule>> {
    if body.len() > CONFIG_BYTES_MAX {
        return Err(S3Error::new(
            S3ErrorCode::MalformedXML,
            format!("A CORS configuration is at most {CONFIG_BYTES_MAX} bytes"),
        ));
    }
    let c: ConfigXml = super::xml::parse(body)?;
    if c.rules.is_empty() {
        return Err(S3Error::new(
            S3ErrorCode::MalformedXML,
            "A CORS configuration needs at least one CORSRule",
        ));
    }
    if c.rules.len() > RULES_MAX {
        return Err(invalid(format!(
            "A CORS configuration holds at most {RULES_MAX} rules"
        )));
    }
    c.rules.into_iter().map(checked).collect()
}

fn checked(r: RuleXml) -> S3Result<Rule> {
    if r.origins.is_empty() || r.methods.is_empty() {
        return Err(S3Error::new(
            S3ErrorCode::MalformedXML,
            "Each CORSRule needs an AllowedOrigin and an AllowedMethod",
        ));
    }
    for m in &r.methods {
        if !METHODS.contains(&m.as_str()) {
            return Err(invalid(format!(
                "Found unsupported HTTP method in CORS config. Unsupported method is {m}"
            )));
        }
    }
    for o in &r.origins {
        if o.matches('*').count() > 1 {
            return Err(invalid(format!(
                "AllowedOrigin \"{o}\" can not have more than one wildcard."
            )));
        }
    }
    for h in &r.headers {
        if h.matches('*').count() > 1 {
            return Err(invalid(format!(
                "AllowedHeader \"{h}\" can not have more than one wildcard."
            )));
        }
    }
    if r.id.as_ref().is_some_and(|id| id.chars().count() > 255) {
        return Err(invalid("A CORSRule's ID is at most 255 characters"));
    }
    let max_age_secs = match r.max_age_secs {
        None => None,
        Some(s) => Some(
            s.trim()
                .parse::<u32>()
                .map_err(|_| S3Error::new(S3ErrorCode::MalformedXML, "MaxAgeSeconds"))?,
        ),
    };
    Ok(Rule {
        id: r.id,
        origins: r.origins,
        methods: r.methods,
        headers: r.headers,
        expose: r.expose,
        max_age_secs,
    })
}

/// The GetBucketCors answer (and the document the store keeps).
pub fn to_xml(rules: &[Rule]) -> Xml {
    let mut x = Xml::new();
    x.root("CORSConfiguration");
    for r in rules {
        x.open("CORSRule");
        if let Some(id) = &r.id {
            x.elem("ID", id);
        }
        for (name, values) in [
            ("AllowedHeader", &r.headers),
            ("AllowedMethod", &r.methods),
            ("AllowedOrigin", &r.origins),
            ("ExposeHeader", &r.expose),
        ] {
            for v in values {
                x.elem(name, v);
            }
        }
        if let Some(age) = r.max_age_secs {
            x.elem("MaxAgeSeconds", &age.to_string());
        }
        x.close("CORSRule");
    }
    x.close("CORSConfiguration");
    x
}

/// Whether `value` matches `pattern`, which holds at most one `*`.
fn wildcard_match(pattern: &str, value: &str, fold_case: bool) -> bool {
    let eq = |a: &str, b: &str| {
        if fold_case {
            a.eq_ignore_ascii_case(b)
        } else {
            a == b
        }
    };
    match pattern.split_once('*') {
        None => eq(pattern, value),
        Some((head, tail)) => {
            value.len() >= head.len() + tail.len()
                && value.is_char_boundary(head.len())
                && value.is_char_boundary(value.len() - tail.len())
                && eq(&value[..head.len()], head)
                && eq(&value[value.len() - tail.len()..], tail)
        }
    }
}

/// The rule that allows `origin` to use `method` (sending `headers`, for a preflight).
pub fn matching<'a>(
    rules: &'a [Rule],
    origin: &str,
    method: &str,
    headers: &[&str],
) -> Option<&'a Rule> {
    rules.iter().find(|r| {
        r.origins.iter().any(|o| wildcard_match(o, origin, false))
            && r.methods.iter().any(|m| m == method)
            && headers
                .iter()
                .all(|h| r.headers.iter().any(|p| wildcard_match(p, h, true)))
    })
}

/// The `Access-Control-*` headers of an answer to `origin` under `rule`; `requested` are the
/// headers a preflight asked for (echoed back as allowed).
pub fn answer_headers(
    rule: &Rule,
    origin: &str,
    requested: &[&str],
) -> Vec<(&'static str, String)> {
    let any_origin = rule.origins.iter().any(|o| o == "*");
    let mut out = vec![
        (
            "access-control-allow-origin",
            if any_origin {
                "*".to_string()
            } else {
                origin.to_string()
            },
        ),
        ("access-control-allow-methods", rule.methods.join(", ")),
        (
            "vary",
            "Origin, Access-Control-Request-Headers, Access-Control-Request-Method".to_string(),
        ),
    ];
    if !any_origin {
        out.push(("access-control-allow-credentials", "true".to_string()));
    }
    if !requested.is_empty() {
        out.push(("access-control-allow-headers", requested.join(", ")));
    }
    if !rule.expose.is_empty() {
        out.push(("access-control-expose-headers", rule.expose.join(", ")));
    }
    if let Some(age) = rule.max_age_secs {
        out.push(("access-control-max-age", age.to_string()));
    }
    out
}

/// The header names of `Access-Control-Request-Headers` (a comma list), lower-cased.
pub fn requested_headers(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = r#"<CORSConfiguration>
        <CORSRule><ID>app</ID><AllowedOrigin>https://app.example.com</AllowedOrigin>
          <AllowedOrigin>https://*.example.org</AllowedOrigin>
          <AllowedMethod>GET</AllowedMethod><AllowedMethod>PUT</AllowedMethod>
          <AllowedHeader>x-amz-*</AllowedHeader><AllowedHeader>Content-Type</AllowedHeader>
          <ExposeHeader>ETag</ExposeHeader><MaxAgeSeconds>600</MaxAgeSeconds></CORSRule>
        <CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule>
        </CORSConfiguration>"#;

    #[test]
    fn rules_match_in_order_with_one_wildcard() {
        let rules = parse(DOC.as_bytes()).unwrap();
        assert_eq!(rules.len(), 2);
        let r = matching(
            &rules,
            "https://app.example.com",
            "PUT",
            &["x-amz-date", "content-type"],
        )
        .unwrap();
        assert_eq!(r.id.as_deref(), Some("app"));
        let h = answer_headers(r, "https://app.example.com", &["x-amz-date"]);
        assert!(h.contains(&(
            "access-control-allow-origin",
            "https://app.example.com".into()
        )));
        assert!(h.contains(&("access-control-max-age", "600".into())));
        assert!(h.contains(&("access-control-expose-headers", "ETag".into())));
        assert!(matching(&rules, "https://a.b.example.org", "GET", &[]).is_some());
        // A header outside the rule's list, a method no rule allows, an origin that only
        // looks alike.
        assert!(matching(&rules, "https://app.example.com", "PUT", &["authorization"]).is_none());
        assert!(matching(&rules, "https://evil.com", "PUT", &[]).is_none());
        assert!(matching(&rules, "https://app.example.com.evil.com", "PUT", &[]).is_none());
        assert!(matching(&rules, "https://example.org", "PUT", &[]).is_none());
        // The catch-all rule answers `*` and no credentials.
        let any = matching(&rules, "https://evil.com", "GET", &[]).unwrap();
        let h = answer_headers(any, "https://evil.com", &[]);
        assert!(h.contains(&("access-control-allow-origin", "*".into())));
        assert!(
            !h.iter()
                .any(|(n, _)| *n == "access-control-allow-credentials")
        );
    }

    #[test]
    fn written_back_as_parsed() {
        let rules = parse(DOC.as_bytes()).unwrap();
        assert_eq!(parse(to_xml(&rules).finish().as_bytes()).unwrap(), rules);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let code = |d: &str| parse(d.as_bytes()).unwrap_err().code;
        let rule = |body: &str| {
            format!("<CORSConfiguration><CORSRule>{body}</CORSRule></CORSConfiguration>")
        };
        assert_eq!(
            code("<CORSConfiguration></CORSConfiguration>"),
            S3ErrorCode::MalformedXML
        );
        assert_eq!(
            code(&rule(
                "<AllowedOrigin>*</AllowedOrigin><AllowedMethod>PATCH</AllowedMethod>"
            )),
            S3ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(&rule(
                "<AllowedOrigin>*.*</AllowedOrigin><AllowedMethod>GET</AllowedMethod>"
            )),
            S3ErrorCode::InvalidRequest
        );
        assert_eq!(
            code(&rule("<AllowedMethod>GET</AllowedMethod>")),
            S3ErrorCode::MalformedXML
        );
        assert_eq!(
            code(&rule(
                "<AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod><MaxAgeSeconds>x</MaxAgeSeconds>"
            )),
            S3ErrorCode::MalformedXML
        );
        let many = (0..101)
            .map(|_| "<CORSRule><AllowedOrigin>*</AllowedOrigin><AllowedMethod>GET</AllowedMethod></CORSRule>")
            .collect::<String>();
        assert_eq!(
            code(&format!("<CORSConfiguration>{many}</CORSConfiguration>")),
            S3ErrorCode::InvalidRequest
        );
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("*", "", false));
        assert!(wildcard_match("a*c", "abbc", false));
        assert!(!wildcard_match("a*c", "ac-", false));
        assert!(
            !wildcard_match("ab*ba", "aba", false),
            "head and tail may not overlap"
        );
        assert!(wildcard_match("X-Amz-*", "x-amz-date", true));
        assert!(!wildcard_match("X-Amz-*", "x-amz-date", false));
        assert!(!wildcard_match("é*", "e\u{301}x", false));
    }
}
