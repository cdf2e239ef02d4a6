//! A CPython process's frames read from userspace: a thread's frames walked by the kernel
//! program's own rules ([`PythonTarget::walk_thread`], the reference the kernel's output is
//! checked against), a recorded frame named ([`PythonTarget::resolve`]) and the threads'
//! `threading` names ([`PythonTarget::threading_names`]).

use std::collections::{HashMap, HashSet};

use anyhow::anyhow;
use profiler_common::{
    PythonEntryRule, PythonInstrRule, PythonProcess, PYTHON_FRAME_OWNED_BY_CSTACK,
    PYTHON_STACKREF_TAG_BITS,
};

use super::{
    code, list_thread_states, names, PythonFrame, PythonFunction, PythonTarget, MAX_FRAMES_VISITED,
    MAX_PYTHON_DEPTH,
};
use crate::Result;

impl PythonTarget {
    /// The code object a frame's `f_executable` (`f_code`) word points to: 3.14 and later
    /// keep a `_PyStackRef` there, a pointer with tag bits, cleared here as the kernel clears
    /// them (earlier versions' plain pointers have them clear: objects are 8-aligned).
    fn frame_code(&self, frame: u64) -> Result<u64> {
        let word = self
            .memory
            .read_u64(frame.wrapping_add(self.layout.kernel.frame_code as u64))?;
        Ok(word & !PYTHON_STACKREF_TAG_BITS)
    }

    /// The Python frames of the thread whose `PyThreadState` is at `tstate`, innermost first,
    /// walked by the kernel program's rules: the same offsets, packing and eval-entry flags
    /// (3.10 every frame; 3.11 a frame with `is_entry`; 3.12+ the frame just before a shim
    /// frame, which is not recorded); it ends at [`MAX_PYTHON_DEPTH`] frames or at a null or
    /// unreadable pointer.
    pub fn walk_thread(&mut self, tstate: u64) -> Result<Vec<PythonFrame>> {
        let k = self.layout.kernel;
        let mut frame = self.current_frame(tstate)?;
        let mut packed: Vec<u64> = Vec::new();
        let mut visited = HashSet::new();
        while frame != 0 && packed.len() < MAX_PYTHON_DEPTH {
            if !visited.insert(frame) || visited.len() > MAX_FRAMES_VISITED {
                self.limits.frames_cut += 1;
                break;
            }
            match self.read_frame(frame, &k) {
                Ok(Some(entry)) => packed.push(entry),
                Ok(None) => {
                    // A shim frame: the frame recorded just before it began the eval call.
                    if let Some(last) = packed.last_mut() {
                        *last = PythonFrame::with_eval_entry(*last);
                    }
                }
                Err(_) => break,
            }
            frame = match self
                .memory
                .read_u64(frame.wrapping_add(k.frame_previous as u64))
            {
                Ok(previous) => previous,
                Err(_) => break,
            };
        }
        Ok(packed.into_iter().map(PythonFrame::unpack).collect())
    }

    /// One frame packed as the kernel packs it, or None for a shim frame.
    fn read_frame(&mut self, frame: u64, k: &PythonProcess) -> Result<Option<u64>> {
        let entry = match k.entry_rule {
            r if r == PythonEntryRule::EveryFrame as u32 => true,
            r if r == PythonEntryRule::EntryFlag as u32 => {
                self.memory
                    .read_u8(frame.wrapping_add(k.frame_entry as u64))?
                    != 0
            }
            _ => {
                if self
                    .memory
                    .read_u8(frame.wrapping_add(k.frame_entry as u64))?
                    == PYTHON_FRAME_OWNED_BY_CSTACK
                {
                    return Ok(None);
                }
                false
            }
        };
        let code = self.frame_code(frame)?;
        let instruction = if k.instr_rule == PythonInstrRule::LastiIndex as u32 {
            // -1 before the first instruction runs: index 0.
            self.memory
                .read_i32(frame.wrapping_add(k.frame_instr as u64))?
                .max(0) as u32
        } else {
            let pointer = self
                .memory
                .read_u64(frame.wrapping_add(k.frame_instr as u64))?;
            let first = self.bytecode_start(frame, code, k)?;
            // 3.11's `prev_instr` starts one code unit before the first instruction: index 0.
            let units = pointer.saturating_sub(first) / 2;
            u32::try_from(units).unwrap_or(u32::MAX)
        };
        // As the kernel does: unknown where a read fails.
        let identity = self
            .memory
            .read_u64(code.wrapping_add(k.code_identity as u64))
            .map_or(PythonFrame::UNKNOWN_IDENTITY, |word| {
                code::identity_bits(&self.memory, k, word)
            });
        Ok(Some(PythonFrame::pack(code, instruction, identity, entry)))
    }

