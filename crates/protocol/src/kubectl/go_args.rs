//! `edgetunnel proxy`'s command line read as kubectl reads it: every flag
//! `kubectl proxy` accepts (its own and kubectl's global ones), in Go's
//! pflag syntax, parsed by [`crate::go::pflag`] and handed on to the
//! clap parser (the kubectl proxy crate's `flags::ProxyArgs`) as canonical `--name=value`
//! arguments, so clap stays the one place where the configuration is built.
//! Reading the process's arguments (`goargs::from_process_args`) stays in
//! the kubectl proxy crate.
//!
//! What this adds over clap alone: Go's value syntax (`--disable-filter=T`,
//! `--port=0x4651`, `--keepalive=1h30m`), a repeated flag's last value
//! winning, `-v4`/`-v=4`, arguments that are not flags ignored (kubectl
//! proxy ignores them), and pflag's error wording. Flags and defaults from
//! `kubectl proxy --help` and `kubectl options` (v1.32), plus `--kuberc`
//! (kubectl 1.33+) and edgetunnel's own.

use crate::go::pflag::{self as goflag, FlagError, Kind, Spec, Value};

const fn short(name: &'static str, c: char, kind: Kind, default: &'static str) -> Spec {
    let mut s = Spec::new(name, kind, default);
    s.shorthand = Some(c);
    s
}

/// Every flag `edgetunnel proxy` takes, with its Go type.
pub const SPECS: &[Spec] = &[
    // kubectl proxy's own.
    Spec::new("accept-hosts", Kind::String, ""),
    Spec::new("accept-paths", Kind::String, ""),
    Spec::new("address", Kind::String, ""),
    Spec::new("api-prefix", Kind::String, ""),
    Spec::new("append-server-path", Kind::Bool, "false"),
    Spec::new("disable-filter", Kind::Bool, "false"),
    Spec::new("keepalive", Kind::Duration, "0s"),
    short("port", 'p', Kind::Int, "8001"),
    Spec::new("reject-methods", Kind::String, ""),
    Spec::new("reject-paths", Kind::String, ""),
    short("unix-socket", 'u', Kind::String, ""),
    short("www", 'w', Kind::String, ""),
    short("www-prefix", 'P', Kind::String, ""),
    // kubectl's global flags.
    Spec::new("as", Kind::String, ""),
    Spec::new("as-group", Kind::StringArray, ""),
    Spec::new("as-uid", Kind::String, ""),
    Spec::new("cache-dir", Kind::String, ""),
    Spec::new("certificate-authority", Kind::String, ""),
    Spec::new("client-certificate", Kind::String, ""),
    Spec::new("client-key", Kind::String, ""),
    Spec::new("cluster", Kind::String, ""),
    Spec::new("context", Kind::String, ""),
    Spec::new("disable-compression", Kind::Bool, "false"),
    Spec::new("insecure-skip-tls-verify", Kind::Bool, "false"),
    Spec::new("kubeconfig", Kind::String, ""),
    Spec::new("kuberc", Kind::String, ""),
    Spec::new("log-flush-frequency", Kind::Duration, "5s"),
    Spec::new("match-server-version", Kind::Bool, "false"),
    short("namespace", 'n', Kind::String, ""),
    Spec::new("password", Kind::String, ""),
    Spec::new("profile", Kind::String, "none"),
    Spec::new("profile-output", Kind::String, "profile.pprof"),
    Spec::new("request-timeout", Kind::String, "0"),
    short("server", 's', Kind::String, ""),
    Spec::new("tls-server-name", Kind::String, ""),
    Spec::new("token", Kind::String, ""),
    Spec::new("user", Kind::String, ""),
    Spec::new("username", Kind::String, ""),
    short("v", 'v', Kind::KlogLevel, "0"),
    Spec::new("vmodule", Kind::KlogModules, ""),
    Spec::new("warnings-as-errors", Kind::Bool, "false"),
    // edgetunnel's own (and the global `--log`).
    Spec::new("log", Kind::String, ""),
    Spec::new("workers", Kind::Int, "0"),
    Spec::new("driver", Kind::String, ""),
    Spec::new("metrics-bind", Kind::String, ""),
    Spec::new("upstream-http2", Kind::Bool, "true"),
    Spec::new("upstream-idle-per-core", Kind::Int, "0"),
];

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Canonical arguments for clap's `proxy` subcommand.
    Args(Vec<String>),
    /// `-h`/`--help`.
    Help,
}

