//! One gzip member (RFC 1952), read as flate2's `GzDecoder` reads it (the same header
//! checks, the same errors), except that the CRC-32 of the decompressed bytes is left to
//! whoever scans them: the inflating and the scanning of a large state can then run on two
//! threads, each taking about half the work (`cargo bench --bench state_read`).

use std::io::{self, BufRead, BufReader, Read};

use flate2::bufread::DeflateDecoder;

use super::{GzipFailure, Sniff};

/// RFC 1952's flag bits.
const FHCRC: u8 = 1 << 1;
const FEXTRA: u8 = 1 << 2;
const FNAME: u8 = 1 << 3;
const FCOMMENT: u8 = 1 << 4;
const FRESERVED: u8 = 1 << 5 | 1 << 6 | 1 << 7;
/// The longest file name or comment read in a header (flate2's limit).
const MAX_HEADER_FIELD: usize = 65_535;

/// How the member ended, for the scanner to check against what it scanned.
#[derive(Debug)]
pub(super) enum Ending {
    /// Reading failed: the failure, decided where the bytes are.
    Failed(GzipFailure),
    /// The member's trailer: the CRC-32 and the length (modulo 2^32) of the decompressed
    /// bytes; and where data after the member starts, if any does.
    Trailer {
        crc: u32,
        amount: u32,
        trailing: Option<u64>,
    },
}

/// Inflates one gzip member, under the decompression cap.
pub(super) struct Inflater<R: Read> {
    body: DeflateDecoder<BufReader<Sniff<R>>>,
    header_read: bool,
    produced: u64,
    cap: u64,
}

impl<R: Read> Inflater<R> {
    pub(super) fn new(gzip: R, cap: u64, buffer: usize) -> Self {
        let sniff = Sniff {
            inner: gzip,
            head: Vec::with_capacity(2),
            consumed: 0,
        };
        Inflater {
            body: DeflateDecoder::new(BufReader::with_capacity(buffer, sniff)),
            header_read: false,
            produced: 0,
            cap,
        }
    }

    /// The next decompressed bytes into `buf` (how many, never 0), or how the member ended.
    pub(super) fn inflate(&mut self, buf: &mut [u8]) -> Result<usize, Ending> {
        if !self.header_read {
            let parsed = header(self.body.get_mut());
            parsed.map_err(|e| Ending::Failed(self.classify(e)))?;
            self.header_read = true;
        }
        loop {
            match self.body.read(buf) {
                Ok(0) => return Err(self.trailer()),
                Ok(n) => {
                    self.produced += n as u64;
                    if self.produced > self.cap {
                        return Err(Ending::Failed(GzipFailure::OverCap { cap: self.cap }));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Ending::Failed(self.classify(e))),
            }
        }
    }

    /// The 8 bytes after the deflate data, and then nothing.
    fn trailer(&mut self) -> Ending {
        let mut trailer = [0u8; 8];
        let read = self.body.get_mut().read_exact(&mut trailer);
        if let Err(e) = read {
            return Ending::Failed(self.classify(e));
        }
        let reader = self.body.get_mut();
        let trailing = match reader.fill_buf() {
            Ok(rest) => !rest.is_empty(),
            Err(e) => {
                return Ending::Failed(GzipFailure::Io {
                    detail: e.to_string(),
                });
            }
        };
        let [c0, c1, c2, c3, a0, a1, a2, a3] = trailer;
        Ending::Trailer {
            crc: u32::from_le_bytes([c0, c1, c2, c3]),
            amount: u32::from_le_bytes([a0, a1, a2, a3]),
            trailing: trailing.then(|| reader.get_ref().consumed - reader.buffer().len() as u64),
        }
    }

    /// What a read error means, by where it happened.
    fn classify(&mut self, e: io::Error) -> GzipFailure {
        let sniff = self.body.get_ref().get_ref();
        if sniff.head.as_slice() != [0x1f, 0x8b] {
            return GzipFailure::NotGzip {
                head: sniff.head.clone(),
            };
        }
        let compressed = sniff.consumed;
        if !self.header_read {
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
}

/// Reads and checks the member's header (as flate2's `GzHeaderParser` does).
fn header(r: &mut impl BufRead) -> io::Result<()> {
    let mut fixed = [0u8; 10];
    r.read_exact(&mut fixed)?;
    if fixed[0] != 0x1f || fixed[1] != 0x8b || fixed[2] != 8 {
        return Err(invalid("invalid gzip header"));
    }
    let flags = fixed[3];
    if flags & FRESERVED != 0 {
        return Err(invalid("invalid gzip header"));
    }
    let mut crc = (flags & FHCRC != 0).then(flate2::Crc::new);
    let mut seen = |bytes: &[u8]| {
        if let Some(crc) = crc.as_mut() {
            crc.update(bytes);
        }
    };
    seen(&fixed);
    if flags & FEXTRA != 0 {
        let mut xlen = [0u8; 2];
        r.read_exact(&mut xlen)?;
        seen(&xlen);
        let mut left = usize::from(u16::from_le_bytes(xlen));
        let mut chunk = [0u8; 512];
        while left > 0 {
            let n = left.min(chunk.len());
            r.read_exact(&mut chunk[..n])?;
            seen(&chunk[..n]);
            left -= n;
        }
    }
    for field in [FNAME, FCOMMENT] {
        if flags & field != 0 {
            let mut len = 0usize;
            loop {
                let byte = next_byte(r)?;
                seen(&[byte]);
                if byte == 0 {
                    break;
                }
                len += 1;
                if len > MAX_HEADER_FIELD {
                    return Err(invalid("gzip header field too long"));
                }
            }
        }
    }
    if let Some(crc) = crc {
        let mut stored = [0u8; 2];
        r.read_exact(&mut stored)?;
        if u16::from_le_bytes(stored) != crc.sum() as u16 {
            return Err(invalid(
                "corrupt gzip stream does not have a matching checksum",
            ));
        }
    }
    Ok(())
}

fn invalid(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

fn next_byte(r: &mut impl BufRead) -> io::Result<u8> {
    let mut byte = [0u8; 1];
    r.read_exact(&mut byte)?;
    Ok(byte[0])
}
