use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use serde_json::{Value, json};

use super::*;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "captf-kubelet-images-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Writes `bytes` as a blob of `layout`; its descriptor.
fn put_blob(layout: &Path, media_type: &str, bytes: &[u8]) -> Value {
    let hex = hex(&sha2::Sha256::digest(bytes));
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(&hex), bytes).unwrap();
    json!({"mediaType": media_type, "digest": format!("sha256:{hex}"), "size": bytes.len()})
}

/// A layer of `files` (path, contents, mode; a path ending in `/` is a directory), gzipped.
fn layer(files: &[(&str, &str, u32)]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, contents, mode) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mode(*mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        if path.ends_with('/') {
            h.set_entry_type(tar::EntryType::Directory);
            h.set_size(0);
            tar.append_data(&mut h, path, std::io::empty()).unwrap();
        } else {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(contents.len() as u64);
            tar.append_data(&mut h, path, contents.as_bytes()).unwrap();
        }
    }
    let raw = tar.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    gz.finish().unwrap()
}

const LAYER_GZ: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// A layout holding one image of two layers (the second removes a file and empties a
/// directory of the first), named `reference`; the manifest's digest.
fn write_image(layout: &Path, reference: &str, config: Value) -> String {
    std::fs::create_dir_all(layout).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let base = put_blob(
        layout,
        LAYER_GZ,
        &layer(&[
            ("bin/", "", 0o755),
            ("bin/hello", "#!/bin/sh\necho hello\n", 0o755),
            ("etc/", "", 0o755),
            (
                "etc/passwd",
                "root:x:0:0:root:/root:/sbin/nologin\napp:x:1001:1002:app:/home/app:/sbin/nologin\n",
                0o644,
            ),
            ("etc/group", "root:x:0:\napp:x:1002:\nstaff:x:50:\n", 0o644),
            ("a/", "", 0o755),
            ("a/old", "old", 0o644),
            ("a/kept", "kept", 0o644),
            ("dir/", "", 0o755),
            ("dir/x", "x", 0o644),
        ]),
    );
    let top = put_blob(
        layout,
        LAYER_GZ,
        &layer(&[
            ("a/.wh.old", "", 0o644),
            ("dir/.wh..wh..opq", "", 0o644),
            ("dir/y", "y", 0o600),
        ]),
    );
    let config = put_blob(
        layout,
        "application/vnd.oci.image.config.v1+json",
        serde_json::to_vec(
            &json!({"architecture": "amd64", "os": "linux", "config": config,
            "rootfs": {"type": "layers", "diff_ids": []}}),
        )
        .unwrap()
        .as_slice(),
    );
    let manifest = put_blob(
        layout,
        "application/vnd.oci.image.manifest.v1+json",
        serde_json::to_vec(&json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config, "layers": [base, top]}))
        .unwrap()
        .as_slice(),
    );
    let mut entry = manifest.clone();
    entry["annotations"] = json!({ REF_NAME: reference });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&json!({"schemaVersion": 2, "manifests": [entry]})).unwrap(),
    )
    .unwrap();
    manifest["digest"].as_str().unwrap().to_string()
}

#[test]
fn references_read_as_docker_reads_them() {
    let r = Reference::parse("busybox");
    assert_eq!(r.repository, "docker.io/library/busybox");
    assert_eq!(r.tag.as_deref(), Some("latest"));
    let r = Reference::parse("hashicorp/terraform:1.11.4");
    assert_eq!(
        (r.repository.as_str(), r.tag.as_deref()),
        ("docker.io/hashicorp/terraform", Some("1.11.4"))
    );
    let r = Reference::parse("registry.example.com:5000/team/runner");
    assert_eq!(
        (r.repository.as_str(), r.tag.as_deref()),
        ("registry.example.com:5000/team/runner", Some("latest"))
    );
    let pinned = format!("ghcr.io/captf/captf@sha256:{}", "a".repeat(64));
    let r = Reference::parse(&pinned);
    assert_eq!(r.repository, "ghcr.io/captf/captf");
    assert_eq!(r.tag, None);
    assert_eq!(r.digest, Some(format!("sha256:{}", "a".repeat(64))));
    let r = Reference::parse("localhost/captf:dev");
    assert_eq!(r.repository, "localhost/captf");
    for official in [
        "docker.io/busybox",
        "index.docker.io/library/busybox",
        "busybox:latest",
    ] {
        assert_eq!(
            Reference::parse(official),
            Reference::parse("busybox"),
            "{official}"
        );
    }
    assert_eq!(
        Reference::parse("index.docker.io/hashicorp/terraform:1.11.4").repository,
        "docker.io/hashicorp/terraform"
    );
}

