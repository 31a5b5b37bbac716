#!/usr/bin/env python3
"""Threaded TCP echo server (pure standard library; no grpc needed).

Echoes every byte back on each accepted connection, half-closes its write side when the
peer half-closes, and exits after --timeout seconds (or --max-connections served).
Prints 'LISTENING port=N' once bound, one 'CONN n bytes=B' line per finished connection,
and a final 'OK connections=.. bytes=..' line. See README.md.
"""

import argparse
import os
import socket
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", required=True, help="HOST:PORT (port 0 = pick one; see LISTENING line)")
    p.add_argument("--timeout", type=float, default=60.0, help="serve this long, then exit 0 (default 60)")
    p.add_argument("--max-connections", type=int, default=0,
                   help="exit 0 once this many connections have finished (0 = until --timeout)")
    a = p.parse_args()

    host, _, port = a.listen.rpartition(":")
    host = host.strip("[]")
    lock = threading.Lock()
    stats = {"conns": 0, "bytes": 0}
    done = threading.Event()

    def say(line):
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        ls = socket.socket(family, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((host, int(port)))
        ls.listen(128)
    except (OSError, ValueError) as e:
        say("FAIL cannot listen on %s: %s" % (a.listen, e))
        sys.exit(2)
    say("LISTENING port=%d" % ls.getsockname()[1])

    def handle(s, n):
        total = 0
        try:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while True:
                data = s.recv(65536)
                if not data:
                    break
                s.sendall(data)
                total += len(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        finally:
            s.close()
        with lock:
            stats["conns"] += 1
            stats["bytes"] += total
            finished = stats["conns"]
        say("CONN %d bytes=%d" % (n, total))
        if a.max_connections and finished >= a.max_connections:
            done.set()

    def acceptor():
        n = 0
        while True:
            try:
                s, _ = ls.accept()
            except OSError:
                return
            n += 1
            threading.Thread(target=handle, args=(s, n), daemon=True).start()

    threading.Thread(target=acceptor, daemon=True).start()
    done.wait(a.timeout)
    say("OK connections=%d bytes=%d" % (stats["conns"], stats["bytes"]))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
