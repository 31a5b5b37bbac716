//! CPU time of a system's processes from `/proc/PID/stat` and of the
//! machine from `/proc/stat`: CPU seconds per GB in the bulk scenarios, CPU
//! per request at saturation, and where the CPU went (busiest thread,
//! machine idle) in core scaling.
//!
//! [`parse_stat`] and [`parse_machine_stat`] are the pure parts: they take
//! the text of one process's stat file (its own and its reaped children's
//! user and system clock ticks) and of `/proc/stat` (the machine's idle and
//! total ticks). [`Snapshot::take`] reads a set of pids, their threads and
//! the machine; [`Window::between`] turns two snapshots into CPU seconds,
//! the user-mode part, the busiest thread's share of a core and the
//! machine's idle share, with `sysconf(_SC_CLK_TCK)` ticks a second.
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
    /// `utime + cutime`: the user-mode part of `own + children`.
    pub user: u64,
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
        user: num(14)?.saturating_add(num(16)?),
    })
}

/// Idle (`idle + iowait`) and total clock ticks of all CPUs, from the text
/// of `/proc/stat` (its first line, "cpu  user nice system idle iowait
/// irq softirq steal ..."). None when the line is not there.
pub(crate) fn parse_machine_stat(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    if v.len() < 5 {
        return None;
    }
    // guest and guest_nice (fields 9 and 10) are already inside user and nice.
    let total: u64 = v.iter().take(8).sum();
    Some((v[3] + v[4], total))
}

/// What a system's processes and the machine had used up to one moment:
/// two of them make a [`Window`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    /// User + system ticks of the system's processes (see [`cpu_seconds`]).
    pub ticks: u64,
    /// The user-mode part of `ticks`.
    pub user_ticks: u64,
    /// Ticks of each live thread of the system's processes, by
    /// (pid, tid).
    pub threads: Vec<((u32, u32), u64)>,
    /// Idle and total ticks of the whole machine (all CPUs).
    pub machine: (u64, u64),
}

/// One process's clock ticks, from `/proc/PID/stat`.
pub(crate) fn process_ticks(pid: u32) -> Option<StatTicks> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

impl Snapshot {
    /// Reads the processes `pids` (with their threads) and `/proc/stat`.
    pub(crate) fn take(pids: &[u32]) -> Snapshot {
        let mut snap = Snapshot {
            machine: std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| parse_machine_stat(&s))
                .unwrap_or_default(),
            ..Snapshot::default()
        };
        for &pid in pids {
            let Some(t) = process_ticks(pid) else {
                continue;
            };
            snap.ticks += t.total();
            snap.user_ticks += t.user;
            let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                continue;
            };
            for task in dir.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|n| n.parse().ok()) else {
                    continue;
                };
                if let Some(t) = std::fs::read_to_string(task.path().join("stat"))
                    .ok()
                    .and_then(|s| parse_stat(&s))
                {
                    snap.threads.push(((pid, tid), t.own));
                }
            }
        }
        snap
    }
}

/// CPU use between two [`Snapshot`]s `wall_seconds` apart.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Window {
    /// CPU seconds of the system's processes (user + system).
    pub seconds: f64,
    /// The user-mode part of `seconds`.
    pub user_seconds: f64,
    /// The busiest single thread's CPU time over the wall time: 1.0 is a
    /// whole core. NaN when no thread lived through both snapshots.
    pub busiest_thread: f64,
    /// Share of all CPUs' time that was idle, 0 to 1 (NaN when
    /// `/proc/stat` was unreadable).
    pub machine_idle: f64,
}

impl Window {
    pub(crate) fn between(a: &Snapshot, b: &Snapshot, wall_seconds: f64) -> Window {
        let hz = clock_ticks();
        let busiest = b
            .threads
            .iter()
            .filter_map(|(id, t1)| {
                let t0 = a.threads.iter().find(|(i, _)| i == id)?.1;
                Some(t1.saturating_sub(t0))
            })
            .max();
        let (idle, total) = (
            b.machine.0.saturating_sub(a.machine.0),
            b.machine.1.saturating_sub(a.machine.1),
        );
        Window {
            seconds: ticks_to_seconds(b.ticks.saturating_sub(a.ticks), hz),
            user_seconds: ticks_to_seconds(b.user_ticks.saturating_sub(a.user_ticks), hz),
            busiest_thread: busiest.map_or(f64::NAN, |t| {
                ticks_to_seconds(t, hz) / wall_seconds.max(f64::MIN_POSITIVE)
            }),
            machine_idle: if total == 0 {
                f64::NAN
            } else {
                idle as f64 / total as f64
            },
        }
    }
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
                children: 15,
                user: 1241
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
                children: 70,
                user: 40
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
    fn machine_idle_from_proc_stat() {
        let text = "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\nintr 1 2\n";
        assert_eq!(parse_machine_stat(text), Some((840, 1000)));
        assert_eq!(parse_machine_stat("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_machine_stat("cpu  1 2 x 4 5\n"), None);
        assert_eq!(parse_machine_stat("cpu  1 2 3\n"), None);
    }

    #[test]
    fn a_window_names_the_busiest_thread_and_the_idle_share() {
        let hz = clock_ticks();
        let a = Snapshot {
            ticks: 10,
            user_ticks: 4,
            threads: vec![((1, 1), 5), ((1, 2), 5), ((2, 3), 0)],
            machine: (100, 400),
        };
        let b = Snapshot {
            ticks: 10 + 3 * hz / 2,
            user_ticks: 4 + hz / 2,
            // Thread 2 gone, thread 4 new: neither is a figure.
            threads: vec![((1, 1), 5 + hz / 4), ((2, 3), hz), ((2, 4), 9 * hz)],
            machine: (150, 600),
        };
        let w = Window::between(&a, &b, 2.0);
        assert!((w.seconds - 1.5).abs() < 1e-9, "{w:?}");
        assert!((w.user_seconds - 0.5).abs() < 1e-9, "{w:?}");
        assert!((w.busiest_thread - 0.5).abs() < 1e-9, "{w:?}");
        assert!((w.machine_idle - 0.25).abs() < 1e-9, "{w:?}");
        let none = Window::between(&Snapshot::default(), &Snapshot::default(), 1.0);
        assert!(none.busiest_thread.is_nan() && none.machine_idle.is_nan());
    }

    #[test]
    fn a_snapshot_sees_this_process_and_its_threads() {
        let me = std::process::id();
        let a = Snapshot::take(&[me]);
        let t0 = std::time::Instant::now();
        let mut x: u64 = 1;
        while t0.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let b = Snapshot::take(&[me]);
        assert!(b.threads.iter().any(|((p, t), _)| *p == me && *t == me));
        assert!(b.machine.1 > a.machine.1, "{:?} {:?}", a.machine, b.machine);
        let w = Window::between(&a, &b, t0.elapsed().as_secs_f64());
        assert!(w.seconds >= 0.05 && w.busiest_thread > 0.1, "{w:?}");
        assert!(w.user_seconds <= w.seconds, "{w:?}");
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
