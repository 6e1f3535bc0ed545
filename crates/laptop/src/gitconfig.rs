//! A reader of git's config files that keeps where each entry is, so one entry can be taken out
//! of a file and the rest left byte for byte as it was.
//!
//! Owns: [`parse`] (sections, `"subsection"`s with their escapes, the old `[section.sub]` form,
//! `key = value` with quotes, escapes, comments and `\` line continuations, a key on its
//! section's line, a key without `=`), [`without`] (the text with some entries removed) and
//! [`render`] (entries written back as a config text).
//!
//! Why not a crate: the maintained one, `gix-config`, brings gitoxide's path, ref, object and
//! lock crates with it, and still gives no byte span per entry, which is all that undoing one key
//! needs. Git's format is small and stable; what this reader does not accept, git itself refuses
//! (`fatal: bad config line`), and callers treat such a file as a whole.
//!
//! Must never: report a value other than the one git reads, or change a byte of an entry it was
//! not asked to remove.

/// One `key = value` of a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Lowercase.
    pub section: String,
    /// As written (case-sensitive) in `[section "sub"]`; lowercase in the old `[section.sub]`.
    pub subsection: Option<String>,
    /// Lowercase.
    pub name: String,
    /// `None` for a key written without `=` (git reads it as true).
    pub value: Option<String>,
    /// Where the entry is: from its first byte to the end of its last line, newline excluded.
    start: usize,
    end: usize,
    /// Whether it is the only thing on its line(s) (else it follows its section header).
    whole_lines: bool,
}

impl Entry {
    /// An entry to write with [`render`].
    pub fn new(section: &str, subsection: Option<&str>, name: &str, value: Option<&str>) -> Entry {
        Entry {
            section: section.to_ascii_lowercase(),
            subsection: subsection.map(str::to_owned),
            name: name.to_ascii_lowercase(),
            value: value.map(str::to_owned),
            start: 0,
            end: 0,
            whole_lines: true,
        }
    }

    /// `section.subsection.name`, as `git config` names it.
    pub fn key(&self) -> String {
        match &self.subsection {
            Some(sub) => format!("{}.{sub}.{}", self.section, self.name),
            None => format!("{}.{}", self.section, self.name),
        }
    }

    /// Same key and value (where it stands in the file does not matter).
    pub fn same(&self, other: &Entry) -> bool {
        (&self.section, &self.subsection, &self.name, &self.value)
            == (&other.section, &other.subsection, &other.name, &other.value)
    }
}

/// Why a text is not a config file git would read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a git config: {reason} at line {line}")]
pub struct ParseError {
    pub line: usize,
    pub reason: &'static str,
}

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn line(&self) -> usize {
        1 + self.text[..self.at.min(self.text.len())]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
    }

    fn fail<T>(&self, reason: &'static str) -> Result<T, ParseError> {
        Err(ParseError {
            line: self.line(),
            reason,
        })
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\r')) {
            self.at += 1;
        }
    }

    /// Past a comment to the end of the line (the newline is not consumed).
    fn skip_comment(&mut self) {
        while !matches!(self.peek(), None | Some(b'\n')) {
            self.at += 1;
        }
    }
}

/// Every entry of `text`, in order. A UTF-8 BOM is skipped, as git does.
pub fn parse(text: &str) -> Result<Vec<Entry>, ParseError> {
    let mut r = Reader {
        text: text.as_bytes(),
        at: 0,
    };
    if text.starts_with('\u{feff}') {
        r.at = 3;
    }
    let mut entries = Vec::new();
    let mut section: Option<(String, Option<String>)> = None;
    loop {
        let line_start = r.at;
        r.skip_blanks();
        match r.peek() {
            None => return Ok(entries),
            Some(b'\n') => r.at += 1,
            Some(b'#' | b';') => r.skip_comment(),
            Some(b'[') => {
                section = Some(read_header(&mut r)?);
                r.skip_blanks();
                match r.peek() {
                    None | Some(b'\n') | Some(b'#' | b';') => {}
                    // A key on the section's own line.
                    Some(_) => {
                        let Some((name, sub)) = section.clone() else {
                            return r.fail("a key before any section");
                        };
                        let entry = read_entry(&mut r, &name, sub, false)?;
                        entries.push(entry);
                    }
                }
            }
            Some(c) if c.is_ascii_alphabetic() => {
                let Some((name, sub)) = section.clone() else {
                    return r.fail("a key before any section");
                };
                let whole = r.text[line_start..r.at]
                    .iter()
                    .all(|b| b.is_ascii_whitespace());
                let mut entry = read_entry(&mut r, &name, sub, whole)?;
                if whole {
                    entry.start = line_start;
                }
                entries.push(entry);
            }
            Some(_) => return r.fail("a line that is neither a section, a key nor a comment"),
        }
    }
}

