//! The gzip member read here against flate2's `GzDecoder` (which read it before the CRC
//! moved to the scanner), and the two-thread read against the one-thread read.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;

use super::*;

const CAP: u64 = 1 << 30;

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn a_state() -> Vec<u8> {
    let mut s = String::from(r#"{"version":4,"serial":3,"lineage":"l-1","resources":["#);
    for r in 0..12 {
        if r > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            r#"{{"mode":"managed","type":"t","name":"r{r}","instances":[{{"attributes":{{"id":"{r}-{}"}}}}]}}"#,
            "x".repeat(r * 7)
        ));
    }
    s.push_str("]}");
    s.into_bytes()
}

/// What flate2's `GzDecoder` makes of one gzip member, as the scanner's source classified
/// its errors before: the kind of failure, or "Ok".
fn flate2_verdict(bytes: &[u8], cap: u64) -> &'static str {
    if !bytes.starts_with(&[0x1f, 0x8b]) {
        return "NotGzip";
    }
    let mut dec = flate2::bufread::GzDecoder::new(bytes);
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        match dec.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                total += n as u64;
                if total > cap {
                    return "OverCap";
                }
            }
            Err(e) if dec.header().is_none() => {
                return if e.kind() == io::ErrorKind::UnexpectedEof {
                    "Truncated"
                } else {
                    "BadHeader"
                };
            }
            Err(e) => {
                return match e.kind() {
                    io::ErrorKind::UnexpectedEof => "Truncated",
                    io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData => "Damaged",
                    _ => "Io",
                };
            }
        }
    }
    if dec.into_inner().is_empty() {
        "Ok"
    } else {
        "TrailingData"
    }
}

fn verdict(scanned: &Scanned) -> &'static str {
    match scanned {
        Scanned::Gzip(GzipFailure::NotGzip { .. }) => "NotGzip",
        Scanned::Gzip(GzipFailure::BadHeader { .. }) => "BadHeader",
        Scanned::Gzip(GzipFailure::Truncated { .. }) => "Truncated",
        Scanned::Gzip(GzipFailure::Damaged { .. }) => "Damaged",
        Scanned::Gzip(GzipFailure::TrailingData { .. }) => "TrailingData",
        Scanned::Gzip(GzipFailure::OverCap { .. }) => "OverCap",
        Scanned::Gzip(GzipFailure::Io { .. }) => "Io",
        Scanned::Json(_) | Scanned::Ok(_) => "Ok",
    }
}

/// Both ways of reading agree with each other, and with flate2 on the gzip layer.
fn check(bytes: &[u8], cap: u64, what: &str) -> Scanned {
    let here = scan_with(bytes, cap, false);
    let piped = scan_with(bytes, cap, true);
    assert_eq!(here, piped, "{what}: one thread and two disagree");
    assert_eq!(
        verdict(&here),
        flate2_verdict(bytes, cap),
        "{what}: {here:?}"
    );
    here
}

/// A member with every optional header field (RFC 1952): extra field, file name, comment
/// and the header's own CRC-16.
fn with_every_header_field(body: &[u8], header_crc_ok: bool) -> Vec<u8> {
    let plain = gz(body);
    // flate2 writes a 10-byte header with no flags: keep its deflate data and trailer.
    let rest = &plain[10..];
    let mut h = vec![0x1f, 0x8b, 8, 0b0001_1110, 0, 0, 0, 0, 0, 255];
    h.extend_from_slice(&5u16.to_le_bytes());
    h.extend_from_slice(b"ab\x00cd");
    h.extend_from_slice(b"terraform.tfstate\x00");
    h.extend_from_slice(b"a comment\x00");
    let mut crc = flate2::Crc::new();
    crc.update(&h);
    let sum = crc.sum() as u16 ^ u16::from(!header_crc_ok);
    h.extend_from_slice(&sum.to_le_bytes());
    h.extend_from_slice(rest);
    h
}

#[test]
fn every_cut_and_flipped_byte_reads_as_flate2_reads_it_on_one_thread_and_on_two() {
    let good = gz(&a_state());
    assert!(matches!(check(&good, CAP, "whole"), Scanned::Ok(_)));
    for cut in 0..good.len() {
        check(&good[..cut], CAP, &format!("cut at {cut}"));
    }
    for at in 0..good.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = good.clone();
            bad[at] ^= flip;
            check(&bad, CAP, &format!("byte {at} ^ {flip:#x}"));
        }
    }
    let mut trailing = good.clone();
    trailing.extend_from_slice(b"\0\0");
    assert_eq!(verdict(&check(&trailing, CAP, "trailing")), "TrailingData");
    let mut reserved = good.clone();
    reserved[3] |= 0x20;
    assert_eq!(
        verdict(&check(&reserved, CAP, "reserved flag")),
        "BadHeader"
    );
}

#[test]
fn every_optional_header_field_is_read_and_the_headers_crc_checked() {
    let body = a_state();
    let full = with_every_header_field(&body, true);
    assert!(matches!(check(&full, CAP, "all fields"), Scanned::Ok(_)));
    for cut in 0..60 {
        check(&full[..cut], CAP, &format!("header cut at {cut}"));
    }
    let wrong = with_every_header_field(&body, false);
    match check(&wrong, CAP, "wrong header CRC") {
        Scanned::Gzip(GzipFailure::BadHeader { detail }) => {
            assert!(detail.contains("checksum"), "{detail}")
        }
        other => panic!("wrong header CRC: {other:?}"),
    }
}

#[test]
fn the_cap_and_the_json_errors_are_the_same_on_two_threads() {
    let body = a_state();
    let len = body.len() as u64;
    let g = gz(&body);
    assert!(matches!(check(&g, len, "at the cap"), Scanned::Ok(_)));
    assert_eq!(verdict(&check(&g, len - 1, "over the cap")), "OverCap");
    // Bad JSON is read to its end: a damaged end still wins over it.
    let junk = gz(b"{\"version\": x}");
    assert!(matches!(check(&junk, CAP, "bad json"), Scanned::Json(_)));
    let mut damaged = junk.clone();
    let n = damaged.len();
    damaged[n - 8] ^= 1;
    assert_eq!(
        verdict(&check(&damaged, CAP, "bad json, bad crc")),
        "Damaged"
    );
    // More than the pipe's buffers hold, many times over, with a JSON error at its end.
    let mut big = a_state();
    big.pop();
    big.extend(std::iter::repeat_n(b' ', 3 * 1024 * 1024));
    big.extend_from_slice(b"]}");
    let g = gz(&big);
    match check(&g, CAP, "big") {
        Scanned::Json(e) => assert_eq!(e.offset, big.len() as u64 - 2, "{e:?}"),
        other => panic!("big: {other:?}"),
    }
}
