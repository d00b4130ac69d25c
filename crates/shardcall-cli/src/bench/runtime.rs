//! The runtime every benchmark runs on, with the workers' log lines on
//! stderr when `RUST_LOG` asks for them (restores, warm-ups, moves).

/// A multi-threaded runtime of `threads` workers (a benchmark's figures
/// assume how many), after starting the logs if `RUST_LOG` is set.
pub fn bench_runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if std::env::var_os("RUST_LOG").is_some() {
        crate::commands::worker::init_logs(crate::commands::worker::LogFormat::Text);
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
}
