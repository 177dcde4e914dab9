//! ENVI header text as files in the wild write it: split into `key = value` pairs that remember their
//! line numbers, whatever the line endings (LF, CRLF or CR alone) and whatever bytes a line holds.
//!
//! A line that is not UTF-8 (Latin-1 descriptions are common) is decoded lossily, each bad sequence
//! becoming U+FFFD, and the pair records where: the caller decides whether the field may be read
//! that way (free text) or not (a number).

use std::borrow::Cow;

/// One line of the header: its 1-based number, its text, and the first byte that is not UTF-8.
struct Line<'a> {
    number: usize,
    text: Cow<'a, str>,
    /// `(byte column, byte)` of the first sequence that is not UTF-8, both 1-based for the column.
    not_utf8: Option<(usize, u8)>,
}

/// A `key = value` pair of a header.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Pair {
    /// The key, lower-cased, its inner whitespace collapsed to single spaces.
    pub key: String,
    /// The value, trimmed; a braced value's lines are trimmed and joined with `\n`.
    pub value: String,
    /// The 1-based line of the key.
    pub line: usize,
    /// Each line of the pair that held bytes that are not UTF-8: `(line, byte column, first such byte)`.
    pub not_utf8: Vec<(usize, usize, u8)>,
}

/// A header the lexer cannot split: the field it was reading (or `magic`) and what is wrong.
#[derive(Debug, PartialEq)]
pub(super) struct LexError {
    pub field: String,
    pub message: String,
}

/// Splits a header's bytes into pairs, after checking the `ENVI` magic on the first non-blank line.
///
/// A leading UTF-8 byte order mark is skipped; lines starting with `;` are comments; a value that
/// starts with `{` runs to the matching `}` across lines.
pub(super) fn pairs(bytes: &[u8]) -> Result<Vec<Pair>, LexError> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    let mut lines = split_lines(bytes).into_iter().skip_while(|l| l.text.trim().is_empty());
    let magic = lines.next();
    let rest = magic.as_ref().and_then(|l| l.text.trim_start().strip_prefix("ENVI"));
    let (Some(magic), Some(rest)) = (&magic, rest) else {
        return Err(LexError {
            field: "magic".into(),
            message: "the first line is not `ENVI`".into(),
        });
    };
    // What follows `ENVI` on its line is read as a line of its own (it is normally empty).
    let first = Line {
        number: magic.number,
        text: Cow::Owned(rest.to_string()),
        not_utf8: magic.not_utf8,
    };
    split_pairs(std::iter::once(first).chain(lines))
}

/// Splits at `\r\n`, `\n` or a lone `\r`, each ending one line.
fn split_lines(bytes: &[u8]) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        if bytes[i] == b'\n' || bytes[i] == b'\r' {
            out.push(decode(out.len() + 1, &bytes[start..i]));
            if bytes[i] == b'\r' && bytes.get(i + 1) == Some(&b'\n') {
                i += 1;
            }
            start = i + 1;
        }
        i += 1;
    }
    if start < bytes.len() {
        out.push(decode(out.len() + 1, &bytes[start..]));
    }
    out
}

fn decode(number: usize, raw: &[u8]) -> Line<'_> {
    match std::str::from_utf8(raw) {
        Ok(text) => Line {
            number,
            text: Cow::Borrowed(text),
            not_utf8: None,
        },
        Err(e) => Line {
            number,
            text: String::from_utf8_lossy(raw),
            not_utf8: raw.get(e.valid_up_to()).map(|&b| (e.valid_up_to() + 1, b)),
        },
    }
}

