#!/usr/bin/python3
"""Runs a command under an OCI seccomp profile, as runc loads a Localhost
profile: reads the JSON (defaultAction with defaultErrnoRet,
architectures, syscalls[] with names, action, errnoRet and args), builds
the filter with libseccomp's Python binding (Debian python3-seccomp),
sets no_new_privs, loads it and execs the command.

    run_under_profile.py PROFILE.json COMMAND [ARG...]

Syscall names this architecture does not know are skipped, as runc skips
them. Exits 125 when the profile cannot be loaded.
"""
import json
import os
import sys

try:
    import seccomp
except ImportError:
    sys.stderr.write("python3-seccomp is not installed (apt-get install python3-seccomp)\n")
    sys.exit(125)

OPS = {
    "SCMP_CMP_NE": seccomp.NE,
    "SCMP_CMP_LT": seccomp.LT,
    "SCMP_CMP_LE": seccomp.LE,
    "SCMP_CMP_EQ": seccomp.EQ,
    "SCMP_CMP_GE": seccomp.GE,
    "SCMP_CMP_GT": seccomp.GT,
    "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
}
ARCHES = {
    "SCMP_ARCH_X86_64": seccomp.Arch.X86_64,
    "SCMP_ARCH_X86": seccomp.Arch.X86,
    "SCMP_ARCH_X32": seccomp.Arch.X32,
    "SCMP_ARCH_AARCH64": seccomp.Arch.AARCH64,
    "SCMP_ARCH_ARM": seccomp.Arch.ARM,
}


def action(name, errno_ret, default_errno):
    if name == "SCMP_ACT_ALLOW":
        return seccomp.ALLOW
    if name == "SCMP_ACT_ERRNO":
        return seccomp.ERRNO(errno_ret if errno_ret is not None else default_errno)
    if name == "SCMP_ACT_KILL" or name == "SCMP_ACT_KILL_THREAD":
        return seccomp.KILL
    if name == "SCMP_ACT_KILL_PROCESS":
        return seccomp.KILL_PROCESS
    if name == "SCMP_ACT_TRAP":
        return seccomp.TRAP
    if name == "SCMP_ACT_LOG":
        return seccomp.LOG
    raise ValueError(f"action {name} not handled")


def build(profile):
    # runc: the default errno is defaultErrnoRet, else EPERM.
    default_errno = profile.get("defaultErrnoRet", 1)
    f = seccomp.SyscallFilter(action(profile["defaultAction"], default_errno, default_errno))
    f.set_attr(seccomp.Attr.CTL_NNP, 1)
    for arch in profile.get("architectures") or []:
        a = ARCHES.get(arch)
        if a is not None and a != seccomp.Arch.NATIVE and not f.exist_arch(a):
            try:
                f.add_arch(a)
            except Exception:
                pass
    added = skipped = 0
    for rule in profile.get("syscalls") or []:
        act = action(rule["action"], rule.get("errnoRet"), default_errno)
        args = [
            seccomp.Arg(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0))
            for a in rule.get("args") or []
        ]
        for name in rule["names"]:
            try:
                f.add_rule(act, name, *args)
                added += 1
            except (RuntimeError, ValueError, OSError):
                skipped += 1
    return f, added, skipped


def main():
    if len(sys.argv) < 3:
        sys.stderr.write(__doc__)
        sys.exit(125)
    with open(sys.argv[1]) as fh:
        profile = json.load(fh)
    try:
        f, added, skipped = build(profile)
    except Exception as e:  # a profile this script cannot express
        sys.stderr.write(f"seccomp profile {sys.argv[1]}: {e}\n")
        sys.exit(125)
    if os.environ.get("SECCOMP_PROFILE_VERBOSE"):
        sys.stderr.write(f"seccomp: {added} rules, {skipped} names unknown here\n")
    f.load()
    os.execvp(sys.argv[2], sys.argv[2:])


main()
