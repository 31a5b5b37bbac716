//! The process's log output: the filter (`--log`), the line format
//! (`--log-format text|json|klog`), where lines go (stderr, a `--log-file`,
//! or both with a stderr threshold, as klog does), and the rule that
//! logging never takes the process down.
//!
//! A log line that cannot be written (stderr's reader went away: EPIPE; a
//! full disk) is dropped and counted in `edgetunnel_log_write_errors_total`
//! ([`write_errors`]). tracing-subscriber reports its own write failures
//! with `eprintln!`, which panics when stderr is closed; the writers here
//! never report a failure to it, and its internal error reports are off.
//!
//! No thread that logs ever waits for the reader: a line is handed to the
//! `edgetunnel-log` thread through a queue of [`QUEUE_LINES`] lines and
//! that thread does the writes, so a stderr pipe nobody reads (a stalled
//! log shipper) holds up only it. When the queue is full the line is
//! dropped and counted as lost too. [`flush`] drains the queue, waiting a
//! bounded time, before the process exits.
//!
//! The klog format follows klog v2's header (`internal/buffer/buffer.go`
//! `FormatHeader`: `Lmmdd hh:mm:ss.uuuuuu PID file:line] `, the PID padded
//! to 7 columns, local time) and its structured style (`"msg" key="value"`,
//! strings quoted, numbers and booleans bare).

use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

/// How each log line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// tracing's human-readable text.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, fields, target).
    Json,
    /// klog's text: `I1205 16:24:02.123456   12345 file.rs:12] "msg" key="value"`.
    Klog,
}

/// Which lines also go to stderr when logs go to a file (klog's
/// `--stderrthreshold`, `--alsologtostderr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StderrThreshold {
    /// Every line that passes the filter.
    All,
    Info,
    Warn,
    Error,
    /// None.
    Off,
}

impl StderrThreshold {
    /// The least severe level still written to stderr.
    fn level(self) -> Option<Level> {
        match self {
            StderrThreshold::All => Some(Level::TRACE),
            StderrThreshold::Info => Some(Level::INFO),
            StderrThreshold::Warn => Some(Level::WARN),
            StderrThreshold::Error => Some(Level::ERROR),
            StderrThreshold::Off => None,
        }
    }
}

/// Everything that decides the log output.
#[derive(Debug, Clone)]
pub struct LogSpec {
    /// EnvFilter directives (`--log`).
    pub filter: String,
    pub format: LogFormat,
    /// Lines go to this file (appended) instead of stderr.
    pub file: Option<PathBuf>,
    /// With a file: which lines also go to stderr.
    pub stderr_threshold: StderrThreshold,
}

/// Why logging could not be set up; the process should not start.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("--log {filter:?}: {word:?} is a log format, not a filter; use --log-format {word}")]
    FormatAsFilter { filter: String, word: String },
    #[error("--log {filter:?} is not a valid log filter ({reason}); examples: info, warn,edgetunnel=debug")]
    BadFilter { filter: String, reason: String },
    #[error("--log-file {}: {source}", path.display())]
    File { path: PathBuf, source: io::Error },
}

/// The filter `--log` gives, checked: a format word (`json`) or a directive
/// EnvFilter cannot parse is an error, never a silent fallback.
pub fn parse_filter(filter: &str) -> Result<tracing_subscriber::EnvFilter, LogError> {
    for d in filter.split(',').map(str::trim) {
        if ["text", "json", "klog"].contains(&d) {
            return Err(LogError::FormatAsFilter {
                filter: filter.to_string(),
                word: d.to_string(),
            });
        }
    }
    tracing_subscriber::EnvFilter::builder()
        .parse(filter)
        .map_err(|e| LogError::BadFilter {
            filter: filter.to_string(),
            reason: e.to_string(),
        })
}

/// Log lines lost to failed writes (stderr closed, disk full); shared by
/// every metrics registry that shows it.
pub fn write_errors() -> Counter {
    static LOST: OnceLock<Counter> = OnceLock::new();
    LOST.get_or_init(Counter::default).clone()
}

/// Lines waiting for the log thread at most; past them lines are lost.
pub const QUEUE_LINES: usize = 8192;

/// What the log thread is handed.
enum Msg {
    Line { bytes: Vec<u8>, stderr: bool },
    Flushed(SyncSender<()>),
}

