#!/usr/bin/env python3
"""Konnectivity-client stand-in: dials through an ANP server's ProxyService/Proxy.

For each of --connections K: DIAL_REQ(tcp, --dial, random) -> DIAL_RSP, then sends
--payload-size random bytes as DATA chunks, expects the very same bytes back (the
target must be an echo server), then CLOSE_REQ -> CLOSE_RSP. Finally half-closes the
stream(s) and waits up to --close-wait seconds for the server to end them.

See README.md in this directory for the output lines and exit codes.
"""

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anp_common as c  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True,
                   help="server frontend: 'unix:/path/to.sock' or 'HOST:PORT'")
    p.add_argument("--dial", required=True, help="address to put in DIAL_REQ (HOST:PORT as seen by the agent)")
    p.add_argument("--payload-size", type=int, default=65536,
                   help="bytes to send and expect echoed per connection (default 65536; 0 = dial+close only)")
    p.add_argument("--connections", type=int, default=1, help="number of concurrent dials (default 1)")
    p.add_argument("--streams", choices=["per-connection", "shared"], default="per-connection",
                   help="per-connection: one Proxy stream per dial, like konnectivity-client (default); "
                        "shared: all dials multiplexed on one Proxy stream")
    p.add_argument("--chunk-size", type=int, default=32 * 1024, help="DATA payload size per packet (default 32768)")
    p.add_argument("--protocol", default="tcp", help="DIAL_REQ.protocol (default tcp)")
    p.add_argument("--expect-dial-error", action="store_true",
                   help="succeed only if every DIAL_RSP carries a non-empty error")
    p.add_argument("--close-wait", type=float, default=2.0,
                   help="seconds to wait for the server to end a stream after our half-close (default 2; "
                        "not an error if it does not)")
    p.add_argument("--connect-wait", type=float, default=10.0,
                   help="seconds to wait for the channel to become ready (default 10)")
    p.add_argument("--ca", help="enable TLS: CA bundle to verify the server")
    p.add_argument("--cert", help="TLS client certificate (PEM), with --key")
    p.add_argument("--key", help="TLS client private key (PEM)")
    p.add_argument("--server-name", help="TLS: override the name checked against the server certificate")
    p.add_argument("--raw-authority", action="store_true",
                   help="unix targets: keep grpc C-core's own :authority (the percent-encoded socket path, "
                        "like kube-apiserver's grpc-go with its custom dialer) instead of 'localhost'")
    c.add_common_args(p)
    a = p.parse_args()
    if a.connections < 1 or a.payload_size < 0 or a.chunk_size < 1:
        p.error("--connections >= 1, --payload-size >= 0, --chunk-size >= 1 required")
    if (a.cert is None) != (a.key is None):
        p.error("--cert and --key go together")
    if a.cert and not a.ca:
        p.error("--cert/--key need --ca")
    return a


def make_channel(grpc, a):
    opts = list(c.GRPC_OPTIONS)
    if a.target.startswith("unix:") and not getattr(a, "raw_authority", False):
        # grpc C-core sends the percent-encoded socket path as :authority,
        # which is not a valid URI authority (the h2 crate rejects it; our
        # server drops it first, see src/protocol/h2_authority.rs). grpc-go
        # sends "localhost" for "unix:" targets: do the same unless
        # --raw-authority asks for C-core's own value.
        opts.append(("grpc.default_authority", "localhost"))
    if not a.ca:
        return grpc.insecure_channel(a.target, options=opts)
    ca = c.read_file(a.ca, "CA")
    key = c.read_file(a.key, "key") if a.key else None
    cert = c.read_file(a.cert, "cert") if a.cert else None
    creds = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    if a.server_name:
        opts.append(("grpc.ssl_target_name_override", a.server_name))
    return grpc.secure_channel(a.target, creds, options=opts)


class Stream:
    def __init__(self, stub, P, verbose, name):
        self.sendq = c.SendQueue(verbose, name)
        self.disp = c.Dispatcher(P, verbose, name)
        self.call = stub.Proxy(self.sendq)
        self.disp.start(self.call)

    def finish(self, close_wait):
        """Half-close and give the server close_wait seconds to end the stream."""
        self.sendq.close()
        if self.disp.ended.wait(close_wait):
            return self.disp.end_reason
        self.call.cancel()
        return "server did not end the stream within %.1fs after half-close (cancelled)" % close_wait


def main():
    a = parse_args()
    start = time.monotonic()
    c.start_watchdog(a.timeout, "proxy_client")
    deadline = start + a.timeout
    pb, pb_grpc, _ = c.load_stubs(a.gen_dir)
    import grpc
    P = c.Packets(pb)

    channel = make_channel(grpc, a)
    c.wait_channel_ready(grpc, channel, a.target,
                         min(a.connect_wait, a.timeout))
    stub = pb_grpc.ProxyServiceStub(channel)

    results = [None] * a.connections
    if a.streams == "shared":
        streams = [Stream(stub, P, a.verbose, "stream0")]
    else:
        streams = [Stream(stub, P, a.verbose, "stream%d" % i) for i in range(a.connections)]

    threads = []
    for i in range(a.connections):
        s = streams[0] if a.streams == "shared" else streams[i]
        t = threading.Thread(target=c.dial_echo_close,
                             args=(P, s.sendq, s.disp, i, a.dial, a.protocol, a.payload_size,
                                   a.chunk_size, a.expect_dial_error, deadline, results),
                             name="conn%d" % i, daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(r is None for r in results):
        c.fail("not all connections finished: %r" % results, c.EXIT_TIMEOUT)

    ends = []
    for s in streams:
        if s.disp.duplicate_ids:
            c.fail("server reused connectID(s) %r on one stream" % s.disp.duplicate_ids)
        strays = [c.describe(p) for p in s.disp.stray]
        if strays:
            c.log("unroutable packets received: %s" % strays)
        ends.append(s.finish(a.close_wait))
    for i, e in enumerate(ends):
        c.out("STREAM %d end=%s" % (i, e))
    channel.close()

    elapsed = time.monotonic() - start
    if a.expect_dial_error:
        c.finish_ok("dial errors=%d streams=%s elapsed=%.2fs" % (a.connections, a.streams, elapsed))
    c.finish_ok("connections=%d streams=%s bytes_each=%d connectIDs=%s elapsed=%.2fs" % (
        a.connections, a.streams, a.payload_size, ",".join(str(r) for r in results), elapsed))


if __name__ == "__main__":
    c.run_main(main)
