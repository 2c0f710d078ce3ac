//! Writing to the API server: the failures of a request ([`Error`]) and guarded writes
//! ([`writes`]), shared by the controllers, the state's Secret I/O
//! (`crate::state::secrets`) and the operator's commands.

pub mod client;
pub mod writes;

/// Failures to talk to the API server (expected outcomes are data, not errors).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A guarded write (JSON patch with a `test` of the resourceVersion) that did not
    /// apply to the object as it is now: the pass acted on a copy older than the object.
    #[error("{0} changed since this pass read it; the next pass decides again")]
    Stale(String),
    #[error("{0}")]
    Setup(String),
    /// An object as read lacks what every object from the API server has (its namespace,
    /// name or uid): nothing is done to it.
    #[error("{0}")]
    Incomplete(String),
    /// The identity an attempt runs with cannot be used (gone, not allowed in the
    /// namespace, its Secret missing or refused): like an API server's refusal, remembered
    /// and shown until an operator fixes it.
    #[error("{0}")]
    Identity(String),
}

impl Error {
    /// A write made from a stale view (409 Conflict, or a guarded patch that did not
    /// apply): the next pass decides again on fresh facts.
    pub fn is_conflict(&self) -> bool {
        match self {
            Error::Kube(kube::Error::Api(s)) => s.code == 409,
            Error::Stale(_) => true,
            _ => false,
        }
    }

    /// The API server refused the request as it is (an admission policy or webhook, a
    /// quota, a missing permission, an invalid object), or the identity cannot be used:
    /// trying again the same way fails again until someone changes something. The API's
    /// message, or the identity's refusal ([`crate::api::identity::refusal`]).
    pub fn refusal(&self) -> Option<String> {
        match self {
            Error::Kube(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 422) => {
                Some(s.message.clone())
            }
            Error::Identity(why) => Some(crate::api::identity::refusal(why)),
            _ => None,
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 404)
    }

    /// A short label for metrics and logs.
    pub fn label(&self) -> String {
        match self {
            Error::Kube(kube::Error::Api(s)) => format!("api_{}", s.code),
            Error::Kube(_) => "api_transport".into(),
            Error::Stale(_) => "stale".into(),
            Error::Setup(_) => "setup".into(),
            Error::Incomplete(_) => "incomplete".into(),
            Error::Identity(_) => "identity".into(),
        }
    }
}
