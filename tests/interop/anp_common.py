"""Shared helpers for the Python grpcio interop peers (fake_agent, proxy_client, fake_server).

Not a test by itself. Every script imports this module from its own directory; the
generated stubs are looked up in (first match wins):
  1. --gen-dir DIR on the command line (handled by each script via add_common_args),
  2. $ANP_INTEROP_GEN,
  3. tests/interop/gen next to this file (what setup.sh writes).
"""

import os
import queue
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# Exit codes shared by all scripts (documented in README.md).
EXIT_OK = 0
EXIT_FAIL = 1      # the peer misbehaved / check failed
EXIT_USAGE = 2     # bad arguments, missing files, stubs not generated
EXIT_TIMEOUT = 3   # --timeout elapsed (watchdog)

# Both peers may send DATA messages larger than grpcio's 4 MiB default receive limit
# (grpcio's default max_receive_message_length is 4 MiB; send is unlimited). Lift it.
MAX_MSG = 64 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MSG),
    ("grpc.max_send_message_length", MAX_MSG),
]

_print_lock = threading.Lock()


def out(line):
    """Print a protocol line to stdout (flushed; safe from any thread)."""
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def log(msg):
    """Diagnostics go to stderr so stdout only carries the documented lines."""
    with _print_lock:
        sys.stderr.write("[%s %.3f] %s\n" % (os.path.basename(sys.argv[0]), time.monotonic(), msg))
        sys.stderr.flush()


def fail(msg, code=EXIT_FAIL):
    """Print 'FAIL <msg>' on stdout and terminate the whole process immediately.

    os._exit is used on purpose: grpcio keeps non-daemon threads alive (server, channel
    polling) and a blocking stream iterator is not interruptible, so a normal sys.exit
    from a helper thread could hang.
    """
    out("FAIL " + msg)
    sys.stderr.flush()
    os._exit(code)


def finish_ok(details):
    out("OK " + details)
    sys.stderr.flush()
    os._exit(EXIT_OK)


def run_main(main):
    """Run a script's main(): any uncaught exception, on the main thread or on a helper
    thread, becomes 'FAIL internal error ...' and exit 1 instead of a hang."""
    import traceback

    def hook(args):
        traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback)
        fail("internal error in thread %s: %s: %s" % (
            args.thread.name if args.thread else "?", args.exc_type.__name__, args.exc_value))
    threading.excepthook = hook
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: B902 (KeyboardInterrupt too: exit promptly)
        traceback.print_exc()
        fail("internal error: %s: %s" % (type(e).__name__, e))


def add_common_args(p):
    p.add_argument("--timeout", type=float, default=60.0,
                   help="hard bound on total run time in seconds (default 60); exit 3 when hit")
    p.add_argument("--gen-dir", default=None,
                   help="directory holding the generated *_pb2.py stubs (default: $ANP_INTEROP_GEN or tests/interop/gen)")
    p.add_argument("--verbose", "-v", action="store_true", help="log every packet to stderr")


def start_watchdog(seconds, what="run"):
    def fire():
        fail("timeout: %s did not finish within --timeout=%.1fs" % (what, seconds), EXIT_TIMEOUT)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    return t


def load_stubs(gen_dir=None):
    """Import the generated modules; returns (client_pb2, client_pb2_grpc, agent_pb2_grpc)."""
    gen = gen_dir or os.environ.get("ANP_INTEROP_GEN") or os.path.join(HERE, "gen")
    if not os.path.isfile(os.path.join(gen, "client_pb2.py")):
        fail("generated stubs not found in %s: run tests/interop/setup.sh VENV_DIR first" % gen, EXIT_USAGE)
    sys.path.insert(0, gen)
    try:
        import grpc  # noqa: F401
        import client_pb2
        import client_pb2_grpc
        import agent_pb2_grpc
    except ImportError as e:
        fail("cannot import grpc/stubs (%s): run the script with the venv python made by setup.sh" % e,
             EXIT_USAGE)
    return client_pb2, client_pb2_grpc, agent_pb2_grpc


def read_file(path, what):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        fail("cannot read %s %s: %s" % (what, path, e), EXIT_USAGE)


def new_random():
    """A DIAL_REQ.random: positive int64, never 0 (0 is the proto3 default)."""
    return random.randint(1, (1 << 63) - 1)


