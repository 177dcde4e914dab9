//! Finding a cube's header and data file, and opening them only when they are regular files.
//!
//! A FIFO opened for reading blocks until a writer comes, so a path's type is checked from its
//! metadata before it is opened, and the opened file is checked again (without blocking) in case
//! the path changed in between.

use std::fs::{File, Metadata, OpenOptions};
use std::path::{Path, PathBuf};

use super::CubeError;

/// Extensions of a data file beside its header, in the order they are tried.
const DATA_EXTENSIONS: [&str; 8] = ["img", "dat", "raw", "bsq", "bil", "bip", "IMG", "DAT"];

/// What a path is, in words, when it is not a regular file; `None` for a regular file.
fn kind_of(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        return None;
    }
    if t.is_dir() {
        return Some("a directory");
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return Some("a FIFO (named pipe)");
        }
        if t.is_char_device() {
            return Some("a character device");
        }
        if t.is_block_device() {
            return Some("a block device");
        }
        if t.is_socket() {
            return Some("a socket");
        }
    }
    Some("something other than a regular file")
}

/// Opens `path` for reading if it is a regular file, returning it with its length; `role` (e.g.
/// "data file") names what it was meant to be in the error when it is not.
pub(super) fn open_regular(path: &Path, role: &'static str) -> Result<(File, u64), CubeError> {
    let io = |source| CubeError::Io {
        path: path.to_path_buf(),
        source,
    };
    let not_a_file = |kind| CubeError::NotAFile {
        path: path.to_path_buf(),
        kind,
        role,
    };
    if let Some(kind) = kind_of(&std::fs::metadata(path).map_err(io)?) {
        return Err(not_a_file(kind));
    }
    let mut options = OpenOptions::new();
    options.read(true);
    // Should a FIFO replace the file after the check, the open still returns at once.
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NONBLOCK);
    let file = options.open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if let Some(kind) = kind_of(&meta) {
        return Err(not_a_file(kind));
    }
    Ok((file, meta.len()))
}

/// Finds the data file of a header: the same stem with `.img`, `.dat`, `.raw`, `.bsq`, `.bil`,
/// `.bip` or no extension, the first that is a regular file.
///
/// When none is, but a candidate with an extension (or the bare stem, unless it is a directory,
/// such as an output folder named after the scene) exists as something else, the error names it
/// and what it is ([`CubeError::NotAFile`]); otherwise it lists the paths tried
/// ([`CubeError::MissingData`]). Nothing is opened.
pub fn data_path_for(header: &Path) -> Result<PathBuf, CubeError> {
    let stem = header.with_extension("");
    let candidates: Vec<PathBuf> = DATA_EXTENSIONS
        .iter()
        .map(|ext| header.with_extension(ext))
        .chain(std::iter::once(stem.clone()))
        .collect();
    let mut other = None;
    for path in &candidates {
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(CubeError::Io {
                    path: path.clone(),
                    source,
                });
            }
        };
        match kind_of(&meta) {
            None => return Ok(path.clone()),
            Some(_) if *path == stem && meta.is_dir() => {}
            Some(kind) => {
                other.get_or_insert((path.clone(), kind));
            }
        }
    }
    Err(match other {
        Some((path, kind)) => CubeError::NotAFile {
            path,
            kind,
            role: "data file",
        },
        None => CubeError::MissingData {
            header: header.to_path_buf(),
            tried: candidates,
        },
    })
}

/// Finds the header of a path given as either the `.hdr` or the data file: `X.img.hdr` if it
/// exists (as anything: reading it then says what it is), else `X.hdr`.
pub fn header_path_for(path: &Path) -> PathBuf {
    if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("hdr")) {
        return path.to_path_buf();
    }
    let appended = PathBuf::from(format!("{}.hdr", path.display()));
    if appended.exists() {
        return appended;
    }
    path.with_extension("hdr")
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::cube::{Cube, DataType, Header, Interleave};

    /// A 1 x 1 x 1 byte cube's header in `dir`, with no data file.
    fn lone_header(dir: &Path) -> PathBuf {
        let hdr = dir.join("x.hdr");
        std::fs::write(&hdr, Header::new(1, 1, 1, DataType::U8, Interleave::Bsq).to_text()).unwrap();
        hdr
    }

    fn mkfifo(path: &Path) {
        let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
        assert!(status.success(), "mkfifo {}", path.display());
    }

    /// `Cube::open(path)`'s error, failing the test if it takes more than 10 s (a blocked open).
    fn open_error(path: &Path) -> String {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || tx.send(Cube::open(&path).map(|_| ()).map_err(|e| e.to_string())));
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(r) => r.unwrap_err(),
            Err(_) => panic!("Cube::open blocked"),
        }
    }

    #[test]
    fn a_data_file_that_is_a_directory_fifo_or_device_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let hdr = lone_header(dir.path());
        let img = dir.path().join("x.img");
        std::fs::create_dir(&img).unwrap();
        let e = open_error(&hdr);
        assert_eq!(e, format!("{}: is a directory, not a data file", img.display()));
        std::fs::remove_dir(&img).unwrap();
        mkfifo(&img);
        let e = open_error(&hdr);
        assert_eq!(e, format!("{}: is a FIFO (named pipe), not a data file", img.display()));
        std::fs::remove_file(&img).unwrap();
        std::os::unix::fs::symlink("/dev/null", &img).unwrap();
        let e = open_error(&hdr);
        assert_eq!(e, format!("{}: is a character device, not a data file", img.display()));
        // A regular file further down the list is preferred over the odd one.
        std::fs::write(dir.path().join("x.dat"), [7u8]).unwrap();
        let cube = Cube::open(&hdr).unwrap();
        assert_eq!(cube.data_path(), dir.path().join("x.dat"));
    }

    #[test]
    fn a_header_that_is_a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let hdr = dir.path().join("p.hdr");
        mkfifo(&hdr);
        let e = open_error(&hdr);
        assert_eq!(
            e,
            format!("{}: is a FIFO (named pipe), not a header file", hdr.display())
        );
        // Given as the data file's path, `p.img.hdr` exists as a FIFO and is named too.
        let appended = dir.path().join("q.img.hdr");
        mkfifo(&appended);
        assert_eq!(header_path_for(&dir.path().join("q.img")), appended);
        assert!(open_error(&dir.path().join("q.img")).contains("q.img.hdr: is a FIFO"));
    }

    #[test]
    fn an_output_folder_named_after_the_scene_is_not_taken_for_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let hdr = lone_header(dir.path());
        std::fs::create_dir(dir.path().join("x")).unwrap();
        let e = Cube::open(&hdr).unwrap_err();
        assert!(matches!(e, CubeError::MissingData { .. }), "{e}");
        assert!(e.to_string().contains("no data file found"), "{e}");
    }
}
