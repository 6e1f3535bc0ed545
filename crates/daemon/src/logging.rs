//! Logging setup: journald with structured fields under systemd, compact text on stderr
//! otherwise (coloured only when stderr is a terminal).
//!
//! Owns installing the one global `tracing` subscriber. Must never panic or fail the daemon: if
//! journald cannot be reached the daemon logs to stderr instead, and a second call (or a
//! subscriber installed by someone else, as in tests) leaves things as they are.
//!
//! On stderr every event is one line, whatever its fields hold: paths, names, request ids and
//! error messages come from callers, so every field (the message too) is written with its
//! control and bidirectional formatting characters escaped ([`escaped_fields`]); a newline in a
//! name cannot start a forged line, an ESC cannot reach the terminal that shows the log. The
//! colours are ours, and only on a terminal. journald keeps each field whole in its own entry.

use std::io::IsTerminal;
use std::sync::Once;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::debug_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

static INIT: Once = Once::new();

/// Installs the global subscriber.
///
/// Logs to journald (tracing-journald, structured fields without a prefix, so `message_id` is
/// `MESSAGE_ID`; `SYSLOG_IDENTIFIER=daemon_name`) when
/// `JOURNAL_STREAM` names our stderr (its `dev:ino` equals fstat of fd 2), otherwise a compact
/// fmt layer to stderr, with ANSI colours only when stderr is a terminal and `NO_COLOR` is
/// unset (a log redirected to a file, or read by a program, holds plain text). The filter
/// comes from `RUST_LOG`, default `info`. A second call is a no-op.
pub fn init(daemon_name: &str) {
    INIT.call_once(|| install(daemon_name));
}

fn filter() -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"))
}

fn install(daemon_name: &str) {
    let mut journal_error = None;
    if stderr_is_journal() {
        match tracing_journald::layer() {
            Ok(layer) => {
                // No field prefix: `message_id` and the audit events' `agentworks_*` fields
                // become the journal's `MESSAGE_ID` and `AGENTWORKS_*` (see `daemon::audit`).
                let layer = layer
                    .with_syslog_identifier(daemon_name.to_owned())
                    .with_field_prefix(None);
                // Err means a subscriber is already installed: keep it.
                let _ = tracing_subscriber::registry()
                    .with(filter())
                    .with(layer)
                    .try_init();
                return;
            }
            Err(error) => journal_error = Some(error),
        }
    }
    let layer = tracing_subscriber::fmt::layer()
        .compact()
        .fmt_fields(escaped_fields())
        .with_ansi(colour(
            std::io::stderr().is_terminal(),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_writer(std::io::stderr);
    let _ = tracing_subscriber::registry()
        .with(filter())
        .with(layer)
        .try_init();
    if let Some(error) = journal_error {
        tracing::warn!(%error, "JOURNAL_STREAM is set but journald is unreachable; logging to stderr");
    }
}

/// Whether to colour the text log: only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>).
fn colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The stderr layer's fields, as `tracing_subscriber` writes them (the message, then
/// `name=value` for each other field, a space between), each written with
/// [`agentworks_core::text::write_escaped`]: no field's control character reaches the line.
pub fn escaped_fields() -> impl for<'writer> FormatFields<'writer> + 'static {
    debug_fn(|writer, field, value| {
        let text = format!("{value:?}");
        if field.name() != "message" {
            write!(writer, "{}=", field.name())?;
        }
        agentworks_core::text::write_escaped(writer, &text)
    })
    .delimited(" ")
}

/// Whether fd 2 is the stream systemd connected to the journal.
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(stat) = rustix::fs::fstat(std::io::stderr()) else {
        return false;
    };
    journal_stream_matches(&value.to_string_lossy(), stat.st_dev, stat.st_ino)
}

/// Whether a `JOURNAL_STREAM` value (`<dev>:<ino>`, decimal) names the file with `dev`/`ino`.
pub fn journal_stream_matches(value: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = value.trim().split_once(':') else {
        return false;
    };
    matches!((d.parse::<u64>(), i.parse::<u64>()), (Ok(d), Ok(i)) if d == dev && i == ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_parsing() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(!journal_stream_matches("8:12345", 8, 1));
        assert!(!journal_stream_matches("9:12345", 8, 12345));
        assert!(!journal_stream_matches("garbage", 8, 12345));
        assert!(!journal_stream_matches("8:", 8, 0));
    }

    /// A field holding a newline, an ESC sequence and U+202E stays on its line, escaped.
    #[test]
    fn fields_are_written_escaped_on_one_line() {
        use tracing_subscriber::fmt::MakeWriter;
        #[derive(Clone, Default)]
        struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Captured {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        impl<'a> MakeWriter<'a> for Captured {
            type Writer = Captured;
            fn make_writer(&'a self) -> Captured {
                self.clone()
            }
        }
        let captured = Captured::default();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .compact()
                .fmt_fields(escaped_fields())
                .with_ansi(false)
                .with_writer(captured.clone()),
        );
        let forged = "a.txt\n2026-01-01T00:00:00Z  INFO forged: all is well";
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(path = %forged, name = "x\x1b]52;c;aGk=\x07\u{202e}y", "wrote {}", "m\r\u{9b}2J");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        assert!(
            !text
                .trim_end_matches('\n')
                .contains(|c: char| agentworks_core::text::is_control_or_bidi(c)),
            "{text:?}"
        );
        assert!(text.contains("path=a.txt\\n2026"), "{text:?}");
        assert!(
            text.contains("\\u{202e}") && text.contains("wrote m\\r\\u{9b}2J"),
            "{text:?}"
        );
        assert!(
            text.contains(" name=\"x\\u{1b}]52;c;aGk=\\u{7}\\u{202e}y\""),
            "{text:?}"
        );
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".as_ref())));
        assert!(!colour(true, Some("1".as_ref())));
        assert!(!colour(false, None));
    }

    #[test]
    fn init_twice_is_harmless() {
        init("agentworks-test");
        init("agentworks-test");
        tracing::info!("logging works");
    }
}
