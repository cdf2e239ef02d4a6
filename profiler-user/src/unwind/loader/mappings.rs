//! A tracked process's executable mappings: read from `/proc/PID/maps`, each keyed to the
//! object it maps (a file, the vDSO, stubs of one frame shape), written to the kernel's map of the
//! process, with the tables of objects not seen before queued.

use super::*;

impl UnwindMaps {
    /// Reads `pid`'s executable mappings and gives them to the kernel, queueing the tables of
    /// objects not seen before.
    pub(super) fn load_maps(
        &mut self,
        pid: u32,
        owner: Owner,
        maps: &[MemoryMap],
    ) -> anyhow::Result<()> {
        let mut executable: Vec<&MemoryMap> = maps
            .iter()
            // `[vsyscall]` lies in the kernel's half of the address space: it is no user code
            // to unwind, and the kernel walk's branch-free bisection compares addresses by the
            // sign of their difference, which holds only within the user half.
            .filter(|m| {
                m.perms.contains(MMPermissions::EXECUTE) && m.address.0 < USER_ADDRESS_LIMIT
            })
            .collect();
        // The kernel walk knows the first MAX_UNWIND_MAPPINGS (by address): only those are
        // opened, so that a process with 60,000 executable mappings costs no more than one
        // with 256 (each is an open, a read of its headers and a key).
        executable.sort_by_key(|m| m.address.0);
        let over = executable.len().saturating_sub(MAX_UNWIND_MAPPINGS);
        executable.truncate(MAX_UNWIND_MAPPINGS);
        let signature: Vec<_> = executable
            .iter()
            .map(|m| (m.address.0, m.address.1, m.offset, m.dev, m.inode))
            .collect();
        if self
            .tracked
            .get(&pid)
            .is_some_and(|t| t.signature == signature && t.owner == owner)
        {
            return Ok(());
        }
        let mut mappings = Vec::with_capacity(executable.len());
        for map in executable {
            let (start, end) = map.address;
            let mapping = match &map.pathname {
                // A JIT's code, else known stub code (its first bytes read once), else none.
                MMapPath::Anonymous => match self.jit_mapping(pid, start, end) {
                    Some(jit) => Ok(jit),
                    None => match fixed_frame_code(pid, start) {
                        Some(shape) => Ok(TrackedMapping {
                            start,
                            end,
                            bias: start,
                            key: Some(self.fixed_frame_table(shape)),
                            source: None,
                        }),
                        None => Err(anyhow!("no file")),
                    },
                },
                MMapPath::Vdso => self
                    .vdso(pid, owner, start, end)
                    .with_context(|| format!("pid {pid}'s vDSO")),
                MMapPath::Path(path) => {
                    // map_files reaches the file whatever the target's mount namespace.
                    let source = PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}"));
                    self.object(
                        &source,
                        (start, end),
                        map.offset,
                        &path.display().to_string(),
                        owner,
                    )
                    .with_context(|| path.display().to_string())
                }
                _ => Err(anyhow!("no file")),
            };
            mappings.push(mapping.unwrap_or_else(|e| {
                log::debug!("no unwind table for {e:#}");
                TrackedMapping {
                    start,
                    end,
                    bias: 0,
                    key: None,
                    source: None,
                }
            }));
        }
        mappings.sort_by_key(|m| m.start);
        if over > 0 {
            log::warn!(
                "pid {pid} has {} executable mappings; the CFI walk knows the first {MAX_UNWIND_MAPPINGS}",
                over + MAX_UNWIND_MAPPINGS
            );
        }
        let tracked = self.tracked.entry(pid).or_default();
        tracked.owner = owner;
        tracked.signature = signature;
        tracked.mappings = mappings;
        // A new process is registered even with no table yet: its walk then takes frame
        // pointers through the objects still being built.
        tracked.written.clear();
        self.write_process(pid)
    }

    /// Gives the kernel `pid`'s mappings with the tables resident now, when they changed.
    pub(super) fn write_process(&mut self, pid: u32) -> anyhow::Result<()> {
        let Some(tracked) = self.tracked.get(&pid) else {
            return Ok(());
        };
        let mappings: Vec<UnwindMapping> = tracked
            .mappings
            .iter()
            .map(|m| {
                let mut mapping = UnwindMapping {
                    start: m.start,
                    end: m.end,
                    ..UnwindMapping::default()
                };
                let resident = m.key.as_ref().and_then(|k| self.tables.get(k));
                if let Some(Table {
                    state: TableState::Resident { first_row, rows },
                    ..
                }) = resident
                {
                    mapping.first_row = *first_row;
                    mapping.rows = *rows;
                    mapping.bias = m.bias;
                }
                mapping
            })
            .collect();
        if !tracked.written.is_empty() && tracked.written == mappings {
            return Ok(());
        }
        let mut value = ProcessMappings {
            len: mappings.len() as u64,
            mappings: [UnwindMapping::default(); MAX_UNWIND_MAPPINGS],
        };
        value.mappings[..mappings.len()].copy_from_slice(&mappings);
        self.processes
            .insert(pid, value, 0)
            .context("registering the process's mappings")?;
        if let Some(tracked) = self.tracked.get_mut(&pid) {
            tracked.written = mappings;
        }
        Ok(())
    }

    /// Rewrites the kernel's mappings of every process that maps `key`.
    pub(super) fn write_processes_of(&mut self, key: &FileKey) {
        let pids: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.mappings.iter().any(|m| m.key.as_ref() == Some(key)))
            .map(|(pid, _)| *pid)
            .collect();
        for pid in pids {
            if let Err(e) = self.write_process(pid) {
                log::debug!("pid {pid}: {e:#}");
            }
        }
    }

    /// The mapping of an object file, its table queued for `owner` when the file is new or
    /// still queued (for another owner, maybe).
    pub(super) fn object(
        &mut self,
        source: &std::path::Path,
        (start, end): (u64, u64),
        offset: u64,
        name: &str,
        owner: Owner,
    ) -> anyhow::Result<TrackedMapping> {
        // A FIFO, a device or a directory mapped executable is nothing to read.
        let (handle, _) = crate::process::target_file::open_proc_link(source)
            .with_context(|| format!("opening {}", source.display()))?;
        let meta = handle.metadata().context("stat")?;
        if !meta.is_file() {
            return Err(anyhow!("not a regular file"));
        }
        // Read by pread, not mapped: the target's user may truncate the file meanwhile.
        let image = crate::process::target_file::ElfReader::new(handle.try_clone()?);
        let bias = load_bias(&image, start, offset).map_err(|e| image.explain(e))?;
        let key = FileKey::of_file(&meta);
        if !self.tables.contains_key(&key) {
            self.new_table(key.clone(), name);
            let estimate = crate::unwind::table::estimate_rows(&image);
            let fits = self
                .free_range(estimate.min(u64::from(u32::MAX)) as u32)
                .is_some();
            if estimate <= EAGER_MAX_ROWS && fits {
                self.submit(key.clone(), Image::File(handle), meta.len(), owner, false);
            } else {
                let estimated_rows = estimate.min(u64::from(u32::MAX)) as u32;
                self.decide(&key, TableState::OnDemand { estimated_rows });
            }
        } else if let Some(builder) = &self.builder {
            // Queued for another process, maybe another owner's: this owner waits for it in
            // its own turn, not behind that owner's queue.
            builder.want(&key, owner);
        }
        Ok(TrackedMapping {
            start,
            end,
            bias,
            key: Some(key),
            source: Some(source.to_path_buf()),
        })
    }

    /// The vDSO's mapping. The vDSO has no file: its ELF image is read from the process's
    /// memory, and its table is built once per kernel (by the image's build id).
    pub(super) fn vdso(
        &mut self,
        pid: u32,
        owner: Owner,
        start: u64,
        end: u64,
    ) -> anyhow::Result<TrackedMapping> {
        let image = crate::process::vdso::read_image(pid, start, end)?;
        let bias = load_bias(image.as_slice(), start, 0)?;
        let key = {
            use object::Object;
            let elf = object::File::parse(&*image).context("parsing the vDSO's ELF headers")?;
            // The owner of /proc/PID is the process's effective uid: who may write to it.
            let uid = std::fs::metadata(format!("/proc/{pid}"))
                .context("stat of the process")?
                .uid();
            FileKey::Vdso {
                build_id: elf.build_id().ok().flatten().unwrap_or_default().to_vec(),
                uid,
            }
        };
        if !self.tables.contains_key(&key) {
            self.new_table(key.clone(), crate::process::maps::VDSO);
            let size = image.len() as u64;
            self.submit(
                key.clone(),
                Image::Memory(image.to_vec()),
                size,
                owner,
                false,
            );
        }
        Ok(TrackedMapping {
            start,
            end,
            bias,
            key: Some(key),
            source: None,
        })
    }

    /// The one-row table of `shape`'s code, written on first use; its key.
    fn fixed_frame_table(&mut self, shape: &FixedFrameCode) -> FileKey {
        let key = FileKey::FixedFrame { cfa: shape.cfa };
        if self.tables.contains_key(&key) {
            return key;
        }
        self.new_table(key.clone(), shape.name);
        let row = UnwindRow::new(0, CfaRule::Rsp, shape.cfa.into(), None, 0).expect("a valid row");
        self.install(Built {
            key: key.clone(),
            table: Ok(UnwindTable { rows: vec![row] }),
            took: Duration::ZERO,
            cpu: Duration::ZERO,
            boosted: false,
            cached: false,
        });
        key
    }
}

