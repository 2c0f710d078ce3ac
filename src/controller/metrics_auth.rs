//! `/metrics` over HTTPS, served only to callers the API server vouches for, as
//! controller-runtime's metrics filter (`filters.WithAuthenticationAndAuthorization`) does:
//! the caller's bearer token goes to a TokenReview, and the user it names to a
//! SubjectAccessReview of `get` on the non-resource URL `/metrics`. A scraper needs a
//! ClusterRole allowing that (config/rbac/metrics_reader_role.yaml); the manager needs to
//! create both reviews (config/rbac/role.yaml). Verdicts are kept for a minute per token,
//! as controller-runtime's delegating authenticator and authorizer keep theirs, so that a
//! scrape every few seconds costs the API server two requests a minute per scraper.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

/// How long a verdict about a token is kept.
const VERDICT_TTL: Duration = Duration::from_secs(60);

/// At most this many tokens' verdicts are kept (all are dropped when it is reached).
const VERDICTS_MAX: usize = 1024;

/// What the caller of `/metrics` may do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Authenticated and allowed `get` on `/metrics`.
    Allowed,
    /// No bearer token, or one the API server does not accept (401).
    Unauthenticated(String),
    /// Authenticated, not allowed (403).
    Forbidden(String),
    /// The API server could not be asked (500); not kept.
    Unknown(String),
}

/// Checks callers of `/metrics` against the API server.
pub struct MetricsAuth {
    client: Client,
    verdicts: Mutex<HashMap<[u8; 32], (Verdict, Instant)>>,
}

impl MetricsAuth {
    pub fn new(client: Client) -> MetricsAuth {
        MetricsAuth {
            client,
            verdicts: Mutex::new(HashMap::new()),
        }
    }

    /// The verdict on a request whose `Authorization` header is `authorization`.
    pub async fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(token) = authorization
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return Verdict::Unauthenticated(
                "a bearer token is needed: /metrics is served to callers the API server authenticates and allows get on the non-resource URL /metrics (ClusterRole captf-metrics-reader)".into(),
            );
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((v, at)) = self.lock().get(&key)
            && at.elapsed() < VERDICT_TTL
        {
            return v.clone();
        }
        let verdict = self.ask(token).await;
        if !matches!(verdict, Verdict::Unknown(_)) {
            let mut verdicts = self.lock();
            if verdicts.len() >= VERDICTS_MAX {
                verdicts.clear();
            }
            verdicts.insert(key, (verdict.clone(), Instant::now()));
        }
        verdict
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], (Verdict, Instant)>> {
        self.verdicts.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn ask(&self, token: &str) -> Verdict {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        let reviewed = match Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
        {
            Ok(r) => r,
            Err(e) => return Verdict::Unknown(format!("the TokenReview failed: {e}")),
        };
        let status = reviewed.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(user)) => user,
            _ => {
                return Verdict::Unauthenticated(format!(
                    "the API server does not accept the bearer token{}",
                    status.error.map(|e| format!(": {e}")).unwrap_or_default()
                ));
            }
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username,
                uid: user.uid,
                groups: user.groups,
                extra: user.extra,
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        match Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await
        {
            Ok(r) if r.status.as_ref().is_some_and(|s| s.allowed) => Verdict::Allowed,
            Ok(r) => Verdict::Forbidden(format!(
                "{name} may not get /metrics{}; bind it to the ClusterRole captf-metrics-reader (config/rbac/metrics_reader_role.yaml)",
                r.status
                    .and_then(|s| s.reason)
                    .filter(|r| !r.is_empty())
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )),
            Err(e) => Verdict::Unknown(format!("the SubjectAccessReview failed: {e}")),
        }
    }
}

/// The serving certificate and key: `tls.crt` and `tls.key` of `dir` (as cert-manager
/// writes them), else a self-signed certificate made now for `hosts`.
pub fn serving_tls(
    dir: Option<&Path>,
    hosts: Vec<String>,
) -> Result<tokio_rustls::TlsAcceptor, String> {
    let (certs, key) = match dir {
        Some(dir) => {
            let crt = dir.join("tls.crt");
            let key = dir.join("tls.key");
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&crt)
                .and_then(|it| it.collect())
                .map_err(|e| format!("{}: {e}", crt.display()))?;
            let key = PrivateKeyDer::from_pem_file(&key)
                .map_err(|e| format!("{}: {e}", key.display()))?;
            (certs, key)
        }
        None => {
            // Only names a certificate may carry (a Pod's name is one; a hostname with
            // other characters is left out rather than failing the start).
            let hosts: Vec<String> = hosts
                .into_iter()
                .filter(|h| {
                    !h.is_empty()
                        && h.len() <= 253
                        && h.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
                })
                .collect();
            let made = rcgen::generate_simple_self_signed(hosts)
                .map_err(|e| format!("a self-signed certificate: {e}"))?;
            (
                vec![made.cert.der().clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der())),
            )
        }
    };
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| format!("the serving certificate: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_self_signed_certificate_is_made_when_no_directory_is_given() {
        assert!(serving_tls(None, vec!["localhost".into()]).is_ok());
        // A host name no certificate may carry is left out, not a failure to start.
        assert!(serving_tls(None, vec!["localhost".into(), "ünïcode host_1".into()]).is_ok());
        let missing = serving_tls(Some(Path::new("/nonexistent/certs")), vec![]);
        assert!(
            missing.is_err_and(|e| e.contains("/nonexistent/certs/tls.crt")),
            "a missing certificate names its file"
        );
    }
}
