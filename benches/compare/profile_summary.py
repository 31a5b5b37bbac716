#!/usr/bin/env python3
"""Summarizes benches/compare/profile.sh's output (issue 29): for each
system and case, the CPU per unit of work (from the perf-stat pass's
task-clock and that pass's work: bytes moved, requests completed), split by
area (from the perf-record pass: each sample's leaf symbol; kernel samples
by the system call or io_uring op they ran under), and the counts per unit
(syscalls, io_uring ops, TLS records, packets, context switches; strace's
syscalls by name).

    benches/compare/profile_summary.py OUT [BULK_MIB]
"""
import collections
import json
import os
import re
import subprocess
import sys

OUT = sys.argv[1]
BULK_BYTES = int(sys.argv[2] if len(sys.argv) > 2 else 256) << 20

# Areas of a user-space leaf symbol (first match wins), then of a kernel one.
USER_AREAS = [
    ("AES-GCM", r"libcrypto|aes|gcm|ghash|ring::aead|ring_core|chacha|poly1305|crypto/aes|crypto/internal/fips140/aes|gcmAes|aesni|EVP_|ossl_aes|ossl_gcm"),
    ("Go (stripped binary: all its user code)", r"anp-(server|agent)$"),
    ("TLS (rustls/OpenSSL/Go)", r"rustls|tokio_rustls|libssl|SSL_|ssl3_|tls1|crypto/tls"),
    ("memcpy/memmove", r"memmove|memcpy|memset|runtime\.memmove|runtime\.memclr"),
    ("allocator", r"malloc|free|_int_|cfree|realloc|tcache|runtime\.mallocgc|runtime\.(gc|scan|mark|sweep|heap|mspan|mcache|mcentral|greyobject|findObject|wbBuf|bulkBarrier|typePointers)"),
    ("h2 crate / Go http2", r"^h2::|golang\.org/x/net/http2|google\.golang\.org/grpc/internal/transport"),
    ("our HTTP/2 + gRPC + packets", r"h2_server|h2_conn|engine::grpc|grpc_frame|protocol::|prost|edgetunnel_protocol|google\.golang\.org/(grpc|protobuf)"),
    ("runtime (monoio/futures/Go sched)", r"monoio|io_uring|futures|tokio::|runtime\.|sync\.|async_task"),
    ("edgetunnel other", r"edgetunnel|^core::|^alloc::|^std::"),
    ("libc syscall stubs, vDSO", r"^__libc|^__GI_|^syscall$|^epoll_wait$|__vdso|^read$|^write$|^writev$|^recv|^send"),
    ("haproxy", r"haproxy|^(process_|sc_|se_|conn_|h1_|stream_|task_|run_tasks|fd_|_do_poll|si_|b_|channel_)"),
]
KERNEL_AREAS = [
    ("copy user<->kernel", r"copy_user|copy_to_iter|copy_from_iter|_copy_|rep_movs|memcpy|memmove|csum_partial_copy|check_object_size|simple_copy"),
    ("TCP/IP stack", r"^tcp_|^ip_|^__ip|^__tcp|skb|^sk_|^sock_|^__sk|net_rx|napi|netif|dev_queue|loopback|^inet_|^__inet|release_sock|lock_sock|^ipv4|tcp|validate_xmit|^__dev|^dst_|^nf_|^raw_v4|__netif"),
    ("scheduler/wakeups", r"schedule|wake|futex|^select_task|enqueue|dequeue|pick_next|^update_|switch_|finish_task|__switch|ttwu|sched|idle|hrtimer|psi_|cpuacct|cgroup_rstat|raw_spin|spin_lock|spin_unlock|ep_|do_epoll|epoll"),
    ("io_uring", r"^io_|^__io|io_uring"),
    ("syscall entry/exit", r"entry_SYSCALL|syscall_exit|do_syscall|exit_to_user|syscall_return|__x64_sys|fpregs|restore_fpregs|srso|retbleed|untrain_ret|clear_bhb"),
    ("memory (pages/slab)", r"kmem|kmalloc|kfree|page|slab|__alloc|mem_cgroup|memcg|folio|vm_|mmap|__rmqueue|rmqueue|refill_obj|obj_cgroup"),
]
SYSCALL_OF = re.compile(r"__x64_sys_(\w+)|__do_sys_(\w+)|^__sys_(\w+)$|^do_(writev|readv|epoll_wait|epoll_pwait)$|^ksys_(\w+)$|^(io_send|io_recv|io_read|io_write|io_sendmsg|io_recvmsg|io_poll\w*|io_accept|io_connect)$")


def area(sym, kernel):
    for name, pat in (KERNEL_AREAS if kernel else USER_AREAS):
        if re.search(pat, sym):
            return name
    return "kernel other" if kernel else "other user"


def profile(path):
    """Shares of samples by area and, for kernel samples, by syscall."""
    out = subprocess.run(
        ["perf", "script", "-i", path, "-F", "period,ip,sym,dso"],
        capture_output=True, text=True).stdout
    areas = collections.Counter()
    calls = collections.Counter()
    total = 0
    for block in out.split("\n\n"):
        lines = [l.strip() for l in block.strip().splitlines() if l.strip()]
        if len(lines) < 2:
            continue
        try:
            period = int(lines[0].split()[0])
        except ValueError:
            continue
        frames = []
        for l in lines[1:]:
            m = re.match(r"(\S+)\s+(.*)\s+\((.*)\)$", l)
            if m:
                frames.append((m.group(2), m.group(3)))
        if not frames:
            continue
        sym, dso = frames[0]
        kernel = "kernel" in dso
        if not kernel and (sym in ("[unknown]", "") or sym.startswith("0x")):
            sym = dso
        total += period
        a = area(sym.split("+")[0], kernel)
        areas[("k " if kernel else "u ") + a] += period
        if kernel:
            call = "other (softirq, fault, timer)"
            for s, _ in frames:
                m = SYSCALL_OF.search(s.split("+")[0])
                if m:
                    call = next(g for g in m.groups() if g)
                    if call.startswith("io_") and call != "io_uring_enter":
                        call = "io_uring op: " + call
                    break
            calls[call] += period
    return total, areas, calls


