//! The scanner's lexical side: skipping any value, literals, numbers and strings
//! (decoding a string only when it is captured).

use super::walk::{Container, JResult, Number, find_string_special};
use super::*;

impl<R: Read> Scanner<R> {
    /// Skips one value of any kind (next), validating it. `depth` is the nesting depth of
    /// the container holding it.
    pub(super) fn skip_value(&mut self, depth: usize) -> JResult<()> {
        let base = self.stack.len();
        'value: loop {
            // A value is expected.
            let b = self.peek_token()?;
            match b {
                b'{' | b'[' => {
                    if depth + self.stack.len() - base + 1 > MAX_DEPTH {
                        return self.err(format!("nested more than {MAX_DEPTH} levels deep"));
                    }
                    self.bump();
                    let close = if b == b'{' { b'}' } else { b']' };
                    if self.peek_token()? == close {
                        self.bump();
                    } else if b == b'{' {
                        self.stack.push(Container::Object);
                        self.skip_key_and_colon()?;
                        continue 'value;
                    } else {
                        self.stack.push(Container::Array);
                        continue 'value;
                    }
                }
                b'"' => {
                    self.bump();
                    self.string_body(None)?;
                }
                b'-' | b'0'..=b'9' => {
                    self.number()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => return self.unexpected(b, "a value"),
            }
            // After a value: close containers or move on to the next member/element.
            loop {
                let Some(&top) = self.stack.last() else {
                    return Ok(());
                };
                if self.stack.len() == base {
                    return Ok(());
                }
                let b = self.peek_token()?;
                match (top, b) {
                    (_, b',') => {
                        self.bump();
                        if top == Container::Object {
                            self.skip_key_and_colon()?;
                        }
                        continue 'value;
                    }
                    (Container::Object, b'}') | (Container::Array, b']') => {
                        self.bump();
                        self.stack.pop();
                    }
                    (Container::Object, _) => return self.unexpected(b, "',' or '}'"),
                    (Container::Array, _) => return self.unexpected(b, "',' or ']'"),
                }
            }
        }
    }

    pub(super) fn skip_key_and_colon(&mut self) -> JResult<()> {
        let b = self.peek_token()?;
        if b != b'"' {
            return self.unexpected(b, "a string key");
        }
        self.bump();
        self.string_body(None)?;
        self.expect(b':', "':'")
    }

    pub(super) fn literal(&mut self, word: &'static [u8]) -> JResult<()> {
        for &want in word {
            match self.peek() {
                Some(b) if b == want => self.bump(),
                Some(b) => {
                    return self
                        .unexpected(b, &format!("the literal {}", String::from_utf8_lossy(word)));
                }
                None => return self.eof(),
            }
        }
        Ok(())
    }

    /// A number token (next), validated against the JSON grammar.
    pub(super) fn number(&mut self) -> JResult<Number> {
        let mut negative = false;
        let mut value: Option<u64> = Some(0);
        if self.peek() == Some(b'-') {
            negative = true;
            self.bump();
        }
        match self.peek() {
            Some(b'0') => self.bump(),
            Some(b'1'..=b'9') => {
                while let Some(b @ b'0'..=b'9') = self.peek() {
                    value = value
                        .and_then(|v| v.checked_mul(10))
                        .and_then(|v| v.checked_add(u64::from(b - b'0')));
                    self.bump();
                }
            }
            Some(b) => return self.unexpected(b, "a digit"),
            None => return self.eof(),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.bump();
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            integer = false;
            self.bump();
            if let Some(b'+' | b'-') = self.peek() {
                self.bump();
            }
            self.digits()?;
        }
        Ok(match value {
            Some(v) if integer && !negative => Number::Unsigned(v),
            _ => Number::Other,
        })
    }

    /// One or more digits.
    pub(super) fn digits(&mut self) -> JResult<()> {
        match self.peek() {
            Some(b'0'..=b'9') => self.bump(),
            Some(b) => return self.unexpected(b, "a digit"),
            None => return self.eof(),
        }
        while let Some(b'0'..=b'9') = self.peek() {
            self.bump();
        }
        Ok(())
    }

    /// The rest of a string after its opening quote. With `capture`, the decoded bytes are
    /// appended up to `limit`; returns whether they all fit.
    pub(super) fn string_body(
        &mut self,
        mut capture: Option<(&mut Vec<u8>, usize)>,
    ) -> JResult<bool> {
        let mut fits = true;
        loop {
            if self.src.pos == self.src.len && !self.src.fill() {
                return self.eof();
            }
            let s = &self.src.buf[self.src.pos..self.src.len];
            let Some(i) = find_string_special(s) else {
                if let Some((out, limit)) = capture.as_mut() {
                    fits &= push_limited(out, s, *limit);
                }
                self.src.pos = self.src.len;
                continue;
            };
            if let Some((out, limit)) = capture.as_mut() {
                fits &= push_limited(out, &s[..i], *limit);
            }
            let b = s[i];
            self.src.pos += i;
            match b {
                b'"' => {
                    self.bump();
                    return Ok(fits);
                }
                b'\\' => {
                    self.bump();
                    let mut utf8 = [0u8; 4];
                    let decoded = self.escape(&mut utf8)?;
                    if let Some((out, limit)) = capture.as_mut() {
                        fits &= push_limited(out, decoded, *limit);
                    }
                }
                _ => return self.unexpected(b, "a character or '\"' in a string"),
            }
        }
    }

    /// An escape sequence after its backslash, decoded into `utf8`.
    pub(super) fn escape<'a>(&mut self, utf8: &'a mut [u8; 4]) -> JResult<&'a [u8]> {
        let Some(b) = self.peek() else {
            return self.eof();
        };
        self.bump();
        let simple = match b {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let first = self.hex4()?;
                let c = if (0xd800..0xdc00).contains(&first) {
                    // A high surrogate: a low one may follow.
                    if self.peek() == Some(b'\\') {
                        self.bump();
                        match self.peek() {
                            Some(b'u') => {
                                self.bump();
                                let second = self.hex4()?;
                                if (0xdc00..0xe000).contains(&second) {
                                    char::from_u32(
                                        0x10000 + ((first - 0xd800) << 10) + (second - 0xdc00),
                                    )
                                } else {
                                    None
                                }
                            }
                            // Another escape follows a lone surrogate: validate it
                            // without decoding (only captured strings lose anything).
                            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                                self.bump();
                                None
                            }
                            Some(b) => return self.unexpected(b, "an escape character"),
                            None => return self.eof(),
                        }
                    } else {
                        None
                    }
                } else {
                    char::from_u32(first)
                };
                let c = c.unwrap_or(char::REPLACEMENT_CHARACTER);
                return Ok(c.encode_utf8(utf8).as_bytes());
            }
            _ => return self.unexpected(b, "an escape character"),
        };
        utf8[0] = simple;
        Ok(&utf8[..1])
    }

    pub(super) fn hex4(&mut self) -> JResult<u32> {
        let mut v = 0u32;
        for _ in 0..4 {
            let Some(b) = self.peek() else {
                return self.eof();
            };
            let d = match b {
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                b'A'..=b'F' => b - b'A' + 10,
                _ => return self.unexpected(b, "a hex digit"),
            };
            self.bump();
            v = v * 16 + u32::from(d);
        }
        Ok(v)
    }
}

/// Appends `s` to `out` while `out` stays within `limit`; false once something was left out.
pub(super) fn push_limited(out: &mut Vec<u8>, s: &[u8], limit: usize) -> bool {
    if out.len() + s.len() <= limit {
        out.extend_from_slice(s);
        true
    } else {
        false
    }
}
