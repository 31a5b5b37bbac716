#!/usr/bin/env python3
"""ANP agent stand-in: holds one mTLS AgentService/Connect stream to an ANP server.

Sends metadata agentid / agentidentifiers (/ authorization: Bearer T), prints the
server's serverID/serverCount response headers, then serves the server's DIAL_REQs by
dialing TCP with plain Python sockets and relaying DATA both ways (a reader and a writer
thread per connection). CLOSE_REQ closes the socket and answers CLOSE_RSP; a target
that closes its side produces an unsolicited CLOSE_RSP, as the Go agent does.

See README.md in this directory for the output lines and exit codes.
"""

import argparse
import itertools
import os
import queue
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anp_common as c  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--server", required=True, help="agent endpoint of the server, HOST:PORT")
    p.add_argument("--ca", required=True, help="CA bundle (PEM) to verify the server certificate")
    p.add_argument("--cert", required=True, help="client certificate (PEM)")
    p.add_argument("--key", required=True, help="client private key (PEM)")
    p.add_argument("--agent-id", required=True, help="sent as metadata 'agentid'")
    p.add_argument("--identifiers", default="",
                   help="sent as metadata 'agentidentifiers', e.g. 'host=node-py&ipv4=127.0.0.1' (default empty: not sent)")
    p.add_argument("--server-name", default=None,
                   help="name checked against the server certificate (grpc.ssl_target_name_override)")
    p.add_argument("--token", default=None, help="send metadata 'authorization: Bearer TOKEN'")
    p.add_argument("--serve-seconds", type=float, default=30.0,
                   help="serve this long after READY, then half-close and exit 0 (default 30)")
    p.add_argument("--exit-after-closes", type=int, default=0,
                   help="exit 0 as soon as this many connections were closed (0 = off)")
    p.add_argument("--expect-dials", type=int, default=0,
                   help="fail at exit unless at least this many dials succeeded (default 0)")
    p.add_argument("--allow-stream-error", action="store_true",
                   help="exit 0 even if the server ends the stream with a non-OK status")
    p.add_argument("--vanish-on-dial", action="store_true",
                   help="on the first DIAL_REQ print VANISH and exit at once without answering "
                        "(the connection drops; tests the server routing the dial to another agent)")
    p.add_argument("--dial-timeout", type=float, default=5.0, help="TCP connect timeout (default 5)")
    p.add_argument("--read-size", type=int, default=32 * 1024, help="max DATA payload read from a target (default 32768)")
    p.add_argument("--connect-wait", type=float, default=10.0,
                   help="seconds to wait for the TLS channel to become ready (default 10)")
    p.add_argument("--close-wait", type=float, default=2.0,
                   help="after our half-close, seconds to wait for the server to end the stream (default 2)")
    c.add_common_args(p)
    return p.parse_args()


def split_hostport(addr):
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError("address %r is not HOST:PORT" % addr)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class Conn:
    def __init__(self, cid, sock):
        self.cid = cid
        self.sock = sock
        self.lock = threading.Lock()
        self.closed = False
        self.writes = queue.Queue()