def md_get(metadata, key):
    """Case-insensitive lookup in a grpc metadata sequence of (key, value) tuples."""
    key = key.lower()
    for k, v in metadata or ():
        if k.lower() == key:
            return v.decode("latin-1") if isinstance(v, bytes) else v
    return None


class SendQueue:
    """Request iterator for a grpcio stream: packets put() here are sent in order.

    grpcio consumes a request iterator on its own thread; close() ends the iterator,
    which half-closes the stream (client side) / ends the response stream (server side).
    """

    _END = object()

    def __init__(self, verbose=False, name="send"):
        self._q = queue.Queue()
        self._closed = False
        self._lock = threading.Lock()
        self.verbose = verbose
        self.name = name

    def put(self, pkt):
        with self._lock:
            if self._closed:
                return False
            if self.verbose:
                log("%s -> %s" % (self.name, describe(pkt)))
            self._q.put(pkt)
            return True

    def close(self):
        with self._lock:
            if not self._closed:
                self._closed = True
                self._q.put(self._END)

    def __iter__(self):
        return self

    def __next__(self):
        item = self._q.get()
        if item is self._END:
            raise StopIteration
        return item


_TYPE_NAMES = {0: "DIAL_REQ", 1: "DIAL_RSP", 2: "CLOSE_REQ", 3: "CLOSE_RSP",
               4: "DATA", 5: "DIAL_CLS", 6: "DRAIN"}


def type_name(t):
    return _TYPE_NAMES.get(t, "UNKNOWN(%d)" % t)


def describe(pkt):
    t = type_name(pkt.type)
    if pkt.type == 0:
        r = pkt.dialRequest
        return "%s protocol=%s address=%s random=%d" % (t, r.protocol, r.address, r.random)
    if pkt.type == 1:
        r = pkt.dialResponse
        return "%s connectID=%d random=%d error=%r" % (t, r.connectID, r.random, r.error)
    if pkt.type == 2:
        return "%s connectID=%d" % (t, pkt.closeRequest.connectID)
    if pkt.type == 3:
        r = pkt.closeResponse
        return "%s connectID=%d error=%r" % (t, r.connectID, r.error)
    if pkt.type == 4:
        r = pkt.data
        return "%s connectID=%d len=%d error=%r" % (t, r.connectID, len(r.data), r.error)
    if pkt.type == 5:
        return "%s random=%d" % (t, pkt.closeDial.random)
    return t


class Packets:
    """Packet constructors bound to the generated client_pb2 module."""

    def __init__(self, pb):
        self.pb = pb
        T = pb.PacketType
        self.DIAL_REQ, self.DIAL_RSP = T.Value("DIAL_REQ"), T.Value("DIAL_RSP")
        self.CLOSE_REQ, self.CLOSE_RSP = T.Value("CLOSE_REQ"), T.Value("CLOSE_RSP")
        self.DATA, self.DIAL_CLS, self.DRAIN = T.Value("DATA"), T.Value("DIAL_CLS"), T.Value("DRAIN")

    def dial_req(self, address, rnd, protocol="tcp"):
        return self.pb.Packet(type=self.DIAL_REQ, dialRequest=self.pb.DialRequest(
            protocol=protocol, address=address, random=rnd))

    def dial_rsp(self, rnd, connect_id=0, error=""):
        return self.pb.Packet(type=self.DIAL_RSP, dialResponse=self.pb.DialResponse(
            random=rnd, connectID=connect_id, error=error))

    def data(self, connect_id, data, error=""):
        return self.pb.Packet(type=self.DATA, data=self.pb.Data(
            connectID=connect_id, data=data, error=error))

    def close_req(self, connect_id):
        return self.pb.Packet(type=self.CLOSE_REQ, closeRequest=self.pb.CloseRequest(connectID=connect_id))

    def close_rsp(self, connect_id, error=""):
        return self.pb.Packet(type=self.CLOSE_RSP, closeResponse=self.pb.CloseResponse(
            connectID=connect_id, error=error))


