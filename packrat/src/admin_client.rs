//! The client side of `packrat admin`: signed requests to a running server's admin API
//! (`/_packrat/admin/`), with progress bars for the long jobs.

use http::{Method, StatusCode};
use packrat_gateway::admin::ADMIN_PREFIX;
use packrat_gateway::s3::sigv4;
use packrat_store_api::reports::{Progress, ScrubReport, TierRunReport};
use serde::de::DeserializeOwned;

/// Client side of `packrat admin kms key create|list`.
pub async fn run_kms(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    cmd: crate::KmsKeyCommand,
    json_out: bool,
) -> Result<(), String> {
    use packrat_store_api::kms::{KmsKey, NewKmsKey};
    let (method, body) = match cmd {
        crate::KmsKeyCommand::Create { name, users } => (
            Method::POST,
            serde_json::to_vec(&NewKmsKey { name, users }).map_err(|e| e.to_string())?,
        ),
        crate::KmsKeyCommand::List => (Method::GET, Vec::new()),
    };
    let creating = method == Method::POST;
    let (status, body) = call(
        endpoint, region, access_key, secret_key, method, "kms/keys", body,
    )
    .await?;
    if !status.is_success() {
        return Err(format!(
            "server answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    let keys: Vec<KmsKey> = if creating {
        vec![serde_json::from_slice(&body).map_err(|e| e.to_string())?]
    } else {
        serde_json::from_slice(&body).map_err(|e| e.to_string())?
    };
    if json_out {
        return match &keys[..] {
            [one] if creating => print_json(one),
            _ => print_json(&keys),
        };
    }
    if creating {
        let k = &keys[0];
        println!("created KMS key {}", k.name);
        println!("  id:    {}", k.id);
        println!("  arn:   {}", k.arn());
        println!("  users: {}", users_shown(&k.users));
        return Ok(());
    }
    println!("{:<36}  {:<24}  USERS", "ID", "NAME");
    for k in &keys {
        println!("{:<36}  {:<24}  {}", k.id, k.name, users_shown(&k.users));
    }
    Ok(())
}

fn users_shown(users: &[String]) -> String {
    if users.is_empty() {
        "(root keys only)".into()
    } else {
        users.join(",")
    }
}

/// Client side of `packrat admin tier run`: starts a run (or joins the one going), shows a
/// progress bar of the bytes to move, then prints the report.
pub async fn run_tier(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    days_ahead: u32,
    json: bool,
) -> Result<(), String> {
    let r: TierRunReport = follow(
        endpoint,
        region,
        access_key,
        secret_key,
        "tier run",
        &format!("tier/run?days_ahead={days_ahead}"),
        "tier/run",
    )
    .await?;
    if json {
        return print_json(&r);
    }
    println!(
        "lifecycle: {} transitions, {} expirations, {} noncurrent versions and delete markers removed, {} noncurrent versions moved colder, {} incomplete uploads aborted; moved {} objects ({} bytes) in {} segments; {} skipped (changed meanwhile); {} unreadable (left in place, see the server log); {} unused tier segments removed; {} NVMe bytes reclaimed; {:.1} s",
        r.lifecycle_transitions,
        r.lifecycle_expirations,
        r.lifecycle_versions_removed,
        r.lifecycle_versions_transitioned,
        r.uploads_aborted,
        r.objects_moved,
        r.bytes_moved,
        r.segments_written,
        r.objects_skipped,
        r.objects_unreadable,
        r.segments_removed,
        r.nvme_bytes_reclaimed,
        r.seconds
    );
    Ok(())
}

/// Client side of `packrat admin scrub`: starts a scrub (or joins the one running), shows a
/// progress bar until it ends, then prints what it found and fixed. Fails if a segment could
/// not be repaired.
pub async fn run_scrub(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    json: bool,
) -> Result<(), String> {
    let r: ScrubReport = follow(
        endpoint, region, access_key, secret_key, "scrub", "scrub", "scrub",
    )
    .await?;
    if json {
        print_json(&r)?;
    } else {
        print_scrub(&r);
    }
    if r.unrepairable.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} segments could not be repaired (fewer than k good shards, or no healthy disk \
             to rebuild on): {:?}",
            r.unrepairable.len(),
            r.unrepairable
        ))
    }
}

