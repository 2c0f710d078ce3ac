//! Whether an image reference is the canonical one a release's components can carry: a
//! registry, a lowercase path, a tag or a digest (see [`check_image`]).

use super::release::ReleaseError;

/// Whether `image` is a canonical image reference, by the rule of clusterctl's parser
/// (`github.com/distribution/reference.ParseNamed`): a reference is canonical when
/// normalizing it changes nothing, so it names its registry (a first component with a
/// `.` or a `:`, or `localhost`), never a Docker Hub short form (`captf:latest` is
/// `docker.io/library/captf:latest`, `captf/captf` is `docker.io/captf/captf`), and its
/// path is lowercase. Hand-written: it is a few rules, and the crates that parse image
/// references normalize rather than say whether a name was canonical.
pub fn check_image(image: &str) -> Result<(), ReleaseError> {
    let refuse = |why: &str| {
        Err(ReleaseError::Image {
            image: image.to_string(),
            why: why.to_string(),
        })
    };
    if image.is_empty() {
        return refuse("it is empty");
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (image, None),
    };
    if let Some(d) = digest
        && !is_digest(d)
    {
        return refuse("its digest is not ALGORITHM:HEX (e.g. sha256: and 64 hex digits)");
    }
    // A tag follows the last `:` after the last `/` (a `:` before it is a port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag
        && !is_tag(t)
    {
        return refuse(
            "its tag is not 1 to 128 letters, digits, `_`, `.` or `-` (not starting with `.` or `-`)",
        );
    }
    if name.len() > 255 {
        return refuse("its name is longer than 255 characters");
    }
    let Some((domain, path)) = name.split_once('/') else {
        return refuse("it names no registry (Docker Hub's short form)");
    };
    let is_domain =
        domain == "localhost" || domain.contains(['.', ':']) || domain.to_lowercase() != domain;
    if !is_domain {
        return refuse("its first component is not a registry (Docker Hub's short form)");
    }
    if domain == "index.docker.io" {
        return refuse("Docker Hub's registry is written docker.io");
    }
    if domain == "docker.io" && !path.contains('/') {
        return refuse("an official Docker Hub image is written docker.io/library/NAME");
    }
    if !is_registry(domain) {
        return refuse("its registry is not a host name or address with an optional :port");
    }
    if !path.split('/').all(is_path_component) {
        return refuse(
            "its repository path is not lowercase letters and digits separated by `/`, `.`, `_`, `__` or `-`",
        );
    }
    Ok(())
}

fn is_tag(t: &str) -> bool {
    let mut chars = t.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric() || c == '_')
        && t.len() <= 128
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
}

fn is_digest(d: &str) -> bool {
    let Some((algorithm, hex)) = d.split_once(':') else {
        return false;
    };
    !algorithm.is_empty()
        && algorithm.starts_with(|c: char| c.is_ascii_alphabetic())
        && algorithm
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_+.".contains(c))
        && hex.len() >= 32
        && hex.chars().all(|c| c.is_ascii_hexdigit())
}

/// A registry: DNS labels (letters, digits, inner `-`) separated by `.`, or an IPv6
/// address in brackets, and an optional `:port`.
fn is_registry(domain: &str) -> bool {
    let (host, port) = if let Some(v6) = domain.strip_prefix('[') {
        match v6.split_once(']') {
            Some((addr, rest)) => {
                if addr.is_empty() || !addr.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
                    return false;
                }
                ("", rest.strip_prefix(':'))
            }
            None => return false,
        }
    } else {
        match domain.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (domain, None),
        }
    };
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = domain.starts_with('[')
        || (!host.is_empty()
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            }));
    port_ok && host_ok
}

/// A path component: lowercase alphanumerics separated by one `.`, one or two `_`, or
/// any number of `-`.
fn is_path_component(c: &str) -> bool {
    let bytes = c.as_bytes();
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    if bytes.is_empty() || !alnum(bytes[0]) || !alnum(bytes[bytes.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if alnum(b) {
            i += 1;
            continue;
        }
        // A separator, then an alphanumeric.
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if !ok {
            return false;
        }
    }
    true
}