class Agent:
    def __init__(self, a, P, sendq):
        self.a = a
        self.P = P
        self.sendq = sendq
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.conns = {}
        self.stats = dict(dials=0, dial_errors=0, closes=0, to_target=0, from_target=0)
        self.closes_event = threading.Event()

    # ---- bookkeeping
    def _count_close(self):
        with self.lock:
            self.stats["closes"] += 1
            n = self.stats["closes"]
        if self.a.exit_after_closes and n >= self.a.exit_after_closes:
            self.closes_event.set()

    # ---- packet handlers (called on the receive thread; must not block)
    def handle(self, pkt):
        P = self.P
        if pkt.type == P.DIAL_REQ:
            if self.a.vanish_on_dial:
                c.out("VANISH address=%s" % pkt.dialRequest.address)
                sys.stdout.flush()
                os._exit(0)
            threading.Thread(target=self.dial, args=(pkt.dialRequest,), daemon=True).start()
        elif pkt.type == P.DATA:
            cid = pkt.data.connectID
            with self.lock:
                conn = self.conns.get(cid)
            if conn is None:
                c.log("DATA for unrecognized connectID %d" % cid)
                self.sendq.put(P.close_rsp(cid, "unrecognized connectID"))
                return
            with self.lock:
                self.stats["to_target"] += len(pkt.data.data)
            conn.writes.put(pkt.data.data)
        elif pkt.type == P.CLOSE_REQ:
            cid = pkt.closeRequest.connectID
            with self.lock:
                conn = self.conns.pop(cid, None)
            if conn is None:
                c.log("CLOSE_REQ for unknown connectID %d" % cid)
                self.sendq.put(P.close_rsp(cid, "Unknown connectID"))
                return
            with conn.lock:
                conn.closed = True
                # Sent under conn.lock: no DATA for cid can follow the CLOSE_RSP.
                self.sendq.put(P.close_rsp(cid))
            conn.writes.put(None)  # writer flushes pending data, then shuts the socket
            c.out("CLOSED connectID=%d by=server" % cid)
            self._count_close()
        elif pkt.type == P.DIAL_CLS:
            c.log("DIAL_CLS random=%d (ignored: dials complete synchronously)" % pkt.closeDial.random)
        elif pkt.type == P.DRAIN:
            c.log("DRAIN received from server (ignored)")
        else:
            c.log("ignoring unexpected packet %s" % c.describe(pkt))

    def dial(self, req):
        P = self.P
        try:
            if req.protocol != "tcp":
                raise ValueError("unsupported protocol %r" % req.protocol)
            host, port = split_hostport(req.address)
            sock = socket.create_connection((host, port), timeout=self.a.dial_timeout)
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except (OSError, ValueError) as e:
            with self.lock:
                self.stats["dial_errors"] += 1
            err = "dial %s: %s" % (req.address, e)
            c.out("DIAL_FAIL address=%s error=%s" % (req.address, err))
            self.sendq.put(P.dial_rsp(req.random, 0, err))
            return
        with self.lock:
            cid = next(self.ids)
            conn = Conn(cid, sock)
            self.conns[cid] = conn
            self.stats["dials"] += 1
        # DIAL_RSP is queued before the reader starts, so it precedes any DATA for cid.
        self.sendq.put(P.dial_rsp(req.random, cid))
        c.out("DIAL connectID=%d address=%s" % (cid, req.address))
        threading.Thread(target=self.writer, args=(conn,), daemon=True).start()
        threading.Thread(target=self.reader, args=(conn,), daemon=True).start()

    def writer(self, conn):
        while True:
            data = conn.writes.get()
            if data is None:
                break
            try:
                conn.sock.sendall(data)
            except OSError as e:
                c.log("connectID %d: write to target failed: %s" % (conn.cid, e))
                break
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def reader(self, conn):
        P = self.P
        while True:
            try:
                data = conn.sock.recv(self.a.read_size)
            except OSError:
                data = b""
            with conn.lock:
                if conn.closed:
                    break
                if not data:
                    # Target closed (or failed): tell the server, as the Go agent does.
                    conn.closed = True
                    with self.lock:
                        self.conns.pop(conn.cid, None)
                    self.sendq.put(P.close_rsp(conn.cid))
                    conn.writes.put(None)
                    c.out("CLOSED connectID=%d by=target" % conn.cid)
                    self._count_close()
                    break
                self.sendq.put(P.data(conn.cid, data))
            with self.lock:
                self.stats["from_target"] += len(data)
        try:
            conn.sock.close()
        except OSError:
            pass

    def close_all(self):
        with self.lock:
            conns = list(self.conns.values())
            self.conns.clear()
        for conn in conns:
            with conn.lock:
                conn.closed = True
            conn.writes.put(None)