fn split_pairs<'a>(mut lines: impl Iterator<Item = Line<'a>>) -> Result<Vec<Pair>, LexError> {
    let mut pairs = Vec::new();
    while let Some(line) = lines.next() {
        let text = line.text.trim();
        if text.is_empty() || text.starts_with(';') {
            continue;
        }
        let Some((key, value)) = text.split_once('=') else {
            return Err(LexError {
                field: text.to_string(),
                message: format!("line {}: expected `key = value`", line.number),
            });
        };
        let key = key
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_ascii_lowercase();
        let mut pair = Pair {
            key,
            value: value.trim().to_string(),
            line: line.number,
            not_utf8: Vec::new(),
        };
        pair.not_utf8
            .extend(line.not_utf8.map(|(col, b)| (line.number, col, b)));
        if pair.value.starts_with('{') {
            while brace_depth(&pair.value) > 0 {
                let Some(next) = lines.next() else {
                    return Err(LexError {
                        field: pair.key,
                        message: format!("line {}: `{{` is never closed", pair.line),
                    });
                };
                pair.value.push('\n');
                pair.value.push_str(next.text.trim());
                pair.not_utf8
                    .extend(next.not_utf8.map(|(col, b)| (next.number, col, b)));
            }
        }
        pairs.push(pair);
    }
    Ok(pairs)
}

fn brace_depth(s: &str) -> i64 {
    s.chars().fold(0, |d, c| match c {
        '{' => d + 1,
        '}' => d - 1,
        _ => d,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_values_lines(bytes: &[u8]) -> Vec<(String, String, usize)> {
        pairs(bytes)
            .unwrap()
            .into_iter()
            .map(|p| (p.key, p.value, p.line))
            .collect()
    }

    #[test]
    fn lf_crlf_cr_and_mixed_endings_give_the_same_pairs_and_line_numbers() {
        let lf = "ENVI\ndescription = {two\n lines}\n\nSamples = 3\n; a comment\nband names = {a,\nb}\n";
        let want = vec![
            ("description".to_string(), "{two\nlines}".to_string(), 2),
            ("samples".to_string(), "3".to_string(), 5),
            ("band names".to_string(), "{a,\nb}".to_string(), 7),
        ];
        assert_eq!(keys_values_lines(lf.as_bytes()), want);
        assert_eq!(keys_values_lines(lf.replace('\n', "\r\n").as_bytes()), want);
        assert_eq!(keys_values_lines(lf.replace('\n', "\r").as_bytes()), want);
        // Mixed, and no final line ending.
        let mixed = "ENVI\r\ndescription = {two\r lines}\n\r\nSamples = 3\r; a comment\nband names = {a,\r\nb}";
        assert_eq!(keys_values_lines(mixed.as_bytes()), want);
    }

    #[test]
    fn bytes_that_are_not_utf8_are_replaced_and_located() {
        // "Café" in ISO-8859-1 on line 3, a braced value whose second line is Latin-1 too.
        let bytes = b"\xEF\xBB\xBFENVI\r\rdescription = {Caf\xE9\r na\xEFve}\rsamples = 3\r";
        let p = pairs(bytes).unwrap();
        assert_eq!(p[0].key, "description");
        assert_eq!(p[0].value, "{Caf\u{FFFD}\nna\u{FFFD}ve}");
        assert_eq!(p[0].not_utf8, vec![(3, 19, 0xE9), (4, 4, 0xEF)]);
        assert_eq!((p[1].key.as_str(), p[1].line), ("samples", 5));
        assert!(p[1].not_utf8.is_empty());
    }

    #[test]
    fn a_missing_magic_or_an_unclosed_brace_is_named() {
        let e = pairs(b"\n\nNOPE\nsamples = 1").unwrap_err();
        assert_eq!(e.field, "magic");
        assert_eq!(pairs(b"").unwrap_err().field, "magic");
        let e = pairs(b"ENVI\rband names = {a, b\rsamples = 1").unwrap_err();
        assert_eq!(e.field, "band names");
        assert!(
            e.message.contains("line 2") && e.message.contains("never closed"),
            "{e:?}"
        );
        let e = pairs(b"ENVI\n\nsamples 1\n").unwrap_err();
        assert!(e.message.contains("line 3"), "{e:?}");
    }
}
