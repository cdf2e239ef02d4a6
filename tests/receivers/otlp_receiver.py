"""An OTLP profiles receiver for bpfprof's tests, built on the official generated stubs (PyPI
`opentelemetry-proto`, `grpcio`): it decodes each ExportProfilesServiceRequest it gets, over
gRPC or HTTP/protobuf, and appends what it found as one JSON line to OUT: the request's
headers (and over HTTP its body's size as sent and decoded), and per resource its attributes and per profile its sample type, period, time,
attributes and samples (each stack as function names through the dictionary, leaf first).

Usage: otlp_receiver.py grpc|http PORT PORT_FILE OUT [STATUS [CERT KEY]]
It listens on loopback's PORT (0: a free one) and writes the port to PORT_FILE once it
listens.
STATUS (HTTP only): answer every request with this status instead of 200 (what is
received is still written, with "answered": STATUS).
CERT KEY: serve TLS with this certificate chain and key (PEM files).
"""

import gzip
import json
import os
import ssl
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2,
    profiles_service_pb2_grpc,
)

LOCK = threading.Lock()


def any_value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def decode(req):
    d = req.dictionary
    strings = d.string_table

    def attrs(indices):
        out = {}
        for i in indices:
            a = d.attribute_table[i]
            out[strings[a.key_strindex]] = any_value(a.value)
        return out

    def stack(index):
        names = []
        for loc in d.stack_table[index].location_indices:
            for line in d.location_table[loc].lines:
                names.append(strings[d.function_table[line.function_index].name_strindex])
        return names

    resources = []
    for rp in req.resource_profiles:
        profiles = []
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                profiles.append(
                    {
                        "scope": sp.scope.name,
                        "sample_type": [
                            strings[p.sample_type.type_strindex],
                            strings[p.sample_type.unit_strindex],
                        ],
                        "period_type": [
                            strings[p.period_type.type_strindex],
                            strings[p.period_type.unit_strindex],
                        ],
                        "period": p.period,
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "attributes": attrs(p.attribute_indices),
                        "samples": [
                            {
                                "stack": stack(s.stack_index),
                                "values": list(s.values),
                                "attributes": attrs(s.attribute_indices),
                            }
                            for s in p.samples
                        ],
                    }
                )
        resources.append(
            {
                "attributes": {kv.key: any_value(kv.value) for kv in rp.resource.attributes},
                "profiles": profiles,
            }
        )
    return resources


def record(out, headers, req, answered, sizes=None):
    entry = {"headers": headers, "answered": answered, "resources": decode(req)}
    # HTTP only: the body's size as sent (gzipped) and decoded.
    if sizes:
        entry["wire_bytes"], entry["body_bytes"] = sizes
    line = json.dumps(entry)
    with LOCK, open(out, "a") as f:
        f.write(line + "\n")


class Servicer(profiles_service_pb2_grpc.ProfilesServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):
        headers = {k: v for k, v in context.invocation_metadata()}
        record(self.out, headers, request, 0)
        return profiles_service_pb2.ExportProfilesServiceResponse()


def serve_grpc(port, port_file, out, tls):
    # One worker: requests are recorded in the order they come.
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    profiles_service_pb2_grpc.add_ProfilesServiceServicer_to_server(Servicer(out), server)
    address = "127.0.0.1:%d" % port
    if tls:
        cert, key = (open(path, "rb").read() for path in tls)
        credentials = grpc.ssl_server_credentials([(key, cert)])
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    server.start()
    write_port(port_file, port)
    server.wait_for_termination()


def serve_http(port, port_file, out, status, tls):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != "/v1development/profiles":
                self.send_response(404)
                self.end_headers()
                return
            wire_bytes = len(body)
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            req = profiles_service_pb2.ExportProfilesServiceRequest.FromString(body)
            headers = {k.lower(): v for k, v in self.headers.items()}
            record(out, headers, req, status, (wire_bytes, len(body)))
            reply = profiles_service_pb2.ExportProfilesServiceResponse().SerializeToString()
            self.send_response(status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    write_port(port_file, server.server_address[1])
    server.serve_forever()


def write_port(port_file, port):
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    os.rename(port_file + ".tmp", port_file)


if __name__ == "__main__":
    protocol, port, port_file, out = sys.argv[1:5]
    status = int(sys.argv[5]) if len(sys.argv) > 5 else 200
    tls = tuple(sys.argv[6:8]) if len(sys.argv) > 7 else None
    if protocol == "grpc":
        import grpc

        serve_grpc(int(port), port_file, out, tls)
    else:
        serve_http(int(port), port_file, out, status, tls)
