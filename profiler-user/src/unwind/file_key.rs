//! [`FileKey`]: an object's identity for table sharing, by what the daemon verified of the file
//! it opened. Both the loader (which tables exist) and the build threads (which jobs are queued)
//! key by it.

use std::os::unix::fs::MetadataExt;

/// An object's identity for table sharing: what the daemon verified itself of the file it
/// opened, never what the file says of itself. A GNU build id is whatever its linker wrote:
/// keyed by it, a user's fake library carrying libc's build id and bogus CFI gave every other
/// user's processes its table for libc (149 of 149 of their stacks lost `_start`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FileKey {
    /// A file, by its device, inode, size, mtime and ctime (in ns) and owner: a user can
    /// neither give its file another file's inode nor set its ctime (only the kernel does),
    /// and a rebuilt or rewritten file gets a new key.
    File {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
        /// `st_size`.
        size: u64,
        /// `st_mtime` in ns.
        mtime: i128,
        /// `st_ctime` in ns.
        ctime: i128,
        /// `st_uid`.
        uid: u32,
    },
    /// The vDSO of the processes of user `uid`, by its image's build id (if any): a process
    /// may write to its own vDSO (it is mapped may-write, for debuggers), so its table is
    /// shared only among processes of the same user.
    Vdso {
        /// The image's GNU build id, empty when it has none.
        build_id: Vec<u8>,
        /// The effective uid of the process it was read from.
        uid: u32,
    },
    /// Anonymous executable code with no CFI whose every frame has one shape, CFA = rsp +
    /// `cfa`: stubs recognised by their bytes (see `FIXED_FRAME_CODE` in the loader; CPython's
    /// perf trampolines today). One table per shape serves every arena of every process.
    FixedFrame {
        /// Bytes from rsp at the return address to the caller's stack pointer.
        cfa: u8,
    },
    /// The code a JIT of process `pid` generated (a JVM's code cache), in one generation of
    /// its table: the runtime writes a new one when its code changes.
    Jit {
        /// The process, by host pid.
        pid: u32,
        /// Which of its tables.
        generation: u64,
    },
}

impl FileKey {
    /// The key of the file whose metadata (from the opened handle, `fstat`) is `meta`.
    pub fn of_file(meta: &std::fs::Metadata) -> FileKey {
        let ns = |secs: i64, nsec: i64| i128::from(secs) * 1_000_000_000 + i128::from(nsec);
        FileKey::File {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: ns(meta.mtime(), meta.mtime_nsec()),
            ctime: ns(meta.ctime(), meta.ctime_nsec()),
            uid: meta.uid(),
        }
    }
}