/// `[section]`, `[section "sub"]` or `[section.sub]`, the reader just past `]`.
fn read_header(r: &mut Reader<'_>) -> Result<(String, Option<String>), ParseError> {
    r.at += 1;
    let start = r.at;
    while matches!(r.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'-' || c == b'.') {
        r.at += 1;
    }
    let name = String::from_utf8_lossy(&r.text[start..r.at]).to_ascii_lowercase();
    if name.is_empty() {
        return r.fail("an empty section name");
    }
    match r.peek() {
        Some(b']') => {
            r.at += 1;
            // The old form: `[section.sub]`, the subsection lowercased.
            Ok(match name.split_once('.') {
                Some((section, sub)) => (section.to_owned(), Some(sub.to_owned())),
                None => (name, None),
            })
        }
        Some(b' ' | b'\t') => {
            r.skip_blanks();
            if r.peek() != Some(b'"') {
                return r.fail("a subsection that is not quoted");
            }
            r.at += 1;
            let mut sub = Vec::new();
            loop {
                match r.peek() {
                    None | Some(b'\n') => return r.fail("an unterminated subsection"),
                    Some(b'"') => {
                        r.at += 1;
                        break;
                    }
                    Some(b'\\') => {
                        r.at += 1;
                        match r.peek() {
                            None | Some(b'\n') => return r.fail("an unterminated subsection"),
                            Some(c) => sub.push(c),
                        }
                        r.at += 1;
                    }
                    Some(c) => {
                        sub.push(c);
                        r.at += 1;
                    }
                }
            }
            if r.peek() != Some(b']') {
                return r.fail("a section header that does not end with ]");
            }
            r.at += 1;
            Ok((name, Some(String::from_utf8_lossy(&sub).into_owned())))
        }
        _ => r.fail("a bad section header"),
    }
}

/// `name [= value]` up to the end of its (last) line; the reader stops before the newline.
fn read_entry(
    r: &mut Reader<'_>,
    section: &str,
    subsection: Option<String>,
    whole_lines: bool,
) -> Result<Entry, ParseError> {
    let start = r.at;
    while matches!(r.peek(), Some(c) if c.is_ascii_alphanumeric() || c == b'-') {
        r.at += 1;
    }
    let name = String::from_utf8_lossy(&r.text[start..r.at]).to_ascii_lowercase();
    r.skip_blanks();
    let value = match r.peek() {
        None | Some(b'\n') => None,
        Some(b'#' | b';') => {
            r.skip_comment();
            None
        }
        Some(b'=') => {
            r.at += 1;
            Some(read_value(r)?)
        }
        Some(_) => return r.fail("a bad key name"),
    };
    Ok(Entry {
        section: section.to_owned(),
        subsection,
        name,
        value,
        start,
        end: r.at,
        whole_lines,
    })
}

/// A value as git reads it: leading blanks dropped, trailing ones too unless quoted, `"` toggling
/// quoting, `\\ \" \n \t \b` escapes, `\` before a newline joining lines, `#` and `;` starting a
/// comment outside quotes.
fn read_value(r: &mut Reader<'_>) -> Result<String, ParseError> {
    let mut value: Vec<u8> = Vec::new();
    let mut quoted = false;
    // Bytes of trailing unquoted blanks, dropped if nothing follows them.
    let mut pending_blanks: Vec<u8> = Vec::new();
    let mut started = false;
    while let Some(c) = r.peek() {
        match c {
            b'\n' => {
                if quoted {
                    return r.fail("an unterminated quote");
                }
                break;
            }
            b'#' | b';' if !quoted => {
                r.skip_comment();
                break;
            }
            b' ' | b'\t' | b'\r' if !quoted => {
                if started {
                    pending_blanks.push(c);
                }
                r.at += 1;
            }
            b'"' => {
                value.append(&mut pending_blanks);
                quoted = !quoted;
                started = true;
                r.at += 1;
            }
            b'\\' => {
                r.at += 1;
                let escaped = match r.peek() {
                    Some(b'\n') => {
                        r.at += 1;
                        continue;
                    }
                    Some(b'\r') if r.text.get(r.at + 1) == Some(&b'\n') => {
                        r.at += 2;
                        continue;
                    }
                    Some(b'\\') => b'\\',
                    Some(b'"') => b'"',
                    Some(b'n') => b'\n',
                    Some(b't') => b'\t',
                    Some(b'b') => 8,
                    _ => return r.fail("a bad escape in a value"),
                };
                value.append(&mut pending_blanks);
                value.push(escaped);
                started = true;
                r.at += 1;
            }
            _ => {
                value.append(&mut pending_blanks);
                value.push(c);
                started = true;
                r.at += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&value).into_owned())
}

/// `text` with `remove` (entries parsed from it) taken out: an entry alone on its line(s) goes
/// with its newline; one that follows its section header on the header's line leaves the
/// header. Every other byte stays.
pub fn without(text: &str, remove: &[&Entry]) -> String {
    let mut spans: Vec<(usize, usize)> = remove
        .iter()
        .map(|e| {
            if e.whole_lines {
                let end = if text.as_bytes().get(e.end) == Some(&b'\n') {
                    e.end + 1
                } else {
                    e.end
                };
                (e.start, end)
            } else {
                (e.start, e.end)
            }
        })
        .collect();
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        if start < at || end > text.len() {
            continue;
        }
        out.push_str(&text[at..start]);
        at = end;
    }
    out.push_str(&text[at..]);
    out
}

