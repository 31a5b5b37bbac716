//! The comparison harness's `/proc/PID/stat` reader (benches/compare/cpu.rs)
//! on arbitrary text: no panics, and a line it accepts keeps its figures
//! when the command name changes (fields count from the last ')').
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../benches/compare/cpu.rs"]
mod cpu;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some(ticks) = cpu::parse_stat(text) else {
        return;
    };
    let _ = ticks.total();
    let after = &text[text.rfind(')').expect("accepted lines have a ')'")..];
    let renamed = format!("1 (a (b) c{after}");
    assert_eq!(cpu::parse_stat(&renamed), Some(ticks));
});
