//! The staged durable write both writers use (workspaced's changes and the laptop's patches):
//! a temp file created beside its target through the folder's fd (`O_CREAT|O_EXCL|O_NOFOLLOW`,
//! so it is always a new file of ours and never a path that leads elsewhere), written, fsynced,
//! then renamed onto the target in the same folder. The caller fsyncs the folder afterwards.
//!
//! A staged file that is never renamed is unlinked when dropped, so an error at any step
//! leaves nothing behind. Must never follow a path or open anything but the one new entry.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};

/// A new temp file in a folder, not yet renamed onto its target.
#[derive(Debug)]
pub struct StagedFile<'a> {
    parent: BorrowedFd<'a>,
    name: String,
    file: std::fs::File,
    renamed: bool,
}

impl<'a> StagedFile<'a> {
    /// Creates `<prefix><16 random hex digits>` in `parent` with `mode` (before the umask, or
    /// the folder's default ACL, which the kernel applies as for any new file).
    pub fn create(
        parent: BorrowedFd<'a>,
        prefix: &str,
        mode: u32,
    ) -> rustix::io::Result<StagedFile<'a>> {
        let name = format!("{prefix}{}", hex::encode(rand::random::<[u8; 8]>()));
        let fd = rustix::fs::openat(
            parent,
            name.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            // `mode_t` is u16 on macOS: a mode that does not fit is refused, not truncated.
            Mode::from_raw_mode(
                rustix::fs::RawMode::try_from(mode).map_err(|_| rustix::io::Errno::INVAL)?,
            ),
        )?;
        Ok(StagedFile {
            parent,
            name,
            file: std::fs::File::from(fd),
            renamed: false,
        })
    }

    /// The temp file's name in its folder.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The temp file, for metadata calls on its fd (ownership, ACL, mode).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    pub fn write_all(&mut self, content: &[u8]) -> std::io::Result<()> {
        self.file.write_all(content)
    }

    /// Starts writing the content to the disk without waiting for it, so that the
    /// [`StagedFile::sync`] of several files that follows waits for writes already under
    /// way instead of starting each in turn. Only a hint: durability is the `sync`'s alone,
    /// so a failure here is ignored (the `sync` reports any real one). rustix and nix have
    /// no `sync_file_range`, hence libc; elsewhere than Linux it does nothing.
    pub fn start_writeback(&self) {
        #[cfg(target_os = "linux")]
        {
            use std::os::fd::AsRawFd;
            // SAFETY: `sync_file_range` only reads its integer arguments; the fd is open and
            // owned by `self.file` for the whole call.
            let _ = unsafe {
                libc::sync_file_range(self.file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE)
            };
        }
    }

    /// Makes the content durable before it may replace anything.
    pub fn sync(&self) -> rustix::io::Result<()> {
        rustix::fs::fsync(&self.file)
    }

    /// Renames the staged file onto `target` in the same folder; with `no_replace` an existing
    /// `target` fails the rename with `EEXIST` instead of being replaced. On any error the
    /// staged file is unlinked.
    pub fn rename_to(mut self, target: &str, no_replace: bool) -> rustix::io::Result<()> {
        let flags = if no_replace {
            RenameFlags::NOREPLACE
        } else {
            RenameFlags::empty()
        };
        rustix::fs::renameat_with(self.parent, self.name.as_str(), self.parent, target, flags)?;
        self.renamed = true;
        Ok(())
    }
}

impl Drop for StagedFile<'_> {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = rustix::fs::unlinkat(self.parent, self.name.as_str(), AtFlags::empty());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_staged_file_replaces_its_target_or_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "old").unwrap();
        let folder = std::fs::File::open(dir.path()).unwrap();

        let mut staged = StagedFile::create(folder.as_fd(), ".tmp-", 0o644).unwrap();
        assert!(staged.name().starts_with(".tmp-"));
        staged.write_all(b"new").unwrap();
        staged.sync().unwrap();
        staged.rename_to("a.txt", false).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
            "new"
        );
        assert_eq!(entries(dir.path()), ["a.txt"]);

        // NOREPLACE onto an existing file: EEXIST, the target untouched, the temp gone.
        let mut staged = StagedFile::create(folder.as_fd(), ".tmp-", 0o644).unwrap();
        staged.write_all(b"other").unwrap();
        let refused = staged.rename_to("a.txt", true).unwrap_err();
        assert_eq!(refused, rustix::io::Errno::EXIST);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
            "new"
        );
        assert_eq!(entries(dir.path()), ["a.txt"]);

        // Dropped before the rename (an error in between): unlinked.
        let staged = StagedFile::create(folder.as_fd(), ".tmp-", 0o644).unwrap();
        assert_eq!(entries(dir.path()).len(), 2);
        drop(staged);
        assert_eq!(entries(dir.path()), ["a.txt"]);
    }
}
