//! V8's named frames merged into a sample's native stack: each recorded JavaScript frame
//! replaces the native frame it was recorded at (by its index from the leaf, which the
//! kernel walk recorded), with the functions optimized code inlined there after it, each a
//! frame of its own (see [`super::code`]); unless the glue is kept, V8's own builtins and
//! unnamed JIT frames between two JavaScript frames go.

use std::collections::{BTreeMap, HashMap};

use profiler_common::{RuntimeTag, V8Frame};

use super::{
    code::{CodeInfo, CodeKind},
    heap::JsFunction,
};
use crate::{
    runtime::FrameOptions,
    symbolize::{Frame, FrameKind},
};

/// The kind of V8's JavaScript frames.
pub const JS_FRAME: FrameKind = FrameKind::Runtime(RuntimeTag::V8);

/// A process's named functions and the Code objects read for its frames.
#[derive(Default)]
pub struct V8Symbols {
    /// Functions by SharedFunctionInfo (tagged address).
    pub functions: HashMap<u64, JsFunction>,
    /// Code objects by tagged address.
    pub codes: HashMap<u64, CodeInfo>,
    /// The same Code objects by their instructions' start.
    pub by_start: BTreeMap<u64, u64>,
}

impl V8Symbols {
    /// Keeps Code `tagged`.
    pub fn add_code(&mut self, tagged: u64, code: CodeInfo) {
        self.by_start.insert(code.start, tagged);
        self.codes.insert(tagged, code);
    }

    /// The Code whose instructions hold `pc`, among those read.
    pub fn code_at(&self, pc: u64) -> Option<&CodeInfo> {
        let (_, tagged) = self.by_start.range(..=pc).next_back()?;
        self.codes.get(tagged).filter(|c| c.contains(pc))
    }

    /// The Code a frame ran: the one holding its pc (its call instruction's, one byte before
    /// a return address), else the function's code the kernel recorded where that holds it.
    pub fn code_of(&self, frame: &V8Frame) -> Option<&CodeInfo> {
        self.code_at(lookup_pc(frame)).or_else(|| {
            self.codes
                .get(&frame.code)
                .filter(|c| c.contains(lookup_pc(frame)))
        })
    }
}

/// The address a frame's code is looked up at: its pc where it is the sampled one (the
/// innermost native frame), else its return address's call instruction, a byte before.
pub fn lookup_pc(frame: &V8Frame) -> u64 {
    if frame.native_index > 0 {
        frame.pc.saturating_sub(1)
    } else {
        frame.pc
    }
}

/// The module of a function inlined into an optimized frame.
pub const INLINED: &str = "[js inlined]";

/// The frames of a runtime stack as the kernel packed them, innermost first.
pub fn frames(stack: &[u64]) -> impl Iterator<Item = V8Frame> + '_ {
    stack
        .chunks_exact(V8Frame::WORDS)
        .map(|w| V8Frame::unpack([w[0], w[1], w[2], w[3]]))
}

/// How V8 ran a frame, as far as the frame and the code it was in tell: by the Code object
/// its pc lies in where one was read (Sparkplug's baseline, Maglev's or TurboFan's optimized
/// code, on-stack replacement code included, whose frame keeps the interpreter's bytecode
/// offset); else interpreted (Ignition) when its bytecode offset slot held a Smi; else compiled (code V8 puts in anonymous memory: on-stack replacement code, or any
/// where V8 exports no Code layout) or a builtin (V8's own code in the object, such as
/// `Array.prototype.forEach`), by the mapping of the native frame it replaces.
pub fn tier(frame: &V8Frame, native: &Frame, code: Option<&CodeInfo>) -> &'static str {
    if let Some(code) = code {
        code.kind.module()
    } else if frame.bytecode_offset.is_some() {
        CodeKind::Interpreted.module()
    } else if native.name.starts_with("[anon]") || native.module.as_deref() == Some("[anon]") {
        CodeKind::Other.module()
    } else {
        "[js builtin]"
    }
}

