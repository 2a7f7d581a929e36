"""A minimal SigV4 signer and raw HTTP client, so tests can send what boto3 never would:
skewed clocks, tampered headers, wrong payload hashes, signed aws-chunked bodies."""

import datetime
import hashlib
import hmac
import http.client
import urllib.parse

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signing_key(secret, date, region="us-east-1", service="s3"):
    k = _hmac(("AWS4" + secret).encode(), date)
    k = _hmac(k, region)
    k = _hmac(k, service)
    return _hmac(k, "aws4_request")


def amz_now(offset_seconds=0):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset_seconds)
    return t.strftime("%Y%m%dT%H%M%SZ")


class Signed:
    """Signs one request; exposes the pieces a streaming body needs."""

    def __init__(self, host, method, path, query, headers, payload_hash, ak, sk,
                 region="us-east-1", amz_date=None, scope_region=None, service="s3"):
        self.amz_date = amz_date or amz_now()
        date = self.amz_date[:8]
        region_in_scope = scope_region or region
        self.scope = f"{date}/{region_in_scope}/{service}/aws4_request"
        self.key = signing_key(sk, date, region_in_scope, service)
        h = {k.lower(): str(v) for k, v in headers.items()}
        h["host"] = host
        h["x-amz-date"] = self.amz_date
        h["x-amz-content-sha256"] = payload_hash
        signed = sorted(h)
        canon_path = urllib.parse.quote(path, safe="/~")
        pairs = sorted((urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~")) for k, v in query)
        canon_query = "&".join(f"{k}={v}" for k, v in pairs)
        creq = "\n".join([method, canon_path, canon_query,
                          "".join(f"{k}:{' '.join(h[k].split())}\n" for k in signed),
                          ";".join(signed), payload_hash])
        sts = "\n".join(["AWS4-HMAC-SHA256", self.amz_date, self.scope, hashlib.sha256(creq.encode()).hexdigest()])
        self.signature = hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()
        h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={ak}/{self.scope}, "
                              f"SignedHeaders={';'.join(signed)}, Signature={self.signature}")
        self.headers = h
        self.path = canon_path + ("?" + canon_query if canon_query else "")

    def chunk_sig(self, previous, data):
        sts = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", self.amz_date, self.scope, previous,
                         EMPTY_SHA256, hashlib.sha256(data).hexdigest()])
        return hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()

    def trailer_sig(self, previous, trailer_text):
        sts = "\n".join(["AWS4-HMAC-SHA256-TRAILER", self.amz_date, self.scope, previous,
                         hashlib.sha256(trailer_text.encode()).hexdigest()])
        return hmac.new(self.key, sts.encode(), hashlib.sha256).hexdigest()

    def signed_chunked_body(self, data, chunk=64 * 1024, trailers=None, tamper_chunk=None):
        out = b""
        prev = self.signature
        pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
        for n, piece in enumerate(pieces):
            sig = self.chunk_sig(prev, piece)
            prev = sig
            sent = piece
            if tamper_chunk == n and piece:
                sent = bytes([piece[0] ^ 1]) + piece[1:]
            out += f"{len(piece):x};chunk-signature={sig}\r\n".encode() + sent + b"\r\n"
        if trailers is not None:
            out = out[:-2]  # the final chunk's CRLF is replaced by the trailer section
            text = "".join(f"{k}:{v}\n" for k, v in trailers)
            for k, v in trailers:
                out += f"{k}:{v}\r\n".encode()
            out += f"x-amz-trailer-signature:{self.trailer_sig(prev, text)}\r\n\r\n".encode()
        return out


def unsigned_chunked_body(data, chunk=64 * 1024, trailers=()):
    out = b""
    for i in range(0, len(data), chunk):
        piece = data[i:i + chunk]
        out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    out += b"0\r\n"
    for k, v in trailers:
        out += f"{k}:{v}\r\n".encode()
    return out + b"\r\n"


def send(endpoint, method, path, headers, body=b""):
    u = urllib.parse.urlparse(endpoint)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
    for k, v in headers.items():
        # As UTF-8, as signed (http.client would send a str as Latin-1).
        conn.putheader(k, v.encode() if isinstance(v, str) else v)
    if "content-length" not in {k.lower() for k in headers}:
        conn.putheader("content-length", str(len(body)))
    conn.endheaders()
    if body:
        conn.send(body)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, data


def host_of(endpoint):
    return urllib.parse.urlparse(endpoint).netloc


def signed_request(endpoint, method, path, query="", body=b"", headers=None,
                   ak="PKTESTROOTKEY", sk="test-root-secret-0123456789abcdef"):
    """Signs (payload hash included) and sends one request; `query` is `a=1&b=` text.
    Returns (status, headers, body)."""
    pairs = [tuple(p.split("=", 1)) if "=" in p else (p, "") for p in query.split("&") if p]
    pairs = [(urllib.parse.unquote(k), urllib.parse.unquote(v)) for k, v in pairs]
    s = Signed(host_of(endpoint), method, path, pairs, dict(headers or {}),
               hashlib.sha256(body).hexdigest(), ak, sk)
    return send(endpoint, method, s.path, s.headers, body)
