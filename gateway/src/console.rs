//! The web console at `/console`: a page, a script and a style sheet compiled into the binary
//! (`gateway/console/`), and sessions.
//!
//! Signing in exchanges an access key and its secret for a session (`POST /console/session`):
//! the server checks the pair once and sets an HttpOnly, SameSite=Strict cookie holding a
//! random token; the page never keeps the secret. The store keeps the session under the
//! token's SHA-256 (`ObjectStore::put_session`): one process in memory, a cluster in etcd,
//! so a browser behind several gateways is signed in at each of them, and a sign-out at one
//! ends the session at all. From then on the page calls the ordinary S3
//! API and the admin API with that cookie and the `x-packrat-console` header, and such a
//! request acts as the session's key, looked up again on every request (a deleted key ends its
//! sessions at once). A request without the header is not a console request whatever cookies
//! it carries, and a browser sends that header cross-site only after a CORS preflight packrat
//! never grants, so another site cannot act through a signed-in console (no CSRF). Signed S3
//! requests never look at the cookie.

use crate::s3::error::{S3Error, S3ErrorCode, S3Result};
use crate::state::{AppState, RespBody, full};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use packrat_store_api::Identity;
use std::time::Duration;

/// The session cookie's name.
pub const COOKIE: &str = "packrat_console";
/// The header every console request carries.
pub const HEADER: &str = "x-packrat-console";
/// How long a session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Largest sign-in request body.
const SIGN_IN_BYTES_MAX: usize = 8 * 1024;

const INDEX_HTML: &str = include_str!("../console/index.html");
const APP_JS: &str = include_str!("../console/app.js");
const APP_CSS: &str = include_str!("../console/app.css");

