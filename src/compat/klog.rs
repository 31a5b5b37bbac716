//! klog's flags, which every ANP and yurt-tunnel binary takes (klog v2
//! `klog.go` `init`/`InitFlags`), and how they become edgetunnel's logging.
//!
//! ANP registers them through `AddGoFlag` after replacing `_` with `-`
//! (`pkg/util/flags.go` `Normalize`, in `cmd/*/main.go`) and sets `-v=4`
//! before parsing; yurt-tunnel adds Go's `flag.CommandLine` unchanged
//! (`--log_file`, `-v` default 0). Both spellings are accepted everywhere.
//!
//! Verbosity: klog's `-v` maps onto an EnvFilter for `--log`: 0..=4 `info`
//! (ANP runs at 4 by default, its ordinary operating level), 5..=6 adds
//! `edgetunnel=debug`, 7 and above `edgetunnel=trace`. `--log` is only
//! passed when `-v` is given, so `EDGETUNNEL_LOG` still works otherwise.
//!
//! Output: edgetunnel logs to stderr only. That is exactly klog with
//! `--logtostderr=true` (its default), where klog ignores `--log-file`,
//! `--log-dir`, `--log-file-max-size` and `--alsologtostderr` too; with
//! `--logtostderr=false` klog would write files, which edgetunnel cannot
//! yet, and says so.

use super::goflag::{Kind, Spec};
use super::{Effect, Flag, Out};
use crate::compat::goflag::Parsed;

const fn klog(
    name: &'static str,
    alias: Option<&'static str>,
    kind: Kind,
    default: &'static str,
) -> Spec {
    Spec {
        name,
        alias,
        shorthand: None,
        kind,
        default,
        deprecated: None,
    }
}

/// Files and stderr: read together by [`translate`].
const OUTPUT: &str = "edgetunnel logs to stderr (klog's --logtostderr=true); see the klog notes";

/// The klog flags, `-v` defaulting to `v_default` ("4" in ANP, "0" in
/// yurt-tunnel).
pub fn flags(v_default: &'static str) -> Vec<Flag> {
    use Effect::{Composite, NoEffect};
    vec![
        Flag {
            spec: Spec {
                shorthand: Some('v'),
                ..klog("v", None, Kind::KlogLevel, v_default)
            },
            effect: Composite("--log: 0-4 info, 5-6 edgetunnel=debug, 7+ edgetunnel=trace"),
        },
        Flag {
            spec: klog("vmodule", None, Kind::KlogModules, ""),
            effect: NoEffect("per-file verbosity does not exist in edgetunnel; use --log (tracing filter syntax) or EDGETUNNEL_LOG"),
        },
        Flag {
            spec: klog("logtostderr", None, Kind::Bool, "true"),
            effect: Composite(OUTPUT),
        },
        Flag {
            spec: klog("alsologtostderr", None, Kind::Bool, "false"),
            effect: Composite(OUTPUT),
        },
        Flag {
            spec: klog("log-file", Some("log_file"), Kind::String, ""),
            effect: Composite(OUTPUT),
        },
        Flag {
            spec: klog("log-dir", Some("log_dir"), Kind::String, ""),
            effect: Composite(OUTPUT),
        },
        Flag {
            spec: klog("log-file-max-size", Some("log_file_max_size"), Kind::Uint64, "1800"),
            effect: Composite(OUTPUT),
        },
        Flag {
            spec: klog("stderrthreshold", None, Kind::KlogSeverity, "2"),
            effect: NoEffect("every level goes to stderr"),
        },
        Flag {
            spec: klog("alsologtostderrthreshold", None, Kind::KlogSeverity, "0"),
            effect: NoEffect("every level goes to stderr"),
        },
        Flag {
            spec: klog(
                "legacy-stderr-threshold-behavior",
                Some("legacy_stderr_threshold_behavior"),
                Kind::Bool,
                "true",
            ),
            effect: NoEffect("every level goes to stderr"),
        },
        Flag {
            spec: klog("add-dir-header", Some("add_dir_header"), Kind::Bool, "false"),
            effect: NoEffect("edgetunnel's log lines have their own format (tracing's)"),
        },
        Flag {
            spec: klog("skip-headers", Some("skip_headers"), Kind::Bool, "false"),
            effect: NoEffect("edgetunnel's log lines have their own format (tracing's)"),
        },
        Flag {
            spec: klog("skip-log-headers", Some("skip_log_headers"), Kind::Bool, "false"),
            effect: NoEffect("edgetunnel writes no log files"),
        },
        Flag {
            spec: klog("one-output", Some("one_output"), Kind::Bool, "false"),
            effect: NoEffect("edgetunnel writes no log files"),
        },
        Flag {
            spec: klog("log-backtrace-at", Some("log_backtrace_at"), Kind::KlogTrace, ""),
            effect: NoEffect("edgetunnel logs no stack traces"),
        },
    ]
}

/// The `--log` filter for klog verbosity `v`.
pub fn filter(v: i64) -> &'static str {
    match v {
        ..=4 => "info",
        5..=6 => "info,edgetunnel=debug",
        _ => "info,edgetunnel=trace",
    }
}

/// Adds `--log` and the notes about log output.
pub fn translate(p: &Parsed, out: &mut Out) {
    if p.is_set("v") {
        out.arg("--log", filter(p.int("v")));
    }
    let files: Vec<String> = [
        "log-file",
        "log-dir",
        "log-file-max-size",
        "alsologtostderr",
    ]
    .into_iter()
    .filter(|n| p.is_set(n))
    .map(|n| format!("--{n}={}", p.text(n)))
    .collect();
    if p.bool("logtostderr") {
        if !files.is_empty() {
            out.info(format!(
                "accepted: {}: ignored, as klog ignores them with --logtostderr=true; logs go to stderr",
                files.join(" ")
            ));
        }
        return;
    }
    let target = match (p.str("log-file"), p.str("log-dir")) {
        ("", "") => "klog's default log directory".to_string(),
        ("", dir) => format!("files in {dir}"),
        (file, _) => file.to_string(),
    };
    out.warn(format!(
        "accepted, no effect: --logtostderr=false{}{}: edgetunnel cannot write log files yet; it logs to stderr, where klog would have written to {target}",
        if files.is_empty() { "" } else { " " },
        files.join(" ")
    ));
}
