//! The decision log's file: one JSON object a line, appended, rotated by size (`<file>` moved to
//! `<file>.1`, `.1` to `.2`, …, the oldest past `keep` deleted), so a log shipper (Fluent Bit's
//! `tail` input, the CloudWatch agent) follows it and the node's disk holds at most
//! `(keep + 1) × max_bytes` of it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// The open file and its size.
pub struct RotatingFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: File,
    size: u64,
}

impl RotatingFile {
    /// Opens `path` for appending (its directory created), rotating at `max_bytes`, keeping
    /// `keep` rotated files.
    pub fn open(path: &Path, max_bytes: u64, keep: u32) -> io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let size = file.metadata()?.len();
        Ok(Self {
            path: path.to_owned(),
            max_bytes,
            keep,
            file,
            size,
        })
    }

    fn rotated(&self, n: u32) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    }

    /// Appends `record` as one JSON line (with `time`, RFC 3339, first); rotates first when the
    /// line would take the file past its size.
    pub fn write<T: Serialize>(
        &mut self,
        time: std::time::SystemTime,
        record: &T,
    ) -> io::Result<()> {
        let mut value = serde_json::to_value(record)?;
        let mut line = serde_json::Map::new();
        line.insert(
            "time".into(),
            humantime::format_rfc3339_millis(time).to_string().into(),
        );
        if let Some(fields) = value.as_object_mut() {
            line.append(fields);
        }
        let mut text = serde_json::to_vec(&line)?;
        text.push(b'\n');
        if self.size > 0 && self.size + text.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.file.write_all(&text)?;
        self.size += text.len() as u64;
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        if self.keep == 0 {
            self.file.set_len(0)?;
        } else {
            let _ = std::fs::remove_file(self.rotated(self.keep));
            for n in (1..self.keep).rev() {
                match std::fs::rename(self.rotated(n), self.rotated(n + 1)) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                }
            }
            std::fs::rename(&self.path, self.rotated(1))?;
            self.file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
        }
        self.size = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Line {
        n: u32,
    }

    #[test]
    fn the_file_rotates_at_its_size_and_keeps_so_many() {
        let dir = std::env::temp_dir().join(format!("eniipam-decisions-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub/decisions.log");
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        // Each line: {"time":"2023-11-14T22:13:20.000Z","n":N}\n, 41 bytes for N < 10.
        let mut f = RotatingFile::open(&path, 100, 2).unwrap();
        for n in 0..9 {
            f.write(t, &Line { n }).unwrap();
        }
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let first: serde_json::Value =
            serde_json::from_str(read(&path).lines().next().unwrap()).unwrap();
        assert_eq!(first["time"], "2023-11-14T22:13:20.000Z");
        // Two lines a file: 6,7 in .1, 8 live; 4,5 in .2; 0..3 gone.
        assert_eq!(read(&path).lines().count(), 1);
        assert!(read(&path).contains("\"n\":8"));
        assert!(read(&f.rotated(1)).contains("\"n\":6"));
        assert!(read(&f.rotated(2)).contains("\"n\":4"));
        assert!(!f.rotated(3).exists());
        // Reopened, it appends and knows its size.
        drop(f);
        let mut f = RotatingFile::open(&path, 100, 2).unwrap();
        f.write(t, &Line { n: 9 }).unwrap();
        assert_eq!(read(&path).lines().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
