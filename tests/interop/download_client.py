#!/usr/bin/env python3
"""Konnectivity-client stand-in for downloads through ProxyService/Proxy.

One Proxy stream, one dial (DIAL_REQ -> DIAL_RSP), then the client sends no payload
and only reads what the target sends. Two modes:

  --expect-bytes N   read DATA until the server sends CLOSE_RSP for the connection
                     (the target closed first); check that exactly N bytes came, and
                     with --pattern mod251 that byte i of the stream is i % 251.
  --read N --then X  read at least N bytes, print 'READ n mono=T', optionally stop
                     reading for --pause seconds (the server's windows fill up), print
                     'LEAVE then=X mono=T' and go away:
                     close  = CLOSE_REQ, drain until CLOSE_RSP or --linger (0 = cancel
                              right away), cancel the call, close the channel;
                     cancel = cancel the call (RST_STREAM) without CLOSE_REQ; the
                              channel (the HTTP/2 connection) stays open for --stay;
                     hang   = stop reading and sleep until killed (or --timeout).

See README.md in this directory for the output lines and exit codes.
"""

import argparse
import os
import queue
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anp_common as c  # noqa: E402
from proxy_client import make_channel  # noqa: E402

# Packets buffered between the thread that pulls from grpc and the main thread. Small
# on purpose: once the main thread stops taking packets, the reader thread stops
# pulling, grpcio stops granting HTTP/2 window, and the server sees a slow client.
RECV_QUEUE = 16
_END = object()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True,
                   help="server frontend: 'unix:/path/to.sock' or 'HOST:PORT'")
    p.add_argument("--dial", required=True, help="address to put in DIAL_REQ (HOST:PORT as seen by the agent)")
    p.add_argument("--protocol", default="tcp", help="DIAL_REQ.protocol (default tcp)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--expect-bytes", type=int, metavar="N",
                      help="read until CLOSE_RSP and expect exactly N bytes")
    mode.add_argument("--read", type=int, metavar="N",
                      help="read at least N bytes, print READ, then do --then")
    p.add_argument("--then", choices=["close", "cancel", "hang"], default="close",
                   help="with --read: how the client goes away (default close)")
    p.add_argument("--pattern", choices=["none", "mod251"], default="none",
                   help="check the content: mod251 = byte at stream offset i is i %% 251 (default none)")
    p.add_argument("--idle-timeout", type=float, default=10.0,
                   help="fail when no packet arrives for this many seconds while reading (default 10)")
    p.add_argument("--go-file", metavar="PATH",
                   help="with --read: after DIALED, wait until PATH exists before reading (lets the "
                        "driver look at the server first)")
    p.add_argument("--pause", type=float, default=0.0,
                   help="--then close/cancel: seconds to stop reading between READ and LEAVE (default 0)")
    p.add_argument("--linger", type=float, default=0.2,
                   help="--then close: seconds to keep draining after CLOSE_REQ while waiting for "
                        "CLOSE_RSP before cancelling (default 0.2)")
    p.add_argument("--stay", type=float, default=0.0,
                   help="--then close/cancel: seconds to stay alive afterwards (for cancel the channel "
                        "stays open that long) before OK and exit (default 0)")
    p.add_argument("--close-wait", type=float, default=1.0,
                   help="--expect-bytes: after CLOSE_RSP, seconds to wait for the server to end the "
                        "half-closed stream (reported, not a failure; default 1)")
    p.add_argument("--connect-wait", type=float, default=10.0,
                   help="seconds to wait for the channel to become ready (default 10)")
    p.add_argument("--ca", help="enable TLS: CA bundle to verify the server")
    p.add_argument("--cert", help="TLS client certificate (PEM), with --key")
    p.add_argument("--key", help="TLS client private key (PEM)")
    p.add_argument("--server-name", help="TLS: override the name checked against the server certificate")
    c.add_common_args(p)
    a = p.parse_args()
    if (a.expect_bytes is not None and a.expect_bytes < 0) or (a.read is not None and a.read < 0):
        p.error("byte counts must be >= 0")
    if a.idle_timeout <= 0 or a.linger < 0 or a.stay < 0 or a.pause < 0:
        p.error("--idle-timeout > 0, --linger >= 0, --stay >= 0, --pause >= 0 required")
    if (a.cert is None) != (a.key is None):
        p.error("--cert and --key go together")
    if a.cert and not a.ca:
        p.error("--cert/--key need --ca")
    return a


class Requests:
    """The request iterator: a SendQueue that also notes when grpc took a CLOSE_REQ."""

    def __init__(self, P, verbose):
        self.P = P
        self.q = c.SendQueue(verbose, "send")
        self.close_req_taken = threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        pkt = next(self.q)
        if pkt.type == self.P.CLOSE_REQ:
            self.close_req_taken.set()
        return pkt


