"""A reverse proxy in front of a real object store (nginx's WebDAV, s3rver)
that fails chosen requests a set number of times, for the tests of what a
store that does not answer, or answers wrongly, must not be taken for
(tests/e2e/test_store_unanswered.sh): a checkpoint that is not there.

Everything else is relayed to the upstream as it is (method, path, headers,
body; the answer likewise), one connection per request.

Rules come from --rules FILE, read again for every request (a test changes
them between commands by rewriting the file; an absent or empty file relays
everything). One rule a line, the first that matches a request applies:

    ACTION METHOD SUBSTRING COUNT [ARG]

  ACTION     a status code: answers it with an HTML body (503, 500: a proxy
                    whose upstream is down); a 3xx one with a Location: ARG (a
                    URL; default: the same path on 127.0.0.2, another host)
             loop   answers 301 to the request's own path (a redirect loop)
             html   answers 200 with an HTML page (a captive portal, a proxy's
                    error page)
             sleep  waits ARG seconds, then relays (a server too slow)
             drop   closes the connection without answering
             fakeok answers a PUT (or MKCOL) 201 without relaying it: a store
                    that says it kept what it did not
             flipput relays a PUT with one byte of its body changed (the
                    middle one): a store that keeps other bytes
             region answers 400 without a body, naming ARG as the bucket's
                    region (x-amz-bucket-region): S3 to a request signed for
                    another region than the bucket's
  METHOD     the request's method (PROPFIND, GET, HEAD, PUT...), or * for any
  SUBSTRING  what the request's path must contain
  COUNT      how many matching requests the rule takes (its first COUNT since
             the rule file was last written: replace it, write it to a new
             file and rename that over it, to count afresh), or "always"

Each request is logged to --log as one line: "METHOD PATH ACTION" (ACTION
"relay" when none applied). The port goes to --port-file once listening.
Run with Debian's /usr/bin/python3 (standard library only)."""
import argparse
import http.client
import http.server
import os
import threading
import time

import loopback

ARGS = None
LOCK = threading.Lock()
STATE = {"text": None, "taken": {}}  # the rules (text, file version), and what each rule (by line) has taken since

HTML = b"<html><body><h1>502 Bad Gateway</h1><p>upstream unavailable</p></body></html>"


def rules():
    """The rules' text, and what tells one writing of the file from another
    (counts start again at each, even of the same text)."""
    try:
        with open(ARGS.rules) as f:
            st = os.fstat(f.fileno())
            return f.read(), (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        return "", None


def action_for(method, path):
    """The rule that takes this request, as (action, arg), or None; counts it."""
    text, version = rules()
    with LOCK:
        if (text, version) != STATE["text"]:
            STATE["text"], STATE["taken"] = (text, version), {}
        for number, line in enumerate(text.splitlines()):
            fields = line.split()
            if len(fields) < 4 or fields[0].startswith("#"):
                continue
            action, want, substring, count = fields[:4]
            if (want != "*" and want != method) or substring not in path:
                continue
            taken = STATE["taken"].get(number, 0)
            if count != "always" and taken >= int(count):
                continue
            STATE["taken"][number] = taken + 1
            return action, fields[4] if len(fields) > 4 else None
    return None


def log(line):
    if ARGS.log:
        with LOCK:
            with open(ARGS.log, "a") as f:
                f.write(line + "\n")


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, body=b"", headers=()):
        self.send_response_only(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(body)
                self.wfile.flush()
            except OSError:
                pass

    def handle_any(self):
        length = int(self.headers.get("Content-Length", "0") or "0")
        body = self.rfile.read(length) if length else None
        rule = action_for(self.command, self.path)
        log("%s %s %s" % (self.command, self.path, rule[0] if rule else "relay"))
        if rule:
            action, arg = rule
            if action.isdigit() and 300 <= int(action) < 400:
                where = arg or "http://127.0.0.2:%d%s" % (ARGS.upstream, self.path)
                return self.answer(int(action), b"", [("Location", where)])
            if action.isdigit():
                return self.answer(int(action), HTML, [("Content-Type", "text/html")])
            if action == "loop":
                return self.answer(301, b"", [("Location", self.path)])
            if action == "html":
                return self.answer(200, HTML, [("Content-Type", "text/html")])
            if action == "drop":
                self.close_connection = True
                return
            if action == "sleep":
                time.sleep(float(arg or "10"))
            if action == "region":
                return self.answer(400, b"", [("x-amz-bucket-region", arg or "eu-central-1")])
            if action == "fakeok":
                return self.answer(201 if self.command in ("PUT", "MKCOL") else 200)
            if action == "flipput" and body:
                changed = bytearray(body)
                changed[len(changed) // 2] ^= 0xFF
                body = bytes(changed)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        conn = http.client.HTTPConnection("127.0.0.1", ARGS.upstream, timeout=600)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            r = conn.getresponse()
            data = r.read()
        finally:
            conn.close()
        hop = ("content-length", "transfer-encoding", "connection", "keep-alive")
        self.send_response_only(r.status, r.reason)
        for k, v in r.getheaders():
            if k.lower() not in hop:
                self.send_header(k, v)
        # A HEAD's answer says the object's length without carrying it.
        self.send_header("Content-Length", r.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                pass

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PROPFIND = do_MKCOL = do_MOVE = do_COPY = handle_any
    do_OPTIONS = handle_any


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--upstream", type=int, required=True, help="the port of the store on 127.0.0.1")
    p.add_argument("--rules", required=True)
    p.add_argument("--port-file", required=True)
    p.add_argument("--log")
    ARGS = p.parse_args()
    loopback.serve_forever(Handler, ARGS.port_file)


if __name__ == "__main__":
    main()
