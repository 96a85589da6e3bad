"""A misbehaving object store for the tests (tests/e2e/test_hostile_store.sh):
serves a local directory over HTTP on 127.0.0.1 as a WebDAV server (GET with
ranges, HEAD, PROPFIND) or an S3 one (path-style GET, ListObjectsV2), and
misbehaves as --mode says:

  good          behaves (the control)
  change        every ranged GET of a shard moves the object to a new version:
                same size, other bytes, a new ETag; If-Match of an old ETag
                gets 412
  change-quiet  as change, but the ETag stays the same and If-Match is ignored
                (only the checksums can tell)
  wrong-range   a 206 carries other bytes than asked, and says so in its
                Content-Range (bytes from 16 further on)
  repeat-token  S3 listings: always truncated, always the same continuation
                token
  ignore-prefix S3 listings ignore the prefix asked for: every key of the
                bucket (a store that does not honour it)
  no-token      S3 listings: truncated, without a continuation token
  trickle       GET bodies of index.json: one byte every 2 s
  entity        PROPFIND answers declare an entity (<!DOCTYPE ... <!ENTITY)
  deep          PROPFIND answers nest 500 elements deep
  replaced      every object is served as version 0 until the file named by
                --switch-file exists, then as version 1 (other bytes, another
                ETag; If-Match of version 0's gets 412): an object replaced
                between two reads, once, when the test says
  slowdown-head HEADs are answered 503 without a body (as S3 throttles
                them) for --throttle-seconds after the first HEAD; the rest
                behaves
  slowdown      every request is answered 503 for --throttle-seconds after
                the first request (default: for ever): a HEAD's bare, the
                others' with S3's SlowDown error (an S3 store over its
                request rate)
  short-body    a 206 of a shard names the bytes asked for in its
                Content-Range, but its body (and Content-Length) is 7 bytes
                shorter
  short-close   a 206 of a shard announces the bytes asked for (Content-Range
                and Content-Length), sends 7 bytes fewer and closes the
                connection
  no-range      a GET of a shard ignores its Range: 200 and the whole object
  utf16         PROPFIND answers in UTF-16 (little-endian, a byte-order mark)
  href-elsewhere  PROPFIND answers of Depth 1 name an entry of another
                collection too (/elsewhere/step_00000009/)
  href-relative PROPFIND answers name entries by hrefs relative to the
                request ("step_00000001/"), itself by its absolute path
  endless-error every GET is answered 500 with a body that never ends
                (as fast as it is taken), without a Content-Length
  huge-headers  every GET is answered 200 with headers that never end
  swapped       the checkpoint is replaced once its index has been read: every
                later GET of an index.json is 404 (a --force upload removes it
                first) and every shard is another version (other bytes,
                another ETag), as another writer's --force leaves them
  torn-rewrites every other GET of an object its writers rewrite (a run
                directory's latest, .tp-run.lease or .tp-run.writers/*, an
                upload's tp-upload-claim.*) is answered with the first half
                of its bytes, as a server rewriting it in place (s3rver)
                serves one read mid-renewal; each torn answer is said on
                stderr

With --s3 it also takes writes, as S3 does: PUT and DELETE of objects (files
under --root), and multipart uploads (POST ?uploads, PUT ?partNumber&uploadId,
POST ?uploadId to complete, DELETE ?uploadId to abort; parts other than the
last under 5 MiB refused at completion, EntityTooSmall), its uploads under
way listed by GET /BUCKET?uploads (ListMultipartUploads). Write modes:

  part-500      the first attempt of every upload's part 2 is answered 500
                InternalError (its body read); the next is taken
  part-drop     the first attempt of every upload's part 2: its body read,
                the connection closed without an answer
  part-refused  every attempt of part 2 is answered 403 AccessDenied
  abort-refused as part-refused, and every abort is answered 500 InternalError
  complete-error         the first completion of every upload is answered
                200 with an <Error> InternalError body and not done (S3's
                "200 with an error": the answer's status goes before the
                work); the next is done
  complete-error-always  every completion is answered so
  complete-garbage       every completion is answered 200 with an HTML page
                (a proxy's), not done
  complete-lost the first completion of every upload is done, and its
                connection closed without an answer; the next gets 404
                NoSuchUpload, as from S3
  complete-lost-replaced  as complete-lost, and the object is then
                replaced by another writer's (other bytes, a plain ETag)
  upload-vanished        the first completion of every upload finds it gone
                (aborted by another process, a lifecycle rule): 404
                NoSuchUpload, nothing made
  part-damaged  the first attempt of every upload's part 2 arrives with a
                byte changed (damaged on the way)
  create-slowdown  the first CreateMultipartUpload of every key is answered
                503 SlowDown, making no upload (S3 over its request rate);
                the next is taken
  put-damaged   the first PUT (whole) of every shard arrives with a byte
                changed
  put-unchecked as put-damaged, and the PUT's Content-MD5 is not checked:
                the damaged bytes kept, answered 200 with their MD5 as ETag
  put-lost      the first PUT (whole) of every object is done, and its
                connection closed without an answer
  etag-sha1     PUTs (whole) answered with the SHA-1 of the bytes as ETag
                (a store whose ETags are not MD5s), HEAD and GET alike
  etag-encrypted  PUTs (whole) answered x-amz-server-side-encryption
                AES256 and an ETag of an MD5's form that is not the bytes'
                MD5 (as MinIO's encrypted objects), HEAD and GET alike

A PUT with a Content-MD5 whose bytes do not match it is refused 400
BadDigest, as S3 refuses it. --lose-create: the first CreateMultipartUpload
of every key makes its upload, and its connection is closed without an
answer (the upload left to the client to find); --foreign-upload stale or
fresh: with it (or with the create-slowdown mode's 503), another
writer's upload of the key, initiated an hour before or at the same
moment (--foreign-count N: N of them). ListMultipartUploads answers
--uploads-page uploads a page (default 1000, S3's; max-uploads if asked),
the next page after its NextKeyMarker and NextUploadIdMarker.

Listings write keys as S3 does: URL-encoded when asked encoding-type=url
(a space as '+', EncodingType url said), else as XML text with control
characters as numeric references ("&#13;"). The mode

  no-url-encoding  ignores encoding-type (as s3rver does): keys as XML
                text, every character outside ASCII a hex reference
                ("&#x1F600;") too

Writes its port to --port-file once listening; counts requests in
--count-file; says each fault done once on stderr ("fault: MODE WHAT of
upload ID"). Run with Debian's /usr/bin/python3 (standard library only)."""
import argparse
import base64
import hashlib
import http.server
import os
import re
import sys
import threading
import time
import urllib.parse