class Dispatcher:
    """Routes received packets of one stream to per-dial / per-connection queues.

    Used by the dialing side (proxy_client, fake_server): DIAL_RSP and DIAL_CLS are
    routed by `random`, DATA and CLOSE_RSP by `connectID`. Anything unroutable is kept
    in `stray` (and logged) so the caller can report it.
    """

    def __init__(self, P, verbose=False, name="recv"):
        self.P = P
        self.verbose = verbose
        self.name = name
        self._lock = threading.Lock()
        self._by_random = {}
        self._by_conn = {}
        self.stray = []
        self.duplicate_ids = []
        self.ended = threading.Event()
        self.end_reason = None

    def expect_dial(self, rnd):
        """Register a pending dial. The returned queue receives the DIAL_RSP/DIAL_CLS for
        `rnd` and, once a successful DIAL_RSP was routed, every DATA/CLOSE_RSP for its
        connectID (bound here, before any DATA can race ahead of the dialer). A None
        item means the stream ended."""
        q = queue.Queue()
        with self._lock:
            self._by_random[rnd] = q
        return q

    def _route(self, pkt):
        P = self.P
        with self._lock:
            if pkt.type == P.DIAL_RSP:
                q = self._by_random.get(pkt.dialResponse.random)
                cid = pkt.dialResponse.connectID
                if q is not None and not pkt.dialResponse.error:
                    if cid in self._by_conn:
                        self.duplicate_ids.append(cid)
                    else:
                        self._by_conn[cid] = q
            elif pkt.type == P.DIAL_CLS:
                q = self._by_random.get(pkt.closeDial.random)
            elif pkt.type == P.DATA:
                q = self._by_conn.get(pkt.data.connectID)
            elif pkt.type == P.CLOSE_RSP:
                q = self._by_conn.get(pkt.closeResponse.connectID)
            else:
                q = None
            if q is None:
                self.stray.append(pkt)
        if q is None:
            log("%s: unroutable packet %s" % (self.name, describe(pkt)))
        else:
            q.put(pkt)

    def _end(self, reason):
        self.end_reason = reason
        self.ended.set()
        with self._lock:
            qs = list(self._by_random.values()) + list(self._by_conn.values())
        for q in qs:
            q.put(None)  # None = stream ended

    def run(self, iterator):
        """Consume `iterator` (a grpcio response/request iterator) until it ends."""
        try:
            for pkt in iterator:
                if self.verbose:
                    log("%s <- %s" % (self.name, describe(pkt)))
                self._route(pkt)
            self._end("stream ended normally")
        except Exception as e:  # grpc.RpcError and friends
            self._end(rpc_error_text(e))

    def start(self, iterator):
        t = threading.Thread(target=self.run, args=(iterator,), name=self.name, daemon=True)
        t.start()
        return t


def wait_channel_ready(grpc, channel, target, seconds):
    """Wait for the channel to connect; on failure, fail() with grpc's own reason.

    grpcio does not log client-side connect/TLS errors by default; a fail-fast call to a
    method that no server implements surfaces them ("failed to connect to all addresses;
    last error: ..."). If that probe does reach a server it just gets UNIMPLEMENTED.
    """
    try:
        grpc.channel_ready_future(channel).result(timeout=seconds)
        return
    except grpc.FutureTimeoutError:
        pass
    reason = "no details"
    try:
        probe = channel.unary_unary("/edgetunnel.interop.Diagnose/Probe",
                                    request_serializer=lambda b: b, response_deserializer=lambda b: b)
        probe(b"", timeout=3)
    except grpc.RpcError as e:
        reason = rpc_error_text(e)
    fail("could not connect to %s within %.1fs: %s" % (target, seconds, reason))


def rpc_error_text(e):
    code = getattr(e, "code", None)
    details = getattr(e, "details", None)
    if callable(code):
        try:
            return "rpc error code=%s details=%r" % (code(), details() if callable(details) else details)
        except Exception:
            pass
    return "%s: %s" % (type(e).__name__, e)


