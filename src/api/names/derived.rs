//! The derived names of what belongs to an object (its state suffix, its Secrets, Lease
//! and Jobs, the abandon's copies), built and parsed here and nowhere else.

use super::*;

/// First 8 characters of the lowercase RFC 4648 base32 of the SHA-256 of `text`.
pub fn short_hash(text: &str) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";
    let digest = Sha256::digest(text.as_bytes());
    // 8 base32 characters are exactly the first 40 bits (5 bytes).
    let bits = digest[..5]
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
    (0..8)
        .map(|i| ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize] as char)
        .collect()
}

/// The state suffix of an object: `<name>.<short>`, or, when that would exceed 63
/// characters, the name cut to 49 characters, `-`, the short hash of the full name, and
/// `.<short>`. It never ends in `-<number>` because it always ends in `.<short>`.
pub fn state_suffix(kind: Kind, name: &str) -> String {
    let short = kind.short_name();
    if name.len() + 1 + short.len() <= LABEL_VALUE_MAX {
        format!("{name}.{short}")
    } else {
        // Object names are ASCII (DNS subdomain), so byte slicing is safe; guard anyway.
        let cut: String = name.chars().take(CUT_LEN).collect();
        format!("{cut}-{}.{short}", short_hash(name))
    }
}

/// The kind and the name part of a state suffix (what [`state_suffix`] made): the object's
/// name, or for a long one its cut-and-hashed stand-in, which names no object by itself.
pub fn parse_state_suffix(suffix: &str) -> Option<(Kind, &str)> {
    let (name, short) = suffix.rsplit_once('.')?;
    let kind = Kind::parse(short)?;
    (kind.short_name() == short && !name.is_empty()).then_some((kind, name))
}

/// Terraform's base state Secret: `tfstate-default-<suffix>`.
pub fn state_secret_name(suffix: &str) -> String {
    format!("tfstate-{TF_WORKSPACE}-{suffix}")
}

/// Part N (N >= 1) of a chunked Secret (state or backup): `<base>-part-<N>`.
pub fn part_secret_name(base: &str, n: u32) -> String {
    format!("{base}-part-{n}")
}

/// Parses `<base>-part-<N>` back into N, for a given base name.
pub fn part_index(base: &str, name: &str) -> Option<u32> {
    split_part(name).filter(|(b, _)| *b == base).map(|(_, n)| n)
}

/// A part Secret's name read back: its base and its number (the inverse of
/// [`part_secret_name`]; Terraform writes part numbers without leading zeros).
pub fn split_part(name: &str) -> Option<(&str, u32)> {
    let (base, n) = name.rsplit_once("-part-")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || n.starts_with('0') {
        return None;
    }
    Some((base, n.parse().ok()?))
}

/// Terraform's lock Lease: `lock-tfstate-default-<suffix>`.
pub fn lock_lease_name(suffix: &str) -> String {
    format!("lock-tfstate-{TF_WORKSPACE}-{suffix}")
}

/// The runner ServiceAccount of an object's own (`spec.runner.serviceAccount`), and its
/// RoleBinding to the namespace's runner Role: `captf-runner-<suffix>`.
pub fn object_runner_name(suffix: &str) -> String {
    format!("{}-{suffix}", super::RUNNER_NAME)
}

/// The durable inputs Secret: `captf-inputs-<suffix>`.
pub fn inputs_secret_name(suffix: &str) -> String {
    format!("captf-inputs-{suffix}")
}

/// The backup of the state taken before the first destroy attempt: `captf-backup-<suffix>`.
pub fn backup_secret_name(suffix: &str) -> String {
    format!("captf-backup-{suffix}")
}

/// Where a runner before the errored-workspace change saved `errored.tfstate` (plain
/// JSON under key [`LEGACY_ERRORED_KEY`]): `captf-errored-<suffix>`. Still read, never
/// written.
pub fn errored_secret_name(suffix: &str) -> String {
    format!("captf-errored-{suffix}")
}

/// The key of [`errored_secret_name`]'s Secret.
pub const LEGACY_ERRORED_KEY: &str = "errored.tfstate";

/// Where attempt `attempt`'s runner saves an `errored.tfstate`: a state of its own, written
/// by Terraform's backend in the default workspace under the backend suffix
/// `errored-<attempt>-<tag>.<suffix>` (`tag`: the five characters that end the runner
/// Pod's name), in `tfstate-default-errored-<attempt>-<tag>.<suffix>` and its parts,
/// labelled [`LABEL_ERRORED_STATE`] and with the owner labels. A suffix of its own, not a
/// workspace of the object's: Terraform's `init` refuses to start in a workspace that does
/// not exist once another one does, and the backend's default workspace there is the
/// object's state. When `<suffix>` would make it longer than a label value, its short hash
/// stands in for it. Returns the parts before and after the tag.
pub fn errored_suffix_around_tag(suffix: &str, attempt: u32) -> (String, String) {
    let before = format!("errored-{attempt}-");
    let tail = if before.len() + 5 + 1 + suffix.len() <= LABEL_VALUE_MAX {
        format!(".{suffix}")
    } else {
        format!(".{}", short_hash(suffix))
    };
    (before, tail)
}

