//! The whole effect of a set of file changes on a tree, worked out before any of them is made.
//!
//! Each file of a patch set is validated against the tree as it is, one at a time; that alone
//! passes a set whose files are each fine but cannot all be: a first file that creates `X` and a
//! second that creates `X/y` (which needs `X` to be a folder) both find their paths free, and
//! the set stops half applied at the second. [`check_set`] replays the changes, in order, on a
//! model of the paths they name: what each one leaves as a file, a folder (every parent of a
//! file), or nothing, and it refuses the first change that finds its path, or a parent, in the
//! wrong state: a path that must be a file and a folder, a path created twice, a path changed
//! after an earlier change deleted it or renamed it away (a rename chain is followed link by
//! link). What the model does not know (a path no earlier change named) is taken as the
//! caller's own check of the disk found it, so the two together decide the set.
//!
//! Both sides use it: workspaced's `/v1/patch_set` and the laptop's patch applier. Neither
//! accepts renames today; the model follows them so that it stays right when one does.
//!
//! Must never: touch the file system (callers bring the paths); accept a set that it cannot
//! replay to its end.

use std::collections::BTreeMap;

use crate::guard::RelPath;

/// One change of a set, in the set's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// A new file: the path must be free and no parent may be a file.
    Create(&'a RelPath),
    /// An existing file's content changes.
    Modify(&'a RelPath),
    /// An existing file goes; its folders stay.
    Delete(&'a RelPath),
    /// An existing file moves to a free path.
    Rename { from: &'a RelPath, to: &'a RelPath },
}

/// How the tree compares names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// Byte for byte (Linux file systems).
    Exact,
    /// Case folded (macOS's default APFS: `A.txt` and `a.txt` are one file).
    CaseInsensitive,
}

/// Why a set cannot be applied whole. Files are numbered from 1, in the set's order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetConflict {
    #[error(
        "file {as_file} of the set makes {path} a file and file {as_folder} needs it as a folder \
         (for {beneath}); a path cannot be both, so nothing was changed"
    )]
    FileAndFolder {
        path: String,
        beneath: String,
        as_file: usize,
        as_folder: usize,
    },
    #[error(
        "file {second} of the set creates {path}, which file {first} already made; nothing was changed"
    )]
    CreatedTwice {
        path: String,
        first: usize,
        second: usize,
    },
    #[error(
        "file {file} of the set changes {path}, which file {by} deletes or moves away; nothing was changed"
    )]
    Gone {
        path: String,
        file: usize,
        by: usize,
    },
    #[error("file {file} of the set moves {from} into itself ({to}); nothing was changed")]
    IntoItself {
        from: String,
        to: String,
        file: usize,
    },
}

/// What the model knows of one path after some changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    File,
    Folder,
    Absent,
}

/// A known path: its state, the change (from 1) that made it so, and the path that change
/// named (the file beneath it, for a folder).
#[derive(Debug, Clone)]
struct Known {
    node: Node,
    by: usize,
    via: String,
}

/// The paths the changes so far have named, and their parents.
struct Tree {
    names: Names,
    known: BTreeMap<String, Known>,
}

impl Tree {
    fn key(&self, path: &str) -> String {
        match self.names {
            Names::Exact => path.to_owned(),
            Names::CaseInsensitive => path.to_lowercase(),
        }
    }

    fn get(&self, path: &str) -> Option<&Known> {
        self.known.get(&self.key(path))
    }

    fn set(&mut self, path: &str, node: Node, by: usize, via: &RelPath) {
        let key = self.key(path);
        self.known.insert(
            key,
            Known {
                node,
                by,
                via: via.to_string(),
            },
        );
    }

    /// Every parent of `path` (change `file`) must be a folder or free: none may be a file.
    fn parents_can_be_folders(&self, path: &RelPath, file: usize) -> Result<(), SetConflict> {
        let mut parent = path.parent();
        while let Some(folder) = parent {
            if let Some(known) = self.get(folder.as_str())
                && known.node == Node::File
            {
                return Err(SetConflict::FileAndFolder {
                    path: folder.to_string(),
                    beneath: path.to_string(),
                    as_file: known.by,
                    as_folder: file,
                });
            }
            parent = folder.parent();
        }
        Ok(())
    }

