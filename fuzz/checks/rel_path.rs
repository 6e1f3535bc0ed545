//! Path normalisation: whatever `RelPath::parse` accepts must be confined (no empty, `.`, `..`
//! or dot components, not absolute, no NUL) and parse again to itself.

use agentworks_core::guard::RelPath;

pub fn run(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(path) = RelPath::parse(raw) else {
        return;
    };
    let s = path.as_str();
    assert!(!s.starts_with('/') && !s.contains('\0') && !s.is_empty());
    for c in path.components() {
        assert!(
            !c.is_empty() && c != "." && c != ".." && !c.starts_with('.'),
            "{s:?}"
        );
    }
    assert_eq!(RelPath::parse(s).as_ref(), Ok(&path));
}
