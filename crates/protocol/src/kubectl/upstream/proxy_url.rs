//! Which proxy, if any, a client-go connection to the API server goes
//! through: the kubeconfig's `proxy-url` (client-go
//! tools/clientcmd/client_config.go `parseProxyURL`, any host, no
//! exceptions), else the environment as Go's `http.ProxyFromEnvironment`
//! (golang.org/x/net/http/httpproxy: `HTTPS_PROXY` for https targets,
//! `HTTP_PROXY` for http ones, upper case first; `NO_PROXY` entries are
//! hosts, domains, `.suffix`, `*.suffix`, IPs, CIDRs, with an optional
//! port, or `*`; localhost and loopback IPs are never proxied).
//! Pure string logic: nothing here resolves names or opens sockets.

use std::net::IpAddr;

/// The proxy protocols client-go accepts in `proxy-url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyScheme {
    Http,
    Https,
    Socks5,
}

/// A parsed proxy URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyUrl {
    pub scheme: ProxyScheme,
    /// Host without brackets.
    pub host: String,
    pub port: u16,
    /// Userinfo, percent-decoded (user, password).
    pub user: Option<(String, String)>,
}

impl ProxyUrl {
    /// `host:port` to dial (IPv6 bracketed).
    pub fn addr(&self) -> String {
        crate::go::net::join_host_port(&self.host, self.port)
    }

    /// The `Proxy-Authorization` value Go's transport sends (Basic, from
    /// the userinfo), if any.
    pub fn basic_auth(&self) -> Option<String> {
        let (u, p) = self.user.as_ref()?;
        Some(format!("Basic {}", base64(format!("{u}:{p}").as_bytes())))
    }
}

/// Standard base64 with padding (Basic credentials), as Go's
/// `base64.StdEncoding.EncodeToString`.
pub fn base64(input: &[u8]) -> String {
    use ::base64::Engine as _;
    ::base64::engine::general_purpose::STANDARD.encode(input)
}

/// Userinfo as Go's `url.Parse` unescapes it: `+` is itself; a bad
/// escape or bytes that are not UTF-8 refuse the URL.
fn percent_decode(s: &str) -> Option<String> {
    crate::go::percent::decode_utf8(s, crate::go::percent::Plus::Literal)
}

/// Why a proxy URL was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyUrlError {
    /// client-go: `could not parse: %v`.
    #[error("could not parse: {0}")]
    Parse(String),
    /// client-go: `unsupported scheme %q, must be http, https, or socks5`.
    #[error("unsupported scheme {0:?}, must be http, https, or socks5")]
    Scheme(String),
}

/// Splits `scheme://[user[:pass]@]host[:port][/...]` as Go's `url.Parse`
/// would for the parts a proxy needs. `Ok(None)` for the scheme when the
/// text has no `scheme:` prefix.
fn split(raw: &str) -> Result<(String, Option<String>, String, Option<u16>), ProxyUrlError> {
    let bad = || ProxyUrlError::Parse(raw.to_string());
    if raw.bytes().any(|c| c < 0x21 || c == 0x7f) {
        return Err(bad());
    }
    // Go's getScheme: letters first, then letters, digits, `+-.`, up to ':'.
    let (scheme, rest) = match raw.split_once(':') {
        Some((s, r))
            if s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.')) =>
        {
            match r.strip_prefix("//") {
                Some(r) => (s.to_ascii_lowercase(), r),
                // Opaque (`scheme:rest`): no host.
                None => (s.to_ascii_lowercase(), ""),
            }
        }
        _ => (String::new(), raw),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u.to_string()), h),
        None => (None, authority),
    };
    let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
        let (h, after) = r.split_once(']').ok_or_else(bad)?;
        match after {
            "" => (h.to_string(), None),
            p => (h.to_string(), Some(p.strip_prefix(':').ok_or_else(bad)?)),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (hostport.to_string(), None),
        }
    };
    let port = match port {
        None | Some("") => None,
        Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
    };
    Ok((scheme, userinfo, host, port))
}

