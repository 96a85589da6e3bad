#!/usr/bin/python3
"""A proxy in front of an S3-compatible test server that checks AWS
Signature Version 4 as S3 does, with botocore (AWS's own implementation,
Debian's python3-botocore), so that the tests prove our signatures against
an independent signer: s3rver itself computes none.

Every request must carry an Authorization header for the configured key
id, signed over the headers it names, the date in x-amz-date and the
payload hash in x-amz-content-sha256 (a body that does not hash to it is
refused too, unless it is UNSIGNED-PAYLOAD). A request that passes is
forwarded to the upstream server and its answer relayed.

Usage: sigv4_proxy.py UPSTREAM_PORT ACCESS_KEY SECRET_KEY REGION [REQUEST_LOG]
With REQUEST_LOG, every request relayed is appended to it as a line
"METHOD PATH STATUS" (tests count uploads with it). Prints "sigv4 proxy listening on 127.0.0.1:PORT" once it listens."""
import hashlib
import http.client
import http.server
import re
import socket
import sys
import threading
from urllib.parse import urlsplit

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

UPSTREAM_PORT, ACCESS_KEY, SECRET_KEY, REGION = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
REQUEST_LOG = sys.argv[5] if len(sys.argv) > 5 else None
LOG_LOCK = threading.Lock()
AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, ?"
                  r"SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})$")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade"}


def error_xml(code, message):
    return ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%s</Code><Message>%s</Message></Error>'
            % (code, message)).encode()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Headers and body go in separate writes: without this, Nagle's
        # algorithm and the client's delayed ACK hold each answer 40 ms.
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt, *args):
        pass

    def refuse(self, status, code, message):
        body = error_xml(code, message)
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def check(self, body):
        """None when the request is signed right, else (status, code, message)."""
        auth = self.headers.get("Authorization", "")
        m = AUTH.match(auth)
        if not m:
            return 403, "AccessDenied", "Access Denied (no Signature Version 4 authorization)"
        key, day, region, signed, signature = m.groups()
        if key != ACCESS_KEY:
            return 403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records."
        amz_date = self.headers.get("x-amz-date", "")
        payload = self.headers.get("x-amz-content-sha256")
        if not amz_date.startswith(day) or region != REGION or payload is None:
            return 400, "AuthorizationHeaderMalformed", "date, region or payload hash header wrong or missing"
        if payload != "UNSIGNED-PAYLOAD" and payload != hashlib.sha256(body).hexdigest():
            return 400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match"
        headers = {}
        for name in signed.split(";"):
            value = self.headers.get_all(name)
            if value is None:
                return 403, "SignatureDoesNotMatch", "signed header %s missing" % name
            headers[name] = ",".join(value)
        request = AWSRequest(method=self.command, url="http://%s%s" % (headers.get("host", ""), self.path),
                             headers=headers, data=body)
        request.context["timestamp"] = amz_date
        signer = S3SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "s3", REGION)
        canonical = signer.canonical_request(request)
        expected = signer.signature(signer.string_to_sign(request, canonical), request)
        if expected != signature:
            return 403, "SignatureDoesNotMatch", ("The request signature we calculated does not match the "
                                                  "signature you provided. Check your key and signing method.")
        return None

    def relay(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if len(body) < length:
            # The client went away mid-body (a cut-off upload): S3 stores
            # nothing of such a request (400 IncompleteBody), whatever its
            # payload hash (UNSIGNED-PAYLOAD passes the check below), where
            # s3rver stored the bytes relayed as the object.
            self.close_connection = True
            try:
                self.refuse(400, "IncompleteBody", "You did not provide the number of bytes specified by the "
                            "Content-Length HTTP header")
            except OSError:
                pass
            return
        refused = self.check(body)
        if refused:
            self.refuse(*refused)
            return
        upstream = http.client.HTTPConnection("127.0.0.1", UPSTREAM_PORT, timeout=600)
        upstream.connect()
        upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "expect"}
        upstream.request(self.command, self.path, body=body if length else None, headers=headers)
        answer = upstream.getresponse()
        data = answer.read()
        if REQUEST_LOG:
            with LOG_LOCK, open(REQUEST_LOG, "a") as log:
                log.write("%s %s %d\n" % (self.command, self.path, answer.status))
        self.send_response(answer.status, answer.reason)
        for name, value in answer.getheaders():
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        length = answer.getheader("Content-Length") if self.command == "HEAD" else None
        self.send_header("Content-Length", length if length is not None else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        upstream.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = relay


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print("sigv4 proxy listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
server.serve_forever()
