use std::process::ExitCode;

/// mimalloc rather than glibc's malloc: with the caches of thousands of objects, glibc's
/// allocation and consolidation were a quarter of the manager's CPU and grew with the
/// heap (docs/decisions.md, "The manager allocates with mimalloc").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    captf::cli::main()
}
