//! Text that came from outside and is about to be named in a path, written to a log line or
//! shown on a terminal: which characters can forge what a person reads, and the two ways of
//! making such text harmless (escaping for logs, stripping for a terminal).
//!
//! The characters are C0 and C1 controls with DEL (a newline starts a forged log line, ESC
//! starts a terminal escape sequence: OSC 52 writes the clipboard, CSI moves the cursor over
//! lines already printed) and the Unicode bidirectional formatting characters (U+202E shows
//! `txt.exe` as `exe.txt`). Refusing them in paths is [`crate::guard::RelPath`]'s job, with
//! [`is_control_or_bidi`]; everything else here leaves the text's other characters as they are.
//! [`first_line`] makes a short one-line label (a summary, a chat's title) from longer text.
//!
//! Must never: allocate when the text holds nothing to escape or strip.

use std::borrow::Cow;
use std::fmt::{self, Write};

/// The Unicode `Bidi_Control` characters: the marks (ALM, LRM, RLM), the embeddings and
/// overrides (LRE, RLE, PDF, LRO, RLO) and the isolates (LRI, RLI, FSI, PDI).
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'
    )
}

/// A C0 or C1 control, DEL, or a bidirectional formatting character: what may not stand in a
/// name a person reads, and what a log line or a terminal must never receive raw.
pub fn is_control_or_bidi(c: char) -> bool {
    c.is_control() || is_bidi_control(c)
}

/// Writes `text` to `out` with every [`is_control_or_bidi`] character escaped as Rust writes
/// it (`\n`, `\r`, `\t`, else `\u{…}`), so that a log line stays one line and shows what was
/// sent. Other characters, backslashes included, are written as they are.
pub fn write_escaped(out: &mut impl Write, text: &str) -> fmt::Result {
    let mut rest = text;
    while let Some(at) = rest.find(is_control_or_bidi) {
        out.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().unwrap_or_default();
        match c {
            '\n' => out.write_str("\\n")?,
            '\r' => out.write_str("\\r")?,
            '\t' => out.write_str("\\t")?,
            c => write!(out, "\\u{{{:x}}}", u32::from(c))?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    out.write_str(rest)
}

/// `text` without its [`is_control_or_bidi`] characters except newline and tab, for a
/// terminal: an escape sequence loses its ESC (or its C1 introducer) and its terminator, and
/// what remains of it is printed as plain characters, moving no cursor and writing no
/// clipboard.
pub fn strip_controls(text: &str) -> Cow<'_, str> {
    let kept = |c: char| c == '\n' || c == '\t' || !is_control_or_bidi(c);
    if text.chars().all(kept) {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(text.chars().filter(|&c| kept(c)).collect())
    }
}

/// The first line of `text` that has anything to show, without its [`is_control_or_bidi`]
/// characters (a tab or a lone carriage return becomes a space), trimmed, and at most
/// `max_chars` characters: a longer line is cut on a character boundary and ends in `…`.
/// Empty when no line has anything to show.
pub fn first_line(text: &str, max_chars: usize) -> String {
    let shown = |line: &str| -> String {
        line.chars()
            .filter_map(|c| match c {
                '\t' | '\r' => Some(' '),
                c if is_control_or_bidi(c) => None,
                c => Some(c),
            })
            .collect::<String>()
            .trim()
            .to_owned()
    };
    let line = text
        .lines()
        .map(shown)
        .find(|line| !line.is_empty())
        .unwrap_or_default();
    if line.chars().count() <= max_chars {
        return line;
    }
    let mut cut: String = line.chars().take(max_chars.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(text: &str) -> String {
        let mut out = String::new();
        write_escaped(&mut out, text).unwrap();
        out
    }

    #[test]
    fn controls_and_bidi_formatting_are_named_and_the_rest_is_not() {
        for c in [
            '\0', '\n', '\r', '\t', '\x1b', '\x07', '\x7f', '\u{85}', '\u{9b}', '\u{9d}',
            '\u{202e}', '\u{202a}', '\u{2066}', '\u{2069}', '\u{200f}', '\u{61c}',
        ] {
            assert!(is_control_or_bidi(c), "{c:?}");
        }
        for c in [
            'a', ' ', '/', '\\', 'é', 'ñ', '中', '🙂', '\u{200b}', '\u{a0}',
        ] {
            assert!(!is_control_or_bidi(c), "{c:?}");
        }
    }

    #[test]
    fn escaping_keeps_a_log_line_one_line() {
        assert_eq!(escaped("plain/path.txt"), "plain/path.txt");
        assert_eq!(escaped("a\nINFO forged\r\tb"), "a\\nINFO forged\\r\\tb");
        assert_eq!(
            escaped("\x1b]52;c;aGk=\x07 x\u{202e}txt.exe"),
            "\\u{1b}]52;c;aGk=\\u{7} x\\u{202e}txt.exe"
        );
        assert_eq!(escaped("ü\u{9b}2J"), "ü\\u{9b}2J");
        assert_eq!(escaped("back\\slash"), "back\\slash");
    }

    #[test]
    fn stripping_keeps_newlines_and_tabs_and_borrows_clean_text() {
        assert!(matches!(strip_controls("fine\n\ttext"), Cow::Borrowed(_)));
        assert_eq!(
            strip_controls("a\x1b]52;c;aGk=\x07b\x1b[2A\r\u{9b}1;1H\u{202e}c\nd\te"),
            "a]52;c;aGk=b[2A1;1Hc\nd\te"
        );
        assert_eq!(strip_controls("\x1b\x1b\x1b"), "");
    }

    #[test]
    fn a_first_line_is_one_bounded_line_without_controls() {
        assert_eq!(
            first_line("\n  \n  Fix the build\nthen the tests", 80),
            "Fix the build"
        );
        assert_eq!(
            first_line("a\tb\rc\x1b[2Jd\u{202e}e\u{7}", 80),
            "a b c[2Jde"
        );
        assert_eq!(first_line("\x1b\u{202e}\n\u{7}", 80), "");
        assert_eq!(first_line("", 80), "");
        assert_eq!(first_line("éééé", 4), "éééé");
        assert_eq!(first_line("ééééé", 4), "ééé…");
        assert_eq!(first_line(&"x".repeat(500), 60).chars().count(), 60);
    }
}