import loopback

ARGS = None
LOCK = threading.Lock()
VERSIONS = {}  # path -> version number (change modes)
SWAPPED = [False]  # swapped mode: an index was read
REQUESTS = [0]
THROTTLED_FROM = [None]  # when the first request to throttle came (slowdown modes)
UPLOADS = {}  # S3 multipart uploads under way: upload id -> {"key": path, "parts": {number: bytes}, "initiated": time}
WRITTEN = {}  # path -> the ETag of the object a PUT or a completion made (S3's: an MD5, "MD5-PARTS" of a multipart)
GETS = {}  # path -> GETs of it (torn-rewrites)
FAULTED = set()  # (upload id, what) of faults done once (part-500, part-drop, complete-error)
S3_PART_MIN = 5 << 20  # S3's smallest part but the last


def xml_escape(text):
    """text as S3 writes it in XML: & < > named, control characters as
    numeric references; in no-url-encoding mode every character outside
    ASCII as a hex reference too."""
    out = []
    for c in text:
        if c in "&<>":
            out.append({"&": "&amp;", "<": "&lt;", ">": "&gt;"}[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append("&#%d;" % ord(c))
        elif ord(c) > 0x7F and ARGS.mode == "no-url-encoding":
            out.append("&#x%X;" % ord(c))
        else:
            out.append(c)
    return "".join(out)


def is_rewritten(path):
    """Whether path is an object its writers rewrite: a run directory's latest or lease, a writer's lease in it, an upload's claim."""
    name = os.path.basename(path)
    return (name in ("latest", ".tp-run.lease") or os.path.basename(os.path.dirname(path)) == ".tp-run.writers"
            or name.startswith("tp-upload-claim."))


def etag_of(path, version):
    return '"%s"' % hashlib.md5(("%s:%d" % (path, version)).encode()).hexdigest()


def content(path, version, first=0, last=None):
    """Bytes first..last (inclusive; the end when None) of the object's version.
    Only those are read: a whole 42 MB shard read and changed for every
    ranged GET made one tp-ckpt verify take 114 s on a loaded machine."""
    size = os.path.getsize(path)
    last = size - 1 if last is None else min(last, size - 1)
    with open(path, "rb") as f:
        f.seek(first)
        data = bytearray(f.read(max(0, last - first + 1)))
    # Another version: same size, every 512th byte changed.
    if version:
        for i in range((-first) % 512, len(data), 512):
            data[i] = (data[i] + version) & 0xFF
    return bytes(data)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def count(self):
        with LOCK:
            REQUESTS[0] += 1
            if ARGS.count_file:
                with open(ARGS.count_file, "w") as f:
                    f.write("%d\n" % REQUESTS[0])

    def local(self):
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        if ARGS.s3:  # path-style: /bucket/key
            parts = path.lstrip("/").split("/", 1)
            path = "/" + (parts[1] if len(parts) > 1 else "")
        full = os.path.normpath(os.path.join(ARGS.root, path.lstrip("/")))
        return full if full.startswith(os.path.normpath(ARGS.root)) else None

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self):
        self.do_GET()

    def body(self):
        length = int(self.headers.get("Content-Length", "0") or "0")
        return self.rfile.read(length) if length else b""

    def s3_error(self, code, name):
        self.send(code, ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
                         "<Message>%s</Message></Error>" % (name, name)).encode())

    def once(self, upload_id, what):
        """Whether the fault `what` of this upload is still to be done (then it is, from now)."""
        with LOCK:
            if (upload_id, what) in FAULTED:
                return False
            FAULTED.add((upload_id, what))
        sys.stderr.write("fault: %s %s of upload %s\n" % (ARGS.mode, what, upload_id))  # for the test to see it done
        sys.stderr.flush()
        return True

    def digest_matches(self, data):
        """Whether the body matches its Content-MD5 (base64 of its MD5), if it has one."""
        want = self.headers.get("Content-MD5")
        return want is None or want == base64.b64encode(hashlib.md5(data).digest()).decode()

    def lost(self):
        """The answer to this request is lost: the connection closed without one."""
        self.close_connection = True

    def new_upload(self, path, initiated):
        upload_id = hashlib.md5(("%s:%d:%f" % (path, len(UPLOADS), time.time())).encode()).hexdigest()
        with LOCK:
            UPLOADS[upload_id] = {"key": path, "parts": {}, "initiated": initiated}
        return upload_id

    def s3_write(self):
        """A write's request (PUT, POST), counted: its query, body and local
        path; None where the server is not S3's (WebDAV takes no writes)."""
        self.count()
        if not ARGS.s3:
            return None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
        return query, self.body(), self.local()

    def do_PUT(self):
        write = self.s3_write()
        if not write:
            return self.send(405)
        query, data, path = write
        if "uploadId" in query:
            upload_id, number = query["uploadId"][0], int(query["partNumber"][0])
            if number == 2 and ARGS.mode == "part-500" and self.once(upload_id, "part"):
                return self.s3_error(500, "InternalError")
            if number == 2 and ARGS.mode == "part-drop" and self.once(upload_id, "part"):
                self.close_connection = True
                return
            if number == 2 and ARGS.mode in ("part-refused", "abort-refused"):
                return self.s3_error(403, "AccessDenied")
            if number == 2 and ARGS.mode == "part-damaged" and data and self.once(upload_id, "part"):
                data = bytes([data[0] ^ 0x40]) + data[1:]
            if not self.digest_matches(data):
                return self.s3_error(400, "BadDigest")
            with LOCK:
                if upload_id not in UPLOADS:
                    return self.s3_error(404, "NoSuchUpload")
                UPLOADS[upload_id]["parts"][number] = data
            return self.send(200, b"", [("ETag", '"%s"' % hashlib.md5(data).hexdigest())])
        if not path:
            return self.s3_error(400, "InvalidRequest")
        if ARGS.mode in ("put-damaged", "put-unchecked") and path.endswith(".h5") and data and self.once(path, "put"):
            data = bytes([data[0] ^ 0x40]) + data[1:]
        if ARGS.mode != "put-unchecked" and not self.digest_matches(data):
            return self.s3_error(400, "BadDigest")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".put", "wb") as f:
            f.write(data)
        os.rename(path + ".put", path)
        WRITTEN[path] = '"%s"' % hashlib.md5(data).hexdigest()
        headers = []
        if ARGS.mode == "etag-sha1":  # a store whose ETags are another digest
            WRITTEN[path] = '"%s"' % hashlib.sha1(data).hexdigest()
        elif ARGS.mode == "etag-encrypted":  # MinIO's SSE-S3: an ETag of an MD5's form, not the bytes' MD5
            WRITTEN[path] = '"%s"' % hashlib.md5(b"sealed:" + data).hexdigest()
            headers = [("x-amz-server-side-encryption", "AES256")]
        if ARGS.mode == "put-lost" and self.once(path, "put"):
            return self.lost()
        self.send(200, b"", [("ETag", WRITTEN[path])] + headers)

    def do_POST(self):
        write = self.s3_write()
        if not write:
            return self.send(405)
        query, data, path = write
        if "uploads" in query and path:
            if ARGS.mode == "create-slowdown" and self.once(path, "create"):
                if ARGS.foreign_upload:
                    self.new_upload(path, time.time() - (3600 if ARGS.foreign_upload == "stale" else 0))
                return self.s3_error(503, "SlowDown")
            upload_id = self.new_upload(path, time.time())
            if ARGS.lose_create and self.once(path, "create"):
                for _ in range(ARGS.foreign_count if ARGS.foreign_upload else 0):
                    self.new_upload(path, time.time() - (3600 if ARGS.foreign_upload == "stale" else 0))
                return self.lost()
            return self.send(200, ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<InitiateMultipartUploadResult>"
                                   "<UploadId>%s</UploadId></InitiateMultipartUploadResult>" % upload_id).encode())
        if "uploadId" not in query:
            return self.s3_error(400, "InvalidRequest")
        upload_id = query["uploadId"][0]
        if ARGS.mode == "complete-garbage":
            return self.send(200, b"<html><body><h1>Welcome</h1></body></html>", [("Content-Type", "text/html")])
        if ARGS.mode == "upload-vanished" and self.once(upload_id, "complete"):
            with LOCK:
                UPLOADS.pop(upload_id, None)
            return self.s3_error(404, "NoSuchUpload")
        if ARGS.mode == "complete-error-always" or (ARGS.mode == "complete-error" and self.once(upload_id, "complete")):
            return self.send(200, b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\n<Error><Code>InternalError</Code>"
                             b"<Message>We encountered an internal error. Please try again.</Message></Error>")
        numbers = [int(n) for n in re.findall(r"<PartNumber>(\d+)</PartNumber>", data.decode())]
        with LOCK:
            upload = UPLOADS.get(upload_id)
            if not upload or upload["key"] != path:
                return self.s3_error(404, "NoSuchUpload")
            if numbers != sorted(set(numbers)) or any(n not in upload["parts"] for n in numbers):
                return self.s3_error(400, "InvalidPart")
            if any(len(upload["parts"][n]) < S3_PART_MIN for n in numbers[:-1]):
                return self.s3_error(400, "EntityTooSmall")
            whole = b"".join(upload["parts"][n] for n in numbers)
            del UPLOADS[upload_id]
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".put", "wb") as f:
            f.write(whole)
        os.rename(path + ".put", path)
        digests = b"".join(hashlib.md5(upload["parts"][n]).digest() for n in numbers)
        etag = WRITTEN[path] = '"%s-%d"' % (hashlib.md5(digests).hexdigest(), len(numbers))
        if ARGS.mode in ("complete-lost", "complete-lost-replaced") and self.once(upload_id, "complete"):
            if ARGS.mode == "complete-lost-replaced":  # another writer's object, after ours
                other = bytes(b ^ 0xFF for b in whole[:4096]) + whole[4096:]
                with open(path + ".put", "wb") as f:
                    f.write(other)
                os.rename(path + ".put", path)
                WRITTEN[path] = '"%s"' % hashlib.md5(other).hexdigest()
            return self.lost()
        self.send(200, ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CompleteMultipartUploadResult>"
                        "<ETag>%s</ETag></CompleteMultipartUploadResult>" % etag).encode())

    def do_DELETE(self):
        self.count()
        if not ARGS.s3:
            return self.send(405)
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
        if "uploadId" in query and ARGS.mode == "abort-refused":
            return self.s3_error(500, "InternalError")
        if "uploadId" in query:
            with LOCK:
                found = UPLOADS.pop(query["uploadId"][0], None)
            return self.send(204) if found else self.s3_error(404, "NoSuchUpload")
        path = self.local()
        if path and os.path.isfile(path):
            os.remove(path)
            WRITTEN.pop(path, None)
        self.send(204)

    def s3_list_uploads(self, query):
        prefix = query.get("prefix", [""])[0]
        url = query.get("encoding-type", [""])[0] == "url"
        encode = (lambda k: urllib.parse.quote_plus(k, safe="/")) if url else xml_escape
        with LOCK:  # as S3 orders them: by key, then oldest first
            entries = sorted((os.path.relpath(u["key"], ARGS.root), u["initiated"], i) for i, u in UPLOADS.items())
        entries = [e for e in entries if e[0].startswith(prefix)]
        key_marker, id_marker = query.get("key-marker", [""])[0], query.get("upload-id-marker", [""])[0]
        if key_marker:  # the page after the last one listed
            at = [n for n, (k, _, i) in enumerate(entries) if k == key_marker and i == id_marker]
            entries = entries[at[0] + 1:] if at else [e for e in entries if e[0] > key_marker]
        size = int(query.get("max-uploads", [ARGS.uploads_page])[0])
        page, more = entries[:size], len(entries) > size
        body = "".join("<Upload><Key>%s</Key><UploadId>%s</UploadId><Initiated>%s.%03dZ</Initiated></Upload>"
                       % (encode(k), i, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)), int(t * 1000) % 1000)
                       for k, t, i in page)
        markers = ("<NextKeyMarker>%s</NextKeyMarker><NextUploadIdMarker>%s</NextUploadIdMarker>"
                   % (encode(page[-1][0]), page[-1][2])) if more else ""
        self.send(200, ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListMultipartUploadsResult>%s"
                        "<IsTruncated>%s</IsTruncated>%s%s</ListMultipartUploadsResult>"
                        % ("<EncodingType>url</EncodingType>" if url else "", "true" if more else "false", markers,
                           body)).encode())

    def throttled(self):
        """Whether this request is answered 503 (slowdown modes); answers it."""
        if ARGS.mode not in ("slowdown", "slowdown-head") or (ARGS.mode == "slowdown-head" and self.command != "HEAD"):
            return False
        with LOCK:
            if THROTTLED_FROM[0] is None:
                THROTTLED_FROM[0] = time.monotonic()
            if ARGS.throttle_seconds is not None and time.monotonic() - THROTTLED_FROM[0] >= ARGS.throttle_seconds:
                return False
        length = int(self.headers.get("Content-Length", "0") or "0")
        if length:
            self.rfile.read(length)
        self.send(503, b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
                       b"<Message>Please reduce your request rate.</Message></Error>")
        return True

    def do_GET(self):
        self.count()
        if self.throttled() or self.endless():
            return
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        if ARGS.s3 and "list-type" in query:
            return self.s3_list(query)
        if ARGS.s3 and "uploads" in urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True):
            return self.s3_list_uploads(query)
        path = self.local()
        if not path or not os.path.isfile(path):
            return self.send(404, b"<Error><Code>NoSuchKey</Code></Error>")
        shard = path.endswith(".h5")
        with LOCK:
            version = VERSIONS.get(path, 0)
            if ARGS.mode == "swapped":
                if path.endswith("index.json") and SWAPPED[0]:
                    return self.send(404, b"<Error><Code>NoSuchKey</Code></Error>")
                version = 1 if SWAPPED[0] and shard else 0
                if path.endswith("index.json") and self.command == "GET":
                    SWAPPED[0] = True
        if ARGS.mode == "replaced":
            version = 1 if os.path.exists(ARGS.switch_file) else 0
        etag = etag_of(path, 0 if ARGS.mode == "change-quiet" else version)
        etag = WRITTEN.get(path, etag) if not version else etag
        want = self.headers.get("If-Match")
        if ARGS.mode in ("change", "replaced") and want and want != etag:
            return self.send(412, b"<Error><Code>PreconditionFailed</Code></Error>")
        torn = None  # the object as a reader meets it mid-rewrite (torn-rewrites): half its bytes
        if ARGS.mode == "torn-rewrites" and self.command == "GET" and is_rewritten(path):
            with LOCK:
                GETS[path] = GETS.get(path, 0) + 1
                count = GETS[path]
            if count % 2 == 1:
                sys.stderr.write("fault: torn-rewrites GET %d of %s\n" % (count, os.path.basename(path)))
                sys.stderr.flush()
                torn = content(path, version)
                torn = torn[:len(torn) // 2]
        rng = self.headers.get("Range")
        if ARGS.mode == "no-range" and shard:
            rng = None
        if not rng:
            data = content(path, version) if torn is None else torn
            if ARGS.mode == "trickle" and path.endswith("index.json") and self.command == "GET":
                return self.trickle(data, etag)
            return self.send(200, data, [("ETag", etag)])
        size = os.path.getsize(path) if torn is None else len(torn)
        first, last = rng.split("=")[1].split("-")
        first, last = int(first), min(int(last), size - 1)
        if first >= size:
            return self.send(416, b"")
        if ARGS.mode == "wrong-range" and shard and first + 16 < size:
            first, last = first + 16, min(last + 16, size - 1)
        if ARGS.mode in ("change", "change-quiet") and shard:
            with LOCK:
                VERSIONS[path] = VERSIONS.get(path, 0) + 1
        body = content(path, version, first, last) if torn is None else torn[first:last + 1]
        headers = [("ETag", etag), ("Content-Range", "bytes %d-%d/%d" % (first, last, size))]
        if ARGS.mode == "short-body" and shard and len(body) > 7:
            return self.send(206, body[:-7], headers)
        if ARGS.mode == "short-close" and shard and len(body) > 7 and self.command == "GET":
            self.send_response(206)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[:-7])
            self.wfile.flush()
            self.close_connection = True
            return
        if ARGS.mode == "trickle" and path.endswith("index.json") and self.command == "GET":
            return self.trickle(body, etag, 206, headers)
        self.send(206, body, headers)

    def endless(self):
        """endless-error, huge-headers: answers the request (never ending); whether it did."""
        if ARGS.mode not in ("endless-error", "huge-headers") or self.command != "GET":
            return False
        self.close_connection = True
        try:
            if ARGS.mode == "endless-error":
                self.send_response(500)
                self.send_header("Connection", "close")
                self.end_headers()
                chunk = b"<Error><Code>InternalError</Code></Error>" + b" " * 65536
                while True:
                    self.wfile.write(chunk)
            self.wfile.write(b"HTTP/1.1 200 OK\r\n")
            line = b"X-Padding: " + b"x" * 1000 + b"\r\n"
            while True:
                self.wfile.write(line * 64)
        except OSError:
            pass
        return True

    def trickle(self, body, etag, code=200, headers=None):
        self.send_response(code)
        for k, v in headers or [("ETag", etag)]:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            for i in range(len(body)):
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
                time.sleep(2)
        except OSError:
            pass

    def s3_list(self, query):
        prefix = query.get("prefix", [""])[0] if ARGS.mode != "ignore-prefix" else ""
        # A probe for one key (max-keys=1) is answered truly; listings loop.
        if ARGS.mode == "no-token" and query.get("max-keys", ["1000"])[0] != "1":
            body = ("<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>"
                    "<Contents><Key>%sx</Key></Contents></ListBucketResult>" % prefix)
            return self.send(200, body.encode())
        if ARGS.mode == "repeat-token" and query.get("max-keys", ["1000"])[0] != "1":
            body = ("<?xml version=\"1.0\"?><ListBucketResult><IsTruncated>true</IsTruncated>"
                    "<Contents><Key>%sx</Key></Contents>"
                    "<NextContinuationToken>same-token</NextContinuationToken></ListBucketResult>" % prefix)
            return self.send(200, body.encode())
        keys = []
        for d, _, files in os.walk(ARGS.root):
            for name in files:
                key = os.path.relpath(os.path.join(d, name), ARGS.root)
                if key.startswith(prefix):
                    keys.append(key)
        if "max-keys" in query:
            keys = sorted(keys)[: int(query["max-keys"][0])]
        # Keys as S3 writes them: asked encoding-type=url, URL-encoded
        # (a space as '+') and said so; else as XML text, a control
        # character as a numeric reference ("&#13;"). no-url-encoding
        # ignores encoding-type (as s3rver does) and writes every character
        # outside ASCII as a hex reference ("&#x1F600;"), as some XML
        # writers do.
        url = query.get("encoding-type", [""])[0] == "url" and ARGS.mode != "no-url-encoding"
        encode = (lambda k: urllib.parse.quote_plus(k, safe="/")) if url else xml_escape
        delimited = "delimiter" in query
        prefixes = sorted({k[len(prefix):].split("/")[0] for k in keys if "/" in k[len(prefix):]}) if delimited else []
        contents = "".join("<Contents><Key>%s</Key></Contents>" % encode(k) for k in sorted(keys)
                           if not delimited or "/" not in k[len(prefix):])
        common = "".join("<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>" % encode(prefix + p + "/")
                         for p in prefixes)
        body = "<ListBucketResult>%s<IsTruncated>false</IsTruncated>%s%s</ListBucketResult>" % (
            "<EncodingType>url</EncodingType>" if url else "", contents, common)
        self.send(200, body.encode())

    def do_PROPFIND(self):
        self.count()
        if self.throttled():
            return
        length = int(self.headers.get("Content-Length", "0"))
        if length:
            self.rfile.read(length)
        path = self.local()
        if not path or not os.path.exists(path):
            return self.send(404)
        if ARGS.mode == "entity":
            body = ('<?xml version="1.0"?><!DOCTYPE m [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
                    '<D:multistatus xmlns:D="DAV:"><D:response><D:href>&b;</D:href></D:response></D:multistatus>')
            return self.send(207, body.encode())
        if ARGS.mode == "deep":
            body = '<D:multistatus xmlns:D="DAV:">' + "<D:x>" * 500 + "</D:x>" * 500 + "</D:multistatus>"
            return self.send(207, body.encode())
        url_path = urllib.parse.urlsplit(self.path).path
        entries = [(url_path, path)]
        if os.path.isdir(path) and self.headers.get("Depth") == "1":
            for name in sorted(os.listdir(path)):
                base = "" if ARGS.mode == "href-relative" else url_path.rstrip("/") + "/"
                entries.append((base + urllib.parse.quote(name), os.path.join(path, name)))
            if ARGS.mode == "href-elsewhere":
                entries.append(("/elsewhere/step_00000009/", path))
        out = ['<?xml version="1.0"?><D:multistatus xmlns:D="DAV:">']
        for href, p in entries:
            if os.path.isdir(p):
                prop = "<D:resourcetype><D:collection/></D:resourcetype>"
                href = href.rstrip("/") + "/"
            else:
                prop = "<D:resourcetype/><D:getcontentlength>%d</D:getcontentlength>" % os.path.getsize(p)
            out.append("<D:response><D:href>%s</D:href><D:propstat><D:prop>%s</D:prop>"
                       "<D:status>HTTP/1.1 200 OK</D:status></D:propstat></D:response>" % (href, prop))
        out.append("</D:multistatus>")
        if ARGS.mode == "utf16":
            text = "".join(out).replace('<?xml version="1.0"?>', '<?xml version="1.0" encoding="utf-16"?>')
            return self.send(207, text.encode("utf-16"), [("Content-Type", "application/xml; charset=utf-16")])
        self.send(207, "".join(out).encode())


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--mode", default="good")
    p.add_argument("--s3", action="store_true")
    p.add_argument("--port-file", required=True)
    p.add_argument("--count-file")
    p.add_argument("--throttle-seconds", type=float)
    p.add_argument("--switch-file", help="replaced mode: objects change once this file exists")
    p.add_argument("--lose-create", action="store_true", help="the first create of every key: made, answer lost")
    p.add_argument("--foreign-upload", choices=["stale", "fresh"], help="with it, another writer's upload of the key")
    p.add_argument("--foreign-count", type=int, default=1, help="how many such uploads")
    p.add_argument("--uploads-page", type=int, default=1000, help="uploads a page of ListMultipartUploads")
    ARGS = p.parse_args()
    loopback.serve_forever(Handler, ARGS.port_file)


if __name__ == "__main__":
    main()