/// What the store keeps a session under: the SHA-256 of its token, so that whoever reads
/// the store (etcd, a memory dump) holds no usable token.
fn token_id(token: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The console's own routes, answered before authentication: the page and its files, and the
/// session. Anything else under `/console` (a query, another name) is S3 as usual, so a
/// bucket named `console` stays reachable by signed requests.
pub fn is_route(method: &Method, path: &str, query: &str) -> bool {
    query.is_empty()
        && match path {
            "/console" | "/console/" | "/console/app.js" | "/console/app.css" => {
                method == Method::GET
            }
            "/console/session" => {
                matches!(*method, Method::GET | Method::POST | Method::DELETE)
            }
            _ => false,
        }
}

/// The token of the request's session cookie.
fn token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

/// Who an unsigned request acts as: `Ok(None)` when it is not a console request (no
/// `x-packrat-console` header), the session's key when it is and the session is live, and
/// AccessDenied otherwise.
pub async fn identity(state: &AppState, headers: &HeaderMap) -> S3Result<Option<Identity>> {
    if !headers.contains_key(HEADER) {
        return Ok(None);
    }
    let expired = || {
        S3Error::new(
            S3ErrorCode::AccessDenied,
            "No live console session: sign in again",
        )
    };
    let Some(token) = token(headers) else {
        return Err(expired());
    };
    let access_key = state
        .store
        .session(&token_id(token))
        .await?
        .ok_or_else(expired)?;
    match state.store.access_key(&access_key)? {
        Some(id) => Ok(Some(id)),
        None => Err(expired()),
    }
}

/// Serves a console route (see [`is_route`]).
pub async fn handle(
    state: &AppState,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    body: Incoming,
) -> Response<RespBody> {
    match path {
        "/console" | "/console/" => asset(INDEX_HTML, "text/html; charset=utf-8"),
        "/console/app.js" => asset(APP_JS, "text/javascript; charset=utf-8"),
        "/console/app.css" => asset(APP_CSS, "text/css; charset=utf-8"),
        _ if !headers.contains_key(HEADER) => json(
            StatusCode::FORBIDDEN,
            &serde_json::json!({ "error": "console requests carry the x-packrat-console header" }),
        ),
        _ => match *method {
            Method::POST => sign_in(state, body).await,
            Method::DELETE => {
                if let Some(t) = token(headers)
                    && let Err(e) = state.store.end_session(&token_id(t)).await
                {
                    tracing::warn!(error = %e, "console sign-out: the session store failed");
                    return json(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &serde_json::json!({ "error": "the session store is unavailable: the session was not ended" }),
                    );
                }
                let mut r = json(StatusCode::OK, &serde_json::json!({ "signed_out": true }));
                set_cookie(&mut r, state, "", 0);
                r
            }
            _ => match identity(state, headers).await {
                Ok(Some(id)) => json(StatusCode::OK, &whoami(&id)),
                Ok(None) | Err(_) => json(
                    StatusCode::UNAUTHORIZED,
                    &serde_json::json!({ "error": "No live console session: sign in" }),
                ),
            },
        },
    }
}

fn whoami(id: &Identity) -> serde_json::Value {
    serde_json::json!({ "name": id.name, "access_key": id.access_key, "is_root": id.is_root })
}

#[derive(serde::Deserialize)]
struct SignIn {
    access_key: String,
    secret_key: String,
}

async fn sign_in(state: &AppState, body: Incoming) -> Response<RespBody> {
    let refused = |status, msg: &str| json(status, &serde_json::json!({ "error": msg }));
    let bytes: Bytes = match http_body_util::Limited::new(body, SIGN_IN_BYTES_MAX)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => return refused(StatusCode::BAD_REQUEST, "the sign-in request is too large"),
    };
    let Ok(req) = serde_json::from_slice::<SignIn>(&bytes) else {
        return refused(
            StatusCode::BAD_REQUEST,
            "expected JSON {\"access_key\", \"secret_key\"}",
        );
    };
    let key = match state.store.access_key(&req.access_key) {
        Ok(k) => k,
        Err(e) => {
            tracing::warn!(error = %e, "console sign-in: key lookup failed");
            return refused(
                StatusCode::SERVICE_UNAVAILABLE,
                "the key store is unavailable",
            );
        }
    };
    // One answer for an unknown key and a wrong secret, and a comparison that takes the same
    // time wherever the secrets differ.
    let ok = key.as_ref().is_some_and(|k| {
        use subtle::ConstantTimeEq as _;
        bool::from(k.secret_key.as_bytes().ct_eq(req.secret_key.as_bytes()))
    });
    let Some(id) = key.filter(|_| ok) else {
        tracing::info!(access_key = %req.access_key, "console sign-in refused");
        return refused(
            StatusCode::FORBIDDEN,
            "The access key or the secret key is wrong",
        );
    };
    let token = hex::encode(rand::random::<[u8; 32]>());
    if let Err(e) = state
        .store
        .put_session(&token_id(&token), &id.access_key, SESSION_TTL)
        .await
    {
        tracing::warn!(error = %e, "console sign-in: the session store failed");
        return refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "the session store is unavailable",
        );
    }
    let mut r = json(StatusCode::OK, &whoami(&id));
    set_cookie(&mut r, state, &token, SESSION_TTL.as_secs());
    r
}

fn set_cookie(r: &mut Response<RespBody>, state: &AppState, token: &str, max_age: u64) {
    let secure = if state.tls.is_some() { "; Secure" } else { "" };
    let v =
        format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}");
    if let Ok(v) = HeaderValue::from_str(&v) {
        r.headers_mut().insert(http::header::SET_COOKIE, v);
    }
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<RespBody> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    );
    r
}

fn asset(body: &'static str, content_type: &'static str) -> Response<RespBody> {
    let mut r = Response::new(full(body));
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static(content_type),
    );
    h.insert(
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    h.insert(
        "content-security-policy",
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_console_files_and_session_are_its_routes() {
        assert!(is_route(&Method::GET, "/console", ""));
        assert!(is_route(&Method::GET, "/console/app.js", ""));
        assert!(is_route(&Method::POST, "/console/session", ""));
        // A listing of a bucket named console, or its objects, stay S3.
        assert!(!is_route(&Method::GET, "/console", "list-type=2"));
        assert!(!is_route(&Method::GET, "/console/train/a.jpg", ""));
        assert!(!is_route(&Method::PUT, "/console/app.js", ""));
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            http::header::COOKIE,
            HeaderValue::from_static("a=1; packrat_console=abc; b=2"),
        );
        assert_eq!(token(&h), Some("abc"));
        h.insert(
            http::header::COOKIE,
            HeaderValue::from_static("xpackrat_console=abc"),
        );
        assert_eq!(token(&h), None);
    }
}
