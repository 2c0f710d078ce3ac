//! Just enough of HCL's native syntax to read a module's blocks offline: block types,
//! labels, attributes (as their source text) and nested blocks. Strings (with their
//! `${…}` interpolations), heredocs and comments are skipped over correctly; expressions
//! are not evaluated. What `captf module check` needs, and no more: Terraform itself is
//! the judge of a module's syntax.

/// How deep blocks and strings in interpolations may nest (the reader recurses; a module's
/// files are untrusted bytes).
pub const MAX_DEPTH: usize = 64;

/// A block: `type "label" … { … }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Block {
    pub kind: String,
    pub labels: Vec<String>,
    /// The body's attributes: name and the expression's source text.
    pub attributes: Vec<(String, String)>,
    pub blocks: Vec<Block>,
    /// The body's source text, between the braces.
    pub body: String,
    /// The line of the block's type (1-based).
    pub line: usize,
}

impl Block {
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every block nested in this one, at any depth.
    pub fn descendants(&self) -> Vec<&Block> {
        let mut out = Vec::new();
        for b in &self.blocks {
            out.push(b);
            out.extend(b.descendants());
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Str(String),
    LBrace,
    RBrace,
    Open,
    Close,
    Eq,
    Newline,
    Other,
}

#[derive(Clone, Debug)]
struct Token {
    tok: Tok,
    start: usize,
    end: usize,
    line: usize,
}

/// Parses one file; the error names the line.
pub fn parse(src: &str) -> Result<Vec<Block>, String> {
    // Terraform reads a file after its UTF-8 byte order mark (some editors write one).
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    let tokens = tokenize(src)?;
    let mut i = 0;
    let (blocks, _) = body(src, &tokens, &mut i, 0)?;
    Ok(blocks)
}

fn tokenize(src: &str) -> Result<Vec<Token>, String> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let push = |out: &mut Vec<Token>, tok, start, end, line| {
        out.push(Token {
            tok,
            start,
            end,
            line,
        })
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                push(&mut out, Tok::Newline, i, i + 1, line);
                line += 1;
                i += 1;
            }
            b' ' | b'\t' | b'\r' => i += 1,
            b'#' => i = skip_line(b, i),
            b'/' if b.get(i + 1) == Some(&b'/') => i = skip_line(b, i),
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let start_line = line;
                let mut j = i + 2;
                loop {
                    if j + 1 >= b.len() {
                        return Err(format!("line {start_line}: a /* comment is not closed"));
                    }
                    if b[j] == b'\n' {
                        line += 1;
                    }
                    if b[j] == b'*' && b[j + 1] == b'/' {
                        break;
                    }
                    j += 1;
                }
                i = j + 2;
            }
            b'"' => {
                let (end, lines) = skip_string(b, i, line, 0)?;
                push(
                    &mut out,
                    Tok::Str(src[i + 1..end - 1].to_string()),
                    i,
                    end,
                    line,
                );
                line += lines;
                i = end;
            }
            b'<' if b.get(i + 1) == Some(&b'<') => {
                let (tok, end, lines) = heredoc(src, i, line)?;
                push(&mut out, tok, i, end, line);
                line += lines;
                i = end;
            }
            b'{' => {
                push(&mut out, Tok::LBrace, i, i + 1, line);
                i += 1;
            }
            b'}' => {
                push(&mut out, Tok::RBrace, i, i + 1, line);
                i += 1;
            }
            b'(' | b'[' => {
                push(&mut out, Tok::Open, i, i + 1, line);
                i += 1;
            }
            b')' | b']' => {
                push(&mut out, Tok::Close, i, i + 1, line);
                i += 1;
            }
            b'=' if matches!(b.get(i + 1), Some(b'=' | b'>')) => {
                push(&mut out, Tok::Other, i, i + 2, line);
                i += 2;
            }
            b'=' => {
                push(&mut out, Tok::Eq, i, i + 1, line);
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b'-')
                {
                    j += 1;
                }
                push(&mut out, Tok::Ident(src[i..j].to_string()), i, j, line);
                i = j;
            }
            _ => {
                // One character (or one UTF-8 sequence) of an expression.
                let len = src[i..].chars().next().map(char::len_utf8).unwrap_or(1);
                push(&mut out, Tok::Other, i, i + len, line);
                i += len;
            }
        }
    }
    Ok(out)
}

