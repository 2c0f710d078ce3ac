//! The Kubernetes clients CAPTF makes. Every request names its sender in its User-Agent
//! (`captf/<version> (manager)`, `captf/<version> (cli)`), for the API server's audit log
//! and for an administrator reading API priority and fairness metrics (see
//! `config/apf/`). The runner's requests are Terraform's own (its kubernetes backend
//! sends `HashiCorp/1.0 Terraform/<version>`, which it does not let be changed), or,
//! through the state proxy of a runner Pod, the proxy's (`captf/<version> (state-proxy)`).

use hyper::header::{HeaderValue, USER_AGENT};

/// Who sends the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    Manager,
    Cli,
    StateProxy,
}

/// The User-Agent of `sender`'s requests.
pub fn user_agent(sender: Sender) -> String {
    let who = match sender {
        Sender::Manager => "manager",
        Sender::Cli => "cli",
        Sender::StateProxy => "state-proxy",
    };
    format!("captf/{} ({who})", env!("CARGO_PKG_VERSION"))
}

/// Sets `sender`'s User-Agent on `config` (in place of any other).
pub fn identify(config: &mut kube::Config, sender: Sender) {
    config.headers.retain(|(name, _)| name != USER_AGENT);
    // A version and a fixed word: always a valid header value.
    if let Ok(value) = HeaderValue::from_str(&user_agent(sender)) {
        config.headers.push((USER_AGENT, value));
    }
}

/// A client from the kubeconfig (`KUBECONFIG`, `~/.kube/config`) or the in-cluster
/// configuration, sending `sender`'s User-Agent; with the configuration's default
/// namespace.
pub async fn connect(sender: Sender) -> Result<(kube::Client, String), String> {
    let mut config = kube::Config::infer()
        .await
        .map_err(|e| format!("no Kubernetes configuration (KUBECONFIG or in-cluster): {e}"))?;
    identify(&mut config, sender);
    let ns = config.default_namespace.clone();
    let client = kube::Client::try_from(config)
        .map_err(|e| format!("cannot build a Kubernetes client: {e}"))?;
    Ok((client, ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_agent_names_captf_its_version_and_the_sender() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            user_agent(Sender::Manager),
            format!("captf/{version} (manager)")
        );
        assert_eq!(user_agent(Sender::Cli), format!("captf/{version} (cli)"));
        let mut config = kube::Config::new("https://127.0.0.1:6443".parse().expect("url"));
        config
            .headers
            .push((USER_AGENT, HeaderValue::from_static("someone-else")));
        identify(&mut config, Sender::Manager);
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == USER_AGENT)
            .map(|(_, v)| v.to_str().expect("ascii").to_string())
            .collect();
        assert_eq!(agents, [user_agent(Sender::Manager)]);
    }
}
