#![no_main]
//! The report target: see captf_fuzz_checks::report.

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: captf_fuzz_checks::alloc::Counting = captf_fuzz_checks::alloc::Counting;

fuzz_target!(|data: &[u8]| {
    captf_fuzz_checks::report(data, &captf_fuzz_checks::Limits::FUZZ);
});