/// `src` (an expression, or a block's body) with its comments and the literal text of its
/// strings and heredocs blanked (each byte but a newline made a space), the code of their
/// `${…}` and `%{…}` kept: what it refers to, without what its comments and texts say.
pub fn code_only(src: &str) -> String {
    let mut out = src.as_bytes().to_vec();
    code(src, &mut out, 0, false);
    // Whole comments and runs of text were blanked, each from an ASCII byte to an ASCII
    // byte or the end; an unexpected cut gives the source back.
    String::from_utf8(out).unwrap_or_else(|_| src.to_string())
}

fn blank(out: &mut [u8], from: usize, to: usize) {
    let to = to.min(out.len());
    for c in &mut out[from.min(to)..to] {
        if *c != b'\n' {
            *c = b' ';
        }
    }
}

/// Code from `i`: to the end, or (`in_template`) to the `}` that closes an interpolation
/// (the index after it).
fn code(src: &str, out: &mut [u8], mut i: usize, in_template: bool) -> usize {
    let b = src.as_bytes();
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'#' => {
                let end = skip_line(b, i);
                blank(out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'/') => {
                let end = skip_line(b, i);
                blank(out, i, end);
                i = end;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let end = src[i + 2..].find("*/").map_or(b.len(), |e| i + 2 + e + 2);
                blank(out, i, end);
                i = end;
            }
            b'"' => i = template(src, out, i + 1, None),
            b'<' if b.get(i + 1) == Some(&b'<') => match heredoc(src, i, 1) {
                Ok((Tok::Str(content), end, _)) => {
                    let body = i + src[i..].find('\n').map_or(0, |n| n + 1);
                    template(src, out, body, Some(body + content.len()));
                    i = end;
                }
                _ => i += 2,
            },
            b'{' => {
                depth += 1;
                i += 1;
            }
            b'}' if in_template && depth == 0 => return i + 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            _ => i += 1,
        }
    }
    i
}

/// The text of a string (from after its opening quote; `end` None) or of a heredoc (up to
/// `end`): its literal parts blanked, the code of its interpolations and directives kept.
/// Returns the index after it.
fn template(src: &str, out: &mut [u8], mut i: usize, end: Option<usize>) -> usize {
    let b = src.as_bytes();
    let stop = end.unwrap_or(b.len()).min(b.len());
    while i < stop {
        match b[i] {
            b'\\' if end.is_none() => {
                blank(out, i, i + 2);
                i += 2;
            }
            b'$' | b'%' if b.get(i + 1) == Some(&b[i]) && b.get(i + 2) == Some(&b'{') => {
                blank(out, i, i + 3);
                i += 3;
            }
            b'$' | b'%' if b.get(i + 1) == Some(&b'{') => i = code(src, out, i + 2, true),
            b'"' if end.is_none() => return i + 1,
            _ => {
                blank(out, i, i + 1);
                i += 1;
            }
        }
    }
    stop
}

fn skip_line(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i] != b'\n' {
        i += 1;
    }
    i
}

/// The end (after the closing quote) of the string starting at `start`, and the newlines
/// in it; `${…}` and `%{…}` may hold strings and braces of their own.
fn skip_string(
    b: &[u8],
    start: usize,
    line: usize,
    nesting: usize,
) -> Result<(usize, usize), String> {
    if nesting > MAX_DEPTH {
        return Err(format!(
            "line {line}: strings nest more than {MAX_DEPTH} deep in interpolations"
        ));
    }
    let mut i = start + 1;
    let mut lines = 0;
    let mut depth = 0usize;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'$' | b'%' if b.get(i + 1) == Some(&b'{') => {
                depth += 1;
                i += 2;
            }
            b'{' if depth > 0 => {
                depth += 1;
                i += 1;
            }
            b'}' if depth > 0 => {
                depth -= 1;
                i += 1;
            }
            b'"' if depth > 0 => {
                let (end, l) = skip_string(b, i, line + lines, nesting + 1)?;
                lines += l;
                i = end;
            }
            b'"' => return Ok((i + 1, lines)),
            b'\n' => {
                lines += 1;
                i += 1;
            }
            _ => i += 1,
        }
    }
    Err(format!("line {line}: a string is not closed"))
}

