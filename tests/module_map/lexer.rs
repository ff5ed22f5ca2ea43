//! Rust source read as code: comments, strings and char literals blanked (so a path in a comment or
//! a string is no import), and identifiers. Shared by the map's checker and the file-circle one.

/// `text` with comments, strings and char literals blanked (newlines kept, so lines still count).
pub fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let n = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..n]);
            i += n;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut n) = (0usize, 0);
            while n < rest.len() {
                if rest[n..].starts_with(b"/*") {
                    depth += 1;
                    n += 2;
                } else if rest[n..].starts_with(b"*/") {
                    depth -= 1;
                    n += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    n += 1;
                }
            }
            blank(&mut out, &rest[..n]);
            i += n;
        } else if let Some(n) = raw_string_len(rest) {
            blank(&mut out, &rest[..n]);
            i += n;
        } else if rest[0] == b'"' {
            let mut n = 1;
            while n < rest.len() && rest[n] != b'"' {
                n += if rest[n] == b'\\' { 2 } else { 1 };
            }
            let n = (n + 1).min(rest.len());
            blank(&mut out, &rest[..n]);
            i += n;
        } else if rest[0] == b'\'' {
            // A char literal ('x', '\n', '\u{..}', a multi-byte char), or a lifetime ('a).
            let n = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                // `i + 1` is a char boundary: the byte at `i` is ASCII.
                let len = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + len) == Some(&b'\'')).then_some(len + 2)
            };
            match n {
                Some(n) => {
                    blank(&mut out, &rest[..n]);
                    i += n;
                }
                None => {
                    out.push(b'\'');
                    i += 1;
                }
            }
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// The length of a raw string literal (`r"…"`, `r#"…"#`, `br"…"`) at the start of `s`, if one is.
fn raw_string_len(s: &[u8]) -> Option<usize> {
    let start = if s.starts_with(b"br") {
        2
    } else if s.starts_with(b"r") {
        1
    } else {
        return None;
    };
    let hashes = s[start..].iter().take_while(|&&c| c == b'#').count();
    if s.get(start + hashes) != Some(&b'"') {
        return None;
    }
    let mut close = vec![b'"'];
    close.extend(std::iter::repeat_n(b'#', hashes));
    let body = start + hashes + 1;
    let end = s[body..].windows(close.len()).position(|w| w == close)?;
    Some(body + end + close.len())
}

pub fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

pub fn ident_at(s: &str) -> &str {
    let n = s.bytes().take_while(|&c| is_ident(c)).count();
    &s[..n]
}
