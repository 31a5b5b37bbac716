#!/usr/bin/env python3
"""Writes edgetunnel.json: Docker's default seccomp profile (moby's
profiles/seccomp/default.json, given as the first argument) flattened to the
plain OCI format a Localhost profile must have (the runtime reads
defaultAction/architectures/syscalls and ignores Docker's archMap,
includes and excludes), for a container without CAP_SYS_ADMIN and the
other capabilities those rules are conditioned on, plus the three io_uring
calls that containerd's and Docker's defaults no longer allow.

    python3 make-profile.py path/to/moby/default.json > edgetunnel.json
"""
import json
import sys

IO_URING = ["io_uring_setup", "io_uring_enter", "io_uring_register"]
# Architectures edgetunnel is built for; names of other arches' calls are
# harmless (the runtime skips names its arch lacks) but kept out.
ARCHES = {"amd64", "x32", "x86", "arm", "arm64"}

moby = json.load(open(sys.argv[1]))
rules = []
for s in moby["syscalls"]:
    inc, exc = s.get("includes", {}), s.get("excludes", {})
    if inc.get("caps"):
        continue  # needs a capability edgetunnel does not get
    if inc.get("arches") and not set(inc["arches"]) & ARCHES:
        continue
    if "CAP_SYS_ADMIN" not in exc.get("caps", []) and exc.get("caps"):
        continue
    rule = {"names": s["names"], "action": s["action"]}
    for k in ("args", "errnoRet"):
        if k in s:
            rule[k] = s[k]
    rules.append(rule)
rules[0]["names"] = sorted(set(rules[0]["names"]) | set(IO_URING))
profile = {
    "defaultAction": moby["defaultAction"],
    "defaultErrnoRet": moby.get("defaultErrnoRet", 1),
    "syscalls": rules,
}
json.dump(profile, sys.stdout, indent=1)
print()
