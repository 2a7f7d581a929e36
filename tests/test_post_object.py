"""Presigned POST (browser form uploads): boto3's generate_presigned_post posted as
multipart/form-data, every way of breaking the policy refused with S3's error and nothing
stored, the success_action_* answers, and a plain HTML form submitted by headless Chromium."""

import os
import subprocess
import time
import urllib.parse
import xml.etree.ElementTree as ET

import pytest
import urllib3
from botocore.exceptions import ClientError

import conftest


def post(url, fields, file=("a.txt", b"hello form", "text/plain"), file_first=False):
    parts = list(fields.items())
    parts = [("file", file)] + parts if file_first else parts + [("file", file)]
    return urllib3.request("POST", url, fields=parts, redirect=False, timeout=30)


def error_code(resp):
    return ET.fromstring(resp.data).findtext("Code")


def missing(s3, bucket, key):
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=bucket, Key=key)
    return e.value.response["Error"]["Code"] == "404"


@pytest.fixture
def s3v4(server):
    return server.client(signature_version="s3v4")


def test_presigned_post_stores_the_file(s3v4, bucket):
    s3 = s3v4
    p = s3.generate_presigned_post(
        bucket, "uploads/${filename}",
        Fields={"Content-Type": "text/plain", "x-amz-meta-source": "form"},
        Conditions=[["content-length-range", 1, 1000], ["starts-with", "$Content-Type", "text/"],
                    {"x-amz-meta-source": "form"}, ["starts-with", "$key", "uploads/"]],
        ExpiresIn=600)
    assert p["fields"]["x-amz-algorithm"] == "AWS4-HMAC-SHA256"
    r = post(p["url"], p["fields"], ("notes.txt", b"hello form", "application/octet-stream"))
    assert r.status == 204, r.data
    etag = r.headers["ETag"]
    assert r.headers["Location"].endswith(f"/{bucket}/uploads/notes.txt")
    got = s3.get_object(Bucket=bucket, Key="uploads/notes.txt")
    assert got["Body"].read() == b"hello form" and got["ETag"] == etag
    assert got["ContentType"] == "text/plain" and got["Metadata"] == {"source": "form"}
    # 201 answers a PostResponse document; 200 an empty body.
    p = s3.generate_presigned_post(bucket, "k201", Fields={"success_action_status": "201"},
                                   Conditions=[{"success_action_status": "201"}])
    r = post(p["url"], p["fields"])
    assert r.status == 201
    doc = ET.fromstring(r.data)
    assert doc.tag.endswith("PostResponse") and doc.findtext("{*}Key") == "k201" and doc.findtext("{*}Bucket") == bucket
    p = s3.generate_presigned_post(bucket, "k200", Fields={"success_action_status": "200"},
                                   Conditions=[{"success_action_status": "200"}])
    assert post(p["url"], p["fields"]).status == 200


TAGGING = ("<Tagging><TagSet><Tag><Key>split</Key><Value>train</Value></Tag>"
           "<Tag><Key>label</Key><Value>cat photo</Value></Tag></TagSet></Tagging>")


