use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use flate2::Compression;
use flate2::write::GzEncoder;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use serde_json::{Value, json};

use super::*;
use crate::api::names::{APPLY_INTERRUPTED, STATE_LINEAGE, STATE_SERIAL, state_secret_name};

const BASE: &str = "tfstate-default-web-1.tfm";
const CAP: u64 = DEFAULT_DECOMPRESSION_CAP;

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn read_json(text: &str) -> StateContent {
    read_bytes(&gz(text.as_bytes())[..], CAP)
}

fn corrupt_message(content: &StateContent) -> &str {
    match content {
        StateContent::Corrupt { message } => message,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

fn managed(content: &StateContent) -> u64 {
    match content {
        StateContent::Parsed {
            managed_instances, ..
        } => *managed_instances,
        other => panic!("expected Parsed, got {other:?}"),
    }
}

fn state(resources: Value) -> String {
    json!({
        "version": 4, "terraform_version": "1.11.4", "serial": 7,
        "lineage": "3f1b9a52-0c8e-4f5e-9d55-0a1b2c3d4e5f", "outputs": {}, "resources": resources,
        "check_results": null
    })
    .to_string()
}

fn secret(name: &str, value: Option<&[u8]>) -> Secret {
    let mut s = Secret::default();
    s.metadata.name = Some(name.to_string());
    if let Some(v) = value {
        s.data = Some(BTreeMap::from([(
            TF_STATE_KEY.to_string(),
            ByteString(v.to_vec()),
        )]));
    }
    s
}

// ---------------------------------------------------------------------------------------
// Fixtures made by tests/fixtures/make-states.sh with the real terraform.

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/states")
}

fn fixture_secrets(name: &str) -> Vec<Secret> {
    let dir = fixtures().join(name);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            out.push(
                serde_saphyr::from_str::<Secret>(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display())),
            );
        }
    }
    out
}

fn fixture_state(name: &str) -> StateSecrets {
    StateSecrets::from_secrets(BASE, &fixture_secrets(name))
}

fn fixture_content(name: &str) -> StateContent {
    read(&fixture_state(name), CAP)
}

fn fingerprints() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("fingerprints.json")).unwrap())
        .unwrap()
}

fn fixture_fingerprint(which: &str) -> (String, u64) {
    let f = &fingerprints()[which];
    (
        f["lineage"].as_str().unwrap().to_string(),
        f["serial"].as_u64().unwrap(),
    )
}

fn object_annotations(file: &str) -> BTreeMap<String, String> {
    #[derive(serde::Deserialize)]
    struct Meta {
        annotations: BTreeMap<String, String>,
    }
    #[derive(serde::Deserialize)]
    struct Object {
        metadata: Meta,
    }
    let text = std::fs::read_to_string(fixtures().join(file)).unwrap();
    serde_saphyr::from_str::<Object>(&text)
        .unwrap()
        .metadata
        .annotations
}

fn verdict_for(state: &str, object: Option<&str>) -> Verdict {
    let (recorded, interrupted) = match object {
        Some(file) => {
            let ann = object_annotations(file);
            (
                Fingerprint::from_annotations(&ann).unwrap(),
                ann.contains_key(APPLY_INTERRUPTED),
            )
        }
        None => (None, false),
    };
    classify_named(
        BASE,
        &fixture_content(state),
        recorded.as_ref(),
        interrupted,
    )
}

#[test]
fn fixture_applied_counts_managed_instances_but_not_the_data_source() {
    let (lineage, serial) = fixture_fingerprint("applied");
    assert_eq!(
        fixture_content("applied"),
        StateContent::Parsed {
            lineage: lineage.clone(),
            serial,
            managed_instances: 3
        }
    );
    let v = verdict_for("applied", None);
    assert!(v.readable);
    assert_eq!(v.reason, StateReason::Readable);
    assert_eq!(
        v.message,
        format!(
            "state {BASE} is readable: 3 managed resource instances, lineage {lineage}, serial {serial}"
        )
    );
}

#[test]
fn fixture_applied_plain_json_matches_the_secret() {
    let plain = std::fs::read(fixtures().join("applied/terraform.tfstate")).unwrap();
    assert_eq!(read_bytes(&gz(&plain)[..], CAP), fixture_content("applied"));
    assert_eq!(
        managed(&read_bytes(&gz(&plain)[..], CAP)),
        reference_count(&serde_json::from_slice(&plain).unwrap())
    );
}

#[test]
fn fixture_destroyed_is_readable_and_empty() {
    let (lineage, serial) = fixture_fingerprint("destroyed");
    assert_eq!(
        fixture_content("destroyed"),
        StateContent::Parsed {
            lineage,
            serial,
            managed_instances: 0
        }
    );
    let v = verdict_for("destroyed", Some("object-applied.yaml"));
    assert_eq!(v.reason, StateReason::Readable, "{}", v.message);
    assert_eq!(v.managed_instances, Some(0));
}