class Pattern:
    """Checks the stream's content against 'byte at offset i is i % 251'."""

    def __init__(self, kind):
        self.kind = kind
        self.block = bytes(range(251)) * 4096  # ~1 MiB, grown on demand

    def check(self, offset, data):
        """None if data (at stream offset `offset`) matches, else the first bad offset."""
        if self.kind == "none" or not data:
            return None
        start = offset % 251
        need = start + len(data)
        if need > len(self.block):
            self.block = bytes(range(251)) * (need // 251 + 1)
        want = self.block[start:need]
        if data == want:
            return None
        return offset + next(i for i in range(len(data)) if data[i] != want[i])


class Receiver:
    """Pulls packets off the call on its own thread into a small bounded queue."""

    def __init__(self, call, verbose):
        self.call = call
        self.verbose = verbose
        self.q = queue.Queue(maxsize=RECV_QUEUE)
        self.end_reason = None
        t = threading.Thread(target=self._run, name="recv", daemon=True)
        t.start()

    def _run(self):
        try:
            for pkt in self.call:
                if self.verbose:
                    c.log("recv <- %s" % c.describe(pkt))
                self.q.put(pkt)
            self.end_reason = "stream ended normally"
        except Exception as e:  # grpc.RpcError and friends
            self.end_reason = c.rpc_error_text(e)
        self.q.put(_END)

    def get(self, timeout):
        """The next packet, _END when the stream ended, None after `timeout` seconds."""
        try:
            return self.q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return None


def dial(P, reqs, recv, address, protocol, deadline):
    rnd = c.new_random()
    reqs.q.put(P.dial_req(address, rnd, protocol))
    while True:
        pkt = recv.get(deadline - time.monotonic())
        if pkt is None:
            c.fail("timeout waiting for DIAL_RSP", c.EXIT_TIMEOUT)
        if pkt is _END:
            c.fail("stream ended before DIAL_RSP: %s" % recv.end_reason)
        if pkt.type == P.DIAL_CLS:
            c.fail("got DIAL_CLS (random=%d) instead of DIAL_RSP" % pkt.closeDial.random)
        if pkt.type != P.DIAL_RSP or pkt.dialResponse.random != rnd:
            c.fail("unexpected %s before DIAL_RSP" % c.describe(pkt))
        rsp = pkt.dialResponse
        if rsp.error:
            c.fail("DIAL_RSP error: %s" % rsp.error)
        if rsp.connectID == 0:
            c.fail("DIAL_RSP without error but connectID=0")
        c.out("DIALED connectID=%d" % rsp.connectID)
        return rsp.connectID


def data_of(P, pkt, cid, got, pattern):
    """Checks one DATA packet for connection `cid`; returns its payload length."""
    if pkt.data.connectID != cid:
        c.fail("DATA for connectID=%d on the stream of connectID=%d" % (pkt.data.connectID, cid))
    if pkt.data.error:
        c.fail("DATA carried error %r after %d bytes" % (pkt.data.error, got))
    bad = pattern.check(got, pkt.data.data)
    if bad is not None:
        c.fail("content differs from the pattern at stream offset %d" % bad)
    return len(pkt.data.data)


def expect_bytes(a, P, reqs, recv, call, cid, start):
    """Read until CLOSE_RSP; exactly a.expect_bytes bytes must have come."""
    pattern = Pattern(a.pattern)
    n = a.expect_bytes
    got = 0
    last = time.monotonic()
    while True:
        pkt = recv.get(a.idle_timeout)
        if pkt is None:
            if got == n:
                c.fail("received all %d bytes, then no CLOSE_RSP for connectID=%d within "
                       "--idle-timeout=%.1fs (nothing arrived for %.1fs)" % (
                           n, cid, a.idle_timeout, time.monotonic() - last))
            c.fail("received %d of %d bytes, then nothing for --idle-timeout=%.1fs (no CLOSE_RSP)" % (
                got, n, a.idle_timeout))
        if pkt is _END:
            c.fail("stream ended after %d of %d bytes without CLOSE_RSP: %s" % (got, n, recv.end_reason))
        last = time.monotonic()
        if pkt.type == P.DATA:
            got += data_of(P, pkt, cid, got, pattern)
            if got > n:
                c.fail("received %d bytes, more than the %d expected" % (got, n))
        elif pkt.type == P.CLOSE_RSP:
            if pkt.closeResponse.connectID != cid:
                c.fail("CLOSE_RSP for connectID=%d, expected %d" % (pkt.closeResponse.connectID, cid))
            if got != n:
                c.fail("CLOSE_RSP after %d of %d bytes" % (got, n))
            err = pkt.closeResponse.error
            break
        else:
            c.fail("unexpected %s while reading" % c.describe(pkt))
    elapsed = time.monotonic() - start
    # Like proxy_client: half-close and let the server end the stream (reported only).
    reqs.q.close()
    end = "server did not end the stream within %.1fs after half-close (cancelled)" % a.close_wait
    deadline = time.monotonic() + a.close_wait
    while True:
        pkt = recv.get(deadline - time.monotonic())
        if pkt is None:
            call.cancel()
            break
        if pkt is _END:
            end = recv.end_reason
            break
        c.log("after CLOSE_RSP: %s" % c.describe(pkt))
    c.out("STREAM end=%s" % end)
    c.finish_ok("bytes=%d close_rsp=1 close_error=%r connectID=%d elapsed=%.3fs" % (got, err, cid, elapsed))


def read_then(a, P, reqs, recv, call, channel, cid, start):
    """Read at least a.read bytes, print READ, then go away as a.then says."""
    pattern = Pattern(a.pattern)
    if a.go_file:
        while not os.path.exists(a.go_file):
            time.sleep(0.005)  # the watchdog bounds it
    got = 0
    while got < a.read:
        pkt = recv.get(a.idle_timeout)
        if pkt is None:
            c.fail("read %d of %d bytes, then nothing for --idle-timeout=%.1fs" % (got, a.read, a.idle_timeout))
        if pkt is _END:
            c.fail("stream ended after %d of %d bytes: %s" % (got, a.read, recv.end_reason))
        if pkt.type == P.DATA:
            got += data_of(P, pkt, cid, got, pattern)
        elif pkt.type == P.CLOSE_RSP:
            c.fail("CLOSE_RSP (error=%r) after only %d of %d bytes" % (pkt.closeResponse.error, got, a.read))
        else:
            c.fail("unexpected %s while reading" % c.describe(pkt))
    # time.monotonic() is CLOCK_MONOTONIC on Linux: the driver compares it with its own.
    c.out("READ %d mono=%.6f" % (got, time.monotonic()))
    if a.then == "hang":
        while True:
            time.sleep(3600)  # until killed; the watchdog bounds it
    time.sleep(a.pause)  # not reading: the receive queue and the HTTP/2 windows fill up
    c.out("LEAVE then=%s mono=%.6f" % (a.then, time.monotonic()))
    close_rsp = 0
    if a.then == "close":
        reqs.q.put(P.close_req(cid))
        # Make sure grpc has taken the CLOSE_REQ before any cancel (even with
        # --linger 0); then, like konnectivity-client, keep draining while
        # waiting for CLOSE_RSP.
        reqs.close_req_taken.wait(1.0)
        drained = 0
        deadline = time.monotonic() + a.linger
        while a.linger > 0:
            pkt = recv.get(deadline - time.monotonic())
            if pkt is None or pkt is _END:
                break
            if pkt.type == P.DATA:
                drained += len(pkt.data.data)
            elif pkt.type == P.CLOSE_RSP:
                close_rsp = 1
                break
        call.cancel()
        channel.close()
        c.out("GONE then=close close_req_sent=%d close_rsp=%d drained=%d mono=%.6f" % (
            1 if reqs.close_req_taken.is_set() else 0, close_rsp, drained, time.monotonic()))
    else:
        call.cancel()
        c.out("GONE then=cancel mono=%.6f" % time.monotonic())
    time.sleep(a.stay)
    if a.then == "cancel":
        channel.close()
    c.finish_ok("read=%d then=%s close_rsp=%d connectID=%d elapsed=%.3fs" % (
        got, a.then, close_rsp, cid, time.monotonic() - start))


def main():
    a = parse_args()
    start = time.monotonic()
    c.start_watchdog(a.timeout, "download_client")
    deadline = start + a.timeout
    pb, pb_grpc, _ = c.load_stubs(a.gen_dir)
    import grpc
    P = c.Packets(pb)

    channel = make_channel(grpc, a)
    c.wait_channel_ready(grpc, channel, a.target, min(a.connect_wait, a.timeout))
    stub = pb_grpc.ProxyServiceStub(channel)
    reqs = Requests(P, a.verbose)
    call = stub.Proxy(reqs)
    recv = Receiver(call, a.verbose)
    cid = dial(P, reqs, recv, a.dial, a.protocol, deadline)
    if a.expect_bytes is not None:
        expect_bytes(a, P, reqs, recv, call, cid, start)
    else:
        read_then(a, P, reqs, recv, call, channel, cid, start)


if __name__ == "__main__":
    c.run_main(main)
