//! CFI unwinding in the kernel: the tables' rows, each process's mappings, and the limits of
//! the walk (its searches and stack scans).

/// Rows of every loaded unwind table, end to end, in the kernel's row array: the memory bound
/// of CFI unwinding (8 bytes a row, so 16 MiB, preallocated when the program loads).
pub const MAX_UNWIND_ROWS: u32 = 1 << 21;
/// Processes whose mappings the kernel program can unwind through CFI tables at once.
pub const MAX_UNWIND_PROCESSES: u32 = 1024;
/// Executable mappings per process the CFI walk knows about; further ones unwind by frame pointer.
pub const MAX_UNWIND_MAPPINGS: usize = 256;
/// Bisection steps over one table's rows: enough for 2^22 rows.
pub const UNWIND_TABLE_SEARCH_STEPS: u32 = 22;
/// Bisection steps over one process's mappings: enough for [`MAX_UNWIND_MAPPINGS`].
pub const UNWIND_MAPPING_SEARCH_STEPS: u32 = 9;
/// Stack words the CFI walk scans above a frame that has neither CFI nor a usable frame
/// pointer, looking for its return address: oneDNN's JIT kernels keep up to a few hundred
/// bytes of locals and saved registers below theirs (Breakpad scans 40 words, 160 for the
/// innermost frame).
pub const STACK_SCAN_WORDS: u32 = 160;
/// Scans one walk may make (each up to [`STACK_SCAN_WORDS`] words): a JIT kernel that calls
/// another, or assembly called from JIT code.
pub const STACK_SCANS: u32 = 2;

/// Whether the 8 bytes before a return address (`bytes`, read as a little-endian u64: the
/// byte just before the address is the top byte) end with an x86-64 call instruction: `call
/// rel32`, or `call r/m64` (`FF /2`, any REX prefix) through a register, a memory operand with
/// or without SIB, an 8- or 32-bit displacement, or rip-relative. The stack scan takes a word
/// as a return address only if it follows a call, as a real one always does.
pub const fn follows_call(bytes: u64) -> bool {
    // The byte `k` bytes before the return address.
    const fn before(bytes: u64, k: u32) -> u8 {
        (bytes >> (64 - 8 * k)) as u8
    }
    // A ModRM byte of `FF /2` (reg field 2), split into mod and rm.
    const fn call_modrm(m: u8) -> Option<(u8, u8)> {
        if m & 0x38 == 0x10 {
            Some((m >> 6, m & 7))
        } else {
            None
        }
    }
    if before(bytes, 5) == 0xe8 {
        return true;
    }
    // FF modrm: a register (mod 3) or [reg] (mod 0, rm neither SIB nor rip-relative).
    if before(bytes, 2) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 1)) {
            if md == 3 || (md == 0 && rm != 4 && rm != 5) {
                return true;
            }
        }
    }
    // FF modrm disp8 (mod 1, no SIB), or FF modrm sib (mod 0, SIB without a disp32 base).
    if before(bytes, 3) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 2)) {
            if (md == 1 && rm != 4) || (md == 0 && rm == 4 && before(bytes, 1) & 7 != 5) {
                return true;
            }
        }
    }
    // FF modrm sib disp8.
    if before(bytes, 4) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 3)) {
            if md == 1 && rm == 4 {
                return true;
            }
        }
    }
    // FF modrm disp32 (mod 2, no SIB), or rip-relative (mod 0, rm 5).
    if before(bytes, 6) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 5)) {
            if (md == 2 && rm != 4) || (md == 0 && rm == 5) {
                return true;
            }
        }
    }
    // FF modrm sib disp32 (mod 2), or SIB with a disp32 and no base (mod 0, base 5).
    if before(bytes, 7) == 0xff {
        if let Some((md, rm)) = call_modrm(before(bytes, 6)) {
            if rm == 4 && (md == 2 || (md == 0 && before(bytes, 5) & 7 == 5)) {
                return true;
            }
        }
    }
    false
}

/// How a row computes the canonical frame address (CFA, the caller's stack pointer).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CfaRule {
    /// No CFI covers this pc: the walk falls back to the frame pointer for this frame.
    NoInfo = 0,
    /// CFA = rsp + offset.
    Rsp = 1,
    /// CFA = rbp + offset.
    Rbp = 2,
    /// The expression compilers emit for PLT stubs: CFA = rsp + offset, plus 8 when
    /// `(rip & 15) >= plt_threshold` (the stub has pushed its relocation index).
    Plt = 3,
    /// The return address is undefined: the outermost frame (`_start`, a thread's entry).
    EndOfStack = 4,
    /// A signal trampoline (`__restore_rt`): rsp points at the `ucontext_t` the kernel saved,
    /// and the interrupted frame's rip, rsp and rbp are read from its `uc_mcontext`.
    SignalFrame = 5,
    /// A frame that realigned its stack (gcc's dynamic realignment for 32- and 64-byte
    /// aligned locals, common in AVX code): CFA = *(rbp - offset), the caller's rbp saved at
    /// rbp. Its CFI is `DW_CFA_def_cfa_expression (DW_OP_breg6 -offset; DW_OP_deref)` with
    /// `DW_CFA_expression: rbp (DW_OP_breg6 0)`.
    RbpDeref = 6,
}

/// Offsets in the x86-64 `ucontext_t` the kernel pushes for a signal handler, from rsp at the
/// signal trampoline: `uc_mcontext.rsp`, `.rip` and `.rbp` (gregs after 40 bytes of uc_flags,
/// uc_link and uc_stack; rsp is greg 15, rip 16, rbp 10).
pub const SIGNAL_FRAME_RSP: u64 = 160;
/// See [`SIGNAL_FRAME_RSP`].
pub const SIGNAL_FRAME_RIP: u64 = 168;
/// See [`SIGNAL_FRAME_RSP`].
pub const SIGNAL_FRAME_RBP: u64 = 120;

