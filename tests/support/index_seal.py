"""The index's own checksum (docs/FORMAT.md, section 3), written by a test
that changes an index on purpose, so that the reader's deeper checks are
the ones that answer. An implementation of its own (python3-xxhash), not
the toolkit's: a seal that only the toolkit could compute would prove
nothing. As a program: index_seal.py INDEX_JSON reseals a file in place."""
import json
import sys

import xxhash

KEY = b'"index_checksum":'


def sealed(text):
    """text (bytes of a JSON object, sealed or not) with a fresh seal: the
    old one removed, the checksum of every byte before the key appended as
    the last member."""
    d = json.loads(text)
    d.pop("index_checksum", None)
    body = json.dumps(d, indent=1).encode()
    body = body[: body.rindex(b"}")].rstrip() + b",\n"
    return body + KEY + b' "' + xxhash.xxh3_64(body).hexdigest().encode() + b'"\n}\n'


def dump(d, path):
    """json.dump of an index, sealed."""
    with open(path, "wb") as f:
        f.write(sealed(json.dumps(d).encode()))


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            text = f.read()
        with open(path, "wb") as f:
            f.write(sealed(text))