/// A heredoc `<<EOT` or `<<-EOT` at `start`: its content, its end and its newlines.
fn heredoc(src: &str, start: usize, line: usize) -> Result<(Tok, usize, usize), String> {
    let rest = &src[start + 2..];
    let rest_trim = rest.strip_prefix('-').unwrap_or(rest);
    let marker: String = rest_trim
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    if marker.is_empty() {
        // `<<` in an expression (a shift has no place in HCL; take it as text).
        return Ok((Tok::Other, start + 2, 0));
    }
    let Some(nl) = src[start..].find('\n') else {
        return Err(format!("line {line}: a heredoc <<{marker} is not closed"));
    };
    let body_start = start + nl + 1;
    let mut pos = body_start;
    for (lines, l) in (1..).zip(src[body_start..].split_inclusive('\n')) {
        if l.trim() == marker {
            let content = src[body_start..pos].to_string();
            let end = pos + l.trim_end_matches(['\n', '\r']).len();
            return Ok((Tok::Str(content), end, lines));
        }
        pos += l.len();
    }
    Err(format!("line {line}: a heredoc <<{marker} is not closed"))
}

/// A body's blocks and attributes.
type Body = (Vec<Block>, Vec<(String, String)>);

/// Parses a body's attributes and blocks, up to its closing brace when `depth` > 0.
fn body(src: &str, t: &[Token], i: &mut usize, depth: usize) -> Result<Body, String> {
    if depth > MAX_DEPTH {
        return Err(format!("blocks nest more than {MAX_DEPTH} deep"));
    }
    let nested = depth > 0;
    let mut blocks = Vec::new();
    let mut attributes = Vec::new();
    loop {
        while t.get(*i).is_some_and(|x| x.tok == Tok::Newline) {
            *i += 1;
        }
        let Some(tok) = t.get(*i) else {
            if nested {
                return Err("a block is not closed (a `}` is missing)".into());
            }
            return Ok((blocks, attributes));
        };
        match &tok.tok {
            Tok::RBrace if nested => {
                *i += 1;
                return Ok((blocks, attributes));
            }
            Tok::Ident(name) => {
                let line = tok.line;
                if t.get(*i + 1).is_some_and(|x| x.tok == Tok::Eq) {
                    *i += 2;
                    let start = t.get(*i).map(|x| x.start).unwrap_or(src.len());
                    let mut end = start;
                    let mut depth = 0i64;
                    while let Some(x) = t.get(*i) {
                        match x.tok {
                            Tok::Newline if depth <= 0 => break,
                            Tok::RBrace if depth <= 0 => break,
                            Tok::LBrace | Tok::Open => depth += 1,
                            Tok::RBrace | Tok::Close => depth -= 1,
                            _ => {}
                        }
                        end = x.end;
                        *i += 1;
                    }
                    attributes.push((name.clone(), src[start..end].trim().to_string()));
                    continue;
                }
                let kind = name.clone();
                *i += 1;
                let mut labels = Vec::new();
                while let Some(x) = t.get(*i) {
                    match &x.tok {
                        Tok::Str(s) | Tok::Ident(s) => {
                            labels.push(s.clone());
                            *i += 1;
                        }
                        _ => break,
                    }
                }
                let Some(open) = t.get(*i).filter(|x| x.tok == Tok::LBrace) else {
                    return Err(format!(
                        "line {line}: expected `{{` after `{kind}{}`",
                        labels
                            .iter()
                            .map(|l| format!(" \"{l}\""))
                            .collect::<String>()
                    ));
                };
                let body_start = open.end;
                *i += 1;
                let (inner, attrs) =
                    body(src, t, i, depth + 1).map_err(|e| format!("line {line}: {kind}: {e}"))?;
                let body_end = t.get(*i - 1).map(|x| x.start).unwrap_or(src.len());
                blocks.push(Block {
                    kind,
                    labels,
                    attributes: attrs,
                    blocks: inner,
                    body: src[body_start..body_end].to_string(),
                    line,
                });
            }
            _ => {
                return Err(format!(
                    "line {}: expected a block or an attribute, found {:?}",
                    tok.line,
                    &src[tok.start..tok.end]
                ));
            }
        }
    }
}
