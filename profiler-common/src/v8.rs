//! V8's (Node.js) frames, recorded by the CFI walk.

/// Processes whose V8 (Node.js) frames the kernel program records at once.
pub const MAX_V8_PROCESSES: u32 = 1024;
/// Bytes below a frame pointer the kernel reads at once for a V8 frame: the frame's fixed
/// slots (context or type marker, function, argument count, bytecode array and offset).
pub const V8_FRAME_SLOT_BYTES: u32 = 64;

/// What the kernel program needs to recognise one V8 process's JavaScript frames on the
/// frame-pointer chain, from V8's postmortem constants (`v8dbg_*`). Userspace fills it per
/// process; every field is checked by the kernel before use (a process may fake them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct V8Process {
    /// Bytes below the frame pointer of the context slot, which holds a frame type marker
    /// (a Smi) in V8's typed frames and a heap object in JavaScript frames.
    pub fp_marker: u32,
    /// Bytes below the frame pointer of the JSFunction slot.
    pub fp_function: u32,
    /// Bytes below the frame pointer of the bytecode offset slot (a Smi in interpreted frames).
    pub fp_bytecode_offset: u32,
    /// `HeapObject::map`'s offset.
    pub heap_object_map: u32,
    /// `Map::instance_type`'s offset (a u16).
    pub map_instance_type: u32,
    /// `JSFunction::shared`'s offset.
    pub function_shared: u32,
    /// `JSFunction::code`'s offset.
    pub function_code: u32,
    /// The range of instance types of JSFunction and its subclasses.
    pub function_type_first: u16,
    pub function_type_last: u16,
}

/// One JavaScript frame as the kernel records it: [`V8Frame::WORDS`] words, innermost frame
/// first, in the sample's runtime stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct V8Frame {
    /// The frame's index in the sample's native user stack (innermost 0).
    pub native_index: u16,
    /// The bytecode offset slot's value when it held a Smi (an interpreted frame).
    pub bytecode_offset: Option<u32>,
    /// The SharedFunctionInfo (tagged pointer) of the frame's function.
    pub shared: u64,
    /// The frame's instruction pointer (as the native stack has it).
    pub pc: u64,
    /// The function's Code object (tagged pointer) when the frame was recorded.
    pub code: u64,
}

impl V8Frame {
    /// Words per frame in a runtime stack.
    pub const WORDS: usize = 4;
    /// Bit of word 0 set when the bytecode offset slot held a Smi.
    pub const SMI_BIT: u64 = 1 << 16;

    /// Word 0 of a frame: native index, the Smi flag, the Smi's value.
    #[inline(always)]
    pub fn word0(native_index: u16, bytecode_slot: u64) -> u64 {
        // Smis are tagged 0 in their low bit and hold their value in the upper 32 bits.
        let smi = if bytecode_slot & 1 == 0 {
            Self::SMI_BIT | (bytecode_slot & 0xffff_ffff_0000_0000)
        } else {
            0
        };
        native_index as u64 | smi
    }

    /// The frame of four recorded words.
    pub fn unpack(words: [u64; Self::WORDS]) -> V8Frame {
        V8Frame {
            native_index: words[0] as u16,
            bytecode_offset: (words[0] & Self::SMI_BIT != 0).then_some((words[0] >> 32) as u32),
            shared: words[1],
            pc: words[2],
            code: words[3],
        }
    }
}