/// The log thread's queue, once [`init`] started it.
static QUEUE: OnceLock<SyncSender<Msg>> = OnceLock::new();

/// Starts the thread that writes lines to `file` and/or stderr.
fn start_writer(file: Option<Arc<File>>) -> Option<SyncSender<Msg>> {
    let (tx, rx) = mpsc::sync_channel::<Msg>(QUEUE_LINES);
    std::thread::Builder::new()
        .name("edgetunnel-log".into())
        .spawn(move || {
            // Started before the roles block their shutdown signals: this
            // thread must not be the one the kernel picks for them (SIGHUP's
            // default action would end the process).
            let _ = crate::sys::ShutdownSignals::block();
            for msg in rx {
                match msg {
                    Msg::Line { bytes, stderr } => {
                        let mut lost = false;
                        if let Some(mut f) = file.as_deref() {
                            lost |= f.write_all(&bytes).is_err();
                        }
                        if stderr {
                            lost |= io::stderr().write_all(&bytes).is_err();
                        }
                        if lost {
                            write_errors().inc();
                        }
                    }
                    Msg::Flushed(ack) => {
                        let _ = ack.send(());
                    }
                }
            }
        })
        .ok()?;
    Some(tx)
}

/// Waits (at most `limit`) until every line logged so far is written: the
/// last lines before an exit are not lost in the queue, and a stderr
/// nobody reads does not hold the exit up longer than `limit`.
pub fn flush(limit: Duration) {
    let Some(q) = QUEUE.get() else { return };
    let deadline = Instant::now() + limit;
    let (ack, done) = mpsc::sync_channel(1);
    let mut msg = Msg::Flushed(ack);
    loop {
        match q.try_send(msg) {
            Ok(()) => break,
            Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
    let _ = done.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// Installs the global subscriber for `spec`.
pub fn init(spec: &LogSpec) -> Result<(), LogError> {
    let filter = parse_filter(&spec.filter)?;
    let sinks = Sinks::open(spec)?;
    if let Some(tx) = start_writer(sinks.file.clone()) {
        let _ = QUEUE.set(tx);
    }
    let ansi = spec.file.is_none()
        && spec.format == LogFormat::Text
        && std::io::IsTerminal::is_terminal(&io::stderr());
    let base = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(sinks)
        .with_ansi(ansi)
        .log_internal_errors(false);
    // A subscriber already set (a test harness) is left alone.
    let _ = match spec.format {
        LogFormat::Text => base.try_init(),
        LogFormat::Json => base.json().flatten_event(true).try_init(),
        LogFormat::Klog => base.event_format(Klog::new()).try_init(),
    };
    Ok(())
}

/// Where lines go: stderr and/or a file.
#[derive(Clone)]
struct Sinks {
    file: Option<Arc<File>>,
    /// Least severe level written to stderr (None: nothing).
    stderr: Option<Level>,
}

impl Sinks {
    fn open(spec: &LogSpec) -> Result<Sinks, LogError> {
        let Some(path) = &spec.file else {
            return Ok(Sinks {
                file: None,
                stderr: Some(Level::TRACE),
            });
        };
        let file = open_append(path).map_err(|source| LogError::File {
            path: path.clone(),
            source,
        })?;
        Ok(Sinks {
            file: Some(Arc::new(file)),
            stderr: spec.stderr_threshold.level(),
        })
    }
}

/// Opens `path` for appending (klog opens its files so at start), creating
/// it and its directory.
fn open_append(path: &Path) -> io::Result<File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl<'a> MakeWriter<'a> for Sinks {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter {
            file: self.file.as_deref(),
            stderr: self.stderr.is_some(),
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter<'a> {
        LineWriter {
            file: self.file.as_deref(),
            // tracing orders levels by verbosity: ERROR is the least.
            stderr: self.stderr.is_some_and(|min| *meta.level() <= min),
        }
    }
}

/// Writes one formatted line to its sinks; never fails. A sink that
/// refuses the line loses it, and the loss is counted.
struct LineWriter<'a> {
    file: Option<&'a File>,
    stderr: bool,
}

impl LineWriter<'_> {
    fn put(&mut self, buf: &[u8]) {
        if let Some(q) = QUEUE.get() {
            if !self.stderr && self.file.is_none() {
                return;
            }
            let line = Msg::Line {
                bytes: buf.to_vec(),
                stderr: self.stderr,
            };
            if q.try_send(line).is_err() {
                write_errors().inc();
            }
            return;
        }
        // No log thread (it could not start): written here.
        let mut lost = false;
        if let Some(mut f) = self.file {
            lost |= f.write_all(buf).is_err();
        }
        if self.stderr {
            lost |= io::stderr().write_all(buf).is_err();
        }
        if lost {
            write_errors().inc();
        }
    }
}

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.put(buf);
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        self.put(buf);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// klog's line format (see the module docs).
struct Klog {
    pid: u32,
}

impl Klog {
    fn new() -> Klog {
        Klog {
            pid: std::process::id(),
        }
    }
}

/// klog's severity letter: I, W, E (debug and trace are klog's V-levels,
/// written as I).
fn severity(level: &Level) -> char {
    match *level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// The klog header for `now` (klog's `FormatHeader` layout).
fn klog_header(
    out: &mut impl fmt::Write,
    level: &Level,
    now: &jiff::civil::DateTime,
    pid: u32,
    file: &str,
    line: u32,
) -> fmt::Result {
    write!(
        out,
        "{}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}:{}] ",
        severity(level),
        now.month(),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.subsec_nanosecond() / 1000,
        pid,
        file,
        line
    )
}

impl<S, N> FormatEvent<S, N> for Klog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let now = jiff::Zoned::now().datetime();
        // klog shows the file's base name (without --add-dir-header).
        let file = meta
            .file()
            .map(|f| f.rsplit('/').next().unwrap_or(f))
            .unwrap_or("?");
        klog_header(
            &mut w,
            meta.level(),
            &now,
            self.pid,
            file,
            meta.line().unwrap_or(0),
        )?;
        let mut v = KlogFields::default();
        event.record(&mut v);
        // Fields of the spans the event is in, outermost first.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                if let Some(f) = ext.get::<tracing_subscriber::fmt::FormattedFields<N>>() {
                    if !f.fields.is_empty() {
                        let _ = write!(v.rest, " {}", f.fields);
                    }
                }
            }
        }
        w.write_str(&quote(&v.message))?;
        w.write_str(&v.rest)?;
        writeln!(w)
    }
}