/// Stub code a runtime writes into anonymous memory without CFI, recognised by its bytes at
/// the start of the mapping, whose every frame has one shape: each gets a one-row table.
struct FixedFrameCode {
    /// What the table is called in logs.
    name: &'static str,
    /// The code at the start of each arena.
    code: &'static [u8],
    /// CFA = rsp + `cfa` anywhere in it.
    cfa: u8,
}

/// The stubs known. CPython's perf trampolines (`-X perf`, `sys.activate_stack_trampoline`,
/// 3.12+ on x86-64): `sub $8,%rsp; call *%rcx; add $8,%rsp; ret`, keeping no frame pointer,
/// so a frame-pointer walk through one loses the stack; a return address into a trampoline
/// sits after its call, where the caller's frame is the 8 bytes it reserved plus the return
/// address: CFA = rsp + 16.
const FIXED_FRAME_CODE: &[FixedFrameCode] = &[FixedFrameCode {
    name: "[python perf trampolines]",
    code: &[
        0x48, 0x83, 0xec, 0x08, 0xff, 0xd1, 0x48, 0x83, 0xc4, 0x08, 0xc3,
    ],
    cfa: 16,
}];

/// The known stub whose code the anonymous executable mapping at `start` of `pid` begins with.
fn fixed_frame_code(pid: u32, start: u64) -> Option<&'static FixedFrameCode> {
    use std::os::unix::fs::FileExt;
    let longest = FIXED_FRAME_CODE.iter().map(|c| c.code.len()).max()?;
    let mut code = vec![0u8; longest];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    // A short mapping reads short: compare what was read.
    let n = mem.read_at(&mut code, start).ok()?;
    FIXED_FRAME_CODE
        .iter()
        .find(|c| code[..n].starts_with(c.code))
}

/// Whether `pid` still runs bpfprof's own image: a launched command between fork and exec.
/// Its tables are loaded after the exec; building bpfprof's own would only delay the command.
pub(crate) fn is_unexeced_child(pid: u32) -> bool {
    let id = |path: String| std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok();
    pid != std::process::id()
        && id(format!("/proc/{pid}/exe"))
            .is_some_and(|child| id("/proc/self/exe".into()) == Some(child))
}