#[test]
fn fixture_large_is_read_across_its_parts() {
    let secrets = fixture_state("large");
    assert_eq!(
        secrets.parts.keys().copied().collect::<Vec<_>>(),
        vec![1, 2]
    );
    let (lineage, serial) = fixture_fingerprint("large");
    assert_eq!(
        read(&secrets, CAP),
        StateContent::Parsed {
            lineage,
            serial,
            managed_instances: 3
        }
    );
    // joined() and chunk() are inverse to Terraform's chunking.
    let joined = secrets.joined().unwrap();
    assert_eq!(
        joined.len() as u64,
        fingerprints()["large"]["gzip_bytes"].as_u64().unwrap()
    );
    let chunks = chunk(&joined);
    assert_eq!(chunks.len(), 3);
    assert_eq!(chunks[0], secrets.base.as_deref().unwrap());
    assert_eq!(chunks[1], secrets.parts[&1].as_deref().unwrap());
    assert_eq!(chunks[2], secrets.parts[&2].as_deref().unwrap());
    assert_eq!(read_bytes(&joined[..], CAP), read(&secrets, CAP));
}

#[test]
fn fixture_missing_part_names_the_part() {
    let content = fixture_content("missing-part");
    assert_eq!(
        corrupt_message(&content),
        "state Secret tfstate-default-web-1.tfm-part-1 is missing: the state has part 2; restore the state \
         (see runbooks/StateCorrupt.md)"
    );
    assert_eq!(fixture_state("missing-part").joined(), None);
}

#[test]
fn fixture_damaged_states_are_corrupt_with_a_reason() {
    for (fixture, needle) in [
        ("truncated-gzip", "truncated gzip data"),
        (
            "not-gzip",
            "does not hold gzip data (it starts with bytes 7b 0a instead of 1f 8b, which looks like plain JSON)",
        ),
        ("not-json", "is not valid JSON"),
        ("not-a-state", "is not a Terraform state: it has no version"),
        ("version-3", "is not a Terraform state: its version is 3"),
        ("empty-key", "has an empty key tfstate"),
        (
            "gzip-bomb",
            "decompresses to more than 256 MiB (the decompression cap)",
        ),
    ] {
        let v = verdict_for(fixture, None);
        assert_eq!(
            v.reason,
            StateReason::StateCorrupt,
            "{fixture}: {}",
            v.message
        );
        assert!(!v.readable);
        assert!(v.message.contains(needle), "{fixture}: {}", v.message);
        assert!(
            v.message.contains(&format!("state Secret {BASE}")),
            "{fixture}: {}",
            v.message
        );
        assert!(
            v.message
                .ends_with("restore the state (see runbooks/StateCorrupt.md)"),
            "{fixture}: {}",
            v.message
        );
        assert_eq!(
            (v.managed_instances, v.lineage, v.serial),
            (None, None, None)
        );
    }
}

#[test]
fn fixture_gzip_bomb_stops_at_a_small_cap_too() {
    let content = read(&fixture_state("gzip-bomb"), 1024 * 1024);
    assert!(
        corrupt_message(&content).contains("more than 1 MiB (the decompression cap)"),
        "{content:?}"
    );
}

#[test]
fn fixture_encrypted_is_encrypted_with_its_fingerprint() {
    let (lineage, _) = fixture_fingerprint("applied");
    let v = verdict_for("encrypted", None);
    assert_eq!(v.reason, StateReason::StateEncrypted);
    assert_eq!(v.lineage, Some(lineage));
    assert_eq!(v.serial, Some(3));
    assert_eq!(v.managed_instances, None);
    assert!(
        v.message.contains("runbooks/StateEncrypted.md"),
        "{}",
        v.message
    );
}

#[test]
fn fixture_objects_check_the_fingerprint() {
    assert_eq!(
        verdict_for("applied", Some("object-applied.yaml")).reason,
        StateReason::Readable
    );
    let v = verdict_for("applied", Some("object-newer-serial.yaml"));
    assert_eq!(v.reason, StateReason::StateInconsistent);
    assert!(v.message.contains("lower than the serial"), "{}", v.message);
    assert!(
        v.message.contains("runbooks/StateInconsistent.md"),
        "{}",
        v.message
    );
    assert_eq!(v.managed_instances, Some(3));
    let v = verdict_for("applied", Some("object-other-lineage.yaml"));
    assert_eq!(v.reason, StateReason::StateInconsistent);
    assert!(
        v.message
            .contains("the object recorded lineage 11111111-2222-3333-4444-555555555555"),
        "{}",
        v.message
    );
    let v = verdict_for("destroyed", Some("object-apply-interrupted.yaml"));
    assert_eq!(v.reason, StateReason::StateInconsistent);
    assert!(v.message.contains("apply was interrupted"), "{}", v.message);
    // An interrupted apply does not matter when the state describes instances.
    let (lineage, serial) = fixture_fingerprint("applied");
    let fp = Fingerprint { lineage, serial };
    assert_eq!(
        classify(&fixture_content("applied"), Some(&fp), true).reason,
        StateReason::Readable
    );
}

#[test]
fn no_base_secret_is_lost() {
    let mut secrets = fixture_secrets("large");
    secrets.retain(|s| s.metadata.name.as_deref() != Some(BASE));
    let state = StateSecrets::from_secrets(BASE, &secrets);
    assert!(!state.base_present);
    assert_eq!(read(&state, CAP), StateContent::Missing);
    let v = classify_named(BASE, &StateContent::Missing, None, false);
    assert_eq!(v.reason, StateReason::StateLost);
    assert_eq!(
        v.message,
        "state Secret tfstate-default-web-1.tfm does not exist: if this object ever applied, what it created is no \
         longer tracked; restore the state from its backup or a copy (see runbooks/StateLost.md)"
    );
    assert!(
        classify(&StateContent::Missing, None, false)
            .message
            .starts_with("the state Secret does not exist")
    );
}

// ---------------------------------------------------------------------------------------
// Secrets and parts.

