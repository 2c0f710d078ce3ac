#![no_main]
//! The hcl target: see captf_fuzz_checks::hcl.

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: captf_fuzz_checks::alloc::Counting = captf_fuzz_checks::alloc::Counting;

fuzz_target!(|data: &[u8]| {
    captf_fuzz_checks::hcl(data, &captf_fuzz_checks::Limits::FUZZ);
});