def get_pkt(q, deadline, what):
    """Block on a routed-packet queue until `deadline` (monotonic). Returns the packet;
    calls fail() on timeout or stream end."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        fail("timeout waiting for %s" % what, EXIT_TIMEOUT)
    try:
        pkt = q.get(timeout=remaining)
    except queue.Empty:
        fail("timeout waiting for %s" % what, EXIT_TIMEOUT)
    return pkt


def run_echo_exchange(P, sendq, conn_q, connect_id, payload, chunk, deadline, label):
    """Send `payload` as DATA chunks on `connect_id` and read the echo back from conn_q.

    Sending happens on a helper thread so that large payloads never dead-lock on flow
    control. Returns (ok, message). Stops reading once len(payload) bytes arrived; a
    CLOSE_RSP / stream end before that is a failure.
    """
    def sender():
        for off in range(0, len(payload), chunk):
            if not sendq.put(P.data(connect_id, payload[off:off + chunk])):
                return
    t = threading.Thread(target=sender, name="data-%s" % label, daemon=True)
    t.start()
    got = bytearray()
    while len(got) < len(payload):
        pkt = get_pkt(conn_q, deadline, "echoed DATA on %s (%d/%d bytes)" % (label, len(got), len(payload)))
        if pkt is None:
            return False, "stream ended after %d/%d echoed bytes" % (len(got), len(payload))
        if pkt.type == P.DATA:
            if pkt.data.error:
                return False, "DATA carried error %r" % pkt.data.error
            got += pkt.data.data
        elif pkt.type == P.CLOSE_RSP:
            return False, "CLOSE_RSP (error=%r) after only %d/%d echoed bytes" % (
                pkt.closeResponse.error, len(got), len(payload))
        else:
            return False, "unexpected %s while reading echo" % describe(pkt)
    t.join(timeout=max(0.0, deadline - time.monotonic()))
    if bytes(got[:len(payload)]) != payload:
        first = next(i for i in range(len(payload)) if got[i] != payload[i])
        return False, "echoed bytes differ from sent bytes (first difference at offset %d)" % first
    if len(got) > len(payload):
        return False, "received %d bytes, more than the %d sent" % (len(got), len(payload))
    return True, "echoed %d bytes" % len(payload)


def wait_close_rsp(P, conn_q, connect_id, deadline, label):
    """After CLOSE_REQ: wait for CLOSE_RSP on connect_id, ignoring trailing DATA."""
    while True:
        pkt = get_pkt(conn_q, deadline, "CLOSE_RSP on %s" % label)
        if pkt is None:
            return False, "stream ended before CLOSE_RSP"
        if pkt.type == P.CLOSE_RSP:
            if pkt.closeResponse.error:
                return False, "CLOSE_RSP carried error %r" % pkt.closeResponse.error
            return True, "closed"
        if pkt.type == P.DATA:
            log("%s: ignoring %d trailing DATA bytes before CLOSE_RSP" % (label, len(pkt.data.data)))
            continue
        return False, "unexpected %s while waiting for CLOSE_RSP" % describe(pkt)


def dial_echo_close(P, sendq, disp, i, address, protocol, payload_size, chunk, expect_dial_error,
                    deadline, results):
    """The dialing side of one tunnelled connection, on a stream shared via sendq/disp.

    DIAL_REQ -> DIAL_RSP; then `payload_size` random bytes out as DATA and the same bytes
    expected back; then CLOSE_REQ -> CLOSE_RSP. Prints 'CONN i connectID=.. bytes=.. closed'
    (or 'DIAL_ERROR conn=i error=..' with expect_dial_error) and stores the connectID (or
    the string 'dial-error') in results[i]. Any deviation terminates the process via fail().
    """
    label = "conn%d" % i
    rnd = new_random()
    q = disp.expect_dial(rnd)
    sendq.put(P.dial_req(address, rnd, protocol))
    pkt = get_pkt(q, deadline, "DIAL_RSP for %s" % label)
    if pkt is None:
        fail("%s: stream ended before DIAL_RSP: %s" % (label, disp.end_reason))
    if pkt.type == P.DIAL_CLS:
        fail("%s: got DIAL_CLS (random=%d) instead of DIAL_RSP" % (label, pkt.closeDial.random))
    rsp = pkt.dialResponse
    if rsp.error:
        if expect_dial_error:
            out("DIAL_ERROR conn=%d error=%s" % (i, rsp.error))
            results[i] = "dial-error"
            return
        fail("%s: DIAL_RSP error: %s" % (label, rsp.error))
    if expect_dial_error:
        fail("%s: expected a dial error but DIAL_RSP succeeded with connectID=%d" % (label, rsp.connectID))
    if rsp.connectID == 0:
        fail("%s: DIAL_RSP without error but connectID=0" % label)
    cid = rsp.connectID
    if payload_size:
        payload = os.urandom(payload_size)
        ok, msg = run_echo_exchange(P, sendq, q, cid, payload, chunk, deadline, label)
        if not ok:
            fail("%s (connectID=%d): %s" % (label, cid, msg))
    sendq.put(P.close_req(cid))
    ok, msg = wait_close_rsp(P, q, cid, deadline, label)
    if not ok:
        fail("%s (connectID=%d): %s" % (label, cid, msg))
    out("CONN %d connectID=%d bytes=%d closed" % (i, cid, payload_size))
    results[i] = cid