#[test]
fn parts_given_out_of_order_are_joined_by_number() {
    let data: Vec<u8> = gz(state(
        json!([{"mode": "managed", "type": "t", "name": "n", "instances": [{}]}]),
    )
    .as_bytes());
    let cut = [0, 10, 20, data.len()];
    let mut secrets = vec![
        secret(&format!("{BASE}-part-2"), Some(&data[cut[2]..cut[3]])),
        secret("unrelated", Some(b"x")),
        secret(BASE, Some(&data[cut[0]..cut[1]])),
        secret(&format!("{BASE}-part-1"), Some(&data[cut[1]..cut[2]])),
        secret(&format!("{BASE}-part-02"), Some(b"not a part")),
        secret(&format!("{BASE}x-part-3"), Some(b"another state's part")),
    ];
    let state = StateSecrets::from_secrets(BASE, &secrets);
    assert_eq!(state.joined().unwrap(), data);
    assert_eq!(managed(&read(&state, CAP)), 1);
    secrets.reverse();
    assert_eq!(StateSecrets::from_secrets(BASE, &secrets), state);
}

#[test]
fn a_gap_in_the_parts_is_corrupt_and_names_the_missing_part() {
    let data = gz(state(json!([])).as_bytes());
    let secrets = [
        secret(BASE, Some(&data[..5])),
        secret(&format!("{BASE}-part-1"), Some(&data[5..10])),
        secret(&format!("{BASE}-part-3"), Some(&data[10..15])),
        secret(&format!("{BASE}-part-4"), Some(&data[15..])),
    ];
    let state = StateSecrets::from_secrets(BASE, &secrets);
    assert_eq!(state.joined(), None);
    assert_eq!(
        corrupt_message(&read(&state, CAP)),
        "state Secret tfstate-default-web-1.tfm-part-2 is missing: the state has parts 1, 3 and 4; restore the state \
         (see runbooks/StateCorrupt.md)"
    );
}

#[test]
fn a_part_or_base_without_the_key_is_corrupt() {
    let data = gz(state(json!([])).as_bytes());
    let state = StateSecrets::from_secrets(
        BASE,
        &[
            secret(BASE, Some(&data[..5])),
            secret(&format!("{BASE}-part-1"), None),
        ],
    );
    assert_eq!(state.joined(), None);
    assert_eq!(
        corrupt_message(&read(&state, CAP)),
        "state Secret tfstate-default-web-1.tfm-part-1 has no key tfstate: restore the state (see \
         runbooks/StateCorrupt.md)"
    );
    let state = StateSecrets::from_secrets(BASE, &[secret(BASE, None)]);
    assert!(state.base_present);
    assert!(
        corrupt_message(&read(&state, CAP))
            .starts_with("state Secret tfstate-default-web-1.tfm has no key tfstate")
    );
}

#[test]
fn a_state_cut_before_its_last_part_is_truncated() {
    let data = gz(state(json!([])).as_bytes());
    let state = StateSecrets::from_secrets(BASE, &[secret(BASE, Some(&data[..20]))]);
    let message = corrupt_message(&read(&state, CAP)).to_string();
    assert!(message.contains("truncated gzip data"), "{message}");
    let state = StateSecrets::from_secrets(
        BASE,
        &[
            secret(BASE, Some(&data[..20])),
            secret(&format!("{BASE}-part-1"), Some(&data[20..data.len() - 1])),
        ],
    );
    let message = corrupt_message(&read(&state, CAP)).to_string();
    assert!(
        message
            .contains("state Secret tfstate-default-web-1.tfm (with its part 1) holds truncated"),
        "{message}"
    );
}

#[test]
fn chunking_follows_terraform() {
    let exact = vec![7u8; TF_CHUNK_SIZE];
    assert_eq!(chunk(&exact).len(), 1);
    let over = vec![7u8; TF_CHUNK_SIZE + 1];
    let c = chunk(&over);
    assert_eq!((c.len(), c[0].len(), c[1].len()), (2, TF_CHUNK_SIZE, 1));
    assert_eq!(chunk(&[]), vec![&b""[..]]);
    assert_eq!(state_secret_name("web-1.tfm"), BASE);
}

// ---------------------------------------------------------------------------------------
// Hand-written documents.

#[test]
fn data_sources_are_not_counted() {
    let doc = state(json!([
        {"mode": "data", "type": "aws_ami", "name": "a", "instances": [{}, {}]},
        {"mode": "managed", "type": "aws_instance", "name": "b", "instances": [{"attributes": {}}]},
        {"mode": "managed", "type": "aws_instance", "name": "c", "instances": []},
    ]));
    assert_eq!(managed(&read_json(&doc)), 1);
    let only_data =
        state(json!([{"mode": "data", "type": "aws_ami", "name": "a", "instances": [{}]}]));
    assert_eq!(managed(&read_json(&only_data)), 0);
}

#[test]
fn key_order_does_not_matter() {
    let doc = r#"{"resources":[{"instances":[{},{}],"name":"x","mode":"managed"},{"instances":[{}],"mode":"data"}],
        "serial":3,"lineage":"l","version":4}"#;
    assert_eq!(
        read_json(doc),
        StateContent::Parsed {
            lineage: "l".into(),
            serial: 3,
            managed_instances: 2
        }
    );
}

