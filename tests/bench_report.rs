//! Runs the unit tests of the comparison harness's report writer
//! (`benches/compare/report.rs`, `fleet_table.rs`, `soak_table.rs`,
//! `upgrade_table.rs`), its plots (`plot.rs`), its /proc CPU reader
//! (`cpu.rs`) and its process probes (`probe.rs`): bench targets built
//! without the test harness never run their own `#[test]`s.

#[allow(dead_code)]
#[path = "../benches/compare/cpu.rs"]
mod cpu;
#[path = "../benches/compare/fleet_table.rs"]
mod fleet_table;
#[allow(dead_code)]
#[path = "../benches/compare/model.rs"]
mod model;
#[allow(dead_code)]
#[path = "../benches/compare/plot.rs"]
mod plot;
#[allow(dead_code)]
#[path = "../benches/compare/probe.rs"]
mod probe;
#[allow(dead_code)]
#[path = "../benches/compare/report.rs"]
mod report;
#[path = "../benches/compare/soak_table.rs"]
mod soak_table;
#[path = "../benches/compare/upgrade_table.rs"]
mod upgrade_table;