    /// `path` must be a file when change `file` comes (unknown: the caller's check of the
    /// disk says it is).
    fn must_be_file(&self, path: &RelPath, file: usize) -> Result<(), SetConflict> {
        self.parents_can_be_folders(path, file)?;
        match self.get(path.as_str()) {
            Some(Known {
                node: Node::Folder,
                by,
                via,
            }) => Err(SetConflict::FileAndFolder {
                path: path.to_string(),
                beneath: via.clone(),
                as_file: file,
                as_folder: *by,
            }),
            Some(Known {
                node: Node::Absent,
                by,
                ..
            }) => Err(SetConflict::Gone {
                path: path.to_string(),
                file,
                by: *by,
            }),
            _ => Ok(()),
        }
    }

    /// `path` must be free when change `file` comes (unknown: the caller's check of the disk
    /// says it is).
    fn must_be_free(&self, path: &RelPath, file: usize) -> Result<(), SetConflict> {
        self.parents_can_be_folders(path, file)?;
        match self.get(path.as_str()) {
            Some(Known {
                node: Node::Folder,
                by,
                via,
            }) => Err(SetConflict::FileAndFolder {
                path: path.to_string(),
                beneath: via.clone(),
                as_file: file,
                as_folder: *by,
            }),
            Some(Known {
                node: Node::File,
                by,
                ..
            }) => Err(SetConflict::CreatedTwice {
                path: path.to_string(),
                first: *by,
                second: file,
            }),
            _ => Ok(()),
        }
    }

    /// After change `file`, `path` is a file and every parent a folder.
    fn make_file(&mut self, path: &RelPath, file: usize) {
        let mut parent = path.parent();
        while let Some(folder) = parent {
            if self.get(folder.as_str()).map(|k| k.node) != Some(Node::Folder) {
                self.set(folder.as_str(), Node::Folder, file, path);
            }
            parent = folder.parent();
        }
        self.set(path.as_str(), Node::File, file, path);
    }
}