#[test]
fn escapes_in_strings_do_not_confuse_the_scanner() {
    let doc = r#"{"version":4,"serial":1,"lineage":"l","outputs":{"x":{"value":"\"instances\": [{}], \"mode\": \"managed\", \\\"","type":"string"}},
        "resources":[{"mode":"managed","name":"a\"b\\","instances":[{"attributes":{"s":"]}]}\\\\","t":"\u005d\u007d"}}]}]}"#;
    assert_eq!(managed(&read_json(doc)), 1);
    // Escaped key names are the same keys (JSON semantics).
    let doc = r#"{"versio\u006e":4,"serial":1,"\u006cineage":"l\u00e9\ud83d\ude00","resources":[{"mod\u0065":"m\u0061naged","instances":[{}]}]}"#;
    assert_eq!(
        read_json(doc),
        StateContent::Parsed {
            lineage: "lé😀".into(),
            serial: 1,
            managed_instances: 1
        }
    );
}

#[test]
fn nested_instances_and_mode_keys_are_not_counted() {
    let doc = state(json!([
        {"mode": "managed", "type": "t", "name": "n", "instances": [
            {"attributes": {"instances": [{}, {}, {}], "mode": "data", "resources": [], "serial": 99}}
        ]},
        {"mode": "data", "type": "t", "name": "d", "instances": [{"attributes": {"mode": "managed", "instances": [{}]}}]},
    ]));
    assert_eq!(
        read_json(&doc),
        StateContent::Parsed {
            lineage: "3f1b9a52-0c8e-4f5e-9d55-0a1b2c3d4e5f".into(),
            serial: 7,
            managed_instances: 1
        }
    );
    // And top-level looking keys inside outputs are not top-level.
    let doc = r#"{"version":4,"serial":2,"lineage":"l","outputs":{"version":3,"serial":"x","encrypted_data":"y"},"resources":[]}"#;
    assert_eq!(managed(&read_json(doc)), 0);
}

#[test]
fn serials_must_be_unsigned_integers() {
    for (serial, ok) in [
        ("7", Some(7)),
        ("0", Some(0)),
        ("18446744073709551615", Some(u64::MAX)),
        ("18446744073709551616", None),
        ("1e3", None),
        ("7.0", None),
        ("-1", None),
        ("-0", None),
        ("\"7\"", None),
        ("null", None),
    ] {
        let doc = format!(r#"{{"version":4,"serial":{serial},"lineage":"l","resources":[]}}"#);
        let content = read_json(&doc);
        match ok {
            Some(n) => assert_eq!(
                content,
                StateContent::Parsed {
                    lineage: "l".into(),
                    serial: n,
                    managed_instances: 0
                }
            ),
            None => {
                let m = corrupt_message(&content);
                assert!(
                    m.contains("is not a Terraform state: serial is not a"),
                    "{serial}: {m}"
                );
            }
        }
    }
}

#[test]
fn not_a_state_reasons() {
    for (doc, why) in [
        (r#"[]"#, "the document is not a JSON object"),
        (r#""x""#, "the document is not a JSON object"),
        (
            r#"{"serial":1,"lineage":"l","resources":[]}"#,
            "it has no version",
        ),
        (
            r#"{"version":"4","serial":1,"lineage":"l","resources":[]}"#,
            "version is not a number",
        ),
        (
            r#"{"version":4.0,"serial":1,"lineage":"l","resources":[]}"#,
            "version is not a non-negative integer",
        ),
        (
            r#"{"version":5,"serial":1,"lineage":"l","resources":[]}"#,
            "its version is 5",
        ),
        (
            r#"{"version":4,"serial":1,"resources":[]}"#,
            "it has no lineage",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"","resources":[]}"#,
            "lineage is empty",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":7,"resources":[]}"#,
            "lineage is not a string",
        ),
        (
            r#"{"version":4,"lineage":"l","resources":[]}"#,
            "it has no serial",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l"}"#,
            "it has no resources array",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l","resources":null}"#,
            "resources is not an array",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l","resources":[1]}"#,
            "resources[0] is not an object",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"instances":[{}]}]}"#,
            "resources[0] has no mode",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"data"},{"mode":"Managed","instances":[{}]}]}"#,
            "resources[1] has mode \"Managed\"",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","instances":{}}]}"#,
            "instances that are not an array",
        ),
        (
            r#"{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","instances":[1]}]}"#,
            "an instance that is not an object",
        ),
    ] {
        let content = read_json(doc);
        let m = corrupt_message(&content);
        assert!(
            m.starts_with("the state is not a Terraform state: "),
            "{doc}: {m}"
        );
        assert!(m.contains(why), "{doc}: {m}");
    }
    // instances null or missing on a managed resource count 0.
    let doc = r#"{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","instances":null},{"mode":"managed"}]}"#;
    assert_eq!(managed(&read_json(doc)), 0);
}

#[test]
fn duplicate_keys_last_wins() {
    let doc = r#"{"version":3,"serial":"x","lineage":"a","resources":[{"mode":"managed","instances":[{}]}],
        "version":4,"serial":5,"lineage":"b","resources":[{"instances":[{},{}],"mode":"data","mode":"managed","instances":[{}]}]}"#;
    assert_eq!(
        read_json(doc),
        StateContent::Parsed {
            lineage: "b".into(),
            serial: 5,
            managed_instances: 1
        }
    );
    let doc = r#"{"version":4,"serial":5,"serial":-5,"lineage":"b","resources":[]}"#;
    assert!(corrupt_message(&read_json(doc)).contains("serial is not a non-negative integer"));
}

