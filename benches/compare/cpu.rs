//! CPU time of a system's processes from `/proc/PID/stat`, for the CPU
//! seconds per GB of the bulk scenarios.
//!
//! [`parse_stat`] is the pure part: it takes the text of one stat file and
//! returns the process's own and its reaped children's user+system clock
//! ticks. [`cpu_seconds`] reads a set of pids and converts ticks to seconds
//! with `sysconf(_SC_CLK_TCK)`.
//!
//! Counting rule: a process's own ticks (`utime + stime`, all its threads)
//! plus its reaped children's (`cutime + cstime`). Summed over a system's
//! roots and all their live descendants, every tick is counted once: while
//! a child lives it is in its own fields, once its parent has waited for it
//! in the parent's `c*` fields (socat forks a child per connection that
//! exits when its connection ends).

/// Clock ticks from one `/proc/PID/stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StatTicks {
    /// `utime + stime` (fields 14 and 15): the process's own threads.
    pub own: u64,
    /// `cutime + cstime` (fields 16 and 17): children it has waited for.
    pub children: u64,
}

impl StatTicks {
    /// Own and reaped children's ticks together.
    pub(crate) fn total(self) -> u64 {
        self.own.saturating_add(self.children)
    }
}

/// Parses the text of `/proc/PID/stat`: "pid (comm) state ppid ...". The
/// command name may hold spaces and parentheses, so fields are counted
/// from the last ')'. None when the text is not a stat line.
pub(crate) fn parse_stat(stat: &str) -> Option<StatTicks> {
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    // After ')': field 3 (state) is index 0, so field N is index N - 3.
    let fields: Vec<&str> = rest.split_whitespace().take(15).collect();
    let num = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some(StatTicks {
        own: num(14)?.checked_add(num(15)?)?,
        children: num(16)?.checked_add(num(17)?)?,
    })
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 on Linux).
#[allow(unsafe_code)]
pub(crate) fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no memory effects.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// Seconds of CPU of `ticks` at `per_second` ticks a second.
pub(crate) fn ticks_to_seconds(ticks: u64, per_second: u64) -> f64 {
    ticks as f64 / per_second.max(1) as f64
}

/// CPU seconds (user + system) of the processes `pids` and of their reaped
/// children; a pid that is gone counts 0.
pub(crate) fn cpu_seconds(pids: &[u32]) -> f64 {
    let ticks: u64 = pids
        .iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|s| parse_stat(&s))
        .map(StatTicks::total)
        .sum();
    ticks_to_seconds(ticks, clock_ticks())
}

/// Fewest clock ticks a CPU figure is reported from: below this, one tick
/// is more than 5% of it (quick runs move a few MiB and measure 0-2 ticks).
pub(crate) const MIN_TICKS: f64 = 20.0;

/// Whether `cpu_seconds` spans enough clock ticks to be worth reporting.
pub(crate) fn measurable(cpu_seconds: f64) -> bool {
    cpu_seconds * clock_ticks() as f64 >= MIN_TICKS
}

/// CPU seconds per GB (10^9 bytes) moved; NaN when nothing moved.
pub(crate) fn seconds_per_gb(cpu_seconds: f64, bytes: u64) -> f64 {
    if bytes == 0 {
        f64::NAN
    } else {
        cpu_seconds / (bytes as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
    #[allow(unused_imports)] // bench builds drop the #[test]s that use it
    use super::*;

    #[test]
    fn too_few_ticks_are_not_a_figure() {
        let tick = 1.0 / clock_ticks() as f64;
        assert!(!measurable(0.0));
        assert!(!measurable(2.0 * tick));
        assert!(measurable(MIN_TICKS * tick));
    }

    #[test]
    fn parses_fields_14_to_17() {
        // A real line of /proc/PID/stat (fields 14-17 are 1234 56 7 8).
        let line = "4242 (haproxy) S 1 4242 4242 0 -1 4194560 2090 0 0 0 1234 56 7 8 20 0 3 0 \
                    123456 98304000 2048 18446744073709551615 1 1 0 0 0 0 0 4096 1 0 0 0 17 1 0 0 0 0 0\n";
        let t = parse_stat(line).expect("parses");
        assert_eq!(
            t,
            StatTicks {
                own: 1290,
                children: 15
            }
        );
        assert_eq!(t.total(), 1305);
    }

    #[test]
    fn command_names_with_spaces_and_parentheses() {
        let line = "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 10 20 30 40 20 0 1 0 5 0 0";
        assert_eq!(
            parse_stat(line),
            Some(StatTicks {
                own: 30,
                children: 70
            })
        );
    }

    #[test]
    fn rejects_what_is_not_a_stat_line() {
        assert_eq!(parse_stat(""), None);
        assert_eq!(parse_stat("no parenthesis 1 2 3"), None);
        // Truncated before cstime.
        assert_eq!(parse_stat("1 (x) S 0 0 0 0 0 0 0 0 0 0 1 2 3"), None);
        // Not a number, and a sum that overflows.
        assert_eq!(parse_stat("1 (x) S 0 0 0 0 0 0 0 0 0 0 1 z 3 4"), None);
        let big = u64::MAX;
        assert_eq!(
            parse_stat(&format!("1 (x) S 0 0 0 0 0 0 0 0 0 0 {big} 1 3 4")),
            None
        );
        // Own and children's sums each fit, their total saturates.
        let t = parse_stat(&format!("1 (x) S 0 0 0 0 0 0 0 0 0 0 {big} 0 {big} 0")).unwrap();
        assert_eq!(t.total(), u64::MAX);
    }

    #[test]
    fn ticks_and_gigabytes() {
        assert_eq!(ticks_to_seconds(250, 100), 2.5);
        assert_eq!(ticks_to_seconds(7, 0), 7.0);
        assert_eq!(seconds_per_gb(1.5, 3_000_000_000), 0.5);
        assert!(seconds_per_gb(1.0, 0).is_nan());
        assert!(clock_ticks() > 0);
    }

    #[test]
    fn counts_a_real_process_burning_cpu() {
        // This process burns about 0.3 s of CPU; /proc must see at least
        // part of it (ticks are 10 ms).
        let me = [std::process::id()];
        let before = cpu_seconds(&me);
        let t0 = std::time::Instant::now();
        let mut x: u64 = 1;
        while t0.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let after = cpu_seconds(&me);
        assert!(after - before >= 0.05, "before {before} after {after}");
        assert_eq!(cpu_seconds(&[u32::MAX]), 0.0);
    }

    #[test]
    fn reaped_children_move_into_the_parent() {
        // A child that burns CPU and is waited for: its ticks show up in
        // our children's fields.
        let me = std::process::id();
        let read =
            || parse_stat(&std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap()).unwrap();
        let before = read();
        let status = std::process::Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done"])
            .status()
            .expect("sh runs");
        assert!(status.success());
        let after = read();
        assert!(after.children > before.children, "{before:?} -> {after:?}");
    }
}
