//! A tiny raw HTTP/1.1 client for the server's own tests (no kube, no hyper client).
#![allow(dead_code)]

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub struct Resp {
    pub status: u16,
    pub headers: String,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn host_of(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(pos) = raw.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&raw[..pos]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = pos + 2;
        if raw.len() < start + size {
            out.extend_from_slice(&raw[start..]);
            break;
        }
        out.extend_from_slice(&raw[start..start + size]);
        raw = &raw[(start + size + 2).min(raw.len())..];
    }
    out
}

/// One request on a fresh connection (`Connection: close`).
pub async fn request(
    url: &str,
    method: &str,
    path: &str,
    content_type: &str,
    body: Option<&Value>,
) -> Resp {
    let host = host_of(url);
    let mut s = TcpStream::connect(&host).await.expect("connect");
    let body = body
        .map(|b| serde_json::to_vec(b).expect("json"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: application/json\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    s.write_all(&body).await.expect("write body");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw))
        .await
        .expect("response in time")
        .expect("read");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let headers = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status = headers
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let rest = &raw[split + 4..];
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body,
    }
}

pub async fn get(url: &str, path: &str) -> Resp {
    request(url, "GET", path, "application/json", None).await
}
pub async fn post(url: &str, path: &str, body: &Value) -> Resp {
    request(url, "POST", path, "application/json", Some(body)).await
}
pub async fn put(url: &str, path: &str, body: &Value) -> Resp {
    request(url, "PUT", path, "application/json", Some(body)).await
}
pub async fn patch(url: &str, path: &str, ct: &str, body: &Value) -> Resp {
    request(url, "PATCH", path, ct, Some(body)).await
}
pub async fn delete(url: &str, path: &str, body: Option<&Value>) -> Resp {
    request(url, "DELETE", path, "application/json", body).await
}

/// A streaming watch connection.
pub struct Watch {
    stream: TcpStream,
    raw: Vec<u8>,
    data: Vec<u8>,
    headers_done: bool,
    pub closed: bool,
}

impl Watch {
    pub async fn open(url: &str, path: &str) -> Watch {
        let host = host_of(url);
        let mut stream = TcpStream::connect(&host).await.expect("connect");
        let head =
            format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\n\r\n");
        stream.write_all(head.as_bytes()).await.expect("write");
        Watch {
            stream,
            raw: Vec::new(),
            data: Vec::new(),
            headers_done: false,
            closed: false,
        }
    }

    fn pump(&mut self) {
        if !self.headers_done {
            if let Some(p) = self.raw.windows(4).position(|w| w == b"\r\n\r\n") {
                self.raw.drain(..p + 4);
                self.headers_done = true;
            } else {
                return;
            }
        }
        loop {
            let Some(pos) = self.raw.windows(2).position(|w| w == b"\r\n") else {
                return;
            };
            let size = usize::from_str_radix(String::from_utf8_lossy(&self.raw[..pos]).trim(), 16)
                .unwrap_or(0);
            if size == 0 {
                self.closed = true;
                return;
            }
            if self.raw.len() < pos + 2 + size + 2 {
                return;
            }
            self.data
                .extend_from_slice(&self.raw[pos + 2..pos + 2 + size]);
            self.raw.drain(..pos + 2 + size + 2);
        }
    }

    /// The next watch event, or None on timeout / end of stream.
    pub async fn next(&mut self, timeout: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.pump();
            if let Some(nl) = self.data.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.data.drain(..=nl).collect();
                return serde_json::from_slice(&line).ok();
            }
            if self.closed {
                return None;
            }
            let mut buf = [0u8; 65536];
            match tokio::time::timeout_at(deadline, self.stream.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    self.closed = true;
                    return None;
                }
                Ok(Ok(n)) => self.raw.extend_from_slice(&buf[..n]),
                Err(_) => return None,
            }
        }
    }
}

/// Poll `f` until it returns Some or the timeout passes.
pub async fn eventually<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if tokio::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
