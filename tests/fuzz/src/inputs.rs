//! The inputs Secret's `inputs.json` (`captf::inputs::parse`, versions 1 and 2).
//!
//! Properties: a verdict (inputs or a refusal) for every input; within the time bound; the
//! size limit holds before the bytes are parsed (a document over
//! [`INPUTS_MAX_BYTES`] is refused having allocated almost nothing); memory within a
//! multiple of the input; and inputs read are written back (`to_json_bytes`, what the
//! manager stores) to bytes that read the same, with the same digest.

use captf::inputs::{INPUTS_MAX_BYTES, Inputs, parse};

use crate::{Limits, bounded};

pub const NAMESPACE: &str = "team-a";
pub const SUFFIX: &str = "web-1.tfm";

/// Per byte of JSON: a `serde_json::Value` (32 bytes a node, a node every two bytes at
/// worst, in vectors that double), then the typed fields built from it.
const PER_BYTE: usize = 96;
const OVERHEAD: usize = 64 * 1024;

pub fn inputs(data: &[u8], limits: &Limits) {
    let bound = if data.len() > INPUTS_MAX_BYTES {
        OVERHEAD
    } else {
        PER_BYTE * data.len() + OVERHEAD
    };
    let read = bounded("inputs::parse", limits, bound, || {
        parse(data, NAMESPACE, SUFFIX)
    });
    if data.len() > INPUTS_MAX_BYTES {
        assert!(read.is_err(), "inputs over the limit were read");
    }
    let Ok(inputs) = read else {
        return;
    };
    assert!(
        [1, 2].contains(&inputs.version),
        "version {} read",
        inputs.version
    );
    let bytes = inputs.to_json_bytes();
    let again: Inputs = parse(&bytes, NAMESPACE, SUFFIX)
        .unwrap_or_else(|e| panic!("inputs written back do not read: {e}"));
    assert_eq!(again, inputs, "inputs written back read otherwise");
    assert_eq!(again.sha256(), inputs.sha256());
}
