//! Decompressed bytes, one buffer at a time, inflated here or by a thread of their own,
//! with their CRC-32 checked against the gzip trailer at the end.

use std::sync::mpsc::{Receiver, Sender};

use super::gzip::{Ending, Inflater};
use super::*;

/// A buffer of decompressed bytes and how many it holds, or how the member ended.
pub(super) type Piece = Result<(Box<[u8]>, usize), Ending>;

/// Where the decompressed bytes come from.
pub(super) enum Feed<R: Read> {
    /// Inflated on this thread, as they are needed.
    Here(Box<Inflater<R>>),
    /// Inflated by the thread of [`pump`]: full buffers come in, read ones go back.
    Piped {
        filled: Receiver<Piece>,
        empty: Sender<Box<[u8]>>,
    },
}

/// The inflating thread: fills the buffers it is given back until the member ends, or
/// until the scanner has gone.
pub(super) fn pump<R: Read>(
    mut inflater: Inflater<R>,
    filled: Sender<Piece>,
    empty: Receiver<Box<[u8]>>,
) {
    while let Ok(mut buf) = empty.recv() {
        let piece = inflater.inflate(&mut buf).map(|n| (buf, n));
        let ended = piece.is_err();
        if filled.send(piece).is_err() || ended {
            return;
        }
    }
}

/// Decompressed bytes, one buffer at a time.
pub(super) struct Source<R: Read> {
    pub(super) feed: Feed<R>,
    pub(super) buf: Box<[u8]>,
    pub(super) pos: usize,
    pub(super) len: usize,
    /// Decompressed bytes scanned so far.
    pub(super) total: u64,
    /// Their CRC-32 and length, for the trailer.
    pub(super) crc: flate2::Crc,
    pub(super) done: bool,
    pub(super) failure: Option<GzipFailure>,
}

impl<R: Read> Source<R> {
    pub(super) fn new(feed: Feed<R>, buffer: usize) -> Self {
        Source {
            feed,
            buf: vec![0; buffer].into_boxed_slice(),
            pos: 0,
            len: 0,
            total: 0,
            crc: flate2::Crc::new(),
            done: false,
            failure: None,
        }
    }

    /// Refills the (fully consumed) buffer; false at the end of the data or on a failure.
    #[cold]
    #[inline(never)]
    pub(super) fn fill(&mut self) -> bool {
        debug_assert_eq!(self.pos, self.len);
        if self.done {
            return false;
        }
        let next = match &mut self.feed {
            Feed::Here(inflater) => inflater.inflate(&mut self.buf),
            Feed::Piped { filled, empty } => match filled.recv() {
                Ok(Ok((buf, n))) => {
                    let read = std::mem::replace(&mut self.buf, buf);
                    // The pump may have ended (at the member's end): nothing to hand back.
                    let _ = empty.send(read);
                    Ok(n)
                }
                Ok(Err(ending)) => Err(ending),
                Err(_) => Err(Ending::Failed(GzipFailure::Io {
                    detail: "the thread inflating it stopped before its end".into(),
                })),
            },
        };
        match next {
            Ok(n) => {
                self.crc.update(&self.buf[..n]);
                self.total += n as u64;
                self.pos = 0;
                self.len = n;
                true
            }
            Err(Ending::Failed(failure)) => self.fail(failure),
            Err(Ending::Trailer {
                crc,
                amount,
                trailing,
            }) => {
                if crc != self.crc.sum() || amount != self.crc.amount() {
                    return self.fail(GzipFailure::Damaged {
                        detail: "corrupt gzip stream does not have a matching checksum".into(),
                    });
                }
                if let Some(compressed) = trailing {
                    return self.fail(GzipFailure::TrailingData { compressed });
                }
                self.done = true;
                self.pos = 0;
                self.len = 0;
                false
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
}
