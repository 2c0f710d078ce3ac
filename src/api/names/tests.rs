use super::*;

fn is_label_value(v: &str) -> bool {
    v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && v.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && v.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn ends_in_dash_number(v: &str) -> bool {
    match v.rsplit_once('-') {
        Some((_, n)) => !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

#[test]
fn short_names_give_plain_suffixes() {
    assert_eq!(state_suffix(Kind::TerraformMachine, "web-1"), "web-1.tfm");
    assert_eq!(state_suffix(Kind::TerraformCluster, "prod"), "prod.tfc");
    assert_eq!(
        state_suffix(Kind::TerraformMachinePool, "pool-7"),
        "pool-7.tfmp"
    );
    assert_eq!(state_secret_name("web-1.tfm"), "tfstate-default-web-1.tfm");
    assert_eq!(
        lock_lease_name("web-1.tfm"),
        "lock-tfstate-default-web-1.tfm"
    );
    assert_eq!(inputs_secret_name("web-1.tfm"), "captf-inputs-web-1.tfm");
    assert_eq!(backup_secret_name("web-1.tfm"), "captf-backup-web-1.tfm");
}

#[test]
fn names_ending_in_a_number_never_give_a_suffix_ending_in_dash_number() {
    for name in [
        "web-1",
        "a-0",
        "node-123456",
        &format!("{}-9", "x".repeat(70)),
    ] {
        for kind in Kind::ALL {
            let s = state_suffix(kind, name);
            assert!(!ends_in_dash_number(&s), "{s}");
            assert!(is_label_value(&s), "{s}");
        }
    }
}

#[test]
fn a_suffix_at_the_limit_is_kept_and_one_over_is_cut_and_hashed() {
    let at_limit = "a".repeat(63 - 4); // + ".tfm" = 63
    assert_eq!(
        state_suffix(Kind::TerraformMachine, &at_limit),
        format!("{at_limit}.tfm")
    );
    let over = "a".repeat(60);
    let s = state_suffix(Kind::TerraformMachine, &over);
    assert_eq!(s.len(), 49 + 1 + 8 + 4);
    assert!(s.starts_with(&"a".repeat(49)));
    assert!(s.ends_with(".tfm"));
    let s = state_suffix(Kind::TerraformMachinePool, &"b".repeat(253));
    assert_eq!(s.len(), 63);
    assert!(is_label_value(&s));
}

#[test]
fn long_names_that_share_a_prefix_get_different_suffixes() {
    let a = format!("{}-one", "p".repeat(60));
    let b = format!("{}-two", "p".repeat(60));
    assert_ne!(
        state_suffix(Kind::TerraformMachine, &a),
        state_suffix(Kind::TerraformMachine, &b)
    );
}

#[test]
fn every_secret_name_reads_back_as_what_made_it() {
    let named = |role, rest: &str, part| {
        Some(SecretName {
            role,
            rest: rest.to_string(),
            part,
        })
    };
    let long = state_suffix(Kind::TerraformMachine, &"a".repeat(90));
    for suffix in ["web-1.tfm", "prod.tfc", "pool-part-3.tfmp", long.as_str()] {
        let state = state_secret_name(suffix);
        let backup = backup_secret_name(suffix);
        let errored = errored_suffix(suffix, 12, "x7k2p");
        let cases = [
            (
                inputs_secret_name(suffix),
                named(SecretRole::Inputs, suffix, None),
            ),
            (state.clone(), named(SecretRole::State, suffix, None)),
            (
                part_secret_name(&state, 2),
                named(SecretRole::State, suffix, Some(2)),
            ),
            (backup.clone(), named(SecretRole::Backup, suffix, None)),
            (
                part_secret_name(&backup, 1),
                named(SecretRole::Backup, suffix, Some(1)),
            ),
            (
                errored_secret_name(suffix),
                named(SecretRole::Errored, suffix, None),
            ),
            (
                state_secret_name(&errored),
                named(SecretRole::Errored, &errored, None),
            ),
            (
                part_secret_name(&state_secret_name(&errored), 3),
                named(SecretRole::Errored, &errored, Some(3)),
            ),
            (
                abandoned_copy_name("team-a", suffix),
                named(
                    SecretRole::AbandonedState,
                    &format!("team-a-{suffix}"),
                    None,
                ),
            ),
            (
                part_secret_name(&abandoned_copy_name("team-a", suffix), 1),
                named(
                    SecretRole::AbandonedState,
                    &format!("team-a-{suffix}"),
                    Some(1),
                ),
            ),
            (
                abandoned_backup_copy_name("team-a", suffix),
                named(
                    SecretRole::AbandonedBackup,
                    &format!("team-a-{suffix}"),
                    None,
                ),
            ),
            (
                part_secret_name(&abandoned_backup_copy_name("team-a", suffix), 2),
                named(
                    SecretRole::AbandonedBackup,
                    &format!("team-a-{suffix}"),
                    Some(2),
                ),
            ),
            (
                abandoned_inputs_copy_name("team-a", suffix),
                named(
                    SecretRole::AbandonedInputs,
                    &format!("team-a-{suffix}"),
                    None,
                ),
            ),
        ];
        for (name, want) in cases {
            assert_eq!(parse_secret_name(&name), want, "{name}");
        }
    }
    for other in [
        "aws-creds",
        "captf-web-1-tfm-destroy-2",
        "tfstate-default-",
        "captf-inputs-web-1.tfm-part-1",
        "captf-backup-web-1.tfm-part-01",
    ] {
        assert_eq!(parse_secret_name(other), None, "{other}");
    }
}

#[test]
fn an_errored_suffix_is_a_label_value_and_names_its_attempt() {
    assert_eq!(
        errored_suffix("web-1.tfm", 3, "x7k2p"),
        "errored-3-x7k2p.web-1.tfm"
    );
    let long = state_suffix(Kind::TerraformMachine, &"a".repeat(90));
    assert!(long.len() > 63 - "errored-4000000000-x7k2p.".len());
    let e = errored_suffix(&long, 4_000_000_000, "x7k2p");
    assert_eq!(e, format!("errored-4000000000-x7k2p.{}", short_hash(&long)));
    assert!(e.len() <= 63, "{e}");
}

#[test]
fn short_hash_is_lowercase_base32_of_sha256() {
    // SHA-256("") starts e3 b0 c4 42 98: base32 of those 40 bits is "4oymiquy".
    assert_eq!(short_hash(""), "4oymiquy");
    let h = short_hash("some-name");
    assert_eq!(h.len(), 8);
    assert!(
        h.bytes()
            .all(|b| b.is_ascii_lowercase() || (b'2'..=b'7').contains(&b))
    );
}

#[test]
fn job_names_stay_valid_label_values() {
    assert_eq!(
        job_name("web-1.tfm", OPERATION_DESTROY, 3),
        "captf-web-1-tfm-destroy-3"
    );
    let long = state_suffix(Kind::TerraformMachinePool, &"z".repeat(200));
    let j = job_name(&long, OPERATION_DESTROY, 12345);
    assert!(j.len() <= 63, "{j}");
    assert!(is_label_value(&j), "{j}");
    assert!(j.ends_with("-destroy-12345"));
    // Different attempts give different names; the same attempt the same name.
    assert_ne!(
        job_name(&long, OPERATION_DESTROY, 1),
        job_name(&long, OPERATION_DESTROY, 2)
    );
    assert_eq!(
        job_name(&long, OPERATION_APPLY, 1),
        job_name(&long, OPERATION_APPLY, 1)
    );
}

#[test]
fn part_indexes_parse_only_exact_part_names() {
    let base = state_secret_name("web-1.tfm");
    assert_eq!(part_index(&base, &part_secret_name(&base, 1)), Some(1));
    assert_eq!(part_index(&base, &part_secret_name(&base, 12)), Some(12));
    assert_eq!(part_index(&base, &base), None);
    assert_eq!(part_index(&base, &format!("{base}-part-")), None);
    assert_eq!(part_index(&base, &format!("{base}-part-x")), None);
    assert_eq!(part_index(&base, &format!("{base}-part-01")), None);
}

#[test]
fn kinds_parse_from_what_people_type() {
    assert_eq!(Kind::parse("tfm"), Some(Kind::TerraformMachine));
    assert_eq!(
        Kind::parse("TerraformMachinePool"),
        Some(Kind::TerraformMachinePool)
    );
    assert_eq!(
        Kind::parse("terraformclusters"),
        Some(Kind::TerraformCluster)
    );
    assert_eq!(
        Kind::parse("terraformclusters.infrastructure.cluster.x-k8s.io"),
        Some(Kind::TerraformCluster)
    );
    assert_eq!(Kind::parse("Machine"), None);
}

#[test]
fn an_errored_suffix_is_its_own_objects_only() {
    let long = format!("web-{}", "x".repeat(60));
    for suffix in ["web-1.tfm", long.as_str()] {
        let mine = errored_suffix(suffix, 3, "ab1cd");
        assert!(is_errored_suffix_of(&mine, suffix), "{mine}");
        assert!(!is_errored_suffix_of(&mine, "web-2.tfm"), "{mine}");
        assert!(!is_errored_suffix_of(suffix, suffix));
    }
    // Another object whose suffix ends in this one's.
    assert!(!is_errored_suffix_of(
        &errored_suffix("a-web-1.tfm", 1, "ab1cd"),
        "web-1.tfm"
    ));
    assert!(!is_errored_suffix_of(
        "errored-x-ab1cd.web-1.tfm",
        "web-1.tfm"
    ));
}