/// Replays `changes` in order on a model of the tree and refuses the first one that cannot
/// follow the ones before it (see the module doc). `Ok` means the set's own changes never get
/// in each other's way; each change must still pass its own check against the disk.
pub fn check_set(changes: &[Change<'_>], names: Names) -> Result<(), SetConflict> {
    let mut tree = Tree {
        names,
        known: BTreeMap::new(),
    };
    for (index, change) in changes.iter().enumerate() {
        let file = index + 1;
        match *change {
            Change::Create(path) => {
                tree.must_be_free(path, file)?;
                tree.make_file(path, file);
            }
            Change::Modify(path) => {
                tree.must_be_file(path, file)?;
                tree.make_file(path, file);
            }
            Change::Delete(path) => {
                tree.must_be_file(path, file)?;
                tree.make_file(path, file);
                tree.set(path.as_str(), Node::Absent, file, path);
            }
            Change::Rename { from, to } => {
                if tree.key(to.as_str()) == tree.key(from.as_str()) || to.is_within(from) {
                    return Err(SetConflict::IntoItself {
                        from: from.to_string(),
                        to: to.to_string(),
                        file,
                    });
                }
                tree.must_be_file(from, file)?;
                tree.make_file(from, file);
                tree.set(from.as_str(), Node::Absent, file, from);
                tree.must_be_free(to, file)?;
                tree.make_file(to, file);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(raw: &str) -> RelPath {
        RelPath::parse(raw).unwrap()
    }

    fn check(changes: &[(&str, &str)], names: Names) -> Result<(), SetConflict> {
        let parsed: Vec<(String, RelPath, Option<RelPath>)> = changes
            .iter()
            .map(|(kind, path)| match path.split_once(" -> ") {
                Some((from, to)) => (kind.to_string(), p(from), Some(p(to))),
                None => (kind.to_string(), p(path), None),
            })
            .collect();
        let set: Vec<Change<'_>> = parsed
            .iter()
            .map(|(kind, path, to)| match (kind.as_str(), to) {
                ("create", _) => Change::Create(path),
                ("modify", _) => Change::Modify(path),
                ("delete", _) => Change::Delete(path),
                ("rename", Some(to)) => Change::Rename { from: path, to },
                other => panic!("{other:?}"),
            })
            .collect();
        check_set(&set, names)
    }

    #[test]
    fn a_file_and_a_folder_at_one_path_is_refused_in_either_order() {
        assert_eq!(
            check(&[("create", "X"), ("create", "X/y")], Names::Exact),
            Err(SetConflict::FileAndFolder {
                path: "X".into(),
                beneath: "X/y".into(),
                as_file: 1,
                as_folder: 2
            })
        );
        assert_eq!(
            check(&[("create", "X/y/z.txt"), ("create", "X")], Names::Exact),
            Err(SetConflict::FileAndFolder {
                path: "X".into(),
                beneath: "X/y/z.txt".into(),
                as_file: 2,
                as_folder: 1
            })
        );
        // A file modified (so a file on disk) cannot hold a new one, nor become a folder's
        // name after its last file is deleted (the folder stays).
        assert!(matches!(
            check(&[("modify", "a.md"), ("create", "a.md/b")], Names::Exact),
            Err(SetConflict::FileAndFolder {
                as_file: 1,
                as_folder: 2,
                ..
            })
        ));
        assert!(matches!(
            check(&[("delete", "d/only.txt"), ("create", "d")], Names::Exact),
            Err(SetConflict::FileAndFolder {
                as_file: 2,
                as_folder: 1,
                ..
            })
        ));
    }

    #[test]
    fn a_path_created_twice_or_changed_after_it_went_is_refused() {
        assert_eq!(
            check(
                &[("create", "a"), ("create", "b"), ("create", "a")],
                Names::Exact
            ),
            Err(SetConflict::CreatedTwice {
                path: "a".into(),
                first: 1,
                second: 3
            })
        );
        assert_eq!(
            check(&[("delete", "a"), ("modify", "a")], Names::Exact),
            Err(SetConflict::Gone {
                path: "a".into(),
                file: 2,
                by: 1
            })
        );
        // On a case-insensitive file system, A.txt and a.txt are one file.
        assert_eq!(
            check(&[("create", "A.txt"), ("create", "a.txt")], Names::Exact),
            Ok(())
        );
        assert!(matches!(
            check(
                &[("create", "A.txt"), ("create", "a.txt")],
                Names::CaseInsensitive
            ),
            Err(SetConflict::CreatedTwice {
                first: 1,
                second: 2,
                ..
            })
        ));
        assert!(matches!(
            check(
                &[("create", "Docs"), ("create", "docs/x")],
                Names::CaseInsensitive
            ),
            Err(SetConflict::FileAndFolder { .. })
        ));
    }

    #[test]
    fn a_rename_chain_is_followed_link_by_link() {
        // a -> b -> c leaves c; b is free again, a is gone.
        assert_eq!(
            check(
                &[("rename", "a -> b"), ("rename", "b -> c"), ("create", "b")],
                Names::Exact
            ),
            Ok(())
        );
        assert_eq!(
            check(&[("rename", "a -> b"), ("modify", "a")], Names::Exact),
            Err(SetConflict::Gone {
                path: "a".into(),
                file: 2,
                by: 1
            })
        );
        assert!(matches!(
            check(&[("rename", "a -> b"), ("rename", "c -> b")], Names::Exact),
            Err(SetConflict::CreatedTwice {
                first: 1,
                second: 2,
                ..
            })
        ));
        // Renamed to a path beneath a file the set makes.
        assert!(matches!(
            check(&[("create", "x"), ("rename", "a -> x/a")], Names::Exact),
            Err(SetConflict::FileAndFolder {
                as_file: 1,
                as_folder: 2,
                ..
            })
        ));
        assert!(matches!(
            check(&[("rename", "a -> a/b")], Names::Exact),
            Err(SetConflict::IntoItself { file: 1, .. })
        ));
    }

    #[test]
    fn sets_whose_changes_keep_out_of_each_others_way_pass() {
        assert_eq!(
            check(
                &[
                    ("create", "new/deep/a.txt"),
                    ("create", "new/deep/b.txt"),
                    ("create", "new/c.txt"),
                    ("modify", "m.txt"),
                    ("delete", "old/gone.txt"),
                    ("create", "old/again.txt"),
                ],
                Names::Exact
            ),
            Ok(())
        );
        // Deleting a file frees its name for a new one.
        assert_eq!(
            check(&[("delete", "a"), ("create", "a")], Names::Exact),
            Ok(())
        );
    }
}
