//! Test support: the logs a test's code writes, kept in memory to be read back (a `tracing`
//! writer). `Logs::capture` takes this thread's logs until its guard drops; a binary whose code
//! logs from other threads installs one `Logs` as the global subscriber itself.

use std::sync::{Arc, Mutex};

/// Everything written to it, shared by its clones.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    /// A subscriber writing to these logs, without colours.
    pub fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false)
            .finish()
    }

    /// Captures this thread's logs until the guard drops.
    #[allow(dead_code)] // not every binary that includes this module captures per thread
    pub fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let guard = tracing::subscriber::set_default(logs.subscriber());
        (logs, guard)
    }

    /// How many times `needle` was logged so far.
    pub fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .matches(needle)
            .count()
    }

    /// Forgets what was logged so far.
    #[allow(dead_code)] // not every binary that includes this module clears
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}
