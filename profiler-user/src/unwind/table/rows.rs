//! Reduces gimli's evaluated CFI rows to the kernel walk's three rules (CFA, return address,
//! caller's rbp), and collects them into a sorted, compacted table within its bounds.

use std::time::Duration;

use anyhow::anyhow;
use gimli::{
    BaseAddresses, CfaRule as GimliCfa, RegisterRule, UnwindContext, UnwindSection, X86_64,
};
use profiler_common::{CfaRule, UnwindRow, RETURN_ADDRESS_OFFSET};

use super::{Slice, UnwindTable, BUILD_LIMIT, WORK_PER_BUDGET_CHECK, WORK_PER_FDE};
use crate::clock::thread_cpu_time;

/// Collects rows from FDEs in any order; [`RowBuilder::finish`] sorts and compacts them.
///
/// Bounded: it holds at most `max_rows` rows (rows equal to the one before them are merged as
/// they come, so the bound is on what the table could hold, not on what the CFI repeats), and
/// fails once the build has used `budget` of CPU time. Either makes the object's table
/// unavailable with the reason, rather than costing the daemon memory and time.
pub(super) struct RowBuilder {
    pub(super) rows: Vec<UnwindRow>,
    max_rows: usize,
    /// Whether `rows` is still sorted by pc (FDEs read in address order keep it so, and then
    /// equal neighbours are merged as they come).
    sorted: bool,
    /// The build's CPU budget and the thread's CPU time when it started.
    budget: Duration,
    started: Duration,
    /// Work done since the CPU budget was last checked (see [`WORK_PER_BUDGET_CHECK`]).
    since_check: usize,
    /// FDEs skipped because another entry had already read them or their range.
    pub(super) skipped_fdes: u64,
}

impl RowBuilder {
    pub(super) fn new(max_rows: usize, budget: Duration) -> RowBuilder {
        RowBuilder {
            rows: Vec::new(),
            max_rows,
            sorted: true,
            budget,
            started: thread_cpu_time(),
            since_check: 0,
            skipped_fdes: 0,
        }
    }

    /// Forgets the rows collected so far (the CPU budget keeps counting).
    pub(super) fn restart(&mut self) {
        self.rows.clear();
        self.sorted = true;
    }

    pub(super) fn add_fde<'a, S: UnwindSection<Slice<'a>>>(
        &mut self,
        section: &S,
        bases: &BaseAddresses,
        ctx: &mut UnwindContext<usize>,
        fde: &gimli::FrameDescriptionEntry<Slice<'a>>,
    ) -> anyhow::Result<()> {
        let end = fde.end_address();
        // Addresses beyond 4 GiB do not fit the 32-bit row pc; such objects do not exist in
        // practice (the largest shared objects are under 1 GiB).
        if end > u64::from(u32::MAX) {
            return Ok(());
        }
        self.work(WORK_PER_FDE)?;
        let mut table = match fde.rows(section, bases, ctx) {
            Ok(t) => t,
            // One unreadable FDE leaves its range to frame pointers; the rest still count.
            Err(_) => return Ok(()),
        };
        let signal = fde.is_signal_trampoline();
        while let Ok(Some(row)) = table.next_row() {
            if row.start_address() >= row.end_address() {
                continue;
            }
            self.push(convert(section, row, signal))?;
        }
        // Past the FDE, nothing is known until the next FDE starts.
        self.push(no_info(end as u32))
    }

    /// Counts `units` of work, failing once the build used more than its CPU budget.
    pub(super) fn work(&mut self, units: usize) -> anyhow::Result<()> {
        self.since_check += units;
        if self.since_check < WORK_PER_BUDGET_CHECK {
            return Ok(());
        }
        self.since_check = 0;
        let used = thread_cpu_time().saturating_sub(self.started);
        if used > self.budget {
            return Err(anyhow!(
                "{BUILD_LIMIT}: its call frame information took more than {} s of CPU to read \
                 ({} rows so far; a broken or hostile file)",
                self.budget.as_secs(),
                self.rows.len()
            ));
        }
        Ok(())
    }