/// `entries` as config text: one section header per run of entries of the same section, each
/// value quoted with git's escapes.
pub fn render(entries: &[Entry]) -> String {
    let mut out = String::new();
    let mut current: Option<(&str, Option<&str>)> = None;
    for entry in entries {
        let section = (entry.section.as_str(), entry.subsection.as_deref());
        if current != Some(section) {
            match section.1 {
                Some(sub) => out.push_str(&format!(
                    "[{} \"{}\"]\n",
                    section.0,
                    sub.replace('\\', "\\\\").replace('"', "\\\"")
                )),
                None => out.push_str(&format!("[{}]\n", section.0)),
            }
            current = Some(section);
        }
        match &entry.value {
            None => out.push_str(&format!("\t{}\n", entry.name)),
            Some(value) => {
                let escaped = value
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"")
                    .replace('\n', "\\n")
                    .replace('\t', "\\t")
                    .replace('\u{8}', "\\b");
                out.push_str(&format!("\t{} = \"{escaped}\"\n", entry.name));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(text: &str) -> Vec<(String, Option<String>)> {
        parse(text)
            .expect("parses")
            .into_iter()
            .map(|e| (e.key(), e.value))
            .collect()
    }

    #[test]
    fn sections_subsections_values_and_comments_read_as_git_reads_them() {
        let text = "\u{feff}# top\n[Core]\n\tFSMonitor = \"./run me\" # why\n\tbare\n\
                    [remote \"Origin \\\"x\\\"\"]\n\turl = git@h:r.git ; c\n\
                    [alias.Co] x = y\n[filter \"lfs\"] clean = git-lfs clean -- %f\n\
                    [a]\n\tb = one \\\n two\\tthree  \n\tc = \"#not a comment\"\n\td =\n";
        assert_eq!(
            keys(text),
            vec![
                ("core.fsmonitor".into(), Some("./run me".into())),
                ("core.bare".into(), None),
                ("remote.Origin \"x\".url".into(), Some("git@h:r.git".into())),
                ("alias.co.x".into(), Some("y".into())),
                (
                    "filter.lfs.clean".into(),
                    Some("git-lfs clean -- %f".into())
                ),
                ("a.b".into(), Some("one  two\tthree".into())),
                ("a.c".into(), Some("#not a comment".into())),
                ("a.d".into(), Some(String::new())),
            ]
        );
    }

    #[test]
    fn what_git_refuses_is_refused() {
        for bad in [
            "key = x\n",
            "[core\n",
            "[core]\n\tx = \"open\n",
            "[core]\n\t= x\n",
            "[core]\n\tx = a\\q\n",
            "[s \"sub]\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn removing_entries_leaves_every_other_byte() {
        let text = "[core]\n\trepositoryformatversion = 0\n\tfsmonitor = \"evil\" \\\n  more\n\
                    [user]\n\tname = Ann\n[core] hooksPath = h\n[alias]\n\tx = !sh\n";
        let entries = parse(text).expect("parses");
        let remove: Vec<&Entry> = entries
            .iter()
            .filter(|e| e.name == "fsmonitor" || e.name == "hookspath" || e.name == "x")
            .collect();
        assert_eq!(
            without(text, &remove),
            "[core]\n\trepositoryformatversion = 0\n[user]\n\tname = Ann\n[core] \n[alias]\n"
        );
    }

    #[test]
    fn rendered_entries_read_back_the_same() {
        let entries = vec![
            Entry::new("core", None, "fsmonitor", Some("a \"b\"\\c\n")),
            Entry::new("core", None, "bare", None),
            Entry::new("includeIf", Some("gitdir:~/w/\"x\""), "path", Some("p")),
        ];
        let back = parse(&render(&entries)).expect("parses");
        assert_eq!(back.len(), 3);
        for (a, b) in entries.iter().zip(&back) {
            assert!(a.same(b), "{a:?} {b:?}");
        }
    }
}
