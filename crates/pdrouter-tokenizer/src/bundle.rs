//! Tokenizer bundles: the archive an engine streams through its `GetTokenizer` RPC.
//!
//! Wire format, as the engines produce it: one zip archive (deflate or stored entries, the
//! tokenizer files flat at its root) cut into chunks; the lowercase hex SHA-256 of the whole
//! archive rides on the final chunk only, the others carry an empty checksum. [`pack`] and
//! [`chunks`] produce it (the mock engine serves them); [`Receiver`] and [`unpack`] take it in.
//!
//! Invariants of the receiving side:
//! - The archive is never larger than [`Limits::max_archive_bytes`], checked chunk by chunk,
//!   before anything is buffered past it.
//! - Nothing is extracted before the checksum matches.
//! - Extraction writes only regular files, at plain relative paths (no absolute path, no `..`,
//!   no backslash or drive prefix), never through or as a symbolic link, never twice to one
//!   path, each file and the total bounded by the actual bytes inflated (not the sizes the
//!   archive declares), into a fresh directory only the current user can read (mode 0700).
//! - On any error the partly written directory is removed; on success it lives as long as the
//!   returned [`Unpacked`] (or is kept with [`Unpacked::keep`]).

use std::fs;
use std::io::{self, Cursor, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use zip::ZipArchive;
use zip::write::SimpleFileOptions;

use crate::error::BundleError;

/// Chunk size the engines stream the archive in.
pub const CHUNK_SIZE: usize = 64 * 1024;

/// Bounds on a received bundle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the zip archive itself (the sum of the chunks).
    pub max_archive_bytes: u64,
    /// Inflated bytes of one file.
    pub max_file_bytes: u64,
    /// Inflated bytes of all files together.
    pub max_total_bytes: u64,
    /// Entries in the archive (files and directories).
    pub max_files: usize,
}

impl Default for Limits {
    /// Room for the largest real tokenizers (a few tens of MB of `tokenizer.json`), a hard stop
    /// well before a zip bomb fills a disk.
    fn default() -> Self {
        Limits {
            max_archive_bytes: 128 << 20,
            max_file_bytes: 256 << 20,
            max_total_bytes: 512 << 20,
            max_files: 64,
        }
    }
}

/// Builds the archive of `files` (`(name, contents)`) and its lowercase hex SHA-256. Names must
/// be plain relative paths, as [`unpack`] requires; the archive is deterministic (fixed
/// timestamps), so the same files always give the same checksum.
pub fn pack<N, D>(files: impl IntoIterator<Item = (N, D)>) -> Result<(Vec<u8>, String), BundleError>
where
    N: AsRef<str>,
    D: AsRef<[u8]>,
{
    let corrupt = |e: zip::result::ZipError| BundleError::Corrupt {
        detail: e.to_string(),
    };
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options = SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o644);
    for (name, data) in files {
        let name = name.as_ref();
        if relative_path(name).is_none() || name.ends_with('/') {
            return Err(BundleError::UnsafePath { name: name.into() });
        }
        writer.start_file(name, options).map_err(corrupt)?;
        writer
            .write_all(data.as_ref())
            .map_err(|source| BundleError::Io {
                context: format!("writing {name:?}"),
                source,
            })?;
    }
    let zip = writer.finish().map_err(corrupt)?.into_inner();
    let sha = sha256_hex(&zip);
    Ok((zip, sha))
}

/// The archive cut into `chunk_size` pieces as the engines stream it: `(data, sha256)` with the
/// checksum on the last piece only. An empty archive still yields one (empty) final piece.
pub fn chunks<'a>(
    zip: &'a [u8],
    sha256: &'a str,
    chunk_size: usize,
) -> impl Iterator<Item = (&'a [u8], &'a str)> + 'a {
    let size = chunk_size.max(1);
    let count = zip.len().div_ceil(size).max(1);
    (0..count).map(move |i| {
        let data = &zip[(i * size).min(zip.len())..((i + 1) * size).min(zip.len())];
        (data, if i + 1 == count { sha256 } else { "" })
    })
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Collects a `GetTokenizer` stream chunk by chunk, refusing it as soon as it outgrows the limit.
#[derive(Debug)]
pub struct Receiver {
    limits: Limits,
    archive: Vec<u8>,
    sha256: Option<String>,
}

impl Receiver {
    pub fn new(limits: Limits) -> Self {
        Receiver {
            limits,
            archive: Vec::new(),
            sha256: None,
        }
    }

    /// Adds one chunk: its bytes and its checksum field (empty except on the final chunk).
    pub fn push(&mut self, data: &[u8], sha256: &str) -> Result<(), BundleError> {
        if self.sha256.is_some() && !(data.is_empty() && sha256.is_empty()) {
            return Err(BundleError::ChunkAfterChecksum);
        }
        let total = self.archive.len() as u64 + data.len() as u64;
        if total > self.limits.max_archive_bytes {
            return Err(BundleError::ArchiveTooLarge {
                limit: self.limits.max_archive_bytes,
            });
        }
        self.archive.extend_from_slice(data);
        if !sha256.is_empty() {
            self.sha256 = Some(sha256.to_owned());
        }
        Ok(())
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.archive.len() as u64
    }

