//! The managed resource instances a state lists, by identity: what an errored state is
//! compared with. Streamed from the gzip chunks (or plain JSON) under the decompression
//! cap; only the identity of each instance is kept, every other value is skipped.

use std::collections::BTreeSet;
use std::io::Read;

use serde::Deserialize;

/// A state's lineage and serial, and its managed resource instances by identity:
/// `<module.>type.name[index]` and its `id` (a deposed object is named as such).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instances {
    pub lineage: Option<String>,
    pub serial: Option<u64>,
    pub managed: BTreeSet<String>,
}

#[derive(Deserialize)]
struct Doc {
    #[serde(default)]
    lineage: Option<String>,
    #[serde(default)]
    serial: Option<u64>,
    #[serde(default)]
    resources: Vec<Resource>,
}

#[derive(Deserialize)]
struct Resource {
    #[serde(default)]
    module: Option<String>,
    #[serde(default)]
    mode: String,
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    instances: Vec<Instance>,
}

#[derive(Deserialize)]
struct Instance {
    #[serde(default)]
    index_key: Option<serde_json::Value>,
    #[serde(default)]
    deposed: Option<String>,
    #[serde(default)]
    attributes: Option<Attributes>,
}

#[derive(Deserialize)]
struct Attributes {
    #[serde(default)]
    id: Option<serde_json::Value>,
}

/// Reads the instances of a state: `gzip` true for the backend's format (the chunks
/// joined, one gzip stream; what follows its end is ignored, as Terraform does), false
/// for plain JSON (`errored.tfstate` as an older runner saved it). More than `cap` bytes
/// of JSON is an error.
pub fn read(bytes: impl Read, gzip: bool, cap: u64) -> Result<Instances, String> {
    let doc: Doc = if gzip {
        let dec = flate2::read::GzDecoder::new(bytes);
        parse(dec.take(cap.saturating_add(1)), cap)?
    } else {
        parse(bytes.take(cap.saturating_add(1)), cap)?
    };
    let mut managed = BTreeSet::new();
    for r in doc.resources.iter().filter(|r| r.mode == "managed") {
        let module = r
            .module
            .as_deref()
            .filter(|m| !m.is_empty())
            .map(|m| format!("{m}."))
            .unwrap_or_default();
        for i in &r.instances {
            let index = match &i.index_key {
                None | Some(serde_json::Value::Null) => String::new(),
                Some(k) => format!("[{k}]"),
            };
            let deposed = i
                .deposed
                .as_deref()
                .map(|d| format!(" (deposed object {d})"))
                .unwrap_or_default();
            let id = match i.attributes.as_ref().and_then(|a| a.id.as_ref()) {
                Some(serde_json::Value::String(s)) => format!(" (id {s})"),
                Some(serde_json::Value::Null) | None => String::new(),
                Some(other) => format!(" (id {other})"),
            };
            managed.insert(format!(
                "{module}{}.{}{index}{deposed}{id}",
                r.type_, r.name
            ));
        }
    }
    Ok(Instances {
        lineage: doc.lineage,
        serial: doc.serial,
        managed,
    })
}

fn parse(reader: impl Read, cap: u64) -> Result<Doc, String> {
    let mut counted = Counted {
        inner: reader,
        read: 0,
    };
    let parsed = serde_json::from_reader::<_, Doc>(&mut counted);
    if counted.read > cap {
        return Err(format!(
            "it decompresses to more than {cap} bytes (the decompression cap)"
        ));
    }
    parsed.map_err(|e| match e.classify() {
        serde_json::error::Category::Io => format!("it could not be decompressed ({e})"),
        _ => format!("it is not a Terraform state ({e})"),
    })
}

struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(bytes).unwrap();
        enc.finish().unwrap()
    }

    const STATE: &str = r#"{"version":4,"serial":7,"lineage":"l-1","outputs":{"x":{"value":"big"}},
      "resources":[
        {"mode":"data","type":"aws_ami","name":"a","instances":[{"attributes":{"id":"ami-1"}}]},
        {"mode":"managed","type":"terraform_data","name":"vm","instances":[
          {"index_key":0,"attributes":{"id":"a1","input":"x"}},
          {"index_key":1,"attributes":{"id":"a2"}},
          {"index_key":1,"deposed":"00ab","attributes":{"id":"a0"}}]},
        {"module":"module.net","mode":"managed","type":"aws_vpc","name":"main",
         "instances":[{"index_key":"blue","attributes":{"id":"vpc-1","tags":{"a":"b"}}}]}]}"#;

    #[test]
    fn managed_instances_are_named_with_their_ids_and_data_sources_are_not() {
        let got = read(&gzip(STATE.as_bytes())[..], true, 1 << 20).unwrap();
        assert_eq!(got.lineage.as_deref(), Some("l-1"));
        assert_eq!(got.serial, Some(7));
        let want: BTreeSet<String> = [
            "terraform_data.vm[0] (id a1)",
            "terraform_data.vm[1] (id a2)",
            "terraform_data.vm[1] (deposed object 00ab) (id a0)",
            "module.net.aws_vpc.main[\"blue\"] (id vpc-1)",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        assert_eq!(got.managed, want);
        assert_eq!(read(STATE.as_bytes(), false, 1 << 20).unwrap(), got);
    }

    #[test]
    fn what_is_not_a_state_or_is_over_the_cap_is_an_error_not_a_panic() {
        let e = read(&b"not gzip"[..], true, 1 << 20).unwrap_err();
        assert!(e.contains("could not be decompressed"), "{e}");
        let e = read(&b"{\"resources\": 3}"[..], false, 1 << 20).unwrap_err();
        assert!(e.contains("not a Terraform state"), "{e}");
        let e = read(&gzip(STATE.as_bytes())[..], true, 100).unwrap_err();
        assert!(e.contains("more than 100 bytes"), "{e}");
    }
}
