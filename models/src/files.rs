//! Reading the files of a model directory.
//!
//! Invariant: every input file is a regular file (symlinks followed, as in Hugging Face's
//! cache, whose snapshot files link into `blobs/`). A FIFO would block a read forever, a
//! device such as `/dev/zero` never ends, and a directory is no file at all: each is an error
//! that says what the path is, never "not found", a hang or an allocation failure.

use std::fs;
use std::path::Path;

use crate::error::ModelError;

/// Whether `path` exists as a regular file: `Ok(false)` when nothing is there, an error when
/// something that is not a regular file is (or when it cannot be inspected).
pub fn is_regular(path: &Path) -> Result<bool, ModelError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(true),
        Ok(m) => Err(ModelError::NotRegular {
            file: path.to_path_buf(),
            found: kind(&m.file_type()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ModelError::io(path, e)),
    }
}

/// The text of the regular file `path` (missing: the OS error, naming the file).
pub fn read_text(path: &Path) -> Result<String, ModelError> {
    is_regular(path)?;
    fs::read_to_string(path).map_err(|e| ModelError::io(path, e))
}

/// What a non-regular file is, in words.
fn kind(t: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "something that is not a regular file"
    }
}