    /// Verifies and extracts the archive into a fresh private directory under `dest_parent`.
    pub fn finish(self, dest_parent: &Path) -> Result<Unpacked, BundleError> {
        let sha = self.sha256.ok_or(BundleError::ChecksumMissing)?;
        unpack(&self.archive, &sha, &self.limits, dest_parent)
    }
}

/// A bundle extracted into a private directory, removed when this is dropped.
#[derive(Debug)]
pub struct Unpacked {
    dir: tempfile::TempDir,
    files: Vec<String>,
}

impl Unpacked {
    /// The directory holding the extracted files.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The extracted files' relative paths, in archive order.
    pub fn files(&self) -> &[String] {
        &self.files
    }

    /// Keeps the directory on disk and returns its path.
    pub fn keep(self) -> PathBuf {
        self.dir.keep()
    }
}

/// Verifies `zip` against `expected_sha256` (hex, any case) and extracts it within `limits`
/// into a fresh directory (mode 0700) created under `dest_parent`.
pub fn unpack(
    zip: &[u8],
    expected_sha256: &str,
    limits: &Limits,
    dest_parent: &Path,
) -> Result<Unpacked, BundleError> {
    if zip.len() as u64 > limits.max_archive_bytes {
        return Err(BundleError::ArchiveTooLarge {
            limit: limits.max_archive_bytes,
        });
    }
    let expected = expected_sha256.trim();
    if expected.is_empty() {
        return Err(BundleError::ChecksumMissing);
    }
    let actual = sha256_hex(zip);
    if !actual.eq_ignore_ascii_case(expected) {
        return Err(BundleError::ChecksumMismatch {
            expected: expected.to_owned(),
            actual,
        });
    }
    let mut archive = ZipArchive::new(Cursor::new(zip)).map_err(|e| BundleError::Corrupt {
        detail: e.to_string(),
    })?;
    if archive.len() > limits.max_files {
        return Err(BundleError::TooManyFiles {
            limit: limits.max_files,
        });
    }
    let dir = private_dir(dest_parent)?;
    let files = extract(&mut archive, dir.path(), limits)?;
    if files.is_empty() {
        return Err(BundleError::Empty);
    }
    Ok(Unpacked { dir, files })
}

fn private_dir(parent: &Path) -> Result<tempfile::TempDir, BundleError> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix("pdrouter-tokenizer-")
        .permissions(fs::Permissions::from_mode(0o700))
        .tempdir_in(parent)
        .map_err(|source| BundleError::Io {
            context: format!("creating a directory in {}", parent.display()),
            source,
        })
}

fn extract(
    archive: &mut ZipArchive<Cursor<&[u8]>>,
    root: &Path,
    limits: &Limits,
) -> Result<Vec<String>, BundleError> {
    let mut files = Vec::new();
    let mut budget = limits.max_total_bytes;
    let mut buf = vec![0u8; 64 * 1024];
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(|e| BundleError::Corrupt {
            detail: e.to_string(),
        })?;
        let name = entry.name().to_owned();
        let rel =
            relative_path(&name).ok_or_else(|| BundleError::UnsafePath { name: name.clone() })?;
        if entry.is_symlink() {
            return Err(BundleError::Symlink { name });
        }
        if entry.encrypted() {
            return Err(BundleError::Encrypted { name });
        }
        let io_err = |context: &str, source| BundleError::Io {
            context: format!("{context} {name:?}"),
            source,
        };
        let target = root.join(&rel);
        if entry.is_dir() {
            fs::create_dir_all(&target).map_err(|e| io_err("creating directory", e))?;
            continue;
        }
        if let Some(parent) = target.parent() {
            fs::create_dir_all(parent).map_err(|e| io_err("creating directory for", e))?;
        }
        let mut out = match open_new(&target) {
            Ok(out) => out,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(BundleError::Duplicate { name });
            }
            Err(e) => return Err(io_err("creating", e)),
        };
        // The declared size may lie: count what actually inflates, and stop at the bound
        // before writing past it.
        let mut written = 0u64;
        loop {
            let n = match entry.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    let detail = format!("{name:?}: {e}");
                    return Err(BundleError::Corrupt { detail });
                }
            };
            written += n as u64;
            if written > limits.max_file_bytes {
                let limit = limits.max_file_bytes;
                return Err(BundleError::FileTooLarge { name, limit });
            }
            if written > budget {
                let limit = limits.max_total_bytes;
                return Err(BundleError::TotalTooLarge { limit });
            }
            out.write_all(&buf[..n]).map_err(|e| io_err("writing", e))?;
        }
        budget -= written;
        files.push(name);
    }
    Ok(files)
}

fn open_new(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

/// `name` as a path of plain components under the extraction root, or `None` when it could
/// reach elsewhere: absolute, `.`/`..`, empty components, backslashes, drive letters, NUL.
fn relative_path(name: &str) -> Option<PathBuf> {
    let trimmed = name.strip_suffix('/').unwrap_or(name);
    if trimmed.is_empty() || trimmed.starts_with('/') || name.contains(['\\', '\0', ':']) {
        return None;
    }
    let mut path = PathBuf::new();
    for part in trimmed.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return None;
        }
        path.push(part);
    }
    Some(path)
}

#[cfg(test)]
mod tests;
