use std::os::unix::fs::PermissionsExt;

use super::*;
use crate::bytelevel;

fn leftovers(parent: &Path) -> usize {
    fs::read_dir(parent).unwrap().count()
}

fn raw_zip(build: impl FnOnce(&mut zip::ZipWriter<Cursor<Vec<u8>>>)) -> (Vec<u8>, String) {
    let mut writer = zip::ZipWriter::new(Cursor::new(Vec::new()));
    build(&mut writer);
    let zip = writer.finish().unwrap().into_inner();
    let sha = sha256_hex(&zip);
    (zip, sha)
}

fn stored() -> SimpleFileOptions {
    SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored)
}

fn unpack_err(zip: &[u8], sha: &str, limits: &Limits) -> BundleError {
    let parent = tempfile::tempdir().unwrap();
    let err = unpack(zip, sha, limits, parent.path()).unwrap_err();
    assert_eq!(
        leftovers(parent.path()),
        0,
        "a failed unpack leaves nothing behind"
    );
    err
}

#[test]
fn bytelevel_files_round_trip_through_chunks_into_a_private_dir() {
    let files = bytelevel::files();
    let (zip, sha) = pack(files.iter().map(|(n, d)| (*n, d))).unwrap();
    assert_eq!(sha.len(), 64);
    assert!(
        sha.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_eq!(
        pack(files.clone()).unwrap().1,
        sha,
        "packing is deterministic"
    );

    let mut rx = Receiver::new(Limits::default());
    let pieces: Vec<_> = chunks(&zip, &sha, 100).collect();
    assert!(pieces.len() > 2);
    assert!(pieces[..pieces.len() - 1].iter().all(|(_, s)| s.is_empty()));
    for (data, sha) in pieces {
        rx.push(data, sha).unwrap();
    }
    assert_eq!(rx.received(), zip.len() as u64);
    let parent = tempfile::tempdir().unwrap();
    let out = rx.finish(parent.path()).unwrap();

    let mode = fs::metadata(out.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);
    assert!(out.path().starts_with(parent.path()));
    let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
    assert_eq!(out.files(), names.as_slice());
    for (name, data) in &files {
        let path = out.path().join(name);
        assert_eq!(&fs::read(&path).unwrap(), data);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
    let dir = out.path().to_owned();
    drop(out);
    assert!(!dir.exists(), "dropping the bundle removes its directory");
}

#[test]
fn checksum_is_required_and_checked_in_any_case() {
    let (zip, sha) = pack([("tokenizer.json", b"{}")]).unwrap();
    let parent = tempfile::tempdir().unwrap();
    let upper = sha.to_ascii_uppercase();
    assert!(unpack(&zip, &upper, &Limits::default(), parent.path()).is_ok());

    let wrong = sha256_hex(b"something else");
    let err = unpack_err(&zip, &wrong, &Limits::default());
    assert!(
        matches!(err, BundleError::ChecksumMismatch { ref expected, .. } if *expected == wrong)
    );
    assert!(matches!(
        unpack_err(&zip, " ", &Limits::default()),
        BundleError::ChecksumMissing
    ));

    let mut rx = Receiver::new(Limits::default());
    rx.push(&zip, "").unwrap();
    assert!(matches!(
        rx.finish(parent.path()),
        Err(BundleError::ChecksumMissing)
    ));
}

#[test]
fn receiver_refuses_oversized_streams_and_data_after_the_final_chunk() {
    let limits = Limits {
        max_archive_bytes: 10,
        ..Limits::default()
    };
    let mut rx = Receiver::new(limits);
    rx.push(&[0; 6], "").unwrap();
    let err = rx.push(&[0; 5], "").unwrap_err();
    assert!(matches!(err, BundleError::ArchiveTooLarge { limit: 10 }));

    let mut rx = Receiver::new(Limits::default());
    rx.push(b"abc", "ff").unwrap();
    rx.push(b"", "").unwrap();
    assert!(matches!(
        rx.push(b"d", ""),
        Err(BundleError::ChunkAfterChecksum)
    ));

    let (zip, sha) = pack([("a", vec![1u8; 100])]).unwrap();
    let small = Limits {
        max_archive_bytes: zip.len() as u64 - 1,
        ..Limits::default()
    };
    assert!(matches!(
        unpack_err(&zip, &sha, &small),
        BundleError::ArchiveTooLarge { .. }
    ));
}

#[test]
fn corrupt_archives_are_refused() {
    let garbage = b"this is not a zip archive at all".to_vec();
    let err = unpack_err(&garbage, &sha256_hex(&garbage), &Limits::default());
    assert!(matches!(err, BundleError::Corrupt { .. }), "{err}");

    let (zip, _) = pack([("tokenizer.json", vec![b'x'; 4096])]).unwrap();
    let truncated = &zip[..zip.len() / 2];
    let err = unpack_err(truncated, &sha256_hex(truncated), &Limits::default());
    assert!(matches!(err, BundleError::Corrupt { .. }), "{err}");

    // Flip bytes inside the stored data: the central directory is intact, the CRC is not.
    let (mut zip, _) = raw_zip(|w| {
        w.start_file("tokenizer.json", stored()).unwrap();
        w.write_all(&[b'q'; 64]).unwrap();
    });
    let at = zip.windows(8).position(|w| w == [b'q'; 8]).unwrap();
    zip[at] = b'z';
    let err = unpack_err(&zip, &sha256_hex(&zip), &Limits::default());
    assert!(matches!(err, BundleError::Corrupt { .. }), "{err}");

    let (empty, sha) = raw_zip(|_| {});
    assert!(matches!(
        unpack_err(&empty, &sha, &Limits::default()),
        BundleError::Empty
    ));
}

#[test]
fn size_and_count_limits_count_inflated_bytes() {
    // 1 MiB of zeros deflates to about a kilobyte: the limit is on what comes out.
    let (zip, sha) = pack([("bomb.json", vec![0u8; 1 << 20])]).unwrap();
    assert!(zip.len() < 8 << 10);
    let per_file = Limits {
        max_file_bytes: 1000,
        ..Limits::default()
    };
    let err = unpack_err(&zip, &sha, &per_file);
    assert!(
        matches!(err, BundleError::FileTooLarge { ref name, limit: 1000 } if name == "bomb.json")
    );

    let (zip, sha) = pack([("a", [7u8; 600]), ("b", [7u8; 600])]).unwrap();
    let total = Limits {
        max_file_bytes: 1000,
        max_total_bytes: 1000,
        ..Limits::default()
    };
    assert!(matches!(
        unpack_err(&zip, &sha, &total),
        BundleError::TotalTooLarge { limit: 1000 }
    ));

    let many: Vec<(String, Vec<u8>)> = (0..5).map(|i| (format!("f{i}"), vec![1])).collect();
    let (zip, sha) = pack(many).unwrap();
    let few = Limits {
        max_files: 4,
        ..Limits::default()
    };
    assert!(matches!(
        unpack_err(&zip, &sha, &few),
        BundleError::TooManyFiles { limit: 4 }
    ));
}

#[test]
fn unsafe_entries_are_refused() {
    for name in [
        "../evil",
        "/etc/evil",
        "a/../../evil",
        "a//b",
        "./a",
        "c:evil",
        "a\\..\\b",
    ] {
        let (zip, sha) = raw_zip(|w| {
            w.start_file(name, stored()).unwrap();
            w.write_all(b"x").unwrap();
        });
        let err = unpack_err(&zip, &sha, &Limits::default());
        assert!(
            matches!(err, BundleError::UnsafePath { .. }),
            "{name}: {err}"
        );
        assert!(matches!(
            pack([(name, b"x")]),
            Err(BundleError::UnsafePath { .. })
        ));
    }

    let (zip, sha) = raw_zip(|w| {
        w.add_symlink("tokenizer.json", "/etc/passwd", stored())
            .unwrap();
    });
    let err = unpack_err(&zip, &sha, &Limits::default());
    assert!(matches!(err, BundleError::Symlink { ref name } if name == "tokenizer.json"));
}

#[test]
fn nested_directories_are_created_and_duplicates_refused() {
    let (zip, sha) = raw_zip(|w| {
        w.add_directory("sub/", stored()).unwrap();
        w.start_file("sub/vocab.json", stored()).unwrap();
        w.write_all(b"{}").unwrap();
    });
    let parent = tempfile::tempdir().unwrap();
    let out = unpack(&zip, &sha, &Limits::default(), parent.path()).unwrap();
    assert_eq!(out.files(), ["sub/vocab.json"]);
    assert_eq!(fs::read(out.path().join("sub/vocab.json")).unwrap(), b"{}");

    // The reader keeps one entry per name; a file over a directory of the same name is the
    // duplicate that remains possible.
    let (zip, sha) = raw_zip(|w| {
        w.add_directory("dup/", stored()).unwrap();
        w.start_file("dup", stored()).unwrap();
        w.write_all(b"x").unwrap();
    });
    let err = unpack_err(&zip, &sha, &Limits::default());
    assert!(
        matches!(err, BundleError::Duplicate { ref name } if name == "dup"),
        "{err}"
    );
}

#[test]
fn chunks_cover_the_archive_exactly_once() {
    let data: Vec<u8> = (0..=255).collect();
    for size in [1, 7, 64, 255, 256, 1000] {
        let pieces: Vec<_> = chunks(&data, "sum", size).collect();
        let joined: Vec<u8> = pieces.iter().flat_map(|(d, _)| d.iter().copied()).collect();
        assert_eq!(joined, data);
        assert_eq!(pieces.last().unwrap().1, "sum");
        assert!(
            pieces
                .iter()
                .rev()
                .skip(1)
                .all(|(d, s)| s.is_empty() && d.len() == size)
        );
    }
    assert_eq!(
        chunks(&[], "sum", 10).collect::<Vec<_>>(),
        [(&[][..], "sum")]
    );
}
