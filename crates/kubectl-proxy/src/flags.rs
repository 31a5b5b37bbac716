//! `edgetunnel proxy` flags: kubectl proxy's, with its short forms and
//! defaults, plus the kubeconfig flags kubectl accepts for this command.
//! Booleans take Go's forms (`--flag`, `--flag=true`, `--flag=false`).

use std::time::Duration;

use clap::{ArgAction, Args};

use super::filter::{
    DEFAULT_ACCEPT_HOSTS, DEFAULT_ACCEPT_PATHS, DEFAULT_REJECT_METHODS, DEFAULT_REJECT_PATHS,
};
use engine::runtime::Driver;

pub const DEFAULT_PORT: u16 = 8001;

/// The help heading of kubectl's global flags (which `kubectl proxy --help`
/// leaves to `kubectl options`); kubectl proxy's own flags stay under
/// `Options:` as in kubectl, edgetunnel's additions under their own.
const GLOBAL: &str = "kubectl global options (kubectl options)";

#[derive(Args, Debug, Clone)]
pub struct ProxyArgs {
    /// The port on which to run the proxy. Set to 0 to pick a random port.
    #[arg(short = 'p', long, default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// The IP address on which to serve on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: String,
    /// Unix socket on which to run the proxy.
    #[arg(short = 'u', long, default_value = "")]
    pub unix_socket: String,
    /// Also serve static files from the given directory under the specified prefix.
    #[arg(short = 'w', long, default_value = "")]
    pub www: String,
    /// Prefix to serve static files under, if static file directory is specified.
    #[arg(short = 'P', long, default_value = "/static/")]
    pub www_prefix: String,
    /// Prefix to serve the proxied API under.
    #[arg(long, default_value = "/")]
    pub api_prefix: String,
    /// Regular expression for paths that the proxy should accept.
    #[arg(long, default_value = DEFAULT_ACCEPT_PATHS)]
    pub accept_paths: String,
    /// Regular expression for paths that the proxy should reject. Paths specified here will be rejected even accepted by --accept-paths.
    #[arg(long, default_value = DEFAULT_REJECT_PATHS)]
    pub reject_paths: String,
    /// Regular expression for hosts that the proxy should accept.
    #[arg(long, default_value = DEFAULT_ACCEPT_HOSTS)]
    pub accept_hosts: String,
    /// Regular expression for HTTP methods that the proxy should reject (example --reject-methods='POST,PUT,PATCH').
    #[arg(long, default_value = DEFAULT_REJECT_METHODS)]
    pub reject_methods: String,
    /// If true, disable request filtering in the proxy. This is dangerous, and can leave you vulnerable to XSRF attacks, when used with an accessible port.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set)]
    pub disable_filter: bool,
    /// keepalive specifies the keep-alive period for an active network connection. Set to 0 to disable keepalive.
    #[arg(long, default_value = "0s", value_parser = parse_go_duration)]
    pub keepalive: Duration,
    /// If true, enables automatic path appending of the kube context server path to each request.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set)]
    pub append_server_path: bool,

    /// Path to the kubeconfig file to use for CLI requests.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub kubeconfig: String,
    /// The name of the kubeconfig context to use.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub context: String,
    /// The name of the kubeconfig cluster to use.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub cluster: String,
    /// The name of the kubeconfig user to use.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub user: String,
    /// The address and port of the Kubernetes API server.
    #[arg(short = 's', long, help_heading = GLOBAL, default_value = "")]
    pub server: String,
    /// Bearer token for authentication to the API server.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub token: String,
    /// Path to a cert file for the certificate authority.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub certificate_authority: String,
    /// Path to a client certificate file for TLS.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub client_certificate: String,
    /// Path to a client key file for TLS.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub client_key: String,
    /// If true, the server's certificate will not be checked for validity. This will make your HTTPS connections insecure.
    #[arg(long, help_heading = GLOBAL, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set)]
    pub insecure_skip_tls_verify: bool,
    /// If true, opt-out of response compression for all requests to the server.
    #[arg(long, help_heading = GLOBAL, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set)]
    pub disable_compression: bool,
    /// Server name to use for server certificate validation.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub tls_server_name: String,
    /// If present, the namespace scope for this CLI request (accepted for compatibility; the proxy is not namespaced).
    #[arg(short = 'n', long, help_heading = GLOBAL, default_value = "")]
    pub namespace: String,

    /// Number for the log level verbosity (kubectl's klog `-v`: 4 and above add edgetunnel=debug to --log, 6 and above log each upstream round trip).
    #[arg(long = "v", help_heading = GLOBAL, default_value_t = 0)]
    pub v: i64,
    /// Comma-separated list of pattern=N settings for file-filtered logging (entries naming proxy_server, upgradeaware or round_trippers raise -v).
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub vmodule: String,
    /// Maximum number of seconds between log flushes (accepted, no effect).
    #[arg(long, help_heading = GLOBAL, default_value = "5s", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,
    /// The length of time to wait before giving up on a single server request (validated as kubectl does; kubectl proxy does not apply it to proxied requests).
    #[arg(long, help_heading = GLOBAL, default_value = "0")]
    pub request_timeout: String,
    /// Default cache directory (accepted, no effect: the proxy uses no discovery cache).
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub cache_dir: String,
    /// Require server version to match client version (edgetunnel emulates kubectl v1.32.4).
    #[arg(long, help_heading = GLOBAL, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set)]
    pub match_server_version: bool,
    /// Treat warnings received from the server as errors (accepted; the proxy relays warnings).
    #[arg(long, help_heading = GLOBAL, num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true", action = ArgAction::Set)]
    pub warnings_as_errors: bool,
    /// Name of profile to capture. One of (none|cpu|heap|goroutine|threadcreate|block|mutex) (validated; no profile is written).
    #[arg(long, help_heading = GLOBAL, default_value = "none")]
    pub profile: String,
    /// Name of the file to write the profile to (accepted, no effect).
    #[arg(long, help_heading = GLOBAL, default_value = "profile.pprof")]
    pub profile_output: String,
    /// Path to the kuberc file (kubectl 1.33+; accepted, no effect).
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub kuberc: String,

