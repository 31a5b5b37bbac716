//! The Prometheus text exposition (0.0.4, [`CONTENT_TYPE`]) shared by
//! every role's `/metrics`: families registered under their exact names
//! ([`Exact`]), counters shown with Go client's names ([`ExactCounter`]),
//! and the process and build families ([`process`]). The roles own their
//! families; this module owns only how they are written out.

pub mod process;

use std::fmt;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    prometheus_text, DescriptorEncoder, EncodeMetric, MetricEncoder,
};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

/// `Content-Type` of [`Exposition::render`]'s output.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// A counter shown under its exact name (no `_total` added) with
/// `# TYPE <name> counter`, as Go's client shows ANP's `*_count` counters
/// (e.g. `dial_failure_count`). prometheus-client adds `_total` to every
/// sample of a counter family, so the family is encoded as untyped and
/// [`Exposition::render`] retypes it (see [`Exact::add_counter`]).
#[derive(Debug, Clone, Default)]
pub struct ExactCounter(Counter);

impl ExactCounter {
    pub fn inc(&self) {
        self.0.inc();
    }
    pub fn get(&self) -> u64 {
        self.0.get()
    }
}

impl TypedMetric for ExactCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for ExactCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        encoder.encode_gauge(&self.0.get())
    }
    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// Families encoded with their exact name and help text (the registry's
/// own `register` appends a period to every help text).
#[derive(Debug, Default)]
pub struct Exact {
    items: Vec<(String, &'static str, Box<dyn Metric>)>,
    /// Families of [`ExactCounter`]s, shown as counters.
    counters: Vec<String>,
}

impl Exact {
    pub fn add(&mut self, name: impl Into<String>, help: &'static str, m: impl Metric) {
        self.items.push((name.into(), help, Box::new(m)));
    }

    /// A family of [`ExactCounter`]s (or one), under `name` exactly.
    pub fn add_counter(&mut self, name: impl Into<String>, help: &'static str, m: impl Metric) {
        let name = name.into();
        self.counters.push(name.clone());
        self.add(name, help, m);
    }
}

impl Collector for Exact {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        for (name, help, metric) in &self.items {
            if metric.is_empty() {
                continue;
            }
            let e = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
            metric.encode(e)?;
        }
        Ok(())
    }
}

/// A registry of [`Exact`] families plus the process and build families
/// ([`process`]), rendered in the Prometheus text format.
#[derive(Debug)]
pub struct Exposition {
    registry: Registry,
    counters: Vec<String>,
}

impl Exposition {
    pub fn new(mut exact: Exact) -> Self {
        let counters = std::mem::take(&mut exact.counters);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(exact));
        registry.register_collector(Box::new(process::ProcessCollector));
        Exposition { registry, counters }
    }

    /// The Prometheus text exposition ([`CONTENT_TYPE`]).
    pub fn render(&self) -> String {
        let mut s = String::new();
        prometheus_text::encode(&mut s, &self.registry).expect("writing to a String");
        for name in &self.counters {
            let untyped = format!("# TYPE {name} untyped\n");
            if let Some(at) = s.find(&untyped) {
                s.replace_range(at..at + untyped.len(), &format!("# TYPE {name} counter\n"));
            }
        }
        s
    }
}
