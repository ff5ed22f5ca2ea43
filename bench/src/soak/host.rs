//! The node the soak plays on: a temporary directory holding the daemon's state directory (a small
//! tmpfs, so the disk can be filled), the plugin's result cache, and the pods' network namespaces —
//! real ones (`unshare(CLONE_NEWNET)` in a throw-away thread, bind-mounted onto a file, exactly what
//! `ip netns add` does), grouped in "racks" that can be hidden. A pod's namespace is bound at
//! `netns/r<k>/ns/<container id>`; hiding rack k mounts an empty tmpfs over `netns/r<k>`, so the
//! namespaces still exist but their directory `netns/r<k>/ns` is gone for everyone looking — what a
//! daemon whose container lacks the host's `/var/run/netns` sees: not an empty directory (that is what
//! deleted namespaces look like), a missing one. Everything mounted is unmounted on drop, also when
//! the soak fails.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

/// How many racks the pods' namespaces are spread over.
pub const RACKS: usize = 4;

/// Size of the state directory's tmpfs: the database, its WAL and shared memory fit many times over.
const STATE_TMPFS: &str = "size=16m,mode=0700";

/// The soak's corner of the machine.
pub struct Host {
    pub root: PathBuf,
    /// The daemon's state directory (a tmpfs of its own).
    pub state_dir: PathBuf,
    /// The plugin's result cache root (both networks) and the daemon's `cni_cache_dir`.
    pub cache_dir: PathBuf,
    /// `CNI_PATH` (empty: the IPAM role delegates nothing).
    pub cni_path: PathBuf,
    netns_dir: PathBuf,
    state_mounted: bool,
    /// Namespaces bind-mounted and not yet removed.
    netns: BTreeSet<PathBuf>,
    /// Racks with a tmpfs over them.
    hidden: BTreeSet<usize>,
    ballast: Option<PathBuf>,
}

impl Host {
    /// Creates the directories and mounts the state tmpfs.
    pub fn new(tag: &str) -> anyhow::Result<Self> {
        let root = std::env::temp_dir().join(format!(
            "eniipam-soak-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
        ));
        let mut host = Self {
            state_dir: root.join("state"),
            cache_dir: root.join("cni-cache"),
            cni_path: root.join("cni-bin"),
            netns_dir: root.join("netns"),
            root,
            state_mounted: false,
            netns: BTreeSet::new(),
            hidden: BTreeSet::new(),
            ballast: None,
        };
        for d in [&host.state_dir, &host.cache_dir, &host.cni_path] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        for r in 0..RACKS {
            let d = host.rack_dir(r).join("ns");
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        nix::mount::mount(
            Some("tmpfs"),
            &host.state_dir,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(STATE_TMPFS),
        )
        .with_context(|| {
            format!(
                "mounting a tmpfs on {} (the soak needs root)",
                host.state_dir.display()
            )
        })?;
        host.state_mounted = true;
        Ok(host)
    }

    fn rack_dir(&self, rack: usize) -> PathBuf {
        self.netns_dir.join(format!("r{rack}"))
    }

    /// The path a pod's namespace gets.
    pub fn netns_path(&self, rack: usize, container_id: &str) -> PathBuf {
        self.rack_dir(rack).join("ns").join(container_id)
    }

    /// Creates a network namespace bound at `path` (inside a visible rack).
    pub fn create_netns(&mut self, path: &Path) -> anyhow::Result<()> {
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let target = path.to_owned();
        let made = std::thread::spawn(move || -> nix::Result<()> {
            // Only this thread moves to the new namespace; it ends right after.
            nix::sched::unshare(CloneFlags::CLONE_NEWNET)?;
            nix::mount::mount(
                Some("/proc/thread-self/ns/net"),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the netns thread panicked"))?;
        if let Err(e) = made {
            let _ = std::fs::remove_file(path);
            bail!("creating a network namespace at {}: {e}", path.display());
        }
        self.netns.insert(path.to_owned());
        Ok(())
    }

    /// Removes a pod's network namespace (the pod is gone).
    pub fn delete_netns(&mut self, path: &Path) -> anyhow::Result<()> {
        if !self.netns.remove(path) {
            return Ok(());
        }
        nix::mount::umount2(path, MntFlags::MNT_DETACH)
            .with_context(|| format!("unmounting {}", path.display()))?;
        std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
        Ok(())
    }

    /// Mounts an empty tmpfs over a rack: its namespaces still exist, but their directory is gone.
    pub fn hide_rack(&mut self, rack: usize) -> anyhow::Result<()> {
        if self.hidden.contains(&rack) {
            return Ok(());
        }
        let d = self.rack_dir(rack);
        nix::mount::mount(
            Some("tmpfs"),
            &d,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some("size=64k"),
        )
        .with_context(|| format!("hiding {}", d.display()))?;
        self.hidden.insert(rack);
        Ok(())
    }

    pub fn unhide_rack(&mut self, rack: usize) -> anyhow::Result<()> {
        if !self.hidden.remove(&rack) {
            return Ok(());
        }
        let d = self.rack_dir(rack);
        nix::mount::umount2(&d, MntFlags::MNT_DETACH)
            .with_context(|| format!("unhiding {}", d.display()))?;
        Ok(())
    }

    pub fn is_hidden(&self, rack: usize) -> bool {
        self.hidden.contains(&rack)
    }

    pub fn hidden_racks(&self) -> Vec<usize> {
        self.hidden.iter().copied().collect()
    }

    /// Fills the state tmpfs with a ballast file until the kernel says ENOSPC; returns its size.
    pub fn fill_disk(&mut self) -> anyhow::Result<u64> {
        let path = self.state_dir.join("ballast");
        let mut f =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        self.ballast = Some(path.clone());
        let chunk = vec![0u8; 64 * 1024];
        let mut written = 0u64;
        loop {
            match f.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(nix::libc::ENOSPC) => break,
                Err(e) => return Err(e).context("writing the ballast"),
            }
        }
        // The last partial pages too.
        while let Ok(1) = f.write(&[0u8]) {
            written += 1;
        }
        Ok(written)
    }

    /// Removes the ballast (the disk has room again).
    pub fn free_disk(&mut self) -> anyhow::Result<()> {
        if let Some(p) = self.ballast.take() {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
        Ok(())
    }

    pub fn disk_full(&self) -> bool {
        self.ballast.is_some()
    }

    /// The daemon's state file and its sidecars.
    pub fn state_files(&self) -> [PathBuf; 3] {
        let db = self.state_dir.join("state.db");
        [
            db.clone(),
            db.with_extension("db-wal"),
            db.with_extension("db-shm"),
        ]
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for r in self.hidden.clone() {
            let _ = self.unhide_rack(r);
        }
        for p in std::mem::take(&mut self.netns) {
            let _ = nix::mount::umount2(&p, MntFlags::MNT_DETACH);
        }
        if self.state_mounted {
            let _ = nix::mount::umount2(&self.state_dir, MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