/// `value` as one line of JSON on stdout (`--output json`).
pub fn print_json(value: &impl serde::Serialize) -> Result<(), String> {
    println!(
        "{}",
        serde_json::to_string(value).map_err(|e| e.to_string())?
    );
    Ok(())
}

fn print_scrub(r: &ScrubReport) {
    println!(
        "checked {} segments ({} shards, {} bytes): {} shards missing, {} corrupt; {} rebuilt; {} sealed segments encoded",
        r.segments_checked,
        r.shards_checked,
        r.bytes_checked,
        r.shards_missing,
        r.shards_corrupt,
        r.shards_rebuilt,
        r.segments_sealed
    );
    if r.unrepairable.is_empty() {
        println!("full redundancy: every encoded segment has all its shards");
    }
}

/// [`call`] without a body, for an answer that must be a success: its body, or the server's
/// error as a message.
pub async fn call_ok(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    method: Method,
    path: &str,
) -> Result<Vec<u8>, String> {
    let (status, body) = call(
        endpoint,
        region,
        access_key,
        secret_key,
        method,
        path,
        Vec::new(),
    )
    .await?;
    if !status.is_success() {
        return Err(format!(
            "server answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(body)
}

/// Client side: one signed request to a running server's admin API.
pub async fn call(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Result<(StatusCode, Vec<u8>), String> {
    use http_body_util::{BodyExt, Full};
    let base: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("bad --endpoint: {e}"))?;
    // The endpoint's scheme is kept: an https endpoint is spoken to over TLS, never in the
    // clear.
    let scheme = match base.scheme_str() {
        None | Some("http") => "http",
        Some("https") => "https",
        Some(other) => {
            return Err(format!(
                "{endpoint}: unknown scheme {other}; use http:// or https://"
            ));
        }
    };
    let authority = base
        .authority()
        .ok_or("the endpoint needs a host, e.g. http://127.0.0.1:9000")?
        .clone();
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let full_path = format!("{ADMIN_PREFIX}{path}");
    let mut headers = http::HeaderMap::new();
    headers.insert("host", authority.as_str().parse().map_err(|_| "bad host")?);
    sigv4::sign_request(
        method.as_str(),
        &full_path,
        query,
        &mut headers,
        &body,
        &sigv4::Signer {
            access_key,
            secret: secret_key,
            region,
        },
        chrono::Utc::now(),
    );
    let uri = if query.is_empty() {
        format!("{scheme}://{authority}{full_path}")
    } else {
        format!("{scheme}://{authority}{full_path}?{query}")
    };
    let mut req = http::Request::builder().method(method).uri(uri);
    for (k, v) in &headers {
        req = req.header(k, v);
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<bytes::Bytes>>(crate::tls::client_connector()?);
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("cannot reach {endpoint}: {e}"))?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes.to_vec()))
}

/// Client side: starts a job with a POST to `start` (or joins the run going), polls `poll`
/// with a progress bar named `what` until a run that began after the first poll has finished,
/// and returns its report.
pub async fn follow<R: DeserializeOwned>(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    what: &str,
    start: &str,
    poll: &str,
) -> Result<R, String> {
    use http::Method;
    let ask = |method: Method, path: String| async move {
        let body = call_ok(endpoint, region, access_key, secret_key, method, &path).await?;
        serde_json::from_slice::<Progress<R>>(&body)
            .map_err(|e| format!("unexpected answer from the server: {e}"))
    };
    let before = ask(Method::GET, poll.to_string()).await?.finished_runs;
    let mut p = ask(Method::POST, start.to_string()).await?;
    let bar = indicatif::ProgressBar::new(p.total_bytes.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, eta {{eta}})"
        ))
        .map_err(|e| e.to_string())?,
    );
    loop {
        bar.set_length(p.total_bytes.max(1));
        bar.set_position(p.done_bytes);
        if !p.running && p.finished_runs > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        p = ask(Method::GET, poll.to_string()).await?;
    }
    bar.finish();
    if let Some(e) = p.error {
        return Err(format!("{what} failed: {e}"));
    }
    p.report
        .ok_or_else(|| format!("the server kept no {what} report"))
}