def stat(path):
    counts = {}
    for l in open(path):
        m = re.match(r"\s*([\d,.]+)\s+(msec )?(\S+)", l)
        if m and not l.strip().startswith("#"):
            try:
                counts[m.group(3)] = float(m.group(1).replace(",", ""))
            except ValueError:
                pass
    return counts


def strace(path):
    rows = []
    for l in open(path):
        f = l.split()
        if len(f) >= 5 and re.match(r"[\d.]+$", f[0]) and f[-1] not in ("total",):
            calls = int(f[3])
            rows.append((f[-1], calls))
    return rows


def work(run_dir):
    """(system, case) -> units of work in that pass: bytes or requests."""
    w = {}
    for s in json.load(open(os.path.join(run_dir, "compare.json")))["samples"]:
        if s["scenario"] == "bulk" and s["metric"] == "Gbit/s":
            w[(s["system"], "bulk-" + s["case"])] = ("GB", BULK_BYTES / 1e9)
        if s["scenario"] == "latency" and s["metric"] == "req/s":
            w[(s["system"], "latency-" + s["case"])] = ("kreq", s["value"] * 5.0 / 1e3)
    return w


def key_of(fname):
    base = fname.rsplit(".", 1)[0]
    base = re.sub(r"-0$", "", base)
    return base


TABLE = collections.defaultdict(dict)  # case -> system -> {row: value}


def main():
    w_stat = work(os.path.join(OUT, "stat", "run"))
    w_strace = work(os.path.join(OUT, "strace", "run"))
    for (system, case), (unit, n) in sorted(w_stat.items(), key=lambda x: (x[0][1], x[0][0])):
        slug = re.sub(r"[^A-Za-z0-9]", "-", f"{system}-{case}")
        st = os.path.join(OUT, "stat", slug + "-0.txt")
        rec = os.path.join(OUT, "record", slug + "-0.data")
        tr = os.path.join(OUT, "strace", slug + "-0.txt")
        if not os.path.exists(st):
            continue
        c = stat(st)
        cpu = c.get("task-clock", 0) / 1e3  # seconds
        per = "s/GB" if unit == "GB" else "µs/req"
        scale = 1.0 if unit == "GB" else 1e3  # kreq -> µs/req
        print(f"\n## {system} · {case}: CPU {cpu / n * scale:.3g} {per}")
        row = TABLE[(case, per)].setdefault(system, {})
        row["CPU (perf stat task-clock)"] = cpu / n * scale
        for ev in ["raw_syscalls:sys_enter", "io_uring:io_uring_submit_req",
                   "context-switches", "net:net_dev_xmit",
                   "probe_edgetunnel:et_seal", "probe_edgetunnel:et_open",
                   "probe_libcrypto:ossl_final"]:
            if c.get(ev):
                u = "per MB" if unit == "GB" else "per req"
                div = n * 1e3 if unit == "GB" else n * 1e3
                print(f"  {ev}: {c[ev] / div:.2f} {u}")
                row[f"{ev} {u}"] = c[ev] / div
        if os.path.exists(rec):
            total, areas, calls = profile(rec)
            if total:
                print("  where (share of samples -> " + per + "):")
                for a, v in areas.most_common():
                    print(f"    {a}: {100 * v / total:.1f}% -> {cpu / n * scale * v / total:.3g}")
                    row[a] = cpu / n * scale * v / total
                kt = sum(calls.values())
                print("  kernel by syscall/op:")
                for a, v in calls.most_common(8):
                    print(f"    {a}: {100 * v / total:.1f}% -> {cpu / n * scale * v / total:.3g}")
                    row["kernel under " + a] = cpu / n * scale * v / total
        if os.path.exists(tr) and (system, case) in w_strace:
            _, n2 = w_strace[(system, case)]
            rows = strace(tr)
            u = "per MB" if unit == "GB" else "per req"
            tot = sum(r[1] for r in rows)
            top = ", ".join(f"{name} {calls / (n2 * 1e3):.2f}" for name, calls in sorted(rows, key=lambda r: -r[1])[:6])
            print(f"  strace syscalls {u}: {tot / (n2 * 1e3):.2f} ({top})")
    # One Markdown table per case: rows are figures, columns systems.
    for (case, per), systems in sorted(TABLE.items()):
        names = sorted(systems)
        rows = []
        for sys_ in names:
            for r in systems[sys_]:
                if r not in rows:
                    rows.append(r)
        print(f"\n### {case} ({per} unless named)\n")
        print("| figure | " + " | ".join(names) + " |")
        print("| --- |" + " ---: |" * len(names))
        for r in rows:
            cells = [f"{systems[n_][r]:.3g}" if r in systems[n_] else "-" for n_ in names]
            print(f"| {r} | " + " | ".join(cells) + " |")


main()