#[test]
fn invalid_json_is_corrupt() {
    for doc in [
        "",
        "   ",
        "{",
        r#"{"version":4"#,
        r#"{"version":4,}"#,
        r#"{"version" 4}"#,
        r#"{"resources":[1,]}"#,
        r#"{"resources":[1 2]}"#,
        r#"{"a":[}"#,
        r#"{"a":{]}"#,
        r#"{"a":tru}"#,
        r#"{"a":nul}"#,
        r#"{"a":True}"#,
        r#"{"a":01}"#,
        r#"{"a":-}"#,
        r#"{"a":1.}"#,
        r#"{"a":1e}"#,
        r#"{"a":.5}"#,
        r#"{"a":+1}"#,
        r#"{"a":"\x"}"#,
        r#"{"a":"\u12g4"}"#,
        "{\"a\":\"tab\there\"}",
        "{\"a\":\"new\nline\"}",
        r#"{"a":"unterminated}"#,
        r#"{a:1}"#,
        r#"{"a":1}}"#,
        r#"{"a":1} x"#,
        r#"{"a":1}{"b":2}"#,
        r#"{"a":'x'}"#,
        "{\"a\":1}\u{0}",
    ] {
        let content = read_json(doc);
        let m = corrupt_message(&content);
        assert!(
            m.starts_with("the state is not valid JSON: "),
            "{doc:?}: {m}"
        );
    }
    // Whitespace around the document is fine.
    assert_eq!(
        managed(&read_json(&format!(" \n\t{}\r\n ", state(json!([]))))),
        0
    );
}

#[test]
fn trailing_garbage_is_corrupt() {
    let m = corrupt_message(&read_json(&format!("{} garbage", state(json!([]))))).to_string();
    assert!(
        m.contains("unexpected 'g' where the end of the document was expected"),
        "{m}"
    );
    // After the gzip stream.
    let mut data = gz(state(json!([])).as_bytes());
    data.extend_from_slice(b"\0\0\0");
    let m = corrupt_message(&read_bytes(&data[..], CAP)).to_string();
    assert!(
        m.contains("unexpected data after the end of the gzip stream"),
        "{m}"
    );
    // A second gzip member is not something Terraform writes.
    let mut data = gz(state(json!([])).as_bytes());
    data.extend_from_slice(&gz(b" "));
    let m = corrupt_message(&read_bytes(&data[..], CAP)).to_string();
    assert!(
        m.contains("unexpected data after the end of the gzip stream"),
        "{m}"
    );
}

#[test]
fn damaged_gzip_is_corrupt() {
    let good = gz(state(json!([])).as_bytes());
    // CRC in the trailer.
    let mut bad = good.clone();
    let n = bad.len();
    bad[n - 8] ^= 0xff;
    let m = corrupt_message(&read_bytes(&bad[..], CAP)).to_string();
    assert!(m.contains("damaged gzip data"), "{m}");
    // Length in the trailer.
    let mut bad = good.clone();
    bad[n - 1] ^= 0x01;
    let m = corrupt_message(&read_bytes(&bad[..], CAP)).to_string();
    assert!(m.contains("damaged gzip data"), "{m}");
    // Bad header (compression method).
    let mut bad = good.clone();
    bad[2] = 7;
    let m = corrupt_message(&read_bytes(&bad[..], CAP)).to_string();
    assert!(m.contains("its gzip header is invalid"), "{m}");
    // Only the magic.
    let m = corrupt_message(&read_bytes(&[0x1f, 0x8b][..], CAP)).to_string();
    assert!(m.contains("truncated gzip data"), "{m}");
    // Empty input, one byte.
    assert!(
        corrupt_message(&read_bytes(&[][..], CAP))
            .contains("does not hold gzip data (it is empty)")
    );
    assert!(corrupt_message(&read_bytes(&[0x1f][..], CAP)).contains("does not hold gzip data"));
    // Every truncation of a valid stream is corrupt, never parsed.
    for cut in 0..good.len() {
        assert!(
            matches!(read_bytes(&good[..cut], CAP), StateContent::Corrupt { .. }),
            "cut at {cut}"
        );
    }
    // A gzip header with a file name and comment is still gzip.
    let mut e = flate2::GzBuilder::new()
        .filename("terraform.tfstate")
        .comment("c")
        .write(Vec::new(), Compression::fast());
    e.write_all(state(json!([])).as_bytes()).unwrap();
    assert_eq!(managed(&read_bytes(&e.finish().unwrap()[..], CAP)), 0);
}

#[test]
fn the_cap_is_inclusive() {
    let doc = state(json!([{"mode": "managed", "instances": [{}]}]));
    let len = doc.len() as u64;
    assert_eq!(managed(&read_bytes(&gz(doc.as_bytes())[..], len)), 1);
    let m = corrupt_message(&read_bytes(&gz(doc.as_bytes())[..], len - 1)).to_string();
    assert!(
        m.contains(&format!(
            "more than {} bytes (the decompression cap)",
            len - 1
        )),
        "{m}"
    );
    // The cap wins over a JSON error and over truncation found later.
    let junk = vec![b'x'; 100_000];
    assert!(corrupt_message(&read_bytes(&gz(&junk)[..], 1000)).contains("decompression cap"));
    let g = gz(&junk);
    assert!(corrupt_message(&read_bytes(&g[..g.len() - 4], 1000)).contains("decompression cap"));
    // A truncated stream is reported as truncated, not as the JSON error it causes.
    let g = gz(doc.as_bytes());
    assert!(corrupt_message(&read_bytes(&g[..g.len() - 4], CAP)).contains("truncated gzip data"));
}