    /// (edgetunnel) Worker cores; default: all cores.
    #[arg(long, help_heading = "edgetunnel")]
    pub workers: Option<usize>,
    /// (edgetunnel) I/O driver: auto, uring, legacy.
    #[arg(
        long,
        help_heading = "edgetunnel",
        env = "EDGETUNNEL_DRIVER",
        default_value = "auto"
    )]
    pub driver: Driver,
    /// (edgetunnel) Serve Prometheus metrics at this address (`/metrics`).
    #[arg(long, help_heading = "edgetunnel")]
    pub metrics_bind: Option<std::net::SocketAddr>,
    /// (edgetunnel) Offer HTTP/2 to an https upstream (as kubectl does) and use
    /// one multiplexed connection per core when it accepts; upgrades always
    /// go over HTTP/1.1.
    #[arg(long, help_heading = "edgetunnel", num_args = 0..=1, require_equals = true, default_value = "true", default_missing_value = "true", action = ArgAction::Set)]
    pub upstream_http2: bool,
    /// (edgetunnel) Idle upstream connections kept per core.
    #[arg(long, help_heading = "edgetunnel", default_value_t = 64)]
    pub upstream_idle_per_core: usize,

    /// Username to impersonate for the operation. User could be a regular user or a service account in a namespace.
    #[arg(long = "as", help_heading = GLOBAL, default_value = "")]
    pub as_user: String,
    /// Group to impersonate for the operation, this flag can be repeated to specify multiple groups.
    #[arg(long = "as-group", help_heading = GLOBAL)]
    pub as_groups: Vec<String>,
    /// UID to impersonate for the operation.
    #[arg(long = "as-uid", help_heading = GLOBAL, default_value = "")]
    pub as_uid: String,
    /// Username for basic authentication to the API server.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub username: String,
    /// Password for basic authentication to the API server.
    #[arg(long, help_heading = GLOBAL, default_value = "")]
    pub password: String,
}

/// kubectl's profile names (`--profile`).
const PROFILES: &[&str] = &[
    "none",
    "cpu",
    "heap",
    "goroutine",
    "threadcreate",
    "block",
    "mutex",
];

/// client-go's `clientcmd.ParseTimeout`: a non-negative integer of seconds
/// or a Go duration.
pub fn parse_request_timeout(s: &str) -> Result<Duration, String> {
    if let Ok(i) = protocol::go::pflag::parse_int(s, 10, 64) {
        if i >= 0 {
            return Ok(Duration::from_secs(i as u64));
        }
    }
    if let Ok(ns) = protocol::go::pflag::parse_duration(s) {
        return Ok(Duration::from_nanos(ns.max(0) as u64));
    }
    Err("Invalid timeout value. Timeout must be a single integer in seconds, or an integer followed by a corresponding time unit (e.g. 1s | 2m | 3h)".into())
}

/// Go's `time.ParseDuration`.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let err = || format!("time: invalid duration {s:?}");
    let mut rest = s.trim_start_matches('+');
    if rest.starts_with('-') {
        return Err(format!("negative duration {s:?} is not allowed"));
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let n: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += n * scale;
        rest = &rest[unit_end..];
    }
    Ok(Duration::from_secs_f64(total))
}

/// Adds the trailing `/` kubectl adds to a prefix.
pub fn with_slash(prefix: &str) -> String {
    if prefix.ends_with('/') {
        prefix.to_string()
    } else {
        format!("{prefix}/")
    }
}

impl ProxyArgs {
    /// kubectl's validation.
    pub fn validate(&self) -> Result<(), String> {
        if !PROFILES.contains(&self.profile.as_str()) {
            return Err(format!("unknown profile '{}'", self.profile));
        }
        parse_request_timeout(&self.request_timeout)?;
        if self.port != DEFAULT_PORT && !self.unix_socket.is_empty() {
            return Err("cannot set --unix-socket and --port at the same time".into());
        }
        if with_slash(&self.api_prefix) == with_slash(&self.www_prefix) && !self.www.is_empty() {
            return Err(format!(
                "--api-prefix and --www-prefix both register {:?}",
                with_slash(&self.api_prefix)
            ));
        }
        Ok(())
    }

    pub fn driver(&self) -> Driver {
        self.driver
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_go_duration("0s").unwrap(), Duration::ZERO);
        assert_eq!(parse_go_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_go_duration("1.5h").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            parse_go_duration("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert!(parse_go_duration("5").is_err());
        assert!(parse_go_duration("s").is_err());
        assert!(parse_go_duration("").is_err());
    }
}