    /// Adds one row, merging it into the last when the rows are in order and it changes
    /// nothing; fails past the row limit or the CPU budget. (Rows merged before an
    /// out-of-order FDE arrives stay merged: only overlapping FDEs, which no linker emits,
    /// read differently than by sorting everything first.)
    pub(super) fn push(&mut self, row: UnwindRow) -> anyhow::Result<()> {
        self.work(1)?;
        if let Some(last) = self.rows.last_mut() {
            if row.pc < last.pc {
                self.sorted = false;
            } else if self.sorted {
                // A later FDE's row at the same pc wins, as in `finish`.
                if last.pc == row.pc {
                    *last = row;
                    return Ok(());
                }
                if same_rule(last, &row) {
                    return Ok(());
                }
            }
        }
        if self.rows.len() >= self.max_rows {
            return Err(anyhow!(
                "{BUILD_LIMIT}: its call frame information has more than {} rows, more than its \
                 code could hold (a broken or hostile file)",
                self.max_rows
            ));
        }
        self.rows.push(row);
        Ok(())
    }

    pub(super) fn finish(self) -> anyhow::Result<UnwindTable> {
        if self.skipped_fdes > 0 {
            log::debug!(
                "{} CFI entries skipped: they repeat FDEs or ranges already read",
                self.skipped_fdes
            );
        }
        let mut unsorted = self.rows;
        // Stable sort: an FDE's closing NoInfo row and the next FDE's first row share a pc,
        // and the latter, pushed later, must win.
        unsorted.sort_by_key(|r| r.pc);
        let mut rows: Vec<UnwindRow> = Vec::with_capacity(unsorted.len());
        for row in unsorted {
            if let Some(last) = rows.last_mut() {
                if last.pc == row.pc {
                    *last = row;
                    continue;
                }
                if same_rule(last, &row) {
                    continue;
                }
            }
            rows.push(row);
        }
        // Collapsing equal pcs can leave two equal neighbours behind.
        rows.dedup_by(|b, a| same_rule(a, b));
        Ok(UnwindTable { rows })
    }
}

pub(super) fn same_rule(a: &UnwindRow, b: &UnwindRow) -> bool {
    UnwindRow { pc: 0, ..*a } == UnwindRow { pc: 0, ..*b }
}

pub(super) fn no_info(pc: u32) -> UnwindRow {
    UnwindRow::new(pc, CfaRule::NoInfo, 0, None, 0).expect("a valid row")
}