    /// Where the bytecode the frame at `frame` runs starts: its code object's
    /// `co_code_adaptive`, or in free-threaded 3.14+ the thread-local copy its `tlbc_index`
    /// names (`co_tlbc->entries[tlbc_index]`), as the kernel reads it (0 where that read
    /// fails).
    fn bytecode_start(&self, frame: u64, code: u64, k: &PythonProcess) -> Result<u64> {
        let index = if k.frame_tlbc_index != 0 {
            self.memory
                .read_i32(frame.wrapping_add(k.frame_tlbc_index as u64))?
        } else {
            0
        };
        if index <= 0 {
            return Ok(code.wrapping_add(k.code_instructions as u64));
        }
        let entry = self
            .memory
            .read_u64(code.wrapping_add(k.code_tlbc as u64))
            .ok()
            .filter(|&array| array != 0)
            .and_then(|array| {
                let at = array.wrapping_add(8).wrapping_add(index as u64 * 8);
                self.memory.read_u64(at).ok()
            });
        Ok(entry.unwrap_or(0))
    }

    /// Python's `threading` names of the threads `threads` lists (host tid, thread state),
    /// by host tid; empty when the program never imported `threading` or no thread runs
    /// its code (see [`names`]). Reads the process's memory without stopping it.
    pub fn threading_names(&mut self, threads: &[(u32, u64)]) -> HashMap<u32, String> {
        let Ok(listed) = list_thread_states(&self.memory, &self.layout, self.interpreter.runtime)
        else {
            return HashMap::new();
        };
        let ident: HashMap<u64, u64> = listed
            .states
            .iter()
            .map(|t| (t.address, t.thread_id))
            .collect();
        let reader_minor = self.interpreter.version.1;
        let globals_offset = names::NameReader {
            memory: &self.memory,
            layout: &self.layout,
            minor: reader_minor,
        }
        .frame_globals_offset();
        let k = self.layout.kernel;
        let mut globals = None;
        'threads: for &(_, tstate) in threads {
            let Ok(mut frame) = self.current_frame(tstate) else {
                continue;
            };
            for _ in 0..MAX_FRAMES_VISITED {
                if frame == 0 {
                    break;
                }
                if let Ok(code) = self.frame_code(frame) {
                    let in_threading = self
                        .function(code, 0, None)
                        .is_ok_and(|f| f.file.ends_with("threading.py"));
                    if in_threading {
                        globals = self.memory.read_u64(frame + globals_offset).ok();
                        break 'threads;
                    }
                }
                frame = match self
                    .memory
                    .read_u64(frame.wrapping_add(k.frame_previous as u64))
                {
                    Ok(previous) => previous,
                    Err(_) => break,
                };
            }
        }
        let Some(globals) = globals.filter(|g| *g != 0) else {
            return HashMap::new();
        };
        let reader = names::NameReader {
            memory: &self.memory,
            layout: &self.layout,
            minor: reader_minor,
        };
        let by_ident = match reader.names(globals) {
            Ok(n) => n,
            Err(e) => {
                log::debug!("pid {}: no threading names: {e:#}", self.pid);
                return HashMap::new();
            }
        };
        threads
            .iter()
            .filter_map(|(tid, tstate)| {
                let name = by_ident.get(ident.get(tstate)?)?;
                Some((*tid, name.clone()))
            })
            .collect()
    }

    /// Name, file, line of one recorded frame; cached by code address, and read again where
    /// another code object took that address since (CPython frees code objects, a module's
    /// once it is imported, and reuses their memory). Without that check, one loaded CI run
    /// named a launched 3.10 script's leaf function `<module>` in every sample, which fits a
    /// start-up module's code named at that address first. A frame whose identity bits are
    /// not those of the code object now at its address was recorded before the change: it is
    /// not named (an error), rather than named after the newcomer. 1 in 128 replacements have
    /// the same bits and still take the newcomer's name: no later read can tell them apart.
    pub fn resolve(&mut self, frame: PythonFrame) -> Result<PythonFunction> {
        self.function(frame.code, frame.instruction, Some(frame.identity))
    }

    /// The function name of the code object at `code` (an asyncio task's coroutine), read
    /// once and cached with the frames' code objects.
    pub fn code_name(&mut self, code: u64) -> Option<String> {
        self.function(code, 0, None).ok().map(|f| f.name)
    }

    /// [`PythonReader::resolve`] the code object at `code`, instruction `instruction`, checked
    /// against the kernel's identity bits where given.
    fn function(
        &mut self,
        code: u64,
        instruction: u32,
        identity: Option<u8>,
    ) -> Result<PythonFunction> {
        let frame = PythonFrame {
            code,
            instruction,
            identity: identity.unwrap_or(PythonFrame::UNKNOWN_IDENTITY),
            eval_entry: false,
        };
        let before = self.memory.bytes_read();
        let stale = self.codes.get(&frame.code).is_none_or(|info| {
            // Bits other than the cached object's: the frame's object may be a newer one (or
            // the cached object's name was hashed since it was read).
            identity.is_some_and(|bits| {
                bits != PythonFrame::UNKNOWN_IDENTITY && bits != info.identity_bits
            }) || code::CodeReader::identity(&self.memory, &self.layout, frame.code)
                .is_ok_and(|now| now != info.identity)
        });
        self.naming_bytes += self.memory.bytes_read().saturating_sub(before);
        if stale {
            let before = self.memory.bytes_read();
            let read = self
                .code_reader
                .read_code(&self.memory, &self.layout, frame.code);
            self.naming_bytes += self.memory.bytes_read().saturating_sub(before);
            match read {
                Ok(info) => {
                    let kept = info.kept_bytes();
                    self.naming_bytes += kept;
                    self.kept_bytes += kept;
                    if let Some(old) = self.codes.insert(frame.code, info) {
                        self.kept_bytes = self.kept_bytes.saturating_sub(old.kept_bytes());
                    }
                }
                // A failed read (the process is gone, the object half freed) keeps what was
                // read while it lived: the bits below say whether it was this frame's.
                Err(e) if !self.codes.contains_key(&frame.code) => {
                    let what = format!("pid {}: code object {:#x}", self.pid, frame.code);
                    return Err(e.context(what).into());
                }
                Err(_) => {}
            }
        }
        let info = &self.codes[&frame.code];
        if let Some(bits) =
            identity.filter(|&bits| !PythonFrame::identities_match(bits, info.identity_bits))
        {
            return Err(anyhow!(
                "pid {}: code object {:#x} was replaced since the frame was recorded \
                 (identity bits {bits:#x}, now {:#x}): its function is gone",
                self.pid,
                frame.code,
                info.identity_bits
            )
            .into());
        }
        Ok(PythonFunction {
            name: info.name.clone(),
            file: info.file.clone(),
            // A clamped instruction could be anywhere past it: the def's line, not a wrong one.
            line: if frame.instruction >= PythonFrame::MAX_INSTRUCTION {
                info.first_line
            } else {
                info.line(frame.instruction)
            },
            first_line: info.first_line,
        })
    }
}
