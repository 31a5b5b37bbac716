//! The pre-authentication cap: how many accepted connections may be in
//! their handshake (TLS, HTTP/2, first request, token review) at once, in
//! total and per source address. A connection over either cap is closed at
//! once by the accept loop, so an unauthenticated flood holds at most
//! `total` descriptors and cannot take the ones other listeners need.
//!
//! [`Table`] is the pure count; [`Admission`] shares it between the cores
//! (one short lock per accept) and hands out [`Permit`]s that give their
//! slot back when dropped.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// The caps; 0 means no cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_ip: usize,
}

/// Why a connection was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("too many connections in their handshake")]
    Total,
    #[error("too many connections in their handshake from this address")]
    PerIp,
}

impl Refused {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refused::Total => "total",
            Refused::PerIp => "per_ip",
        }
    }
}

/// Connections in their handshake, in total and by source address.
#[derive(Debug)]
pub struct Table {
    limits: Limits,
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// IPv4-mapped IPv6 addresses count as the IPv4 address.
fn key(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

impl Table {
    pub fn new(limits: Limits) -> Self {
        Table {
            limits,
            total: 0,
            by_ip: HashMap::new(),
        }
    }

    /// Takes a slot for a connection from `ip` (`None`: no address, only
    /// the total counts), or says which cap is full.
    pub fn admit(&mut self, ip: Option<IpAddr>) -> Result<(), Refused> {
        if self.limits.total != 0 && self.total >= self.limits.total {
            return Err(Refused::Total);
        }
        if let Some(ip) = ip {
            let n = self.by_ip.entry(key(ip)).or_insert(0);
            if self.limits.per_ip != 0 && *n >= self.limits.per_ip {
                return Err(Refused::PerIp);
            }
            *n += 1;
        }
        self.total += 1;
        Ok(())
    }

    /// Gives back a slot taken by [`Table::admit`].
    pub fn release(&mut self, ip: Option<IpAddr>) {
        self.total = self.total.saturating_sub(1);
        if let Some(ip) = ip {
            let k = key(ip);
            if let Some(n) = self.by_ip.get_mut(&k) {
                *n -= 1;
                if *n == 0 {
                    self.by_ip.remove(&k);
                }
            }
        }
    }

    /// Connections in their handshake.
    pub fn in_progress(&self) -> usize {
        self.total
    }

    /// Addresses with a connection in its handshake.
    pub fn addresses(&self) -> usize {
        self.by_ip.len()
    }
}

/// Where the cap reports: the in-progress gauge and refusals by cap.
#[derive(Debug, Clone, Default)]
pub struct AdmissionMetrics {
    pub in_progress: Gauge,
    pub refused_total: Counter,
    pub refused_per_ip: Counter,
}

/// A [`Table`] shared by every core.
#[derive(Debug)]
pub struct Admission {
    table: Mutex<Table>,
    metrics: AdmissionMetrics,
}

impl Admission {
    pub fn new(limits: Limits, metrics: AdmissionMetrics) -> Arc<Self> {
        Arc::new(Admission {
            table: Mutex::new(Table::new(limits)),
            metrics,
        })
    }

    /// A permit for a connection from `ip`, or why there is none (counted).
    pub fn admit(self: &Arc<Self>, ip: Option<IpAddr>) -> Result<Permit, Refused> {
        let r = self.table.lock().expect("admission lock").admit(ip);
        match r {
            Ok(()) => {
                self.metrics.in_progress.inc();
                Ok(Permit {
                    owner: self.clone(),
                    ip,
                })
            }
            Err(e) => {
                match e {
                    Refused::Total => self.metrics.refused_total.inc(),
                    Refused::PerIp => self.metrics.refused_per_ip.inc(),
                };
                Err(e)
            }
        }
    }

    pub fn in_progress(&self) -> usize {
        self.table.lock().expect("admission lock").in_progress()
    }
}

/// A connection's slot while it is in its handshake; dropping it (the
/// handshake is done, or the connection is gone) frees the slot.
#[derive(Debug)]
pub struct Permit {
    owner: Arc<Admission>,
    ip: Option<IpAddr>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.owner
            .table
            .lock()
            .expect("admission lock")
            .release(self.ip);
        self.owner.metrics.in_progress.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn total_cap() {
        let mut t = Table::new(Limits {
            total: 2,
            per_ip: 0,
        });
        assert_eq!(t.admit(ip("10.0.0.1")), Ok(()));
        assert_eq!(t.admit(ip("10.0.0.2")), Ok(()));
        assert_eq!(t.admit(ip("10.0.0.3")), Err(Refused::Total));
        assert_eq!(t.admit(None), Err(Refused::Total));
        t.release(ip("10.0.0.1"));
        assert_eq!(t.admit(None), Ok(()));
        assert_eq!(t.in_progress(), 2);
    }

    #[test]
    fn per_ip_cap_and_mapped_addresses() {
        let mut t = Table::new(Limits {
            total: 10,
            per_ip: 2,
        });
        assert_eq!(t.admit(ip("10.0.0.1")), Ok(()));
        assert_eq!(t.admit(ip("::ffff:10.0.0.1")), Ok(()));
        assert_eq!(t.admit(ip("10.0.0.1")), Err(Refused::PerIp));
        assert_eq!(t.admit(ip("10.0.0.2")), Ok(()));
        // A refusal takes no slot.
        assert_eq!(t.in_progress(), 3);
        t.release(ip("::ffff:10.0.0.1"));
        assert_eq!(t.admit(ip("10.0.0.1")), Ok(()));
        t.release(ip("10.0.0.1"));
        t.release(ip("10.0.0.1"));
        t.release(ip("10.0.0.2"));
        assert_eq!((t.in_progress(), t.addresses()), (0, 0));
    }

    #[test]
    fn zero_means_no_cap() {
        let mut t = Table::new(Limits {
            total: 0,
            per_ip: 0,
        });
        for _ in 0..10_000 {
            t.admit(ip("10.0.0.1")).unwrap();
        }
    }

    #[test]
    fn permits_release_and_count() {
        let m = AdmissionMetrics::default();
        let a = Admission::new(
            Limits {
                total: 1,
                per_ip: 1,
            },
            m.clone(),
        );
        let p = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.2")).unwrap_err(), Refused::Total);
        assert_eq!(m.in_progress.get(), 1);
        drop(p);
        assert_eq!(m.in_progress.get(), 0);
        assert_eq!(a.in_progress(), 0);
        let _p = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(m.refused_total.get(), 1);
    }
}