/// The frames of a recorded JavaScript frame, root first: its function's, then those its
/// optimized code inlined at its pc, innermost last.
fn js_frames(frame: &V8Frame, native: &Frame, symbols: &V8Symbols) -> Vec<Frame> {
    let code = symbols.code_of(frame);
    // The tier goes in the module: names and labels stay the function's whatever V8 runs.
    let module = tier(frame, native, code);
    let own = js_frame(module, symbols.functions.get(&frame.shared));
    let chain = code.and_then(|c| c.inlined_at(frame.pc, frame.native_index > 0, frame.shared));
    let Some(chain) = chain.filter(|c| c.len() > 1) else {
        return vec![own];
    };
    let mut out = vec![own];
    // Innermost first, the last the frame's own function (already out).
    for inlined in chain.iter().rev().skip(1) {
        let mut f = js_frame(INLINED, symbols.functions.get(&inlined.shared));
        f.inlined = true;
        out.push(f);
    }
    out
}

fn js_frame(module: &str, function: Option<&JsFunction>) -> Frame {
    let module = Some(module.into());
    match function {
        Some(f) => Frame {
            name: f.name.as_str().into(),
            module,
            kind: JS_FRAME,
            inlined: false,
            file: f.file.as_deref().map(Into::into),
            line: f.line,
            start_line: f.line,
            build_id: None,
        },
        None => Frame::named("[unknown JavaScript]", module, JS_FRAME),
    }
}

/// Whether `frame` is V8's own code between JavaScript frames: a builtin (entry trampolines,
/// call and construct stubs, the interpreter's handlers) or JIT code no symbol names.
fn is_glue(frame: &Frame) -> bool {
    frame.kind == FrameKind::User
        && (frame.name.starts_with("Builtins_") || frame.name.starts_with("[anon]"))
}

impl crate::runtime::NamedFrames for V8Symbols {
    fn has_unnamed(&self, stack: &[u64]) -> bool {
        frames(stack).any(|f| {
            !self.functions.contains_key(&f.shared)
                || self.code_of(&f).is_some_and(|c| {
                    c.inlined_at(f.pc, f.native_index > 0, f.shared)
                        .is_some_and(|chain| {
                            chain
                                .iter()
                                .any(|i| !self.functions.contains_key(&i.shared))
                        })
                })
        })
    }

    fn merge(
        &self,
        native: Vec<(Frame, Option<crate::profile::CodeAddress>)>,
        stack: &[u64],
        options: FrameOptions,
    ) -> Vec<(Frame, Option<crate::profile::CodeAddress>)> {
        merge(native, stack, self, options.keep_glue)
    }
}