/// Whether `backend_suffix` is that of an errored state of the object of `suffix`
/// ([`errored_suffix`], any attempt and tag): another object's errored states are not its.
pub fn is_errored_suffix_of(backend_suffix: &str, suffix: &str) -> bool {
    let Some((attempt, rest)) = backend_suffix
        .strip_prefix("errored-")
        .and_then(|r| r.split_once('-'))
    else {
        return false;
    };
    let Ok(attempt) = attempt.parse::<u32>() else {
        return false;
    };
    let (before, after) = errored_suffix_around_tag(suffix, attempt);
    backend_suffix.starts_with(&before)
        && rest.len() == 5 + after.len()
        && backend_suffix.ends_with(&after)
}

/// [`errored_suffix_around_tag`] with the tag in place.
pub fn errored_suffix(suffix: &str, attempt: u32, tag: &str) -> String {
    let (before, after) = errored_suffix_around_tag(suffix, attempt);
    format!("{before}{tag}{after}")
}

/// The copy an abandon makes in the manager's namespace when the object's namespace is
/// terminating: `captf-abandoned-<namespace>-<suffix>`.
pub fn abandoned_copy_name(namespace: &str, suffix: &str) -> String {
    format!("captf-abandoned-{namespace}-{suffix}")
}

/// The abandoned copy of the backup: `captf-abandoned-<namespace>-<suffix>-backup`.
pub fn abandoned_backup_copy_name(namespace: &str, suffix: &str) -> String {
    format!("{}-backup", abandoned_copy_name(namespace, suffix))
}

/// The abandoned copy of the inputs: `captf-abandoned-<namespace>-<suffix>-inputs`.
pub fn abandoned_inputs_copy_name(namespace: &str, suffix: &str) -> String {
    format!("{}-inputs", abandoned_copy_name(namespace, suffix))
}

/// What a Secret CAPTF writes (or Terraform's backend writes for it) holds, by its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SecretRole {
    /// [`inputs_secret_name`].
    Inputs,
    /// [`state_secret_name`] and its parts.
    State,
    /// [`backup_secret_name`] and its parts.
    Backup,
    /// An errored state ([`errored_suffix`]) and its parts, or an older runner's
    /// [`errored_secret_name`].
    Errored,
    /// [`abandoned_copy_name`] and its parts.
    AbandonedState,
    /// [`abandoned_backup_copy_name`] and its parts.
    AbandonedBackup,
    /// [`abandoned_inputs_copy_name`].
    AbandonedInputs,
}

/// A Secret name read back: its role, what follows the role's prefix (the suffix; for an
/// errored state the backend suffix `errored-<attempt>-<tag>.<suffix>`; for an abandoned
/// copy `<namespace>-<suffix>`, which cannot be split without knowing the namespace), and
/// its part number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretName {
    pub role: SecretRole,
    pub rest: String,
    pub part: Option<u32>,
}

/// The inverse of the Secret name constructors above; None for a name none of them makes.
pub fn parse_secret_name(name: &str) -> Option<SecretName> {
    // A trailing `-part-N`: every suffix ends with `.<kind short name>`, so it is a part.
    // (Terraform writes part numbers without leading zeros: `-part-01` is nobody's.)
    let (whole, part) = match name.rsplit_once("-part-") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            if n.starts_with('0') {
                return None;
            }
            (base, Some(n.parse().ok()?))
        }
        _ => (name, None),
    };
    let found = |role, rest: &str| {
        (!rest.is_empty()).then(|| SecretName {
            role,
            rest: rest.to_string(),
            part,
        })
    };
    if let Some(rest) = whole.strip_prefix(&format!("tfstate-{TF_WORKSPACE}-")) {
        let errored = rest
            .strip_prefix("errored-")
            .and_then(|r| r.split_once('-'))
            .is_some_and(|(attempt, tail)| {
                attempt.bytes().all(|b| b.is_ascii_digit())
                    && !attempt.is_empty()
                    && tail.as_bytes().get(5) == Some(&b'.')
            });
        return found(
            if errored {
                SecretRole::Errored
            } else {
                SecretRole::State
            },
            rest,
        );
    }
    if let Some(rest) = whole.strip_prefix("captf-abandoned-") {
        if let Some(r) = rest.strip_suffix("-inputs") {
            return part
                .is_none()
                .then(|| found(SecretRole::AbandonedInputs, r))?;
        }
        if let Some(r) = rest.strip_suffix("-backup") {
            return found(SecretRole::AbandonedBackup, r);
        }
        return found(SecretRole::AbandonedState, rest);
    }
    let single = [
        ("captf-inputs-", SecretRole::Inputs),
        ("captf-errored-", SecretRole::Errored),
    ];
    for (prefix, role) in single {
        if let Some(rest) = whole.strip_prefix(prefix) {
            return part.is_none().then(|| found(role, rest))?;
        }
    }
    found(SecretRole::Backup, whole.strip_prefix("captf-backup-")?)
}

/// The Job of one attempt: `captf-<suffix with dots as dashes>-<operation>-<attempt>`, cut
/// and hashed like the suffix so that it stays a valid label value (63 characters).
pub fn job_name(suffix: &str, operation: &str, attempt: u32) -> String {
    let base = suffix.replace('.', "-");
    let tail = format!("-{operation}-{attempt}");
    let plain = format!("captf-{base}{tail}");
    if plain.len() <= LABEL_VALUE_MAX {
        return plain;
    }
    let hash = short_hash(suffix);
    let room = LABEL_VALUE_MAX - "captf-".len() - 1 - hash.len() - tail.len();
    let cut = base[..room.min(base.len())].trim_end_matches('-');
    format!("captf-{cut}-{hash}{tail}")
}
