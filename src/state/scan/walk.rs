//! The scanner and the walk of a state's structure: the top-level object, `resources`,
//! each resource's `mode` and `instances`.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Container {
    Object,
    Array,
}

/// Number tokens, as far as CAPTF cares.
pub(super) enum Number {
    /// A non-negative integer without fraction or exponent that fits in u64.
    Unsigned(u64),
    Other,
}

pub(super) type JResult<T> = Result<T, JsonError>;

pub(super) struct Scanner<R: Read> {
    pub(super) src: Source<R>,
    /// Container stack of the generic skipper.
    pub(super) stack: Vec<Container>,
    /// The current object key, decoded (only when at most MAX_KEY bytes).
    pub(super) key: Vec<u8>,
}

pub(super) const fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// Index of the first byte in `s` that is `"`, `\` or a control character.
#[inline(always)]
pub(super) fn find_string_special(s: &[u8]) -> Option<usize> {
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
    pub(super) fn offset(&self) -> u64 {
        self.src.total - (self.src.len - self.src.pos) as u64
    }

    pub(super) fn err<T>(&self, what: impl Into<String>) -> JResult<T> {
        Err(JsonError {
            offset: self.offset(),
            what: what.into(),
        })
    }

    pub(super) fn eof<T>(&self) -> JResult<T> {
        self.err("the document ends early")
    }

    pub(super) fn unexpected<T>(&self, b: u8, expected: &str) -> JResult<T> {
        let shown = if b.is_ascii_graphic() {
            format!("'{}'", b as char)
        } else {
            format!("byte 0x{b:02x}")
        };
        self.err(format!("unexpected {shown} where {expected} was expected"))
    }

    #[inline(always)]
    pub(super) fn peek(&mut self) -> Option<u8> {
        if self.src.pos < self.src.len || self.src.fill() {
            Some(self.src.buf[self.src.pos])
        } else {
            None
        }
    }

    /// Skips whitespace and returns the next byte without consuming it.
    #[inline(always)]
    pub(super) fn peek_token(&mut self) -> JResult<u8> {
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
    pub(super) fn bump(&mut self) {
        self.src.pos += 1;
    }

    /// Skips whitespace and consumes `want`.
    pub(super) fn expect(&mut self, want: u8, expected: &str) -> JResult<()> {
        let b = self.peek_token()?;
        if b != want {
            return self.unexpected(b, expected);
        }
        self.bump();
        Ok(())
    }

    pub(super) fn document(&mut self) -> JResult<Summary> {
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
    pub(super) fn members(
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
    pub(super) fn elements(
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
    pub(super) fn key_and_colon(&mut self) -> JResult<()> {
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

    pub(super) fn top_object(&mut self, s: &mut Summary) -> JResult<()> {
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

    pub(super) fn unsigned_field(&mut self, name: &str) -> JResult<Field<u64>> {
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
    pub(super) fn resources(&mut self) -> JResult<Field<u64>> {
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
    pub(super) fn resource(&mut self) -> JResult<Result<u64, String>> {
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
    pub(super) fn instances(&mut self) -> JResult<Result<u64, String>> {
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
}
