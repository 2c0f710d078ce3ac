//! The streaming side of state reading: gunzip under a decompression cap, and a JSON
//! scanner that validates the whole document while keeping only the few facts CAPTF needs
//! (top-level `version`, `lineage`, `serial`, the encryption keys, and per resource its
//! `mode` and the number of its `instances`). Nothing is built of the document: strings are
//! skipped by looking for their end (8 bytes at a time), and memory stays at the buffers.

use std::io::{self, BufRead, BufReader, Read};

use flate2::bufread::GzDecoder;

/// Size of the decompressed-JSON buffer and of the compressed-input buffer.
const BUF_SIZE: usize = 64 * 1024;
/// Go's `encoding/json` (and so Terraform) refuses documents nested deeper than this.
pub(crate) const MAX_DEPTH: usize = 10_000;
/// Longest lineage accepted (Terraform writes a 36-character UUID).
pub(crate) const MAX_LINEAGE: usize = 1024;
/// Keys longer than this are none of the keys CAPTF looks for.
const MAX_KEY: usize = 32;

/// Why the bytes could not be decompressed (checked before the JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GzipFailure {
    /// The data does not start with the gzip magic bytes, or its header is invalid.
    NotGzip { head: Vec<u8> },
    /// It starts like gzip, but its header is invalid.
    BadHeader { detail: String },
    /// The gzip stream ends before its end (deflate end and 8-byte trailer).
    Truncated { compressed: u64 },
    /// The deflate data or the trailer (CRC, length) is damaged.
    Damaged { detail: String },
    /// Bytes follow the end of the gzip stream.
    TrailingData { compressed: u64 },
    /// More than `cap` bytes of JSON: reading stopped there.
    OverCap { cap: u64 },
    /// Reading the input itself failed.
    Io { detail: String },
}

/// What is wrong with the JSON text itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JsonError {
    /// Byte offset in the decompressed document.
    pub offset: u64,
    pub what: String,
}

/// A top-level field: not there, there but unusable (why), or its value. The last
/// occurrence of a key wins, like serde_json and Go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Field<T> {
    Absent,
    Invalid(String),
    Value(T),
}

impl<T> Field<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Field::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// The facts kept of a syntactically valid document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Summary {
    /// The document is a JSON object (otherwise nothing else is set).
    pub top_is_object: bool,
    pub version: Field<u64>,
    pub lineage: Field<String>,
    pub serial: Field<u64>,
    /// `encryption_version` or `encrypted_data` is a top-level key.
    pub encrypted: bool,
    /// Managed resource instances in `resources`.
    pub resources: Field<u64>,
}

/// The outcome of scanning one gzip stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scanned {
    Gzip(GzipFailure),
    Json(JsonError),
    Ok(Summary),
}

/// Gunzips `gzip` (one gzip member, nothing after it), at most `cap` bytes of output, and
/// scans the JSON. Decompression failures take precedence over JSON errors: the stream is
/// read to its end even after the JSON turned out to be bad.
pub(crate) fn scan<R: Read>(gzip: R, cap: u64) -> Scanned {
    let sniff = Sniff {
        inner: gzip,
        head: Vec::with_capacity(2),
        consumed: 0,
    };
    let dec = GzDecoder::new(BufReader::with_capacity(BUF_SIZE, sniff));
    let mut scanner = Scanner {
        src: Source {
            dec,
            buf: vec![0; BUF_SIZE].into_boxed_slice(),
            pos: 0,
            len: 0,
            total: 0,
            cap,
            done: false,
            failure: None,
        },
        stack: Vec::new(),
        key: Vec::with_capacity(MAX_KEY),
    };
    let result = scanner.document();
    // Drain the rest: truncation, trailing data and the cap are decided on the whole stream.
    scanner.src.pos = scanner.src.len;
    while scanner.src.fill() {
        scanner.src.pos = scanner.src.len;
    }
    if let Some(f) = scanner.src.failure.take() {
        return Scanned::Gzip(f);
    }
    match result {
        Ok(summary) => Scanned::Ok(summary),
        Err(e) => Scanned::Json(e),
    }
}