/// Go's `%q`-like quoting (JSON string rules, which agree for text).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("{s:?}"))
}

/// An event's message and its `key=value` pairs in klog's style.
#[derive(Default)]
struct KlogFields {
    message: String,
    rest: String,
}

impl Visit for KlogFields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = text;
        } else {
            let _ = write!(self.rest, " {}={}", field.name(), quote(&text));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            let _ = write!(self.rest, " {}={}", field.name(), quote(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        let _ = write!(self.rest, " {}={value}", field.name());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let _ = write!(self.rest, " {}={value}", field.name());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        let _ = write!(self.rest, " {}={value}", field.name());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        let _ = write!(self.rest, " {}={value}", field.name());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let _ = write!(self.rest, " {}={}", field.name(), quote(&value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_words_and_bad_directives_are_refused() {
        assert!(parse_filter("info").is_ok());
        assert!(parse_filter("warn,edgetunnel=debug").is_ok());
        let e = parse_filter("json").unwrap_err().to_string();
        assert!(e.contains("--log-format json"), "{e}");
        let e = parse_filter("info,klog").unwrap_err().to_string();
        assert!(e.contains("--log-format klog"), "{e}");
        assert!(matches!(
            parse_filter("edgetunnel=loud"),
            Err(LogError::BadFilter { .. })
        ));
    }

    #[test]
    fn klog_header_has_klogs_columns() {
        let t = jiff::civil::date(2026, 12, 5).at(6, 4, 2, 123_456_789);
        let mut s = String::new();
        klog_header(&mut s, &Level::WARN, &t, 42, "agent_conn.rs", 7).unwrap();
        assert_eq!(s, "W1205 06:04:02.123456      42 agent_conn.rs:7] ");
    }

    #[test]
    fn a_failed_write_is_counted_not_reported() {
        let before = write_errors().get();
        // A file opened read-only refuses writes.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro");
        std::fs::write(&p, "").unwrap();
        let f = File::open(&p).unwrap();
        let mut w = LineWriter {
            file: Some(&f),
            stderr: false,
        };
        assert!(w.write_all(b"line\n").is_ok());
        assert!(write_errors().get() > before);
    }
}