#[test]
fn an_image_is_found_by_its_reference_and_unpacked_with_its_whiteouts() {
    let dir = scratch("layout");
    let store_dir = dir.join("store");
    let digest = write_image(
        &store_dir.join("captf"),
        "ghcr.io/captf/captf:v0.1.0",
        json!({"Entrypoint": ["/bin/hello"], "Cmd": ["manager"], "Env": ["PATH=/bin", "EMPTY"],
            "User": "app", "WorkingDir": "/a"}),
    );
    let store = Store::new(store_dir, dir.join("cache")).unwrap();
    assert!(store.find("ghcr.io/captf/captf:v0.2.0").unwrap().is_none());
    assert!(
        store.find("captf:v0.1.0").unwrap().is_none(),
        "another repository"
    );
    let image = store
        .find("ghcr.io/captf/captf:v0.1.0")
        .unwrap()
        .expect("found by its reference");
    assert_eq!(image.digest, digest);
    assert_eq!(image.id(), format!("ghcr.io/captf/captf@{digest}"));
    assert_eq!(
        image.config.entrypoint.as_deref(),
        Some(&["/bin/hello".to_string()][..])
    );
    assert_eq!(
        image.config.env_pairs(),
        vec![
            ("PATH".to_string(), "/bin".to_string()),
            ("EMPTY".to_string(), String::new())
        ]
    );
    let root = &image.rootfs;
    assert_eq!(
        std::fs::read_to_string(root.join("bin/hello")).unwrap(),
        "#!/bin/sh\necho hello\n"
    );
    assert_eq!(
        std::fs::metadata(root.join("bin/hello"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o755
    );
    assert!(
        !root.join("a/old").exists(),
        "whited out by the second layer"
    );
    assert!(root.join("a/kept").exists());
    assert!(
        !root.join("dir/x").exists(),
        "the directory was made opaque"
    );
    assert_eq!(std::fs::read_to_string(root.join("dir/y")).unwrap(), "y");
    // The user by name, its group from the image's passwd.
    assert_eq!(
        image.user().unwrap(),
        ImageUser {
            uid: Some(1001),
            gid: Some(1002),
            name: Some("app".into()),
        }
    );
    // By digest, too; and a second lookup reuses the unpacked root.
    let by_digest = store
        .find(&format!("ghcr.io/captf/captf@{digest}"))
        .unwrap()
        .expect("found by digest");
    assert_eq!(by_digest.rootfs, image.rootfs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn users_and_groups_of_the_image_config() {
    let dir = scratch("users");
    let store_dir = dir.join("store");
    write_image(&store_dir.join("i"), "i:1", json!({}));
    let store = Store::new(store_dir, dir.join("cache")).unwrap();
    let mut image = store.find("i:1").unwrap().unwrap();
    assert_eq!(image.user().unwrap().uid, None, "no user: root");
    assert_eq!(image.user().unwrap().gid, Some(0));
    for (spec, uid, gid) in [
        ("65532:65532", Some(65532), Some(65532)),
        ("65532", Some(65532), None),
        ("1001", Some(1001), Some(1002)),
        ("app:staff", Some(1001), Some(50)),
        ("0:50", Some(0), Some(50)),
    ] {
        image.config.user = Some(spec.into());
        let u = image.user().unwrap();
        assert_eq!((u.uid, u.gid), (uid, gid), "{spec}");
    }
    // A user the Pod names by uid: that uid's entry in the image, if any.
    assert_eq!(image.account(1001), Some((1002, "/home/app".to_string())));
    assert_eq!(image.account(2000), None);
    image.config.user = Some("nobody".into());
    assert!(
        image
            .user()
            .unwrap_err()
            .contains("unable to find user nobody")
    );
    image.config.user = Some("app:nogroup".into());
    assert!(
        image
            .user()
            .unwrap_err()
            .contains("unable to find group nogroup")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_archive_is_read_like_a_layout() {
    let dir = scratch("archive");
    let layout = dir.join("layout");
    let digest = write_image(&layout, "localhost/app:1", json!({"Cmd": ["/bin/hello"]}));
    let store_dir = dir.join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let file = File::create(store_dir.join("app.oci.tar")).unwrap();
    let mut tar = tar::Builder::new(file);
    tar.append_dir_all(".", &layout).unwrap();
    tar.finish().unwrap();
    // Something else in the store is passed over.
    std::fs::write(store_dir.join("README"), "not an image").unwrap();
    let store = Store::new(store_dir, dir.join("cache")).unwrap();
    let image = store.find("localhost/app:1").unwrap().expect("found");
    assert_eq!(image.digest, digest);
    assert!(image.rootfs.join("bin/hello").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_blob_or_a_zstd_layer_is_named() {
    let dir = scratch("damaged");
    let store_dir = dir.join("store");
    let layout = store_dir.join("i");
    write_image(&layout, "i:1", json!({}));
    // The first layer replaced by another: its digest does not match.
    let index: Value =
        serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest_digest = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: Value = serde_json::from_slice(&blob(&layout, manifest_digest).unwrap()).unwrap();
    let first = manifest["layers"][0]["digest"].as_str().unwrap();
    let path = blob_path(&layout, first).unwrap();
    std::fs::write(&path, layer(&[("evil", "x", 0o644)])).unwrap();
    let store = Store::new(store_dir.clone(), dir.join("cache")).unwrap();
    let err = store.find("i:1").unwrap_err();
    assert!(err.contains(&format!("the layer {first}")), "{err}");
    assert!(err.contains(&format!("not {first}")), "{err}");

    let zstd = Descriptor {
        media_type: "application/vnd.oci.image.layer.v1.tar+zstd".into(),
        digest: first.into(),
        annotations: BTreeMap::new(),
        platform: None,
    };
    let err = unpack_layer(&layout, &zstd, &dir.join("root")).unwrap_err();
    assert!(err.contains("zstd layers are not supported"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_store_that_is_not_a_directory_is_refused() {
    let err = Store::new(PathBuf::from("/nonexistent/store"), PathBuf::from("/tmp"))
        .err()
        .unwrap();
    assert!(err.contains("--image-store /nonexistent/store"), "{err}");
}
