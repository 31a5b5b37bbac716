//! Go's `net` helpers the tunnel and the kubectl proxy both need.

/// `host:port`, bracketing an IPv6 host, as Go's `net.JoinHostPort`.
pub fn join_host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_ipv6_hosts_only() {
        assert_eq!(join_host_port("::1", 8091), "[::1]:8091");
        assert_eq!(join_host_port("node.example", 8091), "node.example:8091");
        assert_eq!(join_host_port("10.0.0.1", "443"), "10.0.0.1:443");
    }
}
