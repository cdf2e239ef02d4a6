//! V8's named frames merged into a sample's native stack: each recorded JavaScript frame
//! replaces the native frame it was recorded at (by its index from the leaf, which the
//! kernel walk recorded), and, unless the glue is kept, V8's own builtins and unnamed JIT
//! frames between two JavaScript frames go.

use std::collections::HashMap;

use profiler_common::{RuntimeTag, V8Frame};

use super::heap::JsFunction;
use crate::{
    runtime::FrameOptions,
    symbolize::{Frame, FrameKind},
};

/// The kind of V8's JavaScript frames.
pub const JS_FRAME: FrameKind = FrameKind::Runtime(RuntimeTag::V8);

/// Named functions by SharedFunctionInfo (tagged address).
#[derive(Default)]
pub struct V8Symbols(pub HashMap<u64, JsFunction>);

/// The frames of a runtime stack as the kernel packed them, innermost first.
pub fn frames(stack: &[u64]) -> impl Iterator<Item = V8Frame> + '_ {
    stack
        .chunks_exact(V8Frame::WORDS)
        .map(|w| V8Frame::unpack([w[0], w[1], w[2], w[3]]))
}

/// How V8 ran a frame, as far as the frame and the code it was in tell: interpreted
/// (Ignition) when its bytecode offset slot held a Smi; else compiled (Sparkplug, Maglev or
/// TurboFan code, which V8 puts in anonymous memory) or a builtin (V8's own code in the
/// object, such as `Array.prototype.forEach`), by the mapping of the native frame it replaces.
pub fn tier(frame: &V8Frame, native: &Frame) -> &'static str {
    if frame.bytecode_offset.is_some() {
        "interpreted"
    } else if native.name.starts_with("[anon]") || native.module.as_deref() == Some("[anon]") {
        "compiled"
    } else {
        "builtin"
    }
}

fn js_frame(frame: &V8Frame, native: &Frame, function: Option<&JsFunction>) -> Frame {
    // The tier goes in the module: names and labels stay the function's whatever V8 runs.
    let module = Some(format!("[v8 {}]", tier(frame, native)).into());
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
        frames(stack).any(|f| !self.0.contains_key(&f.shared))
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
    let mut replaced: HashMap<usize, Frame> = HashMap::new();
    for frame in frames(stack) {
        if let Some(&at) = called.get(frame.native_index as usize) {
            let js = js_frame(&frame, &native[at].0, symbols.0.get(&frame.shared));
            replaced.insert(at, js);
        }
    }
    let out: Vec<(Frame, A)> = native
        .into_iter()
        .enumerate()
        .map(|(i, (frame, address))| match replaced.remove(&i) {
            Some(js) => (js, address),
            None => (frame, address),
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
        symbols.0.insert(0x11, function("hotA", 12));
        symbols.0.insert(0x21, function("level1", 20));
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
        assert_eq!(merged[3].0.module.as_deref(), Some("[v8 interpreted]"));
        assert_eq!(merged[4].0.module.as_deref(), Some("[v8 compiled]"));
        // A JavaScript frame in V8's own code (a builtin function) is no interpreted one.
        let builtin = merge(
            vec![native("Builtins_ArrayForEach")],
            &packed(0, 0x11, None),
            &symbols,
            false,
        );
        assert_eq!(builtin[0].0.module.as_deref(), Some("[v8 builtin]"));
        let kept = merge(stack_native, &stack, &symbols, true);
        assert_eq!(kept.len(), 6);
        assert_eq!(&*kept[4].0.name, "Builtins_CallFunction");
    }
}