/// Reduces one gimli row to what the kernel walk can evaluate.
pub(super) fn convert<'a, S: UnwindSection<Slice<'a>>>(
    section: &S,
    row: &gimli::UnwindTableRow<usize>,
    signal_trampoline: bool,
) -> UnwindRow {
    let pc = row.start_address() as u32;
    if signal_trampoline {
        // glibc's (and musl's) `__restore_rt`: CFA = *(rsp + 160), registers at fixed offsets
        // from rsp in the saved ucontext. The walk reads that context itself; any other
        // signal-frame CFI is left to frame pointers.
        let is_ucontext = matches!(row.cfa(), GimliCfa::Expression(expr)
            if expr.get(section).is_ok_and(|e| e.0.slice() == SIGCONTEXT_CFA));
        return if is_ucontext {
            UnwindRow::new(pc, CfaRule::SignalFrame, 0, None, 0).expect("a valid row")
        } else {
            no_info(pc)
        };
    }
    match row.register(X86_64::RA) {
        None | Some(RegisterRule::Undefined) => {
            return UnwindRow::new(pc, CfaRule::EndOfStack, 0, None, 0).expect("a valid row")
        }
        Some(RegisterRule::Offset(RETURN_ADDRESS_OFFSET)) => {}
        Some(_) => return no_info(pc),
    };
    // gcc's stack realignment: CFA = *(rbp - N), the caller's rbp saved at rbp.
    if let GimliCfa::Expression(expr) = row.cfa() {
        let realigned = expr
            .get(section)
            .ok()
            .and_then(|e| realigned_cfa(e.0.slice()));
        let rbp_at_rbp = matches!(row.register(X86_64::RBP), Some(RegisterRule::Expression(e))
            if e.get(section).is_ok_and(|e| e.0.slice() == RBP_AT_RBP));
        if let (Some(offset), true) = (realigned, rbp_at_rbp) {
            return UnwindRow::new(pc, CfaRule::RbpDeref, offset, None, 0)
                .unwrap_or_else(|| no_info(pc));
        }
    }
    let rbp = match row.register(X86_64::RBP) {
        None | Some(RegisterRule::SameValue) => None,
        Some(RegisterRule::Offset(off)) => match i16::try_from(off) {
            Ok(off) => Some(off),
            Err(_) => return no_info(pc),
        },
        Some(_) => return no_info(pc),
    };
    let (rule, cfa_offset, plt_threshold) = match row.cfa() {
        GimliCfa::RegisterAndOffset { register, offset } => {
            // CFA offsets are positive (the CFA lies above the frame); u16 reaches 64 KiB frames.
            let Ok(offset) = u16::try_from(*offset) else {
                return no_info(pc);
            };
            match *register {
                X86_64::RSP => (CfaRule::Rsp, offset, 0),
                X86_64::RBP => (CfaRule::Rbp, offset, 0),
                _ => return no_info(pc),
            }
        }
        GimliCfa::Expression(expr) => {
            match expr.get(section).ok().and_then(|e| plt_rule(e.0.slice())) {
                Some((offset, threshold)) if rbp.is_none() => (CfaRule::Plt, offset, threshold),
                _ => return no_info(pc),
            }
        }
    };
    UnwindRow::new(pc, rule, cfa_offset, rbp, plt_threshold).unwrap_or_else(|| no_info(pc))
}

/// `DW_OP_breg6 (rbp) 0`: where a realigned frame saved its caller's rbp.
pub(super) const RBP_AT_RBP: &[u8] = &[0x76, 0x00];

/// Recognizes the CFA expression of gcc's stack realignment, `DW_OP_breg6 (rbp) -N;
/// DW_OP_deref` (CFA = *(rbp - N)), and returns N.
pub(super) fn realigned_cfa(expr: &[u8]) -> Option<u16> {
    const BREG6: u8 = 0x76;
    const DEREF: u8 = 0x06;
    match expr {
        // A one-byte SLEB128 operand from -64 to -1 (0x40..=0x7f).
        [BREG6, n, DEREF] if (0x40..0x80).contains(n) => Some(0x80 - u16::from(*n)),
        _ => None,
    }
}

/// `DW_OP_breg7 (rsp) 160; DW_OP_deref`: the CFA of a signal trampoline is the interrupted
/// rsp saved in the ucontext at rsp + 160.
pub(super) const SIGCONTEXT_CFA: &[u8] = &[0x77, 0xa0, 0x01, 0x06];

/// Recognizes the CFA expression GNU ld and lld emit for `.plt` entries:
/// `DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_litT; DW_OP_ge;
/// DW_OP_lit3; DW_OP_shl; DW_OP_plus`, i.e. CFA = rsp + N + ((rip & 15) >= T) * 8.
/// Returns (N, T).
pub(super) fn plt_rule(expr: &[u8]) -> Option<(u16, u8)> {
    const BREG7: u8 = 0x77;
    const BREG16: u8 = 0x80;
    const LIT0: u8 = 0x30;
    const AND: u8 = 0x1a;
    const GE: u8 = 0x2a;
    const SHL: u8 = 0x24;
    const PLUS: u8 = 0x22;
    // The SLEB128 operands are small here: one byte each, positive (< 64).
    match expr {
        [BREG7, n, BREG16, 0, lit15, AND, lit_t, GE, lit3, SHL, PLUS]
            if *n < 0x40
                && *lit15 == LIT0 + 15
                && (LIT0..=LIT0 + 15).contains(lit_t)
                && *lit3 == LIT0 + 3 =>
        {
            Some((u16::from(*n), lit_t - LIT0))
        }
        _ => None,
    }
}