fn build(
    raw: &str,
    scheme: ProxyScheme,
    userinfo: Option<String>,
    host: String,
    port: Option<u16>,
) -> Result<ProxyUrl, ProxyUrlError> {
    let user = match userinfo {
        None => None,
        Some(u) => {
            let (n, p) = u.split_once(':').unwrap_or((&u, ""));
            let dec = |s: &str| percent_decode(s).ok_or_else(|| ProxyUrlError::Parse(raw.into()));
            Some((dec(n)?, dec(p)?))
        }
    };
    let default = match scheme {
        ProxyScheme::Http => 80,
        ProxyScheme::Https => 443,
        ProxyScheme::Socks5 => 1080,
    };
    Ok(ProxyUrl {
        scheme,
        host,
        port: port.unwrap_or(default),
        user,
    })
}

fn scheme_of(s: &str) -> Option<ProxyScheme> {
    match s {
        "http" => Some(ProxyScheme::Http),
        "https" => Some(ProxyScheme::Https),
        "socks5" => Some(ProxyScheme::Socks5),
        _ => None,
    }
}

/// A kubeconfig `proxy-url`, checked as client-go's `parseProxyURL`.
pub fn parse_kubeconfig_proxy(raw: &str) -> Result<ProxyUrl, ProxyUrlError> {
    let (scheme, userinfo, host, port) = split(raw)?;
    let s = scheme_of(&scheme).ok_or(ProxyUrlError::Scheme(scheme))?;
    build(raw, s, userinfo, host, port)
}

/// An environment proxy value as httpproxy's `parseProxy`: a value
/// without a known scheme is read as `http://VALUE`; unusable values are
/// ignored (`None`), as Go does.
pub fn parse_env_proxy(raw: &str) -> Option<ProxyUrl> {
    if raw.is_empty() {
        return None;
    }
    let parsed = split(raw)
        .ok()
        .and_then(|(s, u, h, p)| Some((scheme_of(&s)?, u, h, p)));
    let (s, u, h, p) = match parsed {
        Some(v) => v,
        None => {
            let with = format!("http://{raw}");
            let (_, u, h, p) = split(&with).ok()?;
            (ProxyScheme::Http, u, h, p)
        }
    };
    build(raw, s, u, h, p).ok()
}

/// One `NO_PROXY` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NoProxyEntry {
    All,
    Cidr(IpAddr, u8),
    Ip(IpAddr, String),
    /// Suffix with its leading dot; `exact`: the bare name matches too.
    Domain {
        suffix: String,
        port: String,
        exact: bool,
    },
}

fn parse_cidr(s: &str) -> Option<(IpAddr, u8)> {
    let (ip, bits) = s.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let bits: u8 = bits.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (bits <= max && !bits.to_string().is_empty()).then_some((ip, bits))
}

fn in_cidr(net: IpAddr, bits: u8, ip: IpAddr) -> bool {
    let to128 = |ip: IpAddr| match ip {
        IpAddr::V4(v) => (u128::from(u32::from(v)) << 96, 32u32),
        IpAddr::V6(v) => (u128::from(v), 128u32),
    };
    // Go's IPNet.Contains compares an IPv4 network with the IPv4 form of
    // an IPv4-mapped address and vice versa.
    let ip = match (net, ip) {
        (IpAddr::V4(_), IpAddr::V6(v)) => match v.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => return false,
        },
        (IpAddr::V6(_), IpAddr::V4(_)) => return false,
        _ => ip,
    };
    let (n, len) = to128(net);
    let (i, _) = to128(ip);
    let bits = u32::from(bits).min(len);
    if bits == 0 {
        return true;
    }
    let mask = u128::MAX << (128 - bits);
    n & mask == i & mask
}

fn same_ip(a: IpAddr, b: IpAddr) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v) => v.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        ip => ip,
    };
    canon(a) == canon(b)
}

/// Go's `net.SplitHostPort` for NO_PROXY entries.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(r) = s.strip_prefix('[') {
        let (h, after) = r.split_once(']')?;
        return Some((h, after.strip_prefix(':')?));
    }
    let (h, p) = s.rsplit_once(':')?;
    (!h.contains(':')).then_some((h, p))
}

/// The proxy settings read from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvProxy {
    http: Option<ProxyUrl>,
    https: Option<ProxyUrl>,
    no_proxy: Vec<NoProxyEntry>,
}