/// One row of an unwind table: the rules that hold from `pc` up to the next row's `pc`.
///
/// 8 bytes (BPF array elements are padded to 8 bytes, so 12 would cost 16). The return
/// address is always at CFA - 8, as on every x86-64 ABI frame; rows where CFI says otherwise
/// are stored as [`CfaRule::NoInfo`]. `info` packs: bits 0-2 the [`CfaRule`]; bit 3 set when
/// the caller's rbp is saved; bits 4-15 the rbp save slot's offset from the CFA in 8-byte
/// units (12-bit signed), or for [`CfaRule::Plt`] the `rip & 15` threshold.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// Start of the range, as an ELF virtual address of the object (before load bias).
    pub pc: u32,
    /// Offset added to the CFA rule's register (CFA offsets are never negative).
    pub cfa_offset: u16,
    /// The packed rules (see the type's documentation).
    pub info: u16,
}

/// Where the return address is, relative to the CFA, in every row.
pub const RETURN_ADDRESS_OFFSET: i64 = -8;
const RBP_SAVED: u16 = 1 << 3;

impl UnwindRow {
    /// A row; `None` when the rbp offset is not a multiple of 8 within ±16 KiB.
    pub const fn new(
        pc: u32,
        rule: CfaRule,
        cfa_offset: u16,
        rbp_offset: Option<i16>,
        plt_threshold: u8,
    ) -> Option<UnwindRow> {
        let mut info = rule as u16;
        if let Some(off) = rbp_offset {
            if off % 8 != 0 || off / 8 < -2048 || off / 8 > 2047 {
                return None;
            }
            info |= RBP_SAVED | (((off / 8) as u16) << 4);
        } else if plt_threshold > 15 {
            return None;
        } else {
            info |= (plt_threshold as u16) << 4;
        }
        Some(UnwindRow {
            pc,
            cfa_offset,
            info,
        })
    }

    /// The row's [`CfaRule`] as its u8 value.
    #[inline(always)]
    pub const fn cfa_rule(&self) -> u8 {
        (self.info & 7) as u8
    }

    /// Where the caller's rbp is saved relative to the CFA, or `None` when rbp is unchanged.
    #[inline(always)]
    pub const fn rbp_offset(&self) -> Option<i16> {
        if self.info & RBP_SAVED != 0 {
            Some(((self.info as i16) >> 4) * 8)
        } else {
            None
        }
    }

    /// For [`CfaRule::Plt`]: the `rip & 15` from which the extra 8 bytes apply.
    #[inline(always)]
    pub const fn plt_threshold(&self) -> u8 {
        (self.info >> 4) as u8 & 15
    }
}

/// One executable mapping of a process, for the CFI walk.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindMapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past its last address.
    pub end: u64,
    /// Runtime address minus ELF virtual address for this mapping's object.
    pub bias: u64,
    /// Index of the object's first row in the row array.
    pub first_row: u32,
    /// Number of rows; zero when the object has no table (walk by frame pointer).
    pub rows: u32,
}

/// The executable mappings of one process, sorted by `start`, as the CFI walk sees them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    /// Number of valid entries at the start of `mappings`.
    pub len: u64,
    /// The mappings; entries from `len` on are zero.
    pub mappings: [UnwindMapping; MAX_UNWIND_MAPPINGS],
}

#[cfg(test)]
mod tests {
    use super::follows_call;

    /// The 8 bytes before a return address that follows `call`, padded in front with `pad`.
    fn before_return(call: &[u8], pad: u8) -> u64 {
        let mut bytes = [pad; 8];
        bytes[8 - call.len()..].copy_from_slice(call);
        u64::from_le_bytes(bytes)
    }

    #[test]
    fn call_instructions_are_recognised_before_a_return_address() {
        // Encodings as gcc and as(1) emit them.
        let calls: &[&[u8]] = &[
            &[0xe8, 0x10, 0x20, 0x30, 0x40],             // call rel32
            &[0xff, 0xd0],                               // call *%rax
            &[0x41, 0xff, 0xd3],                         // call *%r11
            &[0xff, 0x10],                               // call *(%rax)
            &[0xff, 0x50, 0x18],                         // call *0x18(%rax)
            &[0x41, 0xff, 0x54, 0x24, 0x08],             // call *0x8(%r12)
            &[0xff, 0x14, 0xc1],                         // call *(%rcx,%rax,8)
            &[0xff, 0x15, 0x00, 0x10, 0x00, 0x00],       // call *0x1000(%rip)
            &[0xff, 0x90, 0x00, 0x01, 0x00, 0x00],       // call *0x100(%rax)
            &[0xff, 0x94, 0x24, 0x00, 0x01, 0x00, 0x00], // call *0x100(%rsp)
        ];
        for call in calls {
            // Padding that is no call itself (nop).
            assert!(follows_call(before_return(call, 0x90)), "{call:x?}");
        }
        let not_calls: &[&[u8]] = &[
            &[0x90, 0x90],                   // nops
            &[0xff, 0xe0],                   // jmp *%rax (FF /4)
            &[0xff, 0xc0],                   // inc %eax (FF /0)
            &[0x48, 0x89, 0xe5],             // mov %rsp,%rbp
            &[0xe9, 0x10, 0x20, 0x30, 0x40], // jmp rel32
        ];
        for bytes in not_calls {
            assert!(!follows_call(before_return(bytes, 0x90)), "{bytes:x?}");
        }
    }
}
