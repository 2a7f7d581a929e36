"""The web console in a real browser: Debian's Chromium, headless, driven by Selenium through
Debian's chromedriver (no browser or driver download at test time). Every step is checked
against the server with boto3, not only on the page. Screenshots of each page are kept under
target/test-artifacts/console/ (PACKRAT_TEST_ARTIFACTS moves them)."""

import http.server
import json
import os
import pathlib
import shutil
import tempfile
import threading
import time
import urllib.request

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from conftest import REGION, ROOT, ROOT_AK, ROOT_SK, Server, console_request

# Nothing may try to fetch a driver or a browser.
os.environ["SE_OFFLINE"] = "true"

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

ARTIFACTS = pathlib.Path(os.environ.get("PACKRAT_TEST_ARTIFACTS", ROOT / "target" / "test-artifacts")) / "console"


@pytest.fixture
def browser(workdir):
    """A headless Chromium with its own profile and download folder (several tests use one)."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="browser-", dir=workdir))
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "Debian's chromium and chromium-driver are needed (.ci/run installs them)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--no-first-run", "--disable-quic", "--window-size=1280,900",
              f"--user-data-dir={base / 'chromium-profile'}"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    downloads = base / "downloads"
    downloads.mkdir()
    d.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
    d.downloads = downloads
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield d
    d.quit()


class OtherOrigin:
    """A web site on its own loopback port (another origin than packrat's): `pages` maps a
    path (query left off) to the HTML served there."""

    def __init__(self):
        pages = self.pages = {}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = pages.get(self.path.split("?", 1)[0], "<!doctype html><title>?</title>").encode()
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


@pytest.fixture
def other_origin():
    site = OtherOrigin()
    yield site
    site.httpd.shutdown()
    site.httpd.server_close()


def wait(d, cond, what, timeout=20):
    return WebDriverWait(d, timeout).until(lambda _: cond(), message=what)


def find(d, css):
    return wait(d, lambda: d.find_elements(By.CSS_SELECTOR, css) and d.find_element(By.CSS_SELECTOR, css), css)


def flash(d):
    f = d.find_element(By.ID, "flash")
    return f.text if f.is_displayed() else ""


def shot(d, name):
    time.sleep(0.3)  # the last paint
    d.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def s3_as(srv, ak, sk):
    return boto3.client("s3", endpoint_url=srv.endpoint, region_name=REGION,
                        aws_access_key_id=ak, aws_secret_access_key=sk,
                        config=Config(s3={"addressing_style": "path"},
                                      retries={"total_max_attempts": 1, "mode": "standard"}))


def sign_in(d, srv, ak, sk):
    d.get(srv.endpoint + "/console")
    find(d, "#ak").send_keys(ak)
    d.find_element(By.ID, "sk").send_keys(sk)
    d.find_element(By.ID, "signin-go").click()


def test_console_end_to_end_in_chromium(workdir, browser):
    d = browser
    srv = Server(workdir / "console").start()
    s3 = srv.client()

    # A wrong secret: refused, and the page says so.
    d.get(srv.endpoint + "/console")
    find(d, "#signin")
    shot(d, "signin")
    sign_in(d, srv, ROOT_AK, "not-the-secret")
    wait(d, lambda: "Sign-in failed" in flash(d), "the refusal is shown")
    assert "wrong" in flash(d)

    # Root signs in and creates a bucket from the page.
    sign_in(d, srv, ROOT_AK, ROOT_SK)
    find(d, "#buckets")
    find(d, "#new-bucket").send_keys("photos")
    d.find_element(By.ID, "create-bucket").click()
    find(d, 'tr[data-bucket="photos"]')
    assert "photos" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    shot(d, "buckets")

    # Uploads: a small file in one PUT and a 20 MiB one as a multipart upload, with progress.
    small = workdir / "hello.txt"
    small.write_bytes(b"hello from the console\n")
    big = workdir / "big.bin"
    big.write_bytes(os.urandom(20 * 1024 * 1024))
    d.get(srv.endpoint + "/console#/b/photos/")
    find(d, "#upload-file").send_keys(f"{small}\n{big}")
    d.find_element(By.ID, "upload-go").click()
    wait(d, lambda: "Uploaded 2 file(s)" in flash(d), "both uploads end", 120)
    assert s3.get_object(Bucket="photos", Key="hello.txt")["Body"].read() == small.read_bytes()
    got = s3.get_object(Bucket="photos", Key="big.bin")
    assert got["Body"].read() == big.read_bytes()
    assert got["ETag"].strip('"').endswith("-3"), "20 MiB went up in three 8 MiB parts"
    find(d, 'tr[data-key="big.bin"]')
    shot(d, "objects")

    # A folder view, then an object's page: metadata, and tags saved from the page.
    s3.put_object(Bucket="photos", Key="cats/tabby.jpg", Body=b"meow", ContentType="image/jpeg",
                  Metadata={"camera": "x100"})
    d.get(srv.endpoint + "/console#/b/photos/cats/")
    find(d, 'tr[data-key="cats/tabby.jpg"] a').click()
    meta = find(d, "#metadata")
    wait(d, lambda: "x-amz-meta-camera" in meta.text and "image/jpeg" in meta.text, "metadata shown")
    find(d, "#tags").send_keys("team=vision\nsplit=train")
    d.find_element(By.ID, "save-tags").click()
    wait(d, lambda: "Tags saved" in flash(d), "tags saved")
    tags = {t["Key"]: t["Value"] for t in s3.get_object_tagging(Bucket="photos", Key="cats/tabby.jpg")["TagSet"]}
    assert tags == {"team": "vision", "split": "train"}
    shot(d, "object")

    # Download and delete from the listing.
    d.get(srv.endpoint + "/console#/b/photos/")
    row = find(d, 'tr[data-key="hello.txt"]')
    row.find_element(By.XPATH, ".//button[text()='Download']").click()
    target = d.downloads / "hello.txt"
    wait(d, lambda: target.exists() and target.read_bytes() == small.read_bytes(), "the download lands")
    find(d, 'tr[data-key="hello.txt"]').find_element(By.XPATH, ".//button[text()='Delete']").click()
    d.switch_to.alert.accept()
    wait(d, lambda: not d.find_elements(By.CSS_SELECTOR, 'tr[data-key="hello.txt"]'), "the row goes")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.head_object(Bucket="photos", Key="hello.txt")
    assert e.value.response["Error"]["Code"] == "404"

    # Bucket settings: public-read, then anyone reads without signing.
    d.get(srv.endpoint + "/console#/s/photos")
    find(d, "#public-read").click()
    d.find_element(By.ID, "save-acl").click()
    wait(d, lambda: "public-read" in flash(d), "saved")
    anon = urllib.request.urlopen(f"{srv.endpoint}/photos/cats/tabby.jpg", timeout=10).read()
    assert anon == b"meow"
    # Versioning from the same page: never enabled, then enabled (an overwrite keeps the
    # version before it), then suspended.
    assert find(d, "#versioning-state").text == "Never enabled"
    d.find_element(By.ID, "versioning-enable").click()
    wait(d, lambda: "Versioning enabled" in flash(d), "versioning enabled")
    assert s3.get_bucket_versioning(Bucket="photos")["Status"] == "Enabled"
    for body in (b"one", b"two"):
        s3.put_object(Bucket="photos", Key="notes/v.txt", Body=body)
    kept = s3.list_object_versions(Bucket="photos", Prefix="notes/v.txt")["Versions"]
    assert sorted(v["IsLatest"] for v in kept) == [False, True]
    # The versions browser: a delete leaves a marker; the older version downloads by id; the
    # marker removed makes the last version current again; a version deleted for good goes.
    first, second = sorted(kept, key=lambda v: v["IsLatest"])
    marker = s3.delete_object(Bucket="photos", Key="notes/v.txt")["VersionId"]
    d.get(srv.endpoint + "/console#/b/photos/notes/")
    find(d, "#show-versions").click()
    find(d, f'tr[data-version="{marker}"]')
    rows = d.find_elements(By.CSS_SELECTOR, "#versions tr[data-key='notes/v.txt']")
    assert [r.get_attribute("data-version") for r in rows] == [marker, second["VersionId"], first["VersionId"]]
    assert "delete marker" in rows[0].text and "current" in rows[0].text
    shot(d, "versions")
    find(d, f'tr[data-version="{first["VersionId"]}"]').find_element(By.XPATH, ".//button[text()='Download']").click()
    target = d.downloads / "v.txt"
    wait(d, lambda: target.exists() and target.read_bytes() == b"one", "the older version downloads")
    find(d, f'tr[data-version="{marker}"]').find_element(By.XPATH, ".//button[text()='Remove marker']").click()
    d.switch_to.alert.accept()
    wait(d, lambda: not d.find_elements(By.CSS_SELECTOR, f'tr[data-version="{marker}"]'), "the marker goes")
    assert s3.get_object(Bucket="photos", Key="notes/v.txt")["Body"].read() == b"two"
    find(d, f'tr[data-version="{first["VersionId"]}"]').find_element(By.XPATH, ".//button[text()='Delete version']").click()
    d.switch_to.alert.accept()
    wait(d, lambda: not d.find_elements(By.CSS_SELECTOR, f'tr[data-version="{first["VersionId"]}"]'), "the version goes")
    left = s3.list_object_versions(Bucket="photos", Prefix="notes/v.txt")
    assert [v["VersionId"] for v in left["Versions"]] == [second["VersionId"]] and "DeleteMarkers" not in left
    # An object's page lists its versions too.
    d.get(srv.endpoint + "/console#/o/photos/notes/v.txt")
    find(d, f'#object-versions tr[data-version="{second["VersionId"]}"]')
    d.get(srv.endpoint + "/console#/s/photos")
    assert find(d, "#versioning-state").text == "Enabled"
    d.find_element(By.ID, "versioning-suspend").click()
    wait(d, lambda: "Versioning suspended" in flash(d), "versioning suspended")
    assert s3.get_bucket_versioning(Bucket="photos")["Status"] == "Suspended"

    # Keys: root makes a key for alice; the secret is shown once and works.
    d.get(srv.endpoint + "/console#/keys")
    find(d, "#key-name").send_keys("alice")
    d.find_element(By.ID, "key-create").click()
    card = find(d, "#key-created")
    lines = dict(l.split(": ", 1) for l in card.find_element(By.TAG_NAME, "pre").text.splitlines())
    alice = s3_as(srv, lines["access key"], lines["secret key"])
    assert alice.list_buckets()["Buckets"] == []
    shot(d, "keys")

    # A bucket policy from the settings page: alice may read photos/cats/*, nothing else; a
    # malformed one is refused with the reason shown, the saved one kept.
    s3.put_bucket_acl(Bucket="photos", ACL="private")
    d.get(srv.endpoint + "/console#/s/photos")
    policy = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam:::user/alice"}, "Action": "s3:GetObject",
         "Resource": "arn:aws:s3:::photos/cats/*"}]}
    find(d, "#policy").send_keys(json.dumps(policy))
    d.find_element(By.ID, "save-policy").click()
    wait(d, lambda: "Policy saved" in flash(d), "policy saved")
    assert json.loads(s3.get_bucket_policy(Bucket="photos")["Policy"]) == policy
    assert alice.get_object(Bucket="photos", Key="cats/tabby.jpg")["Body"].read() == b"meow"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.get_object(Bucket="photos", Key="big.bin")
    assert e.value.response["Error"]["Code"] == "AccessDenied"
    shot(d, "policy")
    box = find(d, "#policy")
    box.clear()
    box.send_keys('{"Statement": []}')
    d.find_element(By.ID, "save-policy").click()
    wait(d, lambda: "MalformedPolicy" in flash(d), "the refusal is shown")
    assert json.loads(s3.get_bucket_policy(Bucket="photos")["Policy"]) == policy
    d.find_element(By.ID, "remove-policy").click()
    wait(d, lambda: "Policy removed" in flash(d), "policy removed")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.get_object(Bucket="photos", Key="cats/tabby.jpg")
    assert e.value.response["Error"]["Code"] == "AccessDenied"

    # Storage: the store's status and a compaction run from the page.
    d.get(srv.endpoint + "/console#/storage")
    wait(d, lambda: "segments" in find(d, "#status").text, "status shown")
    d.find_element(By.XPATH, "//button[text()='Compact now']").click()
    wait(d, lambda: '"objects_scanned"' in d.find_element(By.ID, "job-result").text, "compaction report shown")
    report = json.loads(d.find_element(By.ID, "job-result").text)
    assert report["objects_scanned"] >= 2, report
    shot(d, "storage")

    # Live charts from /metrics, moving while requests come in.
    d.get(srv.endpoint + "/console#/metrics")
    find(d, "#chart-rps")
    for i in range(40):
        s3.put_object(Bucket="photos", Key=f"load/{i}", Body=b"x" * 4096)
        time.sleep(0.1)
    wait(d, lambda: d.find_element(By.ID, "fig-rps").text.endswith("req/s"), "figures drawn")
    assert float(d.find_element(By.ID, "fig-rps").text.split()[0]) > 0
    shot(d, "metrics")

    # Alice's session sees her own buckets and no admin pages.
    d.find_element(By.ID, "signout").click()
    find(d, "#signin")
    sign_in(d, srv, lines["access key"], lines["secret key"])
    find(d, "#buckets")
    assert not d.find_element(By.ID, "nav-keys").is_displayed()
    assert not d.find_elements(By.CSS_SELECTOR, 'tr[data-bucket="photos"]')
    srv.stop()


def test_console_sessions_cannot_be_forged_or_used_cross_site(workdir):
    srv = Server(workdir / "console-sec").start()
    srv.client().create_bucket(Bucket="private")
    h = {"x-packrat-console": "1", "content-type": "application/json"}
    st, hdrs, _ = console_request(srv, "POST", "/console/session", h,
                                  json.dumps({"access_key": ROOT_AK, "secret_key": ROOT_SK}))
    assert st == 200
    cookie = hdrs["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    token = cookie.split(";")[0]
    # With the header and the cookie: the session's key.
    st, _, body = console_request(srv, "GET", "/", {"x-packrat-console": "1", "cookie": token})
    assert st == 200 and b"private" in body
    # The cookie alone (what a cross-site form or image would carry) is anonymous.
    st, _, body = console_request(srv, "GET", "/private?list-type=2", {"cookie": token})
    assert st == 403 and b"AccessDenied" in body
    # The header with a forged token, or none: refused, never anonymous.
    for c in ("packrat_console=" + "0" * 64, ""):
        st, _, body = console_request(srv, "GET", "/", {"x-packrat-console": "1", "cookie": c})
        assert st == 403 and b"No live console session" in body, body
    # The sign-in answer is the same for an unknown key and a wrong secret.
    for ak, sk in ((ROOT_AK, "wrong"), ("NOSUCHKEY", ROOT_SK)):
        st, _, body = console_request(srv, "POST", "/console/session", h,
                                      json.dumps({"access_key": ak, "secret_key": sk}))
        assert (st, json.loads(body)["error"]) == (403, "The access key or the secret key is wrong")
    # Signed out: the token is dead.
    st, _, _ = console_request(srv, "DELETE", "/console/session", {"x-packrat-console": "1", "cookie": token})
    assert st == 200
    st, _, _ = console_request(srv, "GET", "/", {"x-packrat-console": "1", "cookie": token})
    assert st == 403
    # The page is served with a policy that keeps other sites from framing it.
    st, hdrs, body = console_request(srv, "GET", "/console")
    assert st == 200 and b"app.js" in body and "frame-ancestors 'none'" in hdrs["content-security-policy"]
    srv.stop()