def main():
    a = parse_args()
    c.start_watchdog(a.timeout, "fake_agent")
    start = time.monotonic()
    pb, _, agent_grpc = c.load_stubs(a.gen_dir)
    import grpc
    P = c.Packets(pb)

    creds = grpc.ssl_channel_credentials(
        root_certificates=c.read_file(a.ca, "CA"),
        private_key=c.read_file(a.key, "key"),
        certificate_chain=c.read_file(a.cert, "cert"))
    opts = list(c.GRPC_OPTIONS)
    if a.server_name:
        opts.append(("grpc.ssl_target_name_override", a.server_name))
    channel = grpc.secure_channel(a.server, creds, options=opts)
    c.wait_channel_ready(grpc, channel, a.server,
                         min(a.connect_wait, a.timeout))

    # grpcio rejects metadata keys with upper-case letters: Go's "agentID" is "agentid" on the wire.
    md = [("agentid", a.agent_id)]
    if a.identifiers:
        md.append(("agentidentifiers", a.identifiers))
    if a.token is not None:
        md.append(("authorization", "Bearer " + a.token))

    sendq = c.SendQueue(a.verbose, "agent")
    call = agent_grpc.AgentServiceStub(channel).Connect(sendq, metadata=md)
    headers = call.initial_metadata()  # blocks until headers arrive or the call ends
    server_id = c.md_get(headers, "serverid")
    server_count = c.md_get(headers, "servercount")
    if server_id is None:
        if call.done():
            c.fail("stream ended before response headers: code=%s details=%r" % (call.code(), call.details()))
        c.fail("server response headers lack serverID: %r" % (headers,))
    c.out("HEADERS serverID=%s serverCount=%s" % (server_id, server_count))
    c.out("READY")

    agent = Agent(a, P, sendq)
    ended = threading.Event()
    end = {}

    def recv_loop():
        try:
            for pkt in call:
                if a.verbose:
                    c.log("agent <- %s" % c.describe(pkt))
                agent.handle(pkt)
            end["reason"] = "server ended the stream (OK)"
            end["ok"] = True
        except grpc.RpcError as e:
            end["reason"] = "server ended the stream: " + c.rpc_error_text(e)
            end["ok"] = e.code() == grpc.StatusCode.OK
        ended.set()

    threading.Thread(target=recv_loop, name="recv", daemon=True).start()

    serve_until = time.monotonic() + a.serve_seconds
    why = None
    while why is None:
        if ended.wait(0.05):
            why = "stream"
        elif agent.closes_event.is_set():
            why = "exit-after-closes"
        elif time.monotonic() >= serve_until:
            why = "serve-seconds"

    if why == "stream":
        reason, ok = end["reason"], end["ok"] or a.allow_stream_error
    else:
        # Our choice to stop: half-close (after queued CLOSE_RSPs are flushed) and let the
        # server end the stream; cancel if it does not.
        sendq.close()
        if ended.wait(a.close_wait):
            reason = "%s; %s" % (why, end["reason"])
        else:
            call.cancel()
            reason = "%s; cancelled (server kept the stream open %.1fs after half-close)" % (why, a.close_wait)
        ok = True
    agent.close_all()
    s = agent.stats
    details = ("agent=%s dials=%d dial_errors=%d closes=%d bytes_to_target=%d bytes_from_target=%d "
               "elapsed=%.2fs end=%s" % (a.agent_id, s["dials"], s["dial_errors"], s["closes"],
                                         s["to_target"], s["from_target"], time.monotonic() - start, reason))
    if not ok:
        c.fail(details)
    if s["dials"] < a.expect_dials:
        c.fail("only %d successful dials, expected at least %d: %s" % (s["dials"], a.expect_dials, details))
    c.finish_ok(details)


if __name__ == "__main__":
    c.run_main(main)
