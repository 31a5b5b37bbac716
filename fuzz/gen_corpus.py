#!/usr/bin/env python3
"""Writes the hand-made seed corpora under corpus/<target>/seed-*.

Run once from fuzz/ (python3 gen_corpus.py); the output is committed. It
encodes ANP Packets by hand (protobuf wire format) so it needs nothing but
Python.
"""
import os
import struct


def varint(v):
    v &= (1 << 64) - 1  # int64 two's complement, as protobuf does
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def f_int(tag, v):
    return varint(tag << 3) + varint(v) if v else b""


def f_bytes(tag, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(tag << 3 | 2) + varint(len(b)) + b if b else b""


def packet(kind, field, body):
    # Packet{type=1, payload oneof tags 2..8}; the submessage is always written.
    return f_int(1, kind) + varint(field << 3 | 2) + varint(len(body)) + body


def dial_req(addr, random, proto="tcp"):
    return packet(0, 2, f_bytes(1, proto) + f_bytes(2, addr) + f_int(3, random))


def dial_rsp(random, cid, err=""):
    return packet(1, 3, f_bytes(1, err) + f_int(2, cid) + f_int(3, random))


def close_req(cid):
    return packet(2, 5, f_int(1, cid))


def close_rsp(cid, err=""):
    return packet(3, 6, f_bytes(1, err) + f_int(2, cid))


def data(cid, payload=b"", err=""):
    return packet(4, 4, f_int(1, cid) + f_bytes(2, err) + f_bytes(3, payload))


def dial_cls(random):
    return packet(5, 7, f_int(1, random))


DRAIN = packet(6, 8, b"")


def grpc(msg):
    return b"\x00" + struct.pack(">I", len(msg)) + msg


def write(target, name, content):
    d = os.path.join("corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(content)


ALL_KINDS = [
    dial_req("node1:10250", 7),
    dial_rsp(7, 1),
    dial_rsp(8, 0, "dial tcp 10.0.0.1:80: connect: connection refused"),
    data(1, b"GET / HTTP/1.1\r\n\r\n"),
    data(1, b"", "EOF"),
    data(-1, b"\xff" * 200),
    close_req(1),
    close_rsp(1),
    dial_cls(-5),
    DRAIN,
]

# grpc_frame: [n][n chunk sizes][stream]
stream = b"".join(grpc(m) for m in ALL_KINDS)
write("grpc_frame", "one-chunk", b"\x00" + stream)
write("grpc_frame", "byte-at-a-time", b"\x01\x01" + stream)
write("grpc_frame", "mixed-sizes", b"\x04\x03\x10\x00\x40" + stream)
write("grpc_frame", "truncated", b"\x02\x05\x07" + stream[:-3])
write("grpc_frame", "too-large", b"\x00" + grpc(DRAIN) + b"\x00\x00\x01\x00\x01")
write("grpc_frame", "compressed", b"\x00" + grpc(DRAIN) + b"\x01\x00\x00\x00\x00")
write("grpc_frame", "empty-messages", b"\x00" + grpc(b"") * 3)


# packet_state: messages = op byte (op + 12 * arg) + Packet
def op(o, arg=0, pkt=b""):
    return grpc(bytes([o + 12 * arg]) + pkt)


SERVER, AGENT, BEGIN, CANCEL, CLOSE, OK, FAIL, LCLOSE, SDRAIN, ADRAIN, TO_AGENT, TO_SERVER = range(12)

write("packet_state", "coupled-lifecycle", b"".join([
    op(BEGIN, 3, dial_req("node1:10250", 0)),
    op(TO_AGENT),
    op(OK, 3),
    op(TO_SERVER),
    op(SERVER, 0, data(1, b"hello")),
    op(AGENT, 0, data(1, b"world")),
    op(SERVER, 0, data(1, b"", "EOF")),
    op(CLOSE, 1),
    op(TO_AGENT),
    op(TO_SERVER),
    op(SERVER, 0, data(1, b"late")),
]))
write("packet_state", "cancel-and-fail", b"".join([
    op(BEGIN, 1),
    op(BEGIN, 1),
    op(TO_AGENT),
    op(CANCEL, 1),
    op(TO_AGENT),
    op(OK, 1),
    op(BEGIN, 2),
    op(TO_AGENT),
    op(FAIL, 2),
    op(TO_SERVER),
    op(SERVER, 0, dial_rsp(9, 42)),
    op(SDRAIN),
]))
write("packet_state", "direct-frames", b"".join([
    op(SERVER, 0, dial_rsp(5, 0, "x")),
    op(SERVER, 0, data(77, b"x")),
    op(SERVER, 0, close_rsp(77)),
    op(SERVER, 0, DRAIN),
    op(SERVER, 0, close_req(1)),
    op(AGENT, 0, dial_req("[fd00::1]:443", 5)),
    op(AGENT, 0, dial_req("[fd00::1]:443", 5)),
    op(AGENT, 0, dial_cls(5)),
    op(AGENT, 0, data(1, b"", "EOF")),
    op(AGENT, 0, close_req(3)),
    op(AGENT, 0, DRAIN),
    op(LCLOSE, 1),
    op(ADRAIN),
]))
write("packet_state", "agent-side", b"".join([
    op(AGENT, 0, dial_req("a:1", 4)),
    op(OK, 4),
    op(AGENT, 0, data(1, b"payload")),
    op(AGENT, 0, data(1, b"", "EOF")),
    op(LCLOSE, 4),
    op(TO_SERVER),
    op(AGENT, 0, close_req(1)),
]))

# http_connect
write("http_connect", "basic", "CONNECT node1:10250 HTTP/1.1\r\nHost: node1:10250\r\n\r\n")
write("http_connect", "with-tail", "CONNECT 10.0.0.5:443 HTTP/1.1\r\nHost: 10.0.0.5:443\r\nUser-Agent: Go-http-client/1.1\r\n\r\n\x16\x03\x01")
write("http_connect", "ipv6", "CONNECT [fd00::1]:80 HTTP/1.1\r\n\r\n")
write("http_connect", "partial", "CONNECT a:1 HTTP/1.1\r\nHost: a")
write("http_connect", "get", "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
write("http_connect", "no-port", "CONNECT nohost HTTP/1.1\r\n\r\n")
write("http_connect", "bare-lf", "CONNECT a:1 HTTP/1.0\nHost: a\n\n")

# handover (the listener handover's messages)
write("handover", "hello", "hello min=1 max=1 pid=42\n")
write("handover", "offer", "offer version=1 pid=7\nlistener agent tcp:0.0.0.0:8091 4\nlistener connect-uds unix:/run/a%20b.sock 1\nlistener handover unix:/run/h.sock 1\n")
write("handover", "taken", "taken\nlistener agent\nlistener handover\n")
write("handover", "draining", "draining pid=7\n")
write("handover", "draining-forward", "draining pid=7\nforward unix:/run/a%20b.sock.forward-7\nforward unix:/run/a%20b.sock.forward-5\n")
write("handover", "refused", "refused versions 2..=3 asked\n")
write("handover", "bad", "offer version=1 pid=1\nlistener a tcp:1.2.3.4 0\nlistener a/b unix:%zz 1\n")

# agent_identifiers (also used as dial addresses by the target)
write("agent_identifiers", "all-keys", "host=node1&host=node-1.example&ipv4=10.0.0.5&ipv6=fd00%3A%3A1&cidr=10.1.0.0%2F16&default-route=true&future=x")
write("agent_identifiers", "cidr-v6", "cidr=fd00%3A%3A%2F64&cidr=0.0.0.0/0")
write("agent_identifiers", "encoded-host", "host=a+b%26c%3Dd&host=&host")
write("agent_identifiers", "bad", "ipv4=node1&cidr=10.0.0.0/33&host=%zz")
write("agent_identifiers", "addr-v4", "10.1.2.3:80")
write("agent_identifiers", "addr-v6", "[fd00::1]:443")


# HTTP/2 frames and HPACK by hand (for h2_server below).
def h2_frame(ty, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([ty, flags]) + struct.pack(">I", stream) + payload


def hp_int(first, prefix, v):
    mx = (1 << prefix) - 1
    if v < mx:
        return bytes([first | v])
    out = bytearray([first | mx])
    v -= mx
    while v >= 128:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def hp_str(s):
    if isinstance(s, str):
        s = s.encode()
    return hp_int(0, 7, len(s)) + s


def hp_lit(name, value):  # literal without indexing, new name
    return b"\x00" + hp_str(name) + hp_str(value)


def hp_inc(index, value):  # literal with incremental indexing, indexed name
    return hp_int(0x40, 6, index) + hp_str(value)


def hp_idx(index):
    return hp_int(0x80, 7, index)


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + h2_frame(4, 0, 0)
H2_PERCENT = "%2Fetc%2Fkubernetes%2Fkonnectivity-server%2Fkonnectivity-server.socket"


def h2_request(authority):
    return b"".join([
        hp_idx(3), hp_idx(6), hp_inc(4, "/ProxyService/Proxy"), hp_inc(1, authority),
        hp_lit("content-type", "application/grpc"), hp_lit("te", "trailers"),
    ])


dial = grpc(dial_req("127.0.0.1:8080", 7))
blk = h2_request("localhost:8090")

# h2_server: [n][n chunk sizes][client frames]; the target sends the
# preface and an empty SETTINGS first.
write("h2_server", "call", b"\x00"
      + h2_frame(1, 4, 1, h2_request(H2_PERCENT)) + h2_frame(0, 0, 1, dial)
      + h2_frame(8, 0, 1, b"\x00\x01\x00\x00") + h2_frame(8, 0, 0, b"\x00\x01\x00\x00")
      + h2_frame(6, 0, 0, b"\x00" * 8) + h2_frame(0, 1, 1, b""))
write("h2_server", "two-streams-reset", b"\x02\x09\x40"
      + h2_frame(1, 4, 1, h2_request("")) + h2_frame(1, 4, 3, hp_idx(3) + hp_idx(6) + hp_idx(63) + hp_idx(62))
      + h2_frame(0, 0x8, 3, b"\x02" + dial + b"\x00\x00") + h2_frame(3, 0, 1, b"\x00\x00\x00\x08")
      + h2_frame(1, 5, 3, hp_lit("grpc-status", "0")))
write("h2_server", "continuation-settings", b"\x01\x05"
      + h2_frame(1, 1, 1, blk[:6]) + h2_frame(9, 0, 1, blk[6:20]) + h2_frame(9, 4, 1, blk[20:])
      + h2_frame(4, 0, 0, b"\x00\x04\x00\x10\x00\x00\x00\x05\x00\x00\x80\x00")
      + h2_frame(7, 0, 0, b"\x00\x00\x00\x01\x00\x00\x00\x00"))
write("h2_server", "unknown-path", b"\x00"
      + h2_frame(1, 4, 1, b"".join([hp_idx(3), hp_idx(6), hp_lit(":path", "/x"), hp_lit("content-type", "application/grpc")]))
      + h2_frame(0, 1, 1, dial) + h2_frame(0xfa, 0, 0, b"ext"))

# cert_names: 2-byte little-endian DER length, the certificate, then
# "agent-id\nidentifiers". The certificates come from openssl (run once; the
# seeds are committed, so openssl is needed only to write them again).
import subprocess
import tempfile


def der_cert(subj, ext):
    with tempfile.TemporaryDirectory() as d:
        key, crt = os.path.join(d, "k.pem"), os.path.join(d, "c.der")
        cmd = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
               "-nodes", "-keyout", key, "-out", crt, "-outform", "DER", "-days", "1", "-subj", subj]
        for e in ext:
            cmd += ["-addext", e]
        subprocess.run(cmd, check=True, capture_output=True)
        with open(crt, "rb") as f:
            return f.read()


def cert_seed(name, der, claim):
    write("cert_names", name, struct.pack("<H", len(der)) + der + claim.encode())


node_a = der_cert("/CN=node-a", ["subjectAltName=IP:10.0.0.1,DNS:node-a.example,DNS:*.wild", "extendedKeyUsage=clientAuth"])
cert_seed("node-a-ok", node_a, "node-a\nhost=node-a.example&ipv4=10.0.0.1&cidr=10.0.0.1%2F32")
cert_seed("node-a-spoof", node_a, "node-b\nipv4=10.0.0.2&default-route=true")
cert_seed("node-client", der_cert("/O=system:nodes/CN=system:node:edge-1",
                                  ["extendedKeyUsage=clientAuth"]), "edge-1\nhost=edge-1")
cert_seed("csr-agent", der_cert("/O=openyurt:yurttunnel/CN=tunnel-agent-client",
                                ["subjectAltName=DNS:edge-1,IP:192.168.1.10,IP:fd00::10", "extendedKeyUsage=clientAuth"]),
          "edge-1\nhost=edge-1&ipv4=192.168.1.10&ipv6=fd00%3A%3A10")
cert_seed("serving", der_cert("/CN=node-a", ["subjectAltName=IP:10.0.0.1", "extendedKeyUsage=serverAuth"]), "node-a\n")

# agent_dest_policy: [16-byte IPv6 address][2-byte port]["allow|deny" entries]
V4_MAPPED_LOOPBACK = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1])
V4_MAPPED_METADATA = bytes(10) + b"\xff\xff" + bytes([169, 254, 169, 254])
write("agent_dest_policy", "yurt", V4_MAPPED_LOOPBACK + struct.pack(">H", 10266)
      + b"0.0.0.0/0,::/0,127.0.0.1/32:10266-10267|")
write("agent_dest_policy", "deny-wins", V4_MAPPED_LOOPBACK + struct.pack(">H", 22)
      + b"127.0.0.0/8|127.0.0.1/32:1-1024,10.0.0.0/8:22")
write("agent_dest_policy", "metadata", V4_MAPPED_METADATA + struct.pack(">H", 80)
      + b"0.0.0.0/0:80,[fd00::/8]:1-1024|[::ffff:169.254.169.254]:80")
write("agent_dest_policy", "v6", bytes.fromhex("fe800000000000000000000000000001") + struct.pack(">H", 443)
      + b"fd00::/8,[::1]:443,::1/128|fe80::/10")
write("agent_dest_policy", "bad", bytes(18) + b"10.0.0.1/8,fd00::/8:443,[x]:1,1.2.3.4:0-1|::/129")

# exec_credential: [version byte (even v1, odd v1beta1)][plugin stdout].
write("exec_credential", "v1-token", b"\x00" + b'{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t","expirationTimestamp":"2030-01-02T03:04:05Z"}}')
write("exec_credential", "v1beta1-cert", b"\x01" + b'{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1beta1","status":{"clientCertificateData":"c","clientKeyData":"k"}}')
write("exec_credential", "half-pair", b"\x00" + b'{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"clientKeyData":"k"}}')

# static_files: [selector byte][u64 LE file size / mtime][text]
for name, (k, size, body) in {
    "date-imf": (0, 0, b"Tue, 02 Jan 2024 03:04:05 GMT"),
    "date-850": (0, 0, b"Tuesday, 02-Jan-24 03:04:05 GMT"),
    "date-asc": (0, 0, b"Tue Jan  2 03:04:05 2024"),
    "range-multi": (1, 1000, b"bytes=0-3,5-7,-10,900-"),
    "range-suffix0": (1, 33, b"bytes=-0"),
    "cond": (2, 1704164645, b'GET\n"x", *\nTue, 02 Jan 2024 03:04:05 GMT\nW/"a"\n'
             b"Tue Jan  2 03:04:05 2024\nTue, 02 Jan 2024 03:04:05 GMT\nbytes=0-1"),
    "sniff-html": (3, 0, b"  <HTML><body>"),
    "sniff-mp4": (3, 0, b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom<\x06t\xbfmdat"),
    "mime": (4, 0, b"80:text/x-foo:*.foo\ntext/plain txt text # c\na.foo b.TXT c.html"),
}.items():
    write("static_files", name, bytes([k]) + struct.pack("<Q", size) + body)

# bench_proc_stat: text of /proc/PID/stat lines
write("bench_proc_stat", "haproxy",
      "4242 (haproxy) S 1 4242 4242 0 -1 4194560 2090 0 0 0 1234 56 7 8 20 0 3 0 "
      "123456 98304000 2048 18446744073709551615 1 1 0 0 0 0 0 4096 1 0 0 0 17 1 0 0 0 0 0\n")
write("bench_proc_stat", "parens", "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 10 20 30 40 20 0 1 0 5 0 0")

# agent_links: instance\nlink-of\nworkers\nworker\n then one worker byte per link attempt
write("agent_links", "two-workers", b"00c0ffee12345678\ns1\n2\n1\n\x00\x01\x00\x01\x01")
write("agent_links", "eight", b"abc-_XYZ\ns1\n8\n7\n\x00\x01\x02\x03\x04\x05\x06\x07\x03")
write("agent_links", "go-peer-secondary", b"\ns1\n")
write("agent_links", "bad", b"a b\ns2\n0\n9\n\x00")

# kubectl_upstream_proxy: [selector: 0 URL\nNO_PROXY, 1 CONNECT answer, 2 SOCKS5 replies][...]
write("kubectl_upstream_proxy", "url-noproxy", b"\x00http://u%40x:p@proxy:3128\nexample.com,.s.org,*.t.net,10.0.0.0/8,[::1]:443,*")
write("kubectl_upstream_proxy", "connect-200", b"\x01HTTP/1.1 200 Connection established\r\n\r\n")
write("kubectl_upstream_proxy", "connect-407", b"\x01HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
write("kubectl_upstream_proxy", "socks-auth", b"\x02\x01" + bytes([5, 2, 1, 0, 5, 0, 0, 3, 4]) + b"name" + bytes([1, 187]))

# tls_record: [n][n % 16 chunk sizes][records]; a record's body less its
# last 16 bytes (the tag) is taken as the opened inner plaintext.
def tls_rec(inner):
    body = inner + b"\x00" * 16
    return bytes([23, 3, 3]) + struct.pack(">H", len(body)) + body


write("tls_record", "data-and-close", b"\x02\x05\x40" + tls_rec(b"hello\x17") + tls_rec(b"\x17\x00\x00") + tls_rec(b"\x01\x00\x15"))
write("tls_record", "ticket-split-then-keyupdate", b"\x00" + tls_rec(b"\x04\x00\x00\x03\x16") + tls_rec(b"abc\x18\x00\x00\x01\x01\x16"))
write("tls_record", "lying-length", b"\x00" + tls_rec(b"\x04\xff\xff\xff\x16") + bytes([23, 3, 3, 0xff, 0xff]))
write("tls_record", "alert-fatal", b"\x01\x03" + tls_rec(b"\x02\x14\x15"))
# The anti-flood counters: 40 empty records, KeyUpdate runs around data,
# empty records and KeyUpdates alternating.
write("tls_record", "empty-records-run", b"\x00" + tls_rec(b"\x17") * 40)
write("tls_record", "key-update-run", b"\x00" + tls_rec(b"\x18\x00\x00\x01\x01\x16") * 20 + tls_rec(b"x\x17") + tls_rec(b"\x18\x00\x00\x01\x01\x16") * 40)
write("tls_record", "empty-key-update-pairs", b"\x00" + (tls_rec(b"\x17") + tls_rec(b"\x18\x00\x00\x01\x01\x16")) * 40)