/// Passes compressed bytes through, remembering the first two and counting them.
struct Sniff<R> {
    inner: R,
    head: Vec<u8>,
    consumed: u64,
}

impl<R: Read> Read for Sniff<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if self.head.len() < 2 {
            let take = (2 - self.head.len()).min(n);
            self.head.extend_from_slice(&buf[..take]);
        }
        self.consumed += n as u64;
        Ok(n)
    }
}

type Decoder<R> = GzDecoder<BufReader<Sniff<R>>>;

/// Decompressed bytes, one buffer at a time, counted against the cap.
struct Source<R: Read> {
    dec: Decoder<R>,
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    /// Decompressed bytes produced so far.
    total: u64,
    cap: u64,
    done: bool,
    failure: Option<GzipFailure>,
}

impl<R: Read> Source<R> {
    /// Refills the (fully consumed) buffer; false at the end of the data or on a failure.
    #[cold]
    #[inline(never)]
    fn fill(&mut self) -> bool {
        debug_assert_eq!(self.pos, self.len);
        if self.done {
            return false;
        }
        loop {
            match self.dec.read(&mut self.buf) {
                Ok(0) => {
                    self.done = true;
                    self.check_end();
                    return false;
                }
                Ok(n) => {
                    self.total += n as u64;
                    if self.total > self.cap {
                        return self.fail(GzipFailure::OverCap { cap: self.cap });
                    }
                    self.pos = 0;
                    self.len = n;
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let failure = self.classify_error(e);
                    return self.fail(failure);
                }
            }
        }
    }

    fn fail(&mut self, failure: GzipFailure) -> bool {
        self.done = true;
        self.pos = 0;
        self.len = 0;
        self.failure.get_or_insert(failure);
        false
    }

    fn sniff(&mut self) -> &mut Sniff<R> {
        self.dec.get_mut().get_mut()
    }

