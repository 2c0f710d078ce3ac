//! The kubeconfig file the server writes for its clients (kube-rs, kubectl, terraform's
//! kubernetes backend): one cluster at the plain-HTTP URL, one user without credentials
//! (the server does no authentication), one context with namespace `default`.

use std::path::{Path, PathBuf};

/// Write `<dir>/kubeconfig` for `url` and return its path.
pub fn write(dir: &Path, url: &str) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: captf-test\n  cluster:\n    server: {url}\ncontexts:\n- name: captf-test\n  context:\n    cluster: captf-test\n    user: captf-test\n    namespace: default\ncurrent-context: captf-test\npreferences: {{}}\nusers:\n- name: captf-test\n  user: {{}}\n"
    );
    std::fs::write(&path, text)?;
    Ok(path)
}