#[test]
fn deep_nesting_is_corrupt_without_overflowing_the_stack() {
    let deep = format!(
        r#"{{"version":4,"serial":1,"lineage":"l","resources":[],"x":{}{}}}"#,
        "[".repeat(200_000),
        "]".repeat(200_000)
    );
    assert!(corrupt_message(&read_json(&deep)).contains("nested more than 10000 levels deep"));
    let ok = format!(
        r#"{{"version":4,"serial":1,"lineage":"l","resources":[],"x":{}1{}}}"#,
        "[{\"a\":".repeat(4000),
        "}]".repeat(4000)
    );
    assert_eq!(managed(&read_json(&ok)), 0);
}

#[test]
fn encrypted_is_checked_before_the_version() {
    let doc = r#"{"version":3,"serial":2,"lineage":"l","encryption_version":"v0","encrypted_data":"AAAA","meta":{}}"#;
    assert_eq!(
        read_json(doc),
        StateContent::Encrypted {
            lineage: Some("l".into()),
            serial: Some(2),
            message: "the state is an OpenTofu encrypted state (it has encryption_version or encrypted_data): CAPTF \
                      cannot tell which resources it describes; store the decrypted state in its place (see \
                      runbooks/StateEncrypted.md)"
                .into()
        }
    );
    let v = classify(&read_json(r#"{"encrypted_data":"AAAA"}"#), None, false);
    assert_eq!(
        (v.reason, v.lineage, v.serial),
        (StateReason::StateEncrypted, None, None)
    );
    // Still invalid JSON first.
    assert!(matches!(
        read_json(r#"{"encrypted_data":"AAAA""#),
        StateContent::Corrupt { .. }
    ));
}

#[test]
fn strings_across_buffer_boundaries() {
    // Values much longer than the 64 KiB buffer, with escapes placed around the boundaries.
    for shift in [0usize, 1, 7, 100] {
        let mut big = "y".repeat(65_536 - 40 + shift);
        big.push_str("\\\"instances\\\"\\u005d");
        big.push_str(&"z".repeat(200_000));
        let doc = format!(
            r#"{{"version":4,"serial":1,"lineage":"{}","resources":[{{"mode":"managed","instances":[{{"a":"{big}"}},{{"b":"{big}"}}]}}]}}"#,
            "q".repeat(500)
        );
        assert_eq!(managed(&read_json(&doc)), 2, "shift {shift}");
    }
    let long_lineage = format!(
        r#"{{"version":4,"serial":1,"lineage":"{}","resources":[]}}"#,
        "q".repeat(2000)
    );
    assert!(
        corrupt_message(&read_json(&long_lineage)).contains("lineage is longer than 1024 bytes")
    );
}

// ---------------------------------------------------------------------------------------
// The verdict and the fingerprint.

#[test]
fn verdict_serializes_in_the_inspect_shape() {
    let v = classify_named(
        BASE,
        &StateContent::Parsed {
            lineage: "l".into(),
            serial: 7,
            managed_instances: 3,
        },
        Some(&Fingerprint {
            lineage: "l".into(),
            serial: 7,
        }),
        false,
    );
    assert_eq!(
        serde_json::to_value(&v).unwrap(),
        json!({"readable": true, "reason": "Readable", "managedInstances": 3, "lineage": "l", "serial": 7,
               "message": "state tfstate-default-web-1.tfm is readable: 3 managed resource instances, lineage l, serial 7"})
    );
    let v = classify(
        &StateContent::Corrupt {
            message: "m".into(),
        },
        None,
        false,
    );
    assert_eq!(
        serde_json::to_value(&v).unwrap(),
        json!({"readable": false, "reason": "StateCorrupt", "managedInstances": null, "lineage": null, "serial": null, "message": "m"})
    );
    for r in [
        StateReason::Readable,
        StateReason::StateLost,
        StateReason::StateCorrupt,
        StateReason::StateEncrypted,
        StateReason::StateInconsistent,
    ] {
        assert_eq!(serde_json::to_value(r).unwrap(), json!(r.as_str()));
    }
}

#[test]
fn inconsistency_rules() {
    let parsed = |serial, n| StateContent::Parsed {
        lineage: "l".into(),
        serial,
        managed_instances: n,
    };
    let fp = |serial| Fingerprint {
        lineage: "l".into(),
        serial,
    };
    assert_eq!(
        classify(&parsed(7, 1), Some(&fp(7)), false).reason,
        StateReason::Readable
    );
    assert_eq!(
        classify(&parsed(9, 1), Some(&fp(7)), false).reason,
        StateReason::Readable
    );
    assert_eq!(
        classify(&parsed(6, 1), Some(&fp(7)), false).reason,
        StateReason::StateInconsistent
    );
    let other = Fingerprint {
        lineage: "m".into(),
        serial: 1,
    };
    assert_eq!(
        classify(&parsed(9, 1), Some(&other), false).reason,
        StateReason::StateInconsistent
    );
    assert_eq!(
        classify(&parsed(1, 0), None, true).reason,
        StateReason::StateInconsistent
    );
    assert_eq!(
        classify(&parsed(1, 0), None, false).reason,
        StateReason::Readable
    );
    let v = classify(&parsed(1, 1), None, false);
    assert_eq!(
        v.message,
        "the state is readable: 1 managed resource instance, lineage l, serial 1"
    );
}

#[test]
fn fingerprint_from_annotations() {
    let ann = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(
        Fingerprint::from_annotations(&ann(&[("other", "x")])),
        Ok(None)
    );
    assert_eq!(
        Fingerprint::from_annotations(&ann(&[(STATE_LINEAGE, "l"), (STATE_SERIAL, "12")])),
        Ok(Some(Fingerprint {
            lineage: "l".into(),
            serial: 12
        }))
    );
    let err = Fingerprint::from_annotations(&ann(&[(STATE_LINEAGE, "l")])).unwrap_err();
    assert!(err.contains(STATE_SERIAL), "{err}");
    let err = Fingerprint::from_annotations(&ann(&[(STATE_SERIAL, "1")])).unwrap_err();
    assert!(err.contains(STATE_LINEAGE), "{err}");
    for bad in ["", "x", "-1", "1.5", "+1", "99999999999999999999"] {
        let err = Fingerprint::from_annotations(&ann(&[(STATE_LINEAGE, "l"), (STATE_SERIAL, bad)]))
            .unwrap_err();
        assert!(err.contains(STATE_SERIAL), "{bad}: {err}");
    }
    let err = Fingerprint::from_annotations(&ann(&[(STATE_LINEAGE, " "), (STATE_SERIAL, "1")]))
        .unwrap_err();
    assert!(err.contains(STATE_LINEAGE), "{err}");
}

// ---------------------------------------------------------------------------------------
// Property-style: random valid states, scanner against a serde_json reference.

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn string(&mut self) -> String {
        const PIECES: &[&str] = &[
            "a",
            "instances",
            "mode",
            "\"",
            "\\",
            "}",
            "]",
            "{[",
            "é",
            "😀",
            "\n",
            "\u{1}",
            " ",
            "managed",
            "\u{7f}",
        ];
        let len = self.below(12);
        let mut s = String::new();
        for _ in 0..len {
            s.push_str(PIECES[self.below(PIECES.len() as u64) as usize]);
        }
        if self.below(50) == 0 {
            s.push_str(&"x".repeat(70_000));
        }
        s
    }
    fn value(&mut self, depth: u32) -> Value {
        match if depth > 4 {
            self.below(5)
        } else {
            self.below(8)
        } {
            0 => Value::Null,
            1 => json!(self.below(2) == 0),
            2 => json!(self.next() as i64),
            3 => json!((self.next() % 10_000) as f64 / 7.0),
            4 => json!(self.string()),
            5 | 6 => {
                let n = self.below(5);
                let mut m = serde_json::Map::new();
                for _ in 0..n {
                    let k = match self.below(4) {
                        0 => "instances".to_string(),
                        1 => "mode".to_string(),
                        _ => self.string(),
                    };
                    m.insert(k, self.value(depth + 1));
                }
                Value::Object(m)
            }
            _ => Value::Array((0..self.below(5)).map(|_| self.value(depth + 1)).collect()),
        }
    }
}

/// The reference: count with a fully built serde_json document.
fn reference_count(doc: &Value) -> u64 {
    doc["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["mode"] == "managed")
        .map(|r| r["instances"].as_array().map_or(0, |i| i.len() as u64))
        .sum()
}

#[test]
fn scanner_counts_match_a_serde_json_reference_on_random_states() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..300 {
        let mut resources = Vec::new();
        for _ in 0..rng.below(12) {
            let mut r = serde_json::Map::new();
            let mode = if rng.below(3) == 0 { "data" } else { "managed" };
            let instances: Vec<Value> = (0..rng.below(6))
                .map(|_| {
                    json!({"schema_version": 0, "attributes": rng.value(0), "sensitive_attributes": [],
                           "index_key": rng.below(100)})
                })
                .collect();
            // serde_json's Map sorts its keys, so `instances` always comes before `mode`
            // here: other key orders are tested by hand above.
            for k in ["mode", "type", "name", "provider", "instances", "module"] {
                let v = match k {
                    "mode" => json!(mode),
                    "instances" => json!(instances),
                    _ => json!(rng.string()),
                };
                r.insert(k.to_string(), v);
            }
            resources.push(Value::Object(r));
        }
        let serial = rng.next() >> rng.below(64);
        let doc = json!({
            "version": 4, "terraform_version": "1.11.4", "serial": serial,
            "lineage": format!("lineage-{round}-\u{e9}"), "outputs": {"o": {"value": rng.value(0), "type": "string"}},
            "resources": resources, "check_results": null,
        });
        let text = if round % 2 == 0 {
            serde_json::to_string(&doc).unwrap()
        } else {
            serde_json::to_string_pretty(&doc).unwrap()
        };
        let expected = reference_count(&serde_json::from_str(&text).unwrap());
        assert_eq!(
            read_json(&text),
            StateContent::Parsed {
                lineage: format!("lineage-{round}-\u{e9}"),
                serial,
                managed_instances: expected
            },
            "round {round}"
        );
    }
}

#[test]
fn scanner_agrees_with_serde_json_on_what_is_json() {
    // Random small mutations of a valid state: the scanner calls a document "not valid
    // JSON" exactly when serde_json refuses it. (ASCII mutations only: the scanner, like
    // Go and so Terraform, does not insist on UTF-8; and shallow documents only: serde_json
    // stops at 128 levels, Go at 10000.)
    let base = state(json!([
        {"mode": "managed", "type": "t", "name": "n", "instances": [
            {"attributes": {"s": "a\"b\\c\u{e9}", "n": -1.5e-3, "b": true, "z": null, "a": [1, {}, []]}}
        ]},
        {"mode": "data", "type": "t", "name": "d", "instances": []},
    ]));
    let alphabet = b"{}[]\",:\\ \n0123456789-+.eEtrufalsn\x01/ux";
    let mut rng = Rng(0x5851_f42d_4c95_7f2d);
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..3000 {
        let mut doc = base.as_bytes().to_vec();
        for _ in 0..=rng.below(2) {
            let at = rng.below(doc.len() as u64 + 1) as usize;
            let b = alphabet[rng.below(alphabet.len() as u64) as usize];
            match rng.below(3) {
                0 => doc.insert(at, b),
                1 if at < doc.len() => {
                    doc.remove(at);
                }
                _ if at < doc.len() => doc[at] = b,
                _ => doc.push(b),
            }
        }
        let serde_ok = serde_json::from_slice::<serde::de::IgnoredAny>(&doc).is_ok();
        let content = read_bytes(&gz(&doc)[..], CAP);
        let scanner_ok = !matches!(&content, StateContent::Corrupt { message } if message.contains("not valid JSON"));
        assert_eq!(
            scanner_ok,
            serde_ok,
            "{}: {content:?}",
            String::from_utf8_lossy(&doc)
        );
        if serde_ok { valid += 1 } else { invalid += 1 }
    }
    assert!(
        valid > 100 && invalid > 100,
        "valid {valid}, invalid {invalid}"
    );
}

/// When a state shrinks, Terraform writes the base and deletes the parts it no longer
/// needs; a delete that failed leaves whole parts of the older state after the new one.
/// Terraform 1.11.4 reads such a state fine (it stops at the end of the gzip stream),
/// and so does CAPTF, saying so; with a gap in the parts it crashes, and CAPTF holds.
#[test]
fn whole_stale_parts_after_the_gzip_stream_are_read_past_as_terraform_does() {
    let small = gz(state(
        json!([{"mode": "managed", "type": "t", "name": "a", "instances": [{}]}]),
    )
    .as_bytes());
    let old_part = |n: u8| vec![n; 4096];
    let secrets = |parts: &[u32]| {
        let mut all = vec![secret(BASE, Some(&small))];
        for &n in parts {
            all.push(secret(&part_secret_name(BASE, n), Some(&old_part(n as u8))));
        }
        StateSecrets::from_secrets(BASE, &all)
    };
    // Parts 1 and 2 left over: read as the base alone, with a note naming them.
    let stale = secrets(&[1, 2]);
    let (content, note) = read_noting(&stale, CAP);
    assert_eq!(managed(&content), 1);
    let note = note.expect("a note");
    assert!(
        note.contains("1 and 2") && note.contains("left over"),
        "{note}"
    );
    assert_eq!(
        stale.joined().expect("joined"),
        small,
        "the backup takes the live state"
    );
    // A gap (part 1 deleted, part 2 left): corrupt, as it is to Terraform.
    let gap = secrets(&[2]);
    assert!(matches!(read(&gap, CAP), StateContent::Corrupt { .. }));
    // Bytes after the stream that do not start a part: corrupt.
    let mut torn = small.clone();
    torn.extend_from_slice(b"xyz");
    let torn = StateSecrets::from_secrets(
        BASE,
        &[
            secret(BASE, Some(&torn)),
            secret(&part_secret_name(BASE, 1), Some(&old_part(1))),
        ],
    );
    assert!(matches!(read(&torn, CAP), StateContent::Corrupt { .. }));
}

#[test]
fn outputs_are_read_whatever_their_order_and_a_huge_one_is_refused_on_the_way() {
    let base = state_secret_name("prod.tfc");
    let set = |json: &[u8]| StateSecrets::from_secrets(&base, &[secret(&base, Some(&gz(json)))]);
    // Outputs after the resources, nested values, sensitive ones.
    let ok = set(
        br#"{"version":4,"serial":1,"lineage":"l","resources":[{"mode":"managed","instances":[]}],
        "outputs":{"endpoint":{"value":{"host":"10.0.0.1","port":6443},"type":"object"},
        "secret":{"value":"s","type":"string","sensitive":true}}}"#,
    );
    let out = outputs(&ok, DEFAULT_DECOMPRESSION_CAP).unwrap();
    assert_eq!(out["endpoint"]["port"], 6443);
    assert_eq!(out["secret"], "s");
    assert_eq!(
        outputs(
            &set(br#"{"version":4,"outputs":null}"#),
            DEFAULT_DECOMPRESSION_CAP
        )
        .unwrap(),
        serde_json::Map::new()
    );
    // One output of 64 MiB (a gzip of about 64 KB): refused once the budget is passed,
    // before the value is held whole.
    let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
    enc.write_all(br#"{"version":4,"outputs":{"x":{"value":""#)
        .unwrap();
    let block = vec![b'a'; 1024 * 1024];
    for _ in 0..64 {
        enc.write_all(&block).unwrap();
    }
    enc.write_all(br#""}},"resources":[]}"#).unwrap();
    let huge = StateSecrets::from_secrets(&base, &[secret(&base, Some(&enc.finish().unwrap()))]);
    let err = outputs(&huge, DEFAULT_DECOMPRESSION_CAP).unwrap_err();
    assert!(err.contains("more than"), "{err}");
    // Not JSON, not an object: errors naming the Secret.
    let err = outputs(&set(b"[1,2]"), DEFAULT_DECOMPRESSION_CAP).unwrap_err();
    assert!(err.contains(&base), "{err}");
}
