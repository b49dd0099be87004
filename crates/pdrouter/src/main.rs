//! `pdrouter` binary: the process-wide allocator, then the command ([`pdrouter::entry::run`]).

// jemalloc with a background purge thread hands the memory of a drained admission queue back
// to the OS (glibc keeps it); see bench/queue_memory.py.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn tune_allocator() {
    // Best effort: a failure only means freed memory is returned later.
    let _ = tikv_jemalloc_ctl::background_thread::write(true);
}

fn main() -> std::process::ExitCode {
    tune_allocator();
    std::process::ExitCode::from(pdrouter::entry::run(std::env::args_os()))
}