def test_presigned_post_with_a_tagging_field(s3v4, bucket):
    """The form field `tagging` (a Tagging document) gives the object its tags; the policy must
    name it as any field; a malformed document or a bad tag stores nothing."""
    s3 = s3v4
    p = s3.generate_presigned_post(bucket, "tagged", Fields={"tagging": TAGGING},
                                   Conditions=[{"tagging": TAGGING}])
    r = post(p["url"], p["fields"])
    assert r.status == 204, r.data
    tags = s3.get_object_tagging(Bucket=bucket, Key="tagged")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("label", "cat photo"), ("split", "train")]
    assert s3.head_object(Bucket=bucket, Key="tagged")["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "2"
    # A tagging field the policy does not name, or a broken document, stores nothing.
    plain = s3.generate_presigned_post(bucket, "untagged")
    r = post(plain["url"], {**plain["fields"], "tagging": TAGGING})
    assert (r.status, error_code(r)) == (403, "AccessDenied"), r.data
    for doc, code in (("<Tagging><TagSet>", "MalformedXML"),
                      ("<Tagging><TagSet><Tag><Key>aws:x</Key><Value>1</Value></Tag></TagSet></Tagging>",
                       "InvalidTag")):
        p = s3.generate_presigned_post(bucket, "broken", Fields={"tagging": doc}, Conditions=[{"tagging": doc}])
        r = post(p["url"], p["fields"])
        assert (r.status, error_code(r)) == (400, code), (doc, r.data)
    assert missing(s3, bucket, "untagged") and missing(s3, bucket, "broken")


def test_presigned_post_with_an_acl_field(server, s3v4, bucket):
    """The form field `acl`: refused (AccessControlListNotSupported, nothing stored) while the
    bucket's objects have no ACLs, a canned ACL of the object once they do (ObjectWriter)."""
    s3 = s3v4
    p = s3.generate_presigned_post(bucket, "pub", Fields={"acl": "public-read"}, Conditions=[{"acl": "public-read"}])
    r = post(p["url"], p["fields"], ("f", b"open", "text/plain"))
    assert (r.status, error_code(r)) == (400, "AccessControlListNotSupported"), r.data
    assert missing(s3, bucket, "pub")
    s3.put_bucket_ownership_controls(Bucket=bucket, OwnershipControls={"Rules": [{"ObjectOwnership": "ObjectWriter"}]})
    try:
        r = post(p["url"], p["fields"], ("f", b"open", "text/plain"))
        assert r.status == 204, r.data
        anonymous = urllib3.request("GET", f"{server.endpoint}/{bucket}/pub", timeout=30)
        assert (anonymous.status, anonymous.data) == (200, b"open")
        grants = s3.get_object_acl(Bucket=bucket, Key="pub")["Grants"]
        assert "http://acs.amazonaws.com/groups/global/AllUsers" in [g["Grantee"].get("URI") for g in grants]
    finally:
        s3.delete_bucket_ownership_controls(Bucket=bucket)


def test_sigv2_presigned_post_boto3_default(server, s3, bucket):
    """boto3's default presigned POST is SigV2 (AWSAccessKeyId, signature): accepted, since it
    signs the whole policy; a changed policy or signature is refused."""
    p = s3.generate_presigned_post(bucket, "v2/${filename}", Conditions=[["starts-with", "$key", "v2/"]])
    assert "AWSAccessKeyId" in p["fields"] and "x-amz-signature" not in p["fields"]
    r = post(p["url"], p["fields"], ("x.txt", b"sigv2 form", "text/plain"))
    assert r.status == 204, r.data
    assert s3.get_object(Bucket=bucket, Key="v2/x.txt")["Body"].read() == b"sigv2 form"
    for bad in ({**p["fields"], "signature": "AAAA" + p["fields"]["signature"][4:]},
                {**p["fields"], "key": "elsewhere/x"}):
        r = post(p["url"], bad)
        assert r.status == 403, r.data
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["v2/x.txt"]


@pytest.mark.parametrize("sig", ["s3v4", "s3"])
def test_broken_policies_are_refused_and_store_nothing(server, s3, bucket, sig):
    signer = server.client(signature_version=sig)
    p = signer.generate_presigned_post(bucket, "uploads/${filename}",
                                   Conditions=[["content-length-range", 5, 20], ["starts-with", "$key", "uploads/"]])
    f = p["fields"]
    v4 = sig == "s3v4"
    cases = [
        # (what, fields, file, status, code)
        ("a key outside the policy", {**f, "key": "secret/x"}, None, 403, "AccessDenied"),
        ("a field the policy does not name", {**f, "x-amz-meta-evil": "1"}, None, 403, "AccessDenied"),
        ("a file too large", f, ("big.txt", b"x" * 21, "text/plain"), 400, "EntityTooLarge"),
        ("a file too small", f, ("small.txt", b"x" * 4, "text/plain"), 400, "EntityTooSmall"),
        ("a changed policy", {**f, "policy": f["policy"][:-4] + "AAA="}, None, 403, "SignatureDoesNotMatch"),
        ("a changed signature", {**f, ("x-amz-signature" if v4 else "signature"): "0" * 64}, None, 403,
         "SignatureDoesNotMatch"),
        ("an unknown key", {**f, "x-amz-credential": "NOSUCHKEY/" + f["x-amz-credential"].split("/", 1)[1]} if v4
         else {**f, "AWSAccessKeyId": "NOSUCHKEY"}, None, 403, "InvalidAccessKeyId"),
        ("no policy at all", {"key": "uploads/x"}, None, 403, "AccessDenied"),
        ("encryption asked in a field", {**f, "x-amz-server-side-encryption": "AES256"}, None, 403, "AccessDenied"),
        ("not a form", None, None, 400, "MalformedPOSTRequest"),
    ]
    for what, fields, file, status, code in cases:
        if fields is None:
            r = urllib3.request("POST", p["url"], body=b"--x\r\nnot a form", redirect=False,
                                headers={"Content-Type": "multipart/form-data; boundary=x"})
        else:
            r = post(p["url"], fields, file or ("ok.txt", b"just right", "text/plain"))
        assert (r.status, error_code(r)) == (status, code), (what, r.status, r.data)
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert listed == [], [o["Key"] for o in listed]
    # An expired policy.
    old = signer.generate_presigned_post(bucket, "late", ExpiresIn=1)
    time.sleep(1.5)
    r = post(old["url"], old["fields"])
    assert (r.status, error_code(r)) == (403, "AccessDenied") and b"expired" in r.data
    assert missing(s3, bucket, "late")
    # A key's policy reaches only its own buckets.
    out = subprocess.run(
        [conftest.BIN, "admin", "--endpoint", server.endpoint, "key", "create", "--name", "poster",
         "--access-key", f"POSTER{sig.upper()}", "--secret-key", "poster-secret-1"],
        env=dict(os.environ, PACKRAT_ROOT_ACCESS_KEY=conftest.ROOT_AK, PACKRAT_ROOT_SECRET_KEY=conftest.ROOT_SK),
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    other = server.client(f"POSTER{sig.upper()}", "poster-secret-1", signature_version=sig)
    p = other.generate_presigned_post(bucket, "intruder")
    r = post(p["url"], p["fields"])
    assert (r.status, error_code(r)) == (403, "AccessDenied")
    assert missing(s3, bucket, "intruder")
    # Fields after the file are not part of the form (S3 ignores them): a form whose policy
    # comes after its file has none.
    p = signer.generate_presigned_post(bucket, "order")
    r = post(p["url"], p["fields"], file_first=True)
    assert (r.status, error_code(r)) == (403, "AccessDenied")
    assert missing(s3, bucket, "order")


def test_plain_html_form_in_a_browser(s3v4, bucket, browser, other_origin, tmp_path):
    """A page with an ordinary <form method=post enctype=multipart/form-data> (no script),
    served from another origin, uploads a file chosen in a file input and is redirected back."""
    from test_console import shot

    s3 = s3v4
    origin = other_origin.origin
    p = s3.generate_presigned_post(
        bucket, "forms/${filename}",
        Fields={"success_action_redirect": origin + "/done"},
        Conditions=[["starts-with", "$key", "forms/"], {"success_action_redirect": origin + "/done"},
                    ["content-length-range", 1, 1 << 20]])
    hidden = "".join(f'<input type="hidden" name="{k}" value="{v}">' for k, v in p["fields"].items())
    other_origin.pages["/done"] = "<!doctype html><title>done</title><p id=done>uploaded</p>"
    other_origin.pages["/"] = (f'<!doctype html><title>upload</title><form action="{p["url"]}" method="post" '
                               f'enctype="multipart/form-data">{hidden}<input type="file" name="file" id="file">'
                               f'<input type="submit" id="go" value="Upload"></form>')
    upload = tmp_path / "photo.bin"
    data = bytes(range(256)) * 300
    upload.write_bytes(data)
    from selenium.webdriver.common.by import By

    from test_console import wait

    browser.get(origin + "/")
    browser.find_element(By.ID, "file").send_keys(str(upload))
    shot(browser, "post-form")
    browser.find_element(By.ID, "go").click()
    wait(browser, lambda: browser.current_url.startswith(origin + "/done"), "the redirect back")
    shot(browser, "post-form-done")
    q = urllib.parse.parse_qs(urllib.parse.urlsplit(browser.current_url).query)
    assert q["bucket"] == [bucket] and q["key"] == ["forms/photo.bin"]
    got = s3.get_object(Bucket=bucket, Key="forms/photo.bin")
    assert got["Body"].read() == data and q["etag"] == [got["ETag"]]


from test_console import browser, other_origin  # noqa: E402,F401  (the fixtures)