    fn classify_error(&mut self, e: io::Error) -> GzipFailure {
        let sniff = self.sniff();
        if sniff.head.as_slice() != [0x1f, 0x8b] {
            return GzipFailure::NotGzip {
                head: sniff.head.clone(),
            };
        }
        let compressed = sniff.consumed;
        if self.dec.header().is_none() {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                return GzipFailure::Truncated { compressed };
            }
            return GzipFailure::BadHeader {
                detail: e.to_string(),
            };
        }
        match e.kind() {
            io::ErrorKind::UnexpectedEof => GzipFailure::Truncated { compressed },
            io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => GzipFailure::Damaged {
                detail: e.to_string(),
            },
            _ => GzipFailure::Io {
                detail: e.to_string(),
            },
        }
    }

    /// At the decoder's end: nothing may follow the gzip member.
    fn check_end(&mut self) {
        let reader = self.dec.get_mut();
        let trailing = match reader.fill_buf() {
            Ok(rest) => !rest.is_empty(),
            Err(e) => {
                let detail = e.to_string();
                self.fail(GzipFailure::Io { detail });
                return;
            }
        };
        if trailing {
            let buffered = reader.buffer().len() as u64;
            let compressed = reader.get_ref().consumed - buffered;
            self.fail(GzipFailure::TrailingData { compressed });
        } else if self.sniff().consumed == 0 {
            self.fail(GzipFailure::NotGzip { head: Vec::new() });
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

/// Number tokens, as far as CAPTF cares.
enum Number {
    /// A non-negative integer without fraction or exponent that fits in u64.
    Unsigned(u64),
    Other,
}

type JResult<T> = Result<T, JsonError>;

struct Scanner<R: Read> {
    src: Source<R>,
    /// Container stack of the generic skipper.
    stack: Vec<Container>,
    /// The current object key, decoded (only when at most MAX_KEY bytes).
    key: Vec<u8>,
}

const fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// Index of the first byte in `s` that is `"`, `\` or a control character.
#[inline(always)]
fn find_string_special(s: &[u8]) -> Option<usize> {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let mut i = 0;
    while i + 8 <= s.len() {
        let w = u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
        let quote = w ^ (LO * u64::from(b'"'));
        let backslash = w ^ (LO * u64::from(b'\\'));
        // A byte is zero (or, for `w`, below 0x20) exactly when its high bit ends up set
        // here; bytes >= 0x80 are masked out by `!w`. False positives cannot occur before
        // the first true hit, so the first set bit is exact.
        let hit = (quote.wrapping_sub(LO) & !quote)
            | (backslash.wrapping_sub(LO) & !backslash)
            | (w.wrapping_sub(LO * 0x20) & !w);
        let hit = hit & HI;
        if hit != 0 {
            return Some(i + (hit.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s[i..]
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|p| i + p)
}

impl<R: Read> Scanner<R> {
    fn offset(&self) -> u64 {
        self.src.total - (self.src.len - self.src.pos) as u64
    }

    fn err<T>(&self, what: impl Into<String>) -> JResult<T> {
        Err(JsonError {
            offset: self.offset(),
            what: what.into(),
        })
    }

    fn eof<T>(&self) -> JResult<T> {
        self.err("the document ends early")
    }

    fn unexpected<T>(&self, b: u8, expected: &str) -> JResult<T> {
        let shown = if b.is_ascii_graphic() {
            format!("'{}'", b as char)
        } else {
            format!("byte 0x{b:02x}")
        };
        self.err(format!("unexpected {shown} where {expected} was expected"))
    }

    #[inline(always)]
    fn peek(&mut self) -> Option<u8> {
        if self.src.pos < self.src.len || self.src.fill() {
            Some(self.src.buf[self.src.pos])
        } else {
            None
        }
    }

    /// Skips whitespace and returns the next byte without consuming it.
    #[inline(always)]
    fn peek_token(&mut self) -> JResult<u8> {
        loop {
            if self.src.pos == self.src.len && !self.src.fill() {
                return self.eof();
            }
            let s = &self.src.buf[self.src.pos..self.src.len];
            match s.iter().position(|&b| !is_ws(b)) {
                Some(i) => {
                    self.src.pos += i;
                    return Ok(s[i]);
                }
                None => self.src.pos = self.src.len,
            }
        }
    }

    #[inline(always)]
    fn bump(&mut self) {
        self.src.pos += 1;
    }

    /// Skips whitespace and consumes `want`.
    fn expect(&mut self, want: u8, expected: &str) -> JResult<()> {
        let b = self.peek_token()?;
        if b != want {
            return self.unexpected(b, expected);
        }
        self.bump();
        Ok(())
    }

    fn document(&mut self) -> JResult<Summary> {
        let mut summary = Summary {
            top_is_object: false,
            version: Field::Absent,
            lineage: Field::Absent,
            serial: Field::Absent,
            encrypted: false,
            resources: Field::Absent,
        };
        if self.peek_token()? == b'{' {
            summary.top_is_object = true;
            self.top_object(&mut summary)?;
        } else {
            self.skip_value(0)?;
        }
        // Only whitespace may follow.
        loop {
            match self.peek() {
                None => return Ok(summary),
                Some(b) if is_ws(b) => self.bump(),
                Some(b) => return self.unexpected(b, "the end of the document"),
            }
        }
    }

    /// Calls `each_member(self)` with `self.key` set, for every member of the object whose
    /// `{` is next. The callback must consume the member's value.
    fn members(
        &mut self,
        depth: usize,
        mut each_member: impl FnMut(&mut Self) -> JResult<()>,
    ) -> JResult<()> {
        if depth > MAX_DEPTH {
            return self.err(format!("nested more than {MAX_DEPTH} levels deep"));
        }
        self.expect(b'{', "'{'")?;
        if self.peek_token()? == b'}' {
            self.bump();
            return Ok(());
        }
        loop {
            self.key_and_colon()?;
            each_member(self)?;
            match self.peek_token()? {
                b',' => self.bump(),
                b'}' => {
                    self.bump();
                    return Ok(());
                }
                b => return self.unexpected(b, "',' or '}'"),
            }
        }
    }

    /// Calls `each(self)` for every element of the array whose `[` is next. The callback
    /// must consume the element.
    fn elements(
        &mut self,
        depth: usize,
        mut each: impl FnMut(&mut Self) -> JResult<()>,
    ) -> JResult<()> {
        if depth > MAX_DEPTH {
            return self.err(format!("nested more than {MAX_DEPTH} levels deep"));
        }
        self.expect(b'[', "'['")?;
        if self.peek_token()? == b']' {
            self.bump();
            return Ok(());
        }
        loop {
            each(self)?;
            match self.peek_token()? {
                b',' => self.bump(),
                b']' => {
                    self.bump();
                    return Ok(());
                }
                b => return self.unexpected(b, "',' or ']'"),
            }
        }
    }

    /// Reads an object key into `self.key` (when short) and the `:` after it.
    fn key_and_colon(&mut self) -> JResult<()> {
        let b = self.peek_token()?;
        if b != b'"' {
            return self.unexpected(b, "a string key");
        }
        self.bump();
        let mut key = std::mem::take(&mut self.key);
        key.clear();
        let fits = self.string_body(Some((&mut key, MAX_KEY)));
        self.key = key;
        if !fits? {
            self.key.clear();
            self.key.push(0); // matches no key we look for
        }
        self.expect(b':', "':'")
    }

    fn top_object(&mut self, s: &mut Summary) -> JResult<()> {
        self.members(1, |this| {
            match this.key.as_slice() {
                b"version" => s.version = this.unsigned_field("version")?,
                b"serial" => s.serial = this.unsigned_field("serial")?,
                b"lineage" => {
                    s.lineage = if this.peek_token()? == b'"' {
                        this.bump();
                        let mut text = Vec::new();
                        if !this.string_body(Some((&mut text, MAX_LINEAGE)))? {
                            Field::Invalid(format!("lineage is longer than {MAX_LINEAGE} bytes"))
                        } else if text.is_empty() {
                            Field::Invalid("lineage is empty".into())
                        } else {
                            Field::Value(String::from_utf8_lossy(&text).into_owned())
                        }
                    } else {
                        this.skip_value(1)?;
                        Field::Invalid("lineage is not a string".into())
                    }
                }
                b"encryption_version" | b"encrypted_data" => {
                    s.encrypted = true;
                    this.skip_value(1)?;
                }
                b"resources" => {
                    s.resources = if this.peek_token()? == b'[' {
                        this.resources()?
                    } else {
                        this.skip_value(1)?;
                        Field::Invalid("resources is not an array".into())
                    }
                }
                _ => this.skip_value(1)?,
            }
            Ok(())
        })
    }

    fn unsigned_field(&mut self, name: &str) -> JResult<Field<u64>> {
        let b = self.peek_token()?;
        if b == b'-' || b.is_ascii_digit() {
            Ok(match self.number()? {
                Number::Unsigned(n) => Field::Value(n),
                Number::Other => Field::Invalid(format!("{name} is not a non-negative integer")),
            })
        } else {
            self.skip_value(1)?;
            Ok(Field::Invalid(format!("{name} is not a number")))
        }
    }

    /// The `resources` array (next): managed instances, or why it is not a state's.
    fn resources(&mut self) -> JResult<Field<u64>> {
        let mut managed = 0u64;
        let mut problem: Option<String> = None;
        let mut index = 0usize;
        self.elements(2, |this| {
            if this.peek_token()? != b'{' {
                this.skip_value(2)?;
                problem.get_or_insert(format!("resources[{index}] is not an object"));
            } else {
                match this.resource()? {
                    Ok(n) => managed += n,
                    Err(why) => {
                        problem.get_or_insert(format!("resources[{index}] {why}"));
                    }
                }
            }
            index += 1;
            Ok(())
        })?;
        Ok(match problem {
            Some(p) => Field::Invalid(p),
            None => Field::Value(managed),
        })
    }

    /// One resource object (next): its managed instance count (0 for a data source), or
    /// why it is unusable.
    fn resource(&mut self) -> JResult<Result<u64, String>> {
        enum Mode {
            Absent,
            Managed,
            Data,
            Bad(String),
        }
        let mut mode = Mode::Absent;
        let mut instances: Result<u64, String> = Ok(0);
        self.members(3, |this| {
            match this.key.as_slice() {
                b"mode" => {
                    mode = if this.peek_token()? == b'"' {
                        this.bump();
                        let mut text = Vec::new();
                        let fits = this.string_body(Some((&mut text, 16)))?;
                        match text.as_slice() {
                            b"managed" if fits => Mode::Managed,
                            b"data" if fits => Mode::Data,
                            _ => Mode::Bad(format!(
                                "has mode \"{}\" (neither \"managed\" nor \"data\")",
                                String::from_utf8_lossy(&text)
                            )),
                        }
                    } else {
                        this.skip_value(3)?;
                        Mode::Bad("has a mode that is not a string".into())
                    };
                }
                b"instances" => {
                    instances = match this.peek_token()? {
                        b'[' => this.instances()?,
                        b'n' => {
                            this.skip_value(3)?;
                            Ok(0)
                        }
                        _ => {
                            this.skip_value(3)?;
                            Err("has instances that are not an array".into())
                        }
                    };
                }
                _ => this.skip_value(3)?,
            }
            Ok(())
        })?;
        Ok(match mode {
            Mode::Managed => instances,
            Mode::Data => instances.map(|_| 0),
            Mode::Absent => Err("has no mode".into()),
            Mode::Bad(why) => Err(why),
        })
    }

    /// The `instances` array (next): its element count.
    fn instances(&mut self) -> JResult<Result<u64, String>> {
        let mut count = 0u64;
        let mut all_objects = true;
        self.elements(4, |this| {
            if this.peek_token()? != b'{' {
                all_objects = false;
            }
            this.skip_value(4)?;
            count += 1;
            Ok(())
        })?;
        Ok(if all_objects {
            Ok(count)
        } else {
            Err("has an instance that is not an object".into())
        })
    }

    /// Skips one value of any kind (next), validating it. `depth` is the nesting depth of
    /// the container holding it.
    fn skip_value(&mut self, depth: usize) -> JResult<()> {
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

    fn skip_key_and_colon(&mut self) -> JResult<()> {
        let b = self.peek_token()?;
        if b != b'"' {
            return self.unexpected(b, "a string key");
        }
        self.bump();
        self.string_body(None)?;
        self.expect(b':', "':'")
    }

    fn literal(&mut self, word: &'static [u8]) -> JResult<()> {
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
    fn number(&mut self) -> JResult<Number> {
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
    fn digits(&mut self) -> JResult<()> {
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
    fn string_body(&mut self, mut capture: Option<(&mut Vec<u8>, usize)>) -> JResult<bool> {
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
    fn escape<'a>(&mut self, utf8: &'a mut [u8; 4]) -> JResult<&'a [u8]> {
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

    fn hex4(&mut self) -> JResult<u32> {
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
fn push_limited(out: &mut Vec<u8>, s: &[u8], limit: usize) -> bool {
    if out.len() + s.len() <= limit {
        out.extend_from_slice(s);
        true
    } else {
        false
    }
}
