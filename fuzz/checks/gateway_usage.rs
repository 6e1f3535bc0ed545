//! runnerd's model gateway reading an upstream's answer (`gateway::scan_answer`: the usage
//! scanner and the key's redactor, as the answer pump runs them chunk by chunk): the answer
//! repeats the model's words, and an upstream (or a prompt that makes the model quote it) may
//! echo the operator's key.
//!
//! The input: a flags byte (bit 0: a `text/event-stream` answer, else one JSON body; bit 1:
//! the real key inserted; bit 2: the second key, which overlaps itself), two bytes for where
//! the key goes in the body, two for where in the key a chunk boundary falls, one for how many
//! more boundaries follow, two bytes each, then the body.
//!
//! It must never panic. The client gets the body exactly with every occurrence of the key
//! replaced by `[redacted]` (leftmost first, as `str::replace`), so never the key, however the
//! chunks split it; the usage counted does not depend on the chunks or on the key, and stays
//! within what the clamped counts can add up to.

use agentworks_runner::gateway::{Usage, scan_answer};

/// Keys as an operator's would look: neither shares a character with `[redacted]`'s ends, so
/// a replacement next to the body's bytes cannot form the key again.
const KEYS: [&[u8]; 2] = [b"sk-real-0123456789abcdef", b"sk-sk-sk-"];
const REDACTED: &[u8] = b"[redacted]";
/// The gateway's clamp on one reported count (`MAX_REPORTED_TOKENS`).
const MAX_REPORTED_TOKENS: u64 = 1 << 40;

pub fn run(data: &[u8]) {
    let Some((head, rest)) = data.split_first_chunk::<6>() else {
        return;
    };
    let [flags, at_0, at_1, cut_0, cut_1, more] = *head;
    let more = usize::from(more % 32);
    let Some((cuts, body)) = rest.split_at_checked(more * 2) else {
        return;
    };
    let events = flags & 1 != 0;
    let key = KEYS[usize::from(flags >> 2 & 1)];

    let mut body = body.to_vec();
    let mut boundaries = Vec::new();
    if flags & 2 != 0 {
        let at = usize::from(u16::from_le_bytes([at_0, at_1])) % (body.len() + 1);
        body.splice(at..at, key.iter().copied());
        boundaries.push(at + usize::from(u16::from_le_bytes([cut_0, cut_1])) % (key.len() + 1));
    }
    for cut in cuts.chunks_exact(2) {
        boundaries.push(usize::from(u16::from_le_bytes([cut[0], cut[1]])) % (body.len() + 1));
    }
    boundaries.sort_unstable();
    let mut chunks = Vec::new();
    let mut from = 0;
    for to in boundaries {
        chunks.push(&body[from..to]);
        from = to;
    }
    chunks.push(&body[from..]);

    let key_text = std::str::from_utf8(key).expect("the keys are text");
    let (usage, out) = scan_answer(chunks.iter().copied(), events, Some(key_text));
    assert_eq!(out, replaced(&body, key), "the redacted answer");
    assert!(!contains(&out, key), "the key reached the client");

    let (whole, plain) = scan_answer([body.as_slice()], events, None);
    assert_eq!(plain, body, "without a key the answer passes as it is");
    assert_eq!(usage, whole, "the usage depends on the chunks or the key");
    let Usage {
        input_tokens,
        output_tokens,
    } = usage;
    // Input: a count plus two cache counts; output: a count plus Gemini's thoughts.
    assert!(input_tokens <= 3 * MAX_REPORTED_TOKENS, "{usage:?}");
    assert!(output_tokens <= 2 * MAX_REPORTED_TOKENS, "{usage:?}");
}

/// `body` with every occurrence of `key`, leftmost first, replaced by [`REDACTED`].
fn replaced(body: &[u8], key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len());
    let mut at = 0;
    while at < body.len() {
        if body[at..].starts_with(key) {
            out.extend_from_slice(REDACTED);
            at += key.len();
        } else {
            out.push(body[at]);
            at += 1;
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}
