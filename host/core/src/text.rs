//! Text a plugin hands the host (errors, log messages, stderr) made safe to
//! print: one line, bounded, control characters escaped.
use std::borrow::Cow;
use std::fmt::Write;

/// What one plugin message may take in the host's logs and reports.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// `s` on one line of at most `max_bytes` (plus a note when cut): control
/// characters (newlines, ESC, ...) escaped as `\n`, `\r`, `\t` or `\u{..}`,
/// so that a message cannot forge a log line or a terminal sequence.
pub fn bounded_line(s: &str, max_bytes: usize) -> Cow<'_, str> {
    if s.len() <= max_bytes && !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len().min(max_bytes) + 48);
    let mut cut = false;
    for c in s.chars() {
        let before = out.len();
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
        if out.len() > max_bytes {
            out.truncate(before);
            cut = true;
            break;
        }
    }
    if cut {
        let _ = write!(out, " … (truncated, {} bytes in all)", s.len());
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_plain_text_is_kept_as_is() {
        assert!(matches!(bounded_line("hello", 10), Cow::Borrowed("hello")));
    }

    #[test]
    fn control_characters_cannot_start_a_line() {
        let s = bounded_line("a\nERROR forged\r\x1b[31mred\t", 100);
        assert_eq!(s, "a\\nERROR forged\\r\\u{1b}[31mred\\t");
        assert!(!s.contains('\n'));
    }

    #[test]
    fn a_huge_message_is_cut_at_a_char_boundary_and_says_so() {
        let big = "é".repeat(50 << 20);
        let s = bounded_line(&big, MAX_MESSAGE_BYTES);
        assert!(s.len() <= MAX_MESSAGE_BYTES + 64, "{}", s.len());
        assert!(s.ends_with(&format!("(truncated, {} bytes in all)", big.len())));
        assert!(s.starts_with("éé"));
    }
}
