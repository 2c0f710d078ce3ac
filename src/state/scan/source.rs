//! Decompressed bytes, one buffer at a time, counted against the cap.

use super::*;

pub(super) type Decoder<R> = GzDecoder<BufReader<Sniff<R>>>;

/// Decompressed bytes, one buffer at a time, counted against the cap.
pub(super) struct Source<R: Read> {
    pub(super) dec: Decoder<R>,
    pub(super) buf: Box<[u8]>,
    pub(super) pos: usize,
    pub(super) len: usize,
    /// Decompressed bytes produced so far.
    pub(super) total: u64,
    pub(super) cap: u64,
    pub(super) done: bool,
    pub(super) failure: Option<GzipFailure>,
}

impl<R: Read> Source<R> {
    /// Refills the (fully consumed) buffer; false at the end of the data or on a failure.
    #[cold]
    #[inline(never)]
    pub(super) fn fill(&mut self) -> bool {
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

    pub(super) fn fail(&mut self, failure: GzipFailure) -> bool {
        self.done = true;
        self.pos = 0;
        self.len = 0;
        self.failure.get_or_insert(failure);
        false
    }

    pub(super) fn sniff(&mut self) -> &mut Sniff<R> {
        self.dec.get_mut().get_mut()
    }

    pub(super) fn classify_error(&mut self, e: io::Error) -> GzipFailure {
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
    pub(super) fn check_end(&mut self) {
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
