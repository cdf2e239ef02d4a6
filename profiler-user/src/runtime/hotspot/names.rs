//! A Java method's name from its `Method*`: `Method -> ConstMethod -> ConstantPool`, the
//! class from the pool's holder (`Klass::_name`), the method's name from the pool's entry at
//! `ConstMethod::_name_index` (a `Symbol*` right after the pool's header), as the
//! serviceability agent reads them. Every read is bounded and checked: a `Method*` is a value
//! the target wrote on its stack.

use anyhow::{anyhow, Context};

use super::vmstructs::VmStructs;
use crate::runtime::cpython::memory::ProcessMemory;

/// Longest symbol read (a class or method name): HotSpot's own limit is 65,535.
const MAX_SYMBOL: u64 = 1024;

/// Where names are kept.
#[derive(Clone, Debug)]
pub struct NameLayout {
    method_const_method: u64,
    const_method_constants: u64,
    const_method_name_index: u64,
    constant_pool_holder: u64,
    constant_pool_length: u64,
    constant_pool_size: u64,
    klass_name: u64,
    symbol_length: u64,
    symbol_body: u64,
}

impl NameLayout {
    /// The layout `vm` describes.
    pub fn new(vm: &VmStructs) -> anyhow::Result<NameLayout> {
        Ok(NameLayout {
            method_const_method: vm.offset("Method", "_constMethod")?,
            const_method_constants: vm.offset("ConstMethod", "_constants")?,
            const_method_name_index: vm.offset("ConstMethod", "_name_index")?,
            constant_pool_holder: vm.offset("ConstantPool", "_pool_holder")?,
            constant_pool_length: vm.offset("ConstantPool", "_length")?,
            constant_pool_size: vm.size("ConstantPool")?,
            klass_name: vm.offset("Klass", "_name")?,
            symbol_length: vm.offset("Symbol", "_length")?,
            symbol_body: vm.offset_of_any(&[("Symbol", "_body"), ("Symbol", "_body[0]")])?,
        })
    }
}

/// `Class.method` of `Method*` `method` (the class with dots, as Java writes it).
pub fn method_name(
    memory: &ProcessMemory,
    layout: &NameLayout,
    method: u64,
) -> anyhow::Result<String> {
    let pointer = |at: u64| -> anyhow::Result<u64> {
        let p = memory.read_u64(at)?;
        // Metadata lives in user space and is 8-byte aligned.
        if p == 0 || p & 7 != 0 || p >= 1 << 47 {
            return Err(anyhow!("bad pointer {p:#x} at {at:#x}"));
        }
        Ok(p)
    };
    if method == 0 || method & 7 != 0 {
        return Err(anyhow!("bad Method* {method:#x}"));
    }
    let const_method = pointer(method + layout.method_const_method)?;
    let pool = pointer(const_method + layout.const_method_constants)?;
    let holder = pointer(pool + layout.constant_pool_holder)?;
    let class = symbol(memory, layout, pointer(holder + layout.klass_name)?).context("class")?;
    let mut index = [0u8; 2];
    memory.read_exact(const_method + layout.const_method_name_index, &mut index)?;
    let index = u16::from_le_bytes(index) as u64;
    let length = memory.read_i32(pool + layout.constant_pool_length)?;
    if index == 0 || index >= length.max(0) as u64 {
        return Err(anyhow!("name index {index} outside a pool of {length}"));
    }
    let name = symbol(
        memory,
        layout,
        pointer(pool + layout.constant_pool_size + 8 * index)?,
    )
    .context("method")?;
    Ok(format!("{}.{name}", class.replace('/', ".")))
}

fn symbol(memory: &ProcessMemory, layout: &NameLayout, at: u64) -> anyhow::Result<String> {
    let mut length = [0u8; 2];
    memory.read_exact(at + layout.symbol_length, &mut length)?;
    let length = u16::from_le_bytes(length) as u64;
    if length == 0 || length > MAX_SYMBOL {
        return Err(anyhow!("symbol of {length} bytes"));
    }
    let bytes = memory.read_vec(at + layout.symbol_body, length as usize)?;
    // Modified UTF-8; names of real classes and methods are valid UTF-8 but for NUL and
    // supplementary characters, which are shown replaced.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
