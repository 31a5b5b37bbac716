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
//! Output: as klog's. With `--logtostderr=true` (its default) everything
//! goes to stderr and klog ignores `--log-file`, `--log-dir`,
//! `--log-file-max-size` and `--alsologtostderr`; with `false` the lines go
//! to a file in klog's format (`--log-format klog --log-file ...`) and the
//! severe ones also to stderr (see [`translate`]).

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
const OUTPUT: &str =
    "--log-file, --log-format klog and --log-stderr-threshold, as klog writes files and stderr";

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
            effect: Composite(OUTPUT),
        },
        Flag {
            spec: klog("alsologtostderrthreshold", None, Kind::KlogSeverity, "0"),
            effect: Composite(OUTPUT),
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
            effect: NoEffect("edgetunnel writes no header lines into its log file"),
        },
        Flag {
            spec: klog("one-output", Some("one_output"), Kind::Bool, "false"),
            effect: NoEffect("edgetunnel writes one log file with every severity"),
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

/// Adds `--log` and the log output flags (klog v2 `klog.go` `output`:
/// with `--logtostderr=true`, its default, every line goes to stderr and
/// the file flags are ignored; with `false`, every line goes to
/// `--log-file`, else to a file in `--log-dir` (default: the temporary
/// directory), and lines at or above `--stderrthreshold` (default ERROR),
/// or with `--alsologtostderr` at or above `--alsologtostderrthreshold`
/// (default INFO), also to stderr).
pub fn translate(p: &Parsed, out: &mut Out, program: &str) {
    if p.is_set("v") {
        out.arg("--log", filter(p.int("v")));
    }
    let files: Vec<String> = [
        "log-file",
        "log-dir",
        "log-file-max-size",
        "alsologtostderr",
        "stderrthreshold",
        "alsologtostderrthreshold",
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
    out.arg("--log-format", "klog");
    let file = match (p.str("log-file"), p.str("log-dir")) {
        ("", dir) => {
            let dir = if dir.is_empty() {
                std::env::temp_dir()
            } else {
                dir.into()
            };
            dir.join(log_name(program)).display().to_string()
        }
        (file, _) => file.to_string(),
    };
    out.arg("--log-file", file);
    let threshold = if p.bool("alsologtostderr") {
        p.int("alsologtostderrthreshold")
    } else {
        p.int("stderrthreshold")
    };
    out.arg("--log-stderr-threshold", stderr_threshold(threshold));
    if p.is_set("log-file-max-size") {
        out.info("accepted, no effect: --log-file-max-size: edgetunnel does not rotate its log file; use logrotate (copytruncate)");
    }
}

/// `--log-stderr-threshold` for a klog severity (0 INFO, 1 WARNING,
/// 2 ERROR, 3 FATAL: edgetunnel logs nothing fatal).
fn stderr_threshold(severity: i64) -> &'static str {
    match severity {
        ..=0 => "all",
        1 => "warn",
        2 => "error",
        _ => "off",
    }
}

/// klog's file name in a log directory (`klog_file.go` `logName`):
/// `program.host.user.log.INFO.yyyymmdd-hhmmss.pid`; edgetunnel writes
/// every severity there (klog's INFO file holds them all too).
fn log_name(program: &str) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().split('.').next().unwrap_or("").to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknownhost".into());
    let user = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "unknownuser".into())
        .replace(['/', '\\'], "_");
    let t = jiff::Zoned::now().datetime();
    format!(
        "{program}.{host}.{user}.log.INFO.{:04}{:02}{:02}-{:02}{:02}{:02}.{}",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        std::process::id()
    )
}