/// Parses `args` (after `proxy`) as kubectl does and returns them in the
/// form clap's `ProxyArgs` reads: one `--name=value` per flag
/// given (the last occurrence; one per item for `--as-group`), integers in
/// decimal, booleans `true`/`false`, durations in Go's format.
pub fn canonical(args: &[String]) -> Result<Outcome, FlagError> {
    let parsed = match goflag::parse(SPECS, args) {
        Ok(p) => p,
        Err(FlagError::Help) => return Ok(Outcome::Help),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for spec in SPECS {
        if !parsed.is_set(spec.name) {
            continue;
        }
        let name = spec.name;
        match parsed.value(name) {
            Value::Bool(b) => out.push(format!("--{name}={b}")),
            Value::Int(i) => out.push(format!("--{name}={i}")),
            Value::Uint(u) => out.push(format!("--{name}={u}")),
            Value::Float(f) => out.push(format!("--{name}={f}")),
            // A negative keepalive disables it in Go, as zero does.
            Value::Duration(ns) => out.push(format!(
                "--{name}={}",
                goflag::format_duration((*ns).max(0))
            )),
            Value::Str(s) => out.push(format!("--{name}={s}")),
            Value::List(items) => {
                for item in items {
                    out.push(format!("--{name}={item}"));
                }
            }
        }
    }
    Ok(Outcome::Args(out))
}

/// Where the subcommand is: after the program name and any of edgetunnel's
/// global flags with their values (`--log X`, `--log-format=json`, ...).
pub fn subcommand_index(args: &[String]) -> Option<usize> {
    let mut i = 1;
    // edgetunnel's global flags that take a value.
    const VALUED: [&str; 4] = [
        "--log",
        "--log-format",
        "--log-file",
        "--log-stderr-threshold",
    ];
    while i < args.len() {
        let a = args[i].as_str();
        match a.split_once('=') {
            Some((flag, _)) if VALUED.contains(&flag) => i += 1,
            None if VALUED.contains(&a) => i += 2,
            _ => return Some(i),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(args: &[&str]) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        match canonical(&args).unwrap() {
            Outcome::Args(a) => a,
            Outcome::Help => panic!("help"),
        }
    }

    #[test]
    fn go_value_syntax() {
        assert_eq!(canon(&["--port=0x4651"]), ["--port=18001"]);
        assert_eq!(canon(&["-p", "0o17"]), ["--port=15"]);
        assert_eq!(canon(&["-p010"]), ["--port=8"]);
        assert_eq!(canon(&["--disable-filter=T"]), ["--disable-filter=true"]);
        assert_eq!(canon(&["--disable-filter=1"]), ["--disable-filter=true"]);
        assert_eq!(canon(&["--disable-filter"]), ["--disable-filter=true"]);
        assert_eq!(canon(&["--disable-filter=F"]), ["--disable-filter=false"]);
        assert_eq!(canon(&["--keepalive=1h30m"]), ["--keepalive=1h30m0s"]);
        assert_eq!(canon(&["--keepalive=-1s"]), ["--keepalive=0s"]);
        // Last wins; positional arguments are ignored as kubectl does.
        assert_eq!(canon(&["--port", "5", "extra", "--port=0"]), ["--port=0"]);
        assert_eq!(canon(&["--address=localhost"]), ["--address=localhost"]);
        assert_eq!(canon(&["-v4", "--vmodule=a=2"]), ["--v=4", "--vmodule=a=2"]);
        assert_eq!(canon(&["-v=6"]), ["--v=6"]);
        assert_eq!(
            canon(&["--as-group=a,b", "--as-group", "c", "--as=me"]),
            ["--as=me", "--as-group=a,b", "--as-group=c"]
        );
        assert_eq!(canon(&["--request-timeout", "5"]), ["--request-timeout=5"]);
    }

    #[test]
    fn errors_as_pflag_words_them() {
        let err = |a: &[&str]| {
            let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
            canonical(&a).unwrap_err().to_string()
        };
        assert_eq!(err(&["--nope"]), "unknown flag: --nope");
        assert_eq!(
            err(&["--port=x"]),
            "invalid argument \"x\" for \"-p, --port\" flag: strconv.ParseInt: parsing \"x\": invalid syntax"
        );
        assert_eq!(
            err(&["--disable-filter=yes"]),
            "invalid argument \"yes\" for \"--disable-filter\" flag: strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
        assert_eq!(err(&["--port"]), "flag needs an argument: --port");
        let h: Vec<String> = vec!["-h".into()];
        assert_eq!(canonical(&h).unwrap(), Outcome::Help);
    }

    #[test]
    fn subcommand_position() {
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(subcommand_index(&v(&["e", "proxy"])), Some(1));
        assert_eq!(subcommand_index(&v(&["e", "--log", "x", "proxy"])), Some(3));
        assert_eq!(subcommand_index(&v(&["e", "--log=x", "proxy"])), Some(2));
        let args = ["e", "--log-format", "json", "--log-file=f", "proxy"];
        assert_eq!(subcommand_index(&v(&args)), Some(4));
        assert_eq!(subcommand_index(&v(&["e"])), None);
    }
}
