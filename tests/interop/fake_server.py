#!/usr/bin/env python3
"""ANP server stand-in: an mTLS AgentService servicer that drives one agent through a test.

Waits for an agent on AgentService/Connect (client certificate required), prints the
agentid / agentidentifiers metadata it sent, answers with serverid / servercount response
headers, then - on that agent's stream - for each of --connections K (concurrently):
DIAL_REQ(tcp, --dial) -> DIAL_RSP ok, --payload-size random bytes as DATA expected back
(the target must be an echo server), CLOSE_REQ -> CLOSE_RSP. Then ends the stream with
status OK and exits 0.

See README.md in this directory for the output lines and exit codes.
"""

import argparse
import os
import sys
import threading
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anp_common as c  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, help="HOST:PORT to listen on (port 0 = pick one; see LISTENING line)")
    p.add_argument("--ca", required=True, help="CA bundle (PEM) that agent client certificates must chain to")
    p.add_argument("--cert", required=True, help="server certificate (PEM)")
    p.add_argument("--key", required=True, help="server private key (PEM)")
    p.add_argument("--dial", required=True, help="address to put in DIAL_REQ (HOST:PORT as seen by the agent)")
    p.add_argument("--payload-size", type=int, default=65536,
                   help="bytes to send and expect echoed per connection (default 65536; 0 = dial+close only)")
    p.add_argument("--server-id", default="py-server", help="sent as response header 'serverid'")
    p.add_argument("--server-count", type=int, default=1, help="sent as response header 'servercount'")
    p.add_argument("--connections", type=int, default=1, help="concurrent dials on the agent stream (default 1)")
    p.add_argument("--chunk-size", type=int, default=32 * 1024, help="DATA payload size per packet (default 32768)")
    p.add_argument("--protocol", default="tcp", help="DIAL_REQ.protocol (default tcp)")
    p.add_argument("--expect-dial-error", action="store_true",
                   help="succeed only if every DIAL_RSP carries a non-empty error")
    p.add_argument("--expect-agent-id", help="fail unless the agent's agentid metadata equals this")
    p.add_argument("--expect-identifiers", help="fail unless agentidentifiers metadata equals this")
    p.add_argument("--expect-token", help="fail unless metadata authorization equals 'Bearer TOKEN'")
    p.add_argument("--close-wait", type=float, default=2.0,
                   help="after ending the stream, seconds to let it flush before stopping (default 2)")
    c.add_common_args(p)
    a = p.parse_args()
    if a.connections < 1 or a.payload_size < 0 or a.chunk_size < 1:
        p.error("--connections >= 1, --payload-size >= 0, --chunk-size >= 1 required")
    return a


def main():
    a = parse_args()
    c.start_watchdog(a.timeout, "fake_server")
    start = time.monotonic()
    deadline = start + a.timeout
    pb, _, agent_grpc = c.load_stubs(a.gen_dir)
    import grpc
    P = c.Packets(pb)

    state = {"claimed": False, "results": None, "agent": None, "end": None}
    lock = threading.Lock()
    test_done = threading.Event()   # the test finished (the driving stream was told to end)
    stream_closed = threading.Event()  # the driving handler returned

    class Servicer(agent_grpc.AgentServiceServicer):
        def Connect(self, request_iterator, context):
            md = context.invocation_metadata()
            agent_id = c.md_get(md, "agentid")
            idents = c.md_get(md, "agentidentifiers")
            auth = c.md_get(md, "authorization")
            peer = context.peer()
            context.send_initial_metadata((("serverid", a.server_id), ("servercount", str(a.server_count))))
            with lock:
                mine = not state["claimed"]
                state["claimed"] = True
            if not mine:
                # Extra agent connections (e.g. a second stream): keep them idle until the end.
                c.log("extra agent connection from %s (agentid=%s): idling" % (peer, agent_id))
                test_done.wait(max(0.0, deadline - time.monotonic()))
                return
            c.out("AGENT id=%s identifiers=%s" % (agent_id if agent_id is not None else "",
                                                  idents if idents is not None else ""))
            c.log("agent peer=%s authorization=%s" % (peer, "present" if auth else "absent"))
            if a.expect_agent_id is not None and agent_id != a.expect_agent_id:
                c.fail("agentid metadata %r != expected %r" % (agent_id, a.expect_agent_id))
            if a.expect_identifiers is not None and idents != a.expect_identifiers:
                c.fail("agentidentifiers metadata %r != expected %r" % (idents, a.expect_identifiers))
            if a.expect_token is not None and auth != "Bearer " + a.expect_token:
                c.fail("authorization metadata %r != expected 'Bearer %s'" % (auth, a.expect_token))

            sendq = c.SendQueue(a.verbose, "server")
            disp = c.Dispatcher(P, a.verbose, "server")
            disp.start(request_iterator)
            results = [None] * a.connections

            def drive():
                threads = []
                for i in range(a.connections):
                    t = threading.Thread(target=c.dial_echo_close,
                                         args=(P, sendq, disp, i, a.dial, a.protocol, a.payload_size,
                                               a.chunk_size, a.expect_dial_error, deadline, results),
                                         name="conn%d" % i, daemon=True)
                    t.start()
                    threads.append(t)
                for t in threads:
                    t.join(max(0.0, deadline - time.monotonic()))
                if any(r is None for r in results):
                    c.fail("not all connections finished: %r" % results, c.EXIT_TIMEOUT)
                if disp.duplicate_ids:
                    c.fail("agent reused connectID(s) %r" % disp.duplicate_ids)
                if disp.stray:
                    c.log("unroutable packets from agent: %s" % [c.describe(p) for p in disp.stray])
                state["results"] = results
                state["agent"] = agent_id
                sendq.close()  # handler returns -> stream ends with status OK
                test_done.set()

            threading.Thread(target=drive, name="drive", daemon=True).start()
            try:
                for pkt in sendq:
                    yield pkt
            finally:
                stream_closed.set()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=list(c.GRPC_OPTIONS))
    agent_grpc.add_AgentServiceServicer_to_server(Servicer(), server)
    creds = grpc.ssl_server_credentials(
        [(c.read_file(a.key, "key"), c.read_file(a.cert, "cert"))],
        root_certificates=c.read_file(a.ca, "CA"),
        require_client_auth=True)
    try:
        port = server.add_secure_port(a.listen, creds)
    except RuntimeError as e:
        c.fail("cannot listen on %s: %s" % (a.listen, e), c.EXIT_USAGE)
    if not port:
        c.fail("cannot listen on %s" % a.listen, c.EXIT_USAGE)
    server.start()
    c.out("LISTENING port=%d" % port)

    test_done.wait(max(0.0, deadline - time.monotonic()))
    if not test_done.is_set():
        c.fail("no agent completed the test", c.EXIT_TIMEOUT)
    # Let the OK trailers reach the agent before tearing the server down.
    stream_closed.wait(a.close_wait)
    server.stop(grace=a.close_wait).wait(a.close_wait + 1)
    r = state["results"]
    elapsed = time.monotonic() - start
    if a.expect_dial_error:
        c.finish_ok("agent=%s dial_errors=%d elapsed=%.2fs" % (state["agent"], len(r), elapsed))
    c.finish_ok("agent=%s connections=%d bytes_each=%d connectIDs=%s elapsed=%.2fs" % (
        state["agent"], len(r), a.payload_size, ",".join(str(x) for x in r), elapsed))


if __name__ == "__main__":
    c.run_main(main)