impl EnvProxy {
    /// From a variable lookup (`HTTP_PROXY` before `http_proxy`, ...).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> EnvProxy {
        let any = |a: &str, b: &str| get(a).filter(|v| !v.is_empty()).or_else(|| get(b));
        let mut cfg = EnvProxy {
            http: any("HTTP_PROXY", "http_proxy")
                .as_deref()
                .and_then(parse_env_proxy),
            https: any("HTTPS_PROXY", "https_proxy")
                .as_deref()
                .and_then(parse_env_proxy),
            no_proxy: Vec::new(),
        };
        let no = any("NO_PROXY", "no_proxy").unwrap_or_default();
        for p in no.split(',') {
            let p = p.trim().to_ascii_lowercase();
            if p.is_empty() {
                continue;
            }
            if p == "*" {
                cfg.no_proxy = vec![NoProxyEntry::All];
                return cfg;
            }
            if let Some((ip, bits)) = parse_cidr(&p) {
                cfg.no_proxy.push(NoProxyEntry::Cidr(ip, bits));
                continue;
            }
            let (phost, pport) = match split_host_port(&p) {
                Some(("", _)) => continue,
                Some((h, port)) => (h.to_string(), port.to_string()),
                None => (p.clone(), String::new()),
            };
            if let Ok(ip) = phost.parse::<IpAddr>() {
                cfg.no_proxy.push(NoProxyEntry::Ip(ip, pport));
                continue;
            }
            let mut phost = phost
                .strip_prefix("*.")
                .map_or(phost.clone(), |h| format!(".{h}"));
            let exact = !phost.starts_with('.');
            if exact {
                phost.insert(0, '.');
            }
            cfg.no_proxy.push(NoProxyEntry::Domain {
                suffix: phost,
                port: pport,
                exact,
            });
        }
        cfg
    }

    /// The proxy for a target (`https`: the target scheme), or None.
    pub fn proxy_for(&self, https: bool, host: &str, port: u16) -> Option<ProxyUrl> {
        let proxy = if https { &self.https } else { &self.http };
        let proxy = proxy.as_ref()?;
        self.use_proxy(host, port).then(|| proxy.clone())
    }

    /// httpproxy's `useProxy`.
    fn use_proxy(&self, host: &str, port: u16) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host == "localhost" {
            return false;
        }
        let ip = host.parse::<IpAddr>().ok();
        if ip.is_some_and(|ip| {
            ip.is_loopback()
                || matches!(ip, IpAddr::V6(v) if v.to_ipv4_mapped().is_some_and(|v| v.is_loopback()))
        }) {
            return false;
        }
        let host = host.trim().to_ascii_lowercase();
        let port = port.to_string();
        for m in &self.no_proxy {
            let hit = match (m, ip) {
                (NoProxyEntry::All, _) => true,
                (NoProxyEntry::Cidr(n, b), Some(ip)) => in_cidr(*n, *b, ip),
                (NoProxyEntry::Ip(m, p), Some(ip)) => {
                    same_ip(*m, ip) && (p.is_empty() || *p == port)
                }
                (
                    NoProxyEntry::Domain {
                        suffix,
                        port: p,
                        exact,
                    },
                    _,
                ) => {
                    (host.ends_with(suffix.as_str()) || (*exact && host == suffix[1..]))
                        && (p.is_empty() || *p == port)
                }
                _ => false,
            };
            if hit {
                return false;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> EnvProxy {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        EnvProxy::from_lookup(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
    }

    #[test]
    fn kubeconfig_urls_as_client_go() {
        let p = parse_kubeconfig_proxy("http://u%40x:p%3A@proxy.example:3128").unwrap();
        assert_eq!(p.scheme, ProxyScheme::Http);
        assert_eq!(p.addr(), "proxy.example:3128");
        assert_eq!(p.user, Some(("u@x".into(), "p:".into())));
        assert_eq!(p.basic_auth().unwrap(), "Basic dUB4OnA6");
        let s = parse_kubeconfig_proxy("socks5://[::1]").unwrap();
        assert_eq!(
            (s.scheme, s.addr()),
            (ProxyScheme::Socks5, "[::1]:1080".into())
        );
        assert_eq!(parse_kubeconfig_proxy("https://h").unwrap().port, 443);
        assert_eq!(
            parse_kubeconfig_proxy("ftp://bad:1")
                .unwrap_err()
                .to_string(),
            "unsupported scheme \"ftp\", must be http, https, or socks5"
        );
        assert_eq!(
            parse_kubeconfig_proxy("http://a b")
                .unwrap_err()
                .to_string(),
            "could not parse: http://a b"
        );
        assert_eq!(
            parse_kubeconfig_proxy("proxy:3128").unwrap_err(),
            ProxyUrlError::Scheme("proxy".into())
        );
    }

    /// Userinfo unescaping as Go's `url.Parse`: `+` stays a `+`, a bad
    /// escape refuses the URL (`%+1` too: Go checks for two hex digits;
    /// the hand-written decoder before took it as 0x01), and the Basic
    /// credentials are standard base64 with padding.
    #[test]
    fn userinfo_escapes_as_go() {
        let p = parse_kubeconfig_proxy("http://a+b:c%2Bd%20e@h:1").unwrap();
        assert_eq!(p.user, Some(("a+b".into(), "c+d e".into())));
        for bad in ["http://u:%+1@h:1", "http://u:%zz@h:1", "http://u%4@h:1"] {
            assert_eq!(
                parse_kubeconfig_proxy(bad),
                Err(ProxyUrlError::Parse(bad.into())),
                "{bad}"
            );
        }
        for (input, want) in [("", ""), ("a", "YQ=="), ("ab", "YWI="), ("abc", "YWJj")] {
            assert_eq!(base64(input.as_bytes()), want);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8=");
    }

    #[test]
    fn env_scheme_per_target_and_case() {
        let e = env(&[("https_proxy", "p1:8080"), ("HTTP_PROXY", "socks5://s:1")]);
        let p = e.proxy_for(true, "10.0.0.1", 443).unwrap();
        assert_eq!((p.scheme, p.addr()), (ProxyScheme::Http, "p1:8080".into()));
        let p = e.proxy_for(false, "10.0.0.1", 80).unwrap();
        assert_eq!(p.scheme, ProxyScheme::Socks5);
        let e = env(&[("HTTPS_PROXY", "http://A:1"), ("https_proxy", "http://b:2")]);
        assert_eq!(e.proxy_for(true, "x", 1).unwrap().host, "A");
        assert_eq!(env(&[]).proxy_for(true, "x", 1), None);
    }

    #[test]
    fn loopback_never_from_env() {
        let e = env(&[("HTTPS_PROXY", "http://p:1")]);
        for h in ["localhost", "127.0.0.1", "127.9.9.9", "::1", "[::1]"] {
            assert_eq!(e.proxy_for(true, h, 443), None, "{h}");
        }
        assert!(e.proxy_for(true, "localhost.example", 443).is_some());
    }

    #[test]
    fn no_proxy_matching() {
        let e = env(&[
            ("HTTPS_PROXY", "http://p:1"),
            (
                "NO_PROXY",
                " Example.com, .suffix.org,*.star.net,10.1.0.0/16,192.168.1.5,[2001:db8::1]:8443,host.x:6443,:99",
            ),
        ]);
        let bypass = |h: &str, p: u16| e.proxy_for(true, h, p).is_none();
        assert!(bypass("example.com", 443));
        assert!(bypass("api.example.com", 443));
        assert!(!bypass("notexample.com", 443));
        assert!(bypass("a.suffix.org", 1));
        assert!(!bypass("suffix.org", 1));
        assert!(bypass("a.star.net", 1));
        assert!(!bypass("star.net", 1));
        assert!(bypass("10.1.200.3", 6443));
        assert!(!bypass("10.2.0.1", 6443));
        assert!(bypass("192.168.1.5", 1));
        assert!(bypass("2001:db8::1", 8443));
        assert!(!bypass("2001:db8::1", 443));
        assert!(bypass("host.x", 6443));
        assert!(!bypass("host.x", 443));
        let all = env(&[("HTTPS_PROXY", "http://p:1"), ("no_proxy", "a,*")]);
        assert!(all.proxy_for(true, "anything", 1).is_none());
    }
}
