#!/usr/bin/python3
"""zero_crc.py IN OUT [PREFIX]: IN's torch.save zip with the CRC-32 of its
data.pkl recorded as 0 (torch's "none"), so that a fuzzer's mutations of
the pickle are interpreted rather than refused as damage; PREFIX bytes
(a fuzzer's mode line, "#common.pt\\n") written before it. Made the seeds
tests/fuzz/corpus/megatron/*_pickle_crc0.pt and
corpus/megatron_dist/common_pickle_crc0.txt."""
import struct, sys, zipfile
data = bytearray(open(sys.argv[1], "rb").read())
for info in zipfile.ZipFile(sys.argv[1]).infolist():
    if info.filename.endswith("/data.pkl"):
        assert data[info.header_offset:info.header_offset + 4] == b"PK\x03\x04"
        data[info.header_offset + 14:info.header_offset + 18] = b"\0\0\0\0"
        at = data.find(b"PK\x01\x02")
        while at >= 0:
            n, = struct.unpack_from("<H", data, at + 28)
            if data[at + 46:at + 46 + n].decode() == info.filename:
                data[at + 16:at + 20] = b"\0\0\0\0"
            at = data.find(b"PK\x01\x02", at + 4)
prefix = sys.argv[3].encode().decode("unicode_escape").encode() if len(sys.argv) > 3 else b""
open(sys.argv[2], "wb").write(prefix + bytes(data))
