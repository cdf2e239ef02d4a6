//! Reads another process's memory: `process_vm_readv` (one system call, no ptrace stop), with
//! `/proc/PID/mem` as the fallback where that call is refused (e.g. seccomp in a container).

use std::{
    fs::File,
    os::unix::fs::FileExt,
    sync::{
        atomic::{AtomicU64, Ordering},
        OnceLock,
    },
};

use anyhow::{anyhow, Context};

use crate::{Error, Result};

/// A handle on one process's address space.
pub struct ProcessMemory {
    pid: u32,
    /// Opened on the first failure of `process_vm_readv`, then used for every read.
    mem_file: OnceLock<File>,
    /// Bytes asked for so far, for the budgets of the walks over this memory.
    bytes_read: AtomicU64,
}

impl ProcessMemory {
    /// Reads from the memory of process `pid` (in bpfprof's pid namespace).
    pub fn new(pid: u32) -> ProcessMemory {
        ProcessMemory {
            pid,
            mem_file: OnceLock::new(),
            bytes_read: AtomicU64::new(0),
        }
    }

    /// Bytes read (or asked for) from the process so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// The process this reads from.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Fills `buf` from address `addr`; fails unless every byte could be read.
    pub fn read_exact(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        self.bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        if self.mem_file.get().is_none() {
            match self.vm_readv(addr, buf) {
                Ok(n) if n == buf.len() => return Ok(()),
                Ok(n) => {
                    return Err(anyhow!(
                        "pid {}: short read at {addr:#x}: {n} of {} bytes",
                        self.pid,
                        buf.len()
                    )
                    .into())
                }
                // EFAULT: the address is not mapped; no other way reads it either.
                Err(e) if e.raw_os_error() == Some(libc::EFAULT) => {
                    return Err(anyhow!("pid {}: address {addr:#x} not mapped", self.pid).into())
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    return Err(anyhow!("pid {}: no such process", self.pid).into())
                }
                Err(_) => {
                    let path = format!("/proc/{}/mem", self.pid);
                    let file = match File::open(&path) {
                        Ok(file) => file,
                        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                            return Err(Error::PermissionDenied(format!(
                                "reading the memory of pid {} ({path})",
                                self.pid
                            )))
                        }
                        Err(e) => return Err(anyhow!(e).context(format!("open {path}")).into()),
                    };
                    let _ = self.mem_file.set(file);
                }
            }
        }
        let file = self.mem_file.get().expect("opened above");
        file.read_exact_at(buf, addr)
            .with_context(|| format!("pid {}: read {} bytes at {addr:#x}", self.pid, buf.len()))?;
        Ok(())
    }

    fn vm_readv(&self, addr: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: buf.len(),
        };
        // SAFETY: `local` describes `buf`, which is valid for writes of its length for the whole
        // call; the remote iovec is only an address in the other process and never dereferenced
        // here.
        let n =
            unsafe { libc::process_vm_readv(self.pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    /// Reads `len` bytes at `addr`.
    pub fn read_vec(&self, addr: u64, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0; len];
        self.read_exact(addr, &mut buf)?;
        Ok(buf)
    }

    /// Reads a native-endian `u64` (a pointer, a `Py_ssize_t`).
    pub fn read_u64(&self, addr: u64) -> Result<u64> {
        let mut b = [0; 8];
        self.read_exact(addr, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// Reads a native-endian `u32`.
    pub fn read_u32(&self, addr: u64) -> Result<u32> {
        let mut b = [0; 4];
        self.read_exact(addr, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    /// Reads a native-endian `i32` (a C `int`).
    pub fn read_i32(&self, addr: u64) -> Result<i32> {
        Ok(self.read_u32(addr)? as i32)
    }

    /// Reads one byte.
    pub fn read_u8(&self, addr: u64) -> Result<u8> {
        let mut b = [0; 1];
        self.read_exact(addr, &mut b)?;
        Ok(b[0])
    }

    /// Reads a NUL-terminated C string of at most `max` bytes (lossily as UTF-8).
    pub fn read_c_string(&self, addr: u64, max: usize) -> Result<String> {
        let mut out = Vec::new();
        // Page-sized steps so a string near the end of a mapping is still readable.
        let mut at = addr;
        while out.len() < max {
            let to_page_end = 4096 - (at % 4096) as usize;
            let chunk = self.read_vec(at, to_page_end.min(max - out.len()))?;
            if let Some(nul) = chunk.iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..nul]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk);
            at += chunk.len() as u64;
        }
        Err(anyhow!(
            "pid {}: no string end within {max} bytes at {addr:#x}",
            self.pid
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::ProcessMemory;

    #[test]
    fn reads_own_memory() {
        let value: u64 = 0x1122_3344_5566_7788;
        let text = b"hello\0world";
        let mem = ProcessMemory::new(std::process::id());
        assert_eq!(mem.read_u64(&value as *const u64 as u64).unwrap(), value);
        assert_eq!(
            mem.read_c_string(text.as_ptr() as u64, 64).unwrap(),
            "hello"
        );
        assert!(mem.read_u64(8).is_err(), "the zero page is never mapped");
    }
}
