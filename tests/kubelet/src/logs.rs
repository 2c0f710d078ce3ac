//! The kubelet's log endpoint, which kube-apiserver calls for `pods/log` (`kubectl
//! logs`): `GET /containerLogs/{namespace}/{pod}/{container}` over TLS, with `follow`,
//! `tailLines` and `limitBytes`. Logs are the container's stdout and stderr as written,
//! without the per-line timestamps of the CRI format (`timestamps=true` is answered
//! without them). There are no restarts, so `previous=true` finds nothing. Client
//! certificates are not checked.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::pods::{Kubelet, LogRef};
use crate::{Args, say};

type Body = BoxBody<Bytes, Infallible>;

fn text(status: StatusCode, msg: String) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", "text/plain")
        .body(Full::new(Bytes::from(msg)).boxed())
        .expect("response")
}

/// Starts the server; the task runs until aborted.
pub async fn serve(
    args: &Args,
    kubelet: Arc<Kubelet>,
) -> Result<tokio::task::JoinHandle<()>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&args.tls_cert_file)
        .and_then(|it| it.collect())
        .map_err(|e| format!("{}: {e}", args.tls_cert_file.display()))?;
    let key = PrivateKeyDer::from_pem_file(&args.tls_private_key_file)
        .map_err(|e| format!("{}: {e}", args.tls_private_key_file.display()))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| e.to_string())?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((args.address.as_str(), args.port))
        .await
        .map_err(|e| e.to_string())?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            let kubelet = kubelet.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req| {
                    let kubelet = kubelet.clone();
                    async move { Ok::<_, Infallible>(handle(kubelet, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
            });
        }
    }))
}

#[derive(Debug, Default, PartialEq)]
struct Query {
    follow: bool,
    previous: bool,
    tail_lines: Option<usize>,
    limit_bytes: Option<usize>,
}

fn parse_query(q: Option<&str>) -> Result<Query, String> {
    let mut out = Query::default();
    for pair in q.unwrap_or_default().split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let num = || {
            v.parse::<usize>()
                .map_err(|_| format!("{k}={v} is not a number"))
        };
        match k {
            "follow" => out.follow = v == "true" || v == "1",
            "previous" => out.previous = v == "true" || v == "1",
            "tailLines" => out.tail_lines = Some(num()?),
            "limitBytes" => out.limit_bytes = Some(num()?),
            _ => {}
        }
    }
    Ok(out)
}

/// The last `n` lines of `data`.
fn tail_lines(data: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &data[data.len()..];
    }
    let mut seen = 0;
    let end = if data.ends_with(b"\n") {
        data.len() - 1
    } else {
        data.len()
    };
    for i in (0..end).rev() {
        if data[i] == b'\n' {
            seen += 1;
            if seen == n {
                return &data[i + 1..];
            }
        }
    }
    data
}

async fn handle(kubelet: Arc<Kubelet>, req: Request<hyper::body::Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == "/healthz" {
        return text(StatusCode::OK, "ok".into());
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let ["containerLogs", ns, pod, container] = parts.as_slice() else {
        return text(
            StatusCode::NOT_FOUND,
            format!("captf-kubelet serves no {path}"),
        );
    };
    let q = match parse_query(req.uri().query()) {
        Ok(q) => q,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let Some(log) = kubelet.log_ref(ns, pod, container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} in pod {ns}/{pod} is not running here"),
        );
    };
    if q.previous {
        return text(
            StatusCode::BAD_REQUEST,
            format!("previous terminated container \"{container}\" in pod \"{pod}\" not found"),
        );
    }
    let data = tokio::fs::read(&log.path).await.unwrap_or_default();
    let mut start = match q.tail_lines {
        Some(n) => data.len() - tail_lines(&data, n).len(),
        None => 0,
    };
    let mut budget = q.limit_bytes.unwrap_or(usize::MAX);
    if !q.follow {
        let end = data.len().min(start.saturating_add(budget));
        return Response::builder()
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::copy_from_slice(&data[start..end])).boxed())
            .expect("response");
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(8);
    tokio::spawn(async move {
        if let Err(e) = follow(&log, &mut start, &mut budget, &tx).await {
            say!("following {}: {e}", log.path.display());
        }
    });
    let stream = tokio_stream_from(rx);
    Response::builder()
        .header("content-type", "text/plain")
        .body(StreamBody::new(stream).boxed())
        .expect("response")
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// Sends the log from `start` as it grows, until the container has exited and all of it
/// is sent, the byte budget is spent or the client went away.
async fn follow(
    log: &LogRef,
    start: &mut usize,
    budget: &mut usize,
    tx: &tokio::sync::mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) -> std::io::Result<()> {
    let mut f = tokio::fs::File::open(&log.path).await?;
    f.seek(std::io::SeekFrom::Start(*start as u64)).await?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let exited = *log.exited.borrow();
        let n = f.read(&mut buf).await?;
        if n == 0 {
            if exited {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let n = n.min(*budget);
        *budget -= n;
        if tx
            .send(Ok(Frame::data(Bytes::copy_from_slice(&buf[..n]))))
            .await
            .is_err()
            || *budget == 0
        {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_tail() {
        let q = parse_query(Some(
            "follow=true&tailLines=2&limitBytes=10&timestamps=true",
        ))
        .unwrap();
        assert_eq!(
            q,
            Query {
                follow: true,
                previous: false,
                tail_lines: Some(2),
                limit_bytes: Some(10)
            }
        );
        assert!(parse_query(Some("tailLines=x")).is_err());
        assert_eq!(tail_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(tail_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(tail_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(tail_lines(b"a\nb\n", 0), b"");
    }
}
