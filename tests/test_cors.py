"""CORS: Put/Get/DeleteBucketCors through boto3, a preflight OPTIONS and the headers of actual
requests over raw HTTP, and a real browser (headless Chromium) on another origin that uploads
with a presigned PUT and reads the object back, allowed by the bucket's rules, and is refused
by a bucket without them."""

import http.client
import urllib.parse

import pytest
from botocore.exceptions import ClientError

import conftest

APP = "https://app.example.com"


def code(e):
    return e.value.response["Error"]["Code"]


def raw(endpoint, method, path, headers):
    u = urllib.parse.urlsplit(endpoint)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request(method, path, headers=headers)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, body


RULES = {"CORSRules": [
    {"ID": "app", "AllowedOrigins": [APP, "https://*.example.org"], "AllowedMethods": ["GET", "PUT"],
     "AllowedHeaders": ["x-amz-*", "content-type"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 600},
    {"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]},
]}


def test_bucket_cors_configuration(s3, bucket):
    with pytest.raises(ClientError) as e:
        s3.get_bucket_cors(Bucket=bucket)
    assert code(e) == "NoSuchCORSConfiguration"
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    got = s3.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert got == RULES["CORSRules"]
    bad = [
        ({"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}]}, "InvalidRequest"),
        ({"CORSRules": [{"AllowedOrigins": ["*.*"], "AllowedMethods": ["GET"]}]}, "InvalidRequest"),
        ({"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}] * 101}, "InvalidRequest"),
    ]
    for config, want in bad:
        with pytest.raises(ClientError) as e:
            s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=config)
        assert code(e) == want, config
    # A refused configuration changed nothing.
    assert s3.get_bucket_cors(Bucket=bucket)["CORSRules"] == RULES["CORSRules"]
    assert s3.delete_bucket_cors(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 204
    with pytest.raises(ClientError) as e:
        s3.get_bucket_cors(Bucket=bucket)
    assert code(e) == "NoSuchCORSConfiguration"


def test_preflight_and_actual_request_headers(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="a.txt", Body=b"hello")

    def preflight(origin, method, req_headers=None, path=f"/{bucket}/a.txt"):
        h = {"Origin": origin, "Access-Control-Request-Method": method}
        if req_headers:
            h["Access-Control-Request-Headers"] = req_headers
        return raw(server.endpoint, "OPTIONS", path, h)

    # No rules yet: refused as S3 refuses.
    status, _, body = preflight(APP, "PUT")
    assert status == 403 and b"AccessForbidden" in body and b"CORS is not enabled" in body
    s3.put_bucket_cors(Bucket=bucket, CORSConfiguration=RULES)
    status, h, _ = preflight(APP, "PUT", "Content-Type, X-Amz-Date")
    assert status == 200
    assert h["access-control-allow-origin"] == APP
    assert h["access-control-allow-methods"] == "GET, PUT"
    assert h["access-control-allow-headers"] == "content-type, x-amz-date"
    assert h["access-control-max-age"] == "600"
    assert h["access-control-allow-credentials"] == "true"
    assert "Origin" in h["vary"]
    assert preflight("https://a.b.example.org", "GET", path=f"/{bucket}")[0] == 200
    # The catch-all rule allows any origin to GET, answering `*`.
    status, h, _ = preflight("https://evil.test", "GET")
    assert status == 200 and h["access-control-allow-origin"] == "*"
    assert "access-control-allow-credentials" not in h
    # Not allowed: a method, a header, an origin that only looks alike; no Origin at all.
    for origin, method, hdrs in [("https://evil.test", "PUT", None), (APP, "DELETE", None),
                                 (APP, "PUT", "authorization"), (APP + ".evil.test", "PUT", None)]:
        status, h, body = preflight(origin, method, hdrs)
        assert status == 403 and b"AccessForbidden" in body, (origin, method, hdrs)
        assert "access-control-allow-origin" not in h
    status, _, body = raw(server.endpoint, "OPTIONS", f"/{bucket}/a.txt", {"Access-Control-Request-Method": "GET"})
    assert status == 400
    # A bucket that does not exist answers like one without rules.
    assert preflight(APP, "GET", path="/no-such-bucket-cors/a")[0] == 403
    # An actual request with an Origin: the answer names who may read it, and what it exposes.
    url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "a.txt"})
    path = url.split(server.endpoint, 1)[1]
    status, h, body = raw(server.endpoint, "GET", path, {"Origin": APP})
    assert status == 200 and body == b"hello"
    assert h["access-control-allow-origin"] == APP and h["access-control-expose-headers"] == "ETag"
    status, h, _ = raw(server.endpoint, "GET", path, {})
    assert status == 200 and "access-control-allow-origin" not in h
    # Errors carry the headers too, so the page can read why.
    status, h, _ = raw(server.endpoint, "GET", f"/{bucket}/missing", {"Origin": APP})
    assert status == 403 and h["access-control-allow-origin"] == APP
    s3.delete_bucket_cors(Bucket=bucket)
    status, h, _ = raw(server.endpoint, "GET", path, {"Origin": APP})
    assert status == 200 and "access-control-allow-origin" not in h


UPLOAD_AND_READ = """
const [putUrl, getUrl, done] = arguments;
(async () => {
  try {
    const put = await fetch(putUrl, {method: 'PUT', body: 'from the browser',
                                     headers: {'Content-Type': 'text/plain'}});
    const got = await fetch(getUrl);
    done({put: put.status, get: got.status, body: await got.text(), etag: got.headers.get('ETag')});
  } catch (e) {
    done({error: String(e)});
  }
})();
"""


def test_browser_on_another_origin(server, s3, bucket, browser, other_origin):
    """Chromium on http://127.0.0.1:<other port> uploads through a presigned PUT (a preflight
    first) and reads the object back with its ETag exposed; with no rules it is blocked."""
    from test_console import shot

    origin = other_origin.origin
    other_origin.pages["/"] = "<!doctype html><title>other origin</title><p>an app on another origin</p>"
    try:
        browser.get(origin + "/")
        browser.set_script_timeout(30)

        def attempt(key):
            put = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key, "ContentType": "text/plain"})
            get = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key})
            return browser.execute_async_script(UPLOAD_AND_READ, put, get)

        blocked = attempt("blocked.txt")
        assert "error" in blocked and "Failed to fetch" in blocked["error"], blocked
        with pytest.raises(ClientError):
            s3.head_object(Bucket=bucket, Key="blocked.txt")  # the preflight stopped the PUT
        s3.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [
            {"AllowedOrigins": [origin], "AllowedMethods": ["GET", "PUT"], "AllowedHeaders": ["*"],
             "ExposeHeaders": ["ETag"]}]})
        ok = attempt("allowed.txt")
        assert ok.get("put") == 200, ok
        assert ok == {"put": 200, "get": 200, "body": "from the browser",
                      "etag": s3.head_object(Bucket=bucket, Key="allowed.txt")["ETag"]}, ok
        assert s3.get_object(Bucket=bucket, Key="allowed.txt")["Body"].read() == b"from the browser"
        shot(browser, "cors-other-origin")
    finally:
        s3.delete_bucket_cors(Bucket=bucket)


from test_console import browser, other_origin  # noqa: E402,F401  (the fixtures)
