//! The daemon's unix socket: created mode 0600 (root only), never stolen from a live daemon.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use tokio::net::{UnixListener, UnixStream};

/// Errors preparing the socket.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("another eniipamd is already serving on {0}")]
    InUse(String),
    #[error("cannot prepare socket {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Binds the unix socket: creates the directory, replaces a stale socket (one nobody answers on), and
/// refuses to steal a live one; the socket is mode 0600.
pub async fn bind_socket(path: &Path) -> Result<UnixListener, SocketError> {
    let io = |source| SocketError::Io {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            return Err(SocketError::InUse(path.display().to_string()));
        }
        std::fs::remove_file(path).map_err(io)?;
    }
    let listener = UnixListener::bind(path).map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    Ok(listener)
}
