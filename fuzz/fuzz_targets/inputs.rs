#![no_main]
//! The inputs target: see captf_fuzz_checks::inputs.

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: captf_fuzz_checks::alloc::Counting = captf_fuzz_checks::alloc::Counting;

fuzz_target!(|data: &[u8]| {
    captf_fuzz_checks::inputs(data, &captf_fuzz_checks::Limits::FUZZ);
});