/// [`crate::runtime::NamedFrames::merge`] for any address type.
pub fn merge<A: Clone>(
    native: Vec<(Frame, A)>,
    stack: &[u64],
    symbols: &V8Symbols,
    keep_glue: bool,
) -> Vec<(Frame, A)> {
    if stack.is_empty() {
        return native;
    }
    // One frame per recorded address is not inlined (its inlined callees come after it, root
    // first): the n-th of those from the leaf is the kernel's frame n.
    let called: Vec<usize> = (0..native.len())
        .rev()
        .filter(|&i| !native[i].0.inlined)
        .collect();
    let mut replaced: HashMap<usize, Vec<Frame>> = HashMap::new();
    for frame in frames(stack) {
        if let Some(&at) = called.get(frame.native_index as usize) {
            replaced.insert(at, js_frames(&frame, &native[at].0, symbols));
        }
    }
    let out: Vec<(Frame, A)> = native
        .into_iter()
        .enumerate()
        .flat_map(|(i, (frame, address))| match replaced.remove(&i) {
            Some(js) => js.into_iter().map(|f| (f, address.clone())).collect(),
            None => vec![(frame, address)],
        })
        .collect();
    if keep_glue {
        return out;
    }
    let is_js = |f: &Frame| f.kind == JS_FRAME;
    let Some(first) = out.iter().position(|(f, _)| is_js(f)) else {
        return out;
    };
    let last = out.iter().rposition(|(f, _)| is_js(f)).unwrap_or(first);
    out.into_iter()
        .enumerate()
        .filter(|(i, (f, _))| !(*i > first && *i < last && is_glue(f)))
        .map(|(_, x)| x)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(name: &str) -> (Frame, u32) {
        (
            Frame::named(name, Some("/usr/bin/node".into()), FrameKind::User),
            1,
        )
    }

    fn packed(index: u16, shared: u64, smi: Option<u32>) -> [u64; 4] {
        let slot = match smi {
            Some(v) => (v as u64) << 32,
            None => 0x1234_5671,
        };
        [V8Frame::word0(index, slot), shared, 0x7f00_0000_1000, 0x41]
    }

    #[test]
    fn js_frames_replace_the_native_frames_they_were_recorded_at() {
        let mut symbols = V8Symbols::default();
        let function = |name: &str, line| JsFunction {
            name: name.into(),
            file: Some("/app/prog.js".into()),
            line: Some(line),
        };
        symbols.functions.insert(0x11, function("hotA", 12));
        symbols.functions.insert(0x21, function("level1", 20));
        // Leaf first: hotA optimized at native frame 0, level1 interpreted at frame 2.
        let stack: Vec<u64> = [packed(0, 0x11, None), packed(2, 0x21, Some(60))]
            .concat()
            .to_vec();
        let mut inlined = native("inlined_into_start");
        inlined.0.inlined = true;
        let stack_native = vec![
            native("node::Start"),
            inlined,
            native("Builtins_JSEntry"),
            native("Builtins_InterpreterEntryTrampoline"),
            native("Builtins_CallFunction"),
            native("[anon]+0x10"),
        ];
        let merged = merge(stack_native.clone(), &stack, &symbols, false);
        let names: Vec<&str> = merged.iter().map(|(f, _)| &*f.name).collect();
        assert_eq!(
            names,
            [
                "node::Start",
                "inlined_into_start",
                "Builtins_JSEntry",
                "level1",
                "hotA"
            ]
        );
        assert_eq!(merged[3].0.module.as_deref(), Some("[js interpreted]"));
        assert_eq!(merged[4].0.module.as_deref(), Some("[js compiled]"));
        // A JavaScript frame in V8's own code (a builtin function) is no interpreted one.
        let builtin = merge(
            vec![native("Builtins_ArrayForEach")],
            &packed(0, 0x11, None),
            &symbols,
            false,
        );
        assert_eq!(builtin[0].0.module.as_deref(), Some("[js builtin]"));
        let kept = merge(stack_native, &stack, &symbols, true);
        assert_eq!(kept.len(), 6);
        assert_eq!(&*kept[4].0.name, "Builtins_CallFunction");
    }

    #[test]
    fn optimized_frames_expand_their_inlined_functions_in_call_order() {
        use super::super::code::SourcePosition;
        let function = |name: &str| JsFunction {
            name: name.into(),
            file: Some("/app/prog.js".into()),
            line: Some(1),
        };
        let mut symbols = V8Symbols::default();
        for (shared, name) in [(0x11, "outer"), (0x21, "middle"), (0x31, "inner")] {
            symbols.functions.insert(shared, function(name));
        }
        let position = |id: u64| SourcePosition((10 << 1) | (id << 31));
        // TurboFan code at 0x7f00_0000_0f00 whose instructions from offset 0x100 on run
        // `inner` inlined into `middle`, inlined into the code's own `outer`.
        symbols.add_code(
            0x5001,
            CodeInfo {
                kind: CodeKind::Turbofan,
                start: 0x7f00_0000_0f00,
                size: 0x200,
                positions: vec![(0, position(0)), (0x100, position(2))],
                inlining: vec![(position(0), 0), (position(1), 1)],
                inlined: vec![0x21, 0x31],
            },
        );
        // The sampled frame (pc 0x7f00_0000_1000, offset 0x100): three frames, root first.
        let merged = merge(
            vec![native("[anon]+0x1000")],
            &packed(0, 0x11, None),
            &symbols,
            false,
        );
        let shown: Vec<(&str, &str, bool)> = merged
            .iter()
            .map(|(f, _)| (&*f.name, f.module.as_deref().unwrap(), f.inlined))
            .collect();
        assert_eq!(
            shown,
            [
                ("outer", "[js optimized TurboFan]", false),
                ("middle", "[js inlined]", true),
                ("inner", "[js inlined]", true),
            ]
        );
        // A caller's frame at the same address is a return address: looked up a byte back
        // (offset 0xff), where the code runs its own function alone.
        let caller = merge(
            vec![native("[anon]+0x1000"), native("Builtins_CallFunction")],
            &packed(1, 0x11, None),
            &symbols,
            true,
        );
        assert_eq!(caller.len(), 2);
        assert_eq!(&*caller[0].0.name, "outer");
        // A frame whose pc is in no code read keeps one frame, its kind as before.
        let mut elsewhere = packed(0, 0x11, None);
        elsewhere[2] = 0x7f00_0000_9000;
        let merged = merge(vec![native("[anon]+0x9000")], &elsewhere, &symbols, false);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].0.module.as_deref(), Some("[js compiled]"));
    }
}
