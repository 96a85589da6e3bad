"""loopback.py: what the tests' own HTTP servers share (hostile_store.py,
fault_proxy.py): a server on 127.0.0.1 at a free port, a thread a
connection, its port written to a file (whole, by a rename) once it
listens, for the test that waits for that file. Standard library only."""

import http.server
import os
import socketserver


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve_forever(handler, port_file):
    """Serves handler's requests for ever, its port in port_file."""
    server = Server(("127.0.0.1", 0), handler)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.rename(tmp, port_file)
    server.serve_forever()
