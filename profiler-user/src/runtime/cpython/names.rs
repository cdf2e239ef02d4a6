//! Python's `threading` names of a process's threads (`Thread(name="worker-a")`,
//! `MainThread`), read from `threading._active`, the module's dict of thread ident to
//! `Thread` object, as `py-spy dump` reads it.
//!
//! The module is found through the globals of a frame running `threading.py`'s code (any
//! thread started by `threading` runs one at its root); its dict, the `_active` dict and each
//! `Thread`'s `_name` attribute are read with the dict layouts of 3.10 and of 3.11+. An
//! instance's attributes live in a dict (3.10, or once materialized) or in a values array
//! whose keys its type shares (3.11+: found by looking in the heap type for the keys object
//! that holds `_name`). Every read is bounded; a name that cannot be read is left out.
//!
//! Object fields are placed after the layout's object header: a free-threaded build's is 32
//! bytes (`ob_tid`, the local and shared reference counts, `ob_type` at 24), not 16, which
//! moves every field of a dict and of a type object by 16 bytes.

use std::collections::HashMap;

use anyhow::{anyhow, ensure};

use super::{code::read_str, layout::Layout, memory::ProcessMemory};
use anyhow::Result;

/// Most entries of a dict read (a module's globals, `_active`, an instance's attributes).
const MAX_DICT_ENTRIES: u64 = 1 << 14;
/// `offsetof(PyTypeObject, tp_dictoffset)` of 3.10 (the only version that reads it).
const TYPE_DICTOFFSET: u64 = 288;
/// Where the heap type's fields after `PyTypeObject` are searched for its shared keys
/// (`ht_cached_keys`): its offset differs between versions and builds (16 bytes later in a
/// free-threaded one), and the keys object found must hold the attribute asked for.
const HEAP_TYPE_SEARCH: std::ops::Range<u64> = 400..1216;
/// `PyDictKeysObject.dk_kind` of a split table (3.11+): keys shared by a type's instances.
const DICT_KEYS_SPLIT: u8 = 2;

/// One entry of a dict: its hash (0 where the table keeps none), key and value.
#[derive(Clone, Copy, Debug)]
struct Entry {
    hash: u64,
    key: u64,
    value: u64,
}

/// Reads the dicts and objects of one interpreter version.
pub struct NameReader<'a> {
    /// The process's memory.
    pub memory: &'a ProcessMemory,
    /// Its layout (for `str` objects).
    pub layout: &'a Layout,
    /// The minor version (10-13).
    pub minor: u8,
}

impl NameReader<'_> {
    /// `offsetof(frame, f_globals)` for the version's frame (`PyFrameObject` on 3.10,
    /// `_PyInterpreterFrame` on 3.11+).
    pub fn frame_globals_offset(&self) -> u64 {
        match self.minor {
            10 => 48,
            11 => 8,
            _ => 24,
        }
    }

    /// The entries of a keys object and where its entries start; `values` is the values
    /// array of a split table (3.10: `ma_values`), 0 for a combined one.
    fn keys_entries(&self, keys: u64, values: u64) -> Result<Vec<Entry>> {
        let m = self.memory;
        let (entries_at, count, wide) = if self.minor == 10 {
            let size = m.read_u64(keys + 8)?;
            ensure!(
                size.is_power_of_two() && size <= 1 << 20,
                "dict size {size}"
            );
            let index_bytes = match size {
                s if s <= 0xff => 1,
                s if s <= 0xffff => 2,
                s if s <= 0xffff_ffff => 4,
                _ => 8,
            };
            (keys + 40 + size * index_bytes, m.read_u64(keys + 32)?, true)
        } else {
            let log2_index_bytes = m.read_u8(keys + 9)?;
            ensure!(
                log2_index_bytes < 24,
                "dict index bytes 2^{log2_index_bytes}"
            );
            let kind = m.read_u8(keys + 10)?;
            (
                keys + 32 + (1u64 << log2_index_bytes),
                m.read_u64(keys + 24)?,
                kind == 0,
            )
        };
        ensure!(count <= MAX_DICT_ENTRIES, "dict of {count} entries");
        let size = if wide { 24 } else { 16 };
        let raw = m.read_vec(entries_at, (count * size) as usize)?;
        let values = if values != 0 {
            // 3.13's values array begins with a 4-byte header, padded to 8.
            let base = if self.minor >= 13 { values + 8 } else { values };
            Some(m.read_vec(base, (count * 8) as usize)?)
        } else {
            None
        };
        let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        Ok((0..count as usize)
            .map(|i| {
                let e = &raw[i * size as usize..];
                let (hash, key, value) = if wide {
                    (word(e, 0), word(e, 8), word(e, 16))
                } else {
                    (0, word(e, 0), word(e, 8))
                };
                let value = values.as_ref().map_or(value, |v| word(v, i * 8));
                Entry { hash, key, value }
            })
            .filter(|e| e.key != 0 && e.value != 0)
            .collect())
    }

    /// `sizeof(PyObject)`: `ob_type` is its last field in every build.
    fn header(&self) -> u64 {
        u64::from(self.layout.object_type) + 8
    }

    /// `offsetof(PyTypeObject, tp_basicsize)`: the word after `tp_name`.
    fn type_basicsize(&self) -> u64 {
        u64::from(self.layout.type_name) + 8
    }

    /// The entries of the dict object at `dict` (`ma_used` and the version or watcher tag
    /// after the header, then `ma_keys` and `ma_values`).
    fn dict_entries(&self, dict: u64) -> Result<Vec<Entry>> {
        let keys = self.memory.read_u64(dict + self.header() + 16)?;
        let values = self.memory.read_u64(dict + self.header() + 24)?;
        self.keys_entries(keys, values)
    }

    /// The value of the `str` key `name` among `entries`.
    fn lookup(&self, entries: &[Entry], name: &str) -> Option<u64> {
        entries
            .iter()
            .find(|e| read_str(self.memory, self.layout, e.key).is_ok_and(|k| k == name))
            .map(|e| e.value)
    }

    /// The attribute `name` of the object at `obj`, from its instance dict or its values.
    fn attribute(&self, obj: u64, name: &str) -> Result<u64> {
        let m = self.memory;
        let ty = m.read_u64(obj + u64::from(self.layout.object_type))?;
        let (dict, values) = match self.minor {
            10 => {
                let offset = m.read_u64(ty + TYPE_DICTOFFSET)? as i64;
                ensure!(offset > 0, "no instance dict at a fixed offset");
                (m.read_u64(obj.wrapping_add(offset as u64))?, 0)
            }
            11 => {
                let dict = m.read_u64(obj.wrapping_sub(24))?;
                (dict, m.read_u64(obj.wrapping_sub(32))?)
            }
            12 => {
                let tagged = m.read_u64(obj.wrapping_sub(24))?;
                // A values pointer is stored less one, which makes it odd.
                if tagged & 1 != 0 {
                    (0, tagged + 1)
                } else {
                    (tagged, 0)
                }
            }
            _ => {
                let dict = m.read_u64(obj.wrapping_sub(24))?;
                (dict, obj + m.read_u64(ty + self.type_basicsize())?)
            }
        };
        if dict != 0 {
            return self
                .lookup(&self.dict_entries(dict)?, name)
                .ok_or_else(|| anyhow!("no attribute {name}"));
        }
        ensure!(values != 0, "no attributes");
        // The type's shared keys: the keys object of a split table that holds `name`.
        for off in HEAP_TYPE_SEARCH.step_by(8) {
            let Ok(keys) = m.read_u64(ty + off) else {
                break;
            };
            if keys == 0 || keys % 8 != 0 || m.read_u8(keys + 10).ok() != Some(DICT_KEYS_SPLIT) {
                continue;
            }
            if let Ok(entries) = self.keys_entries(keys, values) {
                if let Some(v) = self.lookup(&entries, name) {
                    return Ok(v);
                }
            }
        }
        Err(anyhow!("no shared keys hold {name}"))
    }

    /// Thread ident -> `threading` name, from the `threading` module's globals at `globals`.
    pub fn names(&self, globals: u64) -> Result<HashMap<u64, String>> {
        let active = self
            .lookup(&self.dict_entries(globals)?, "_active")
            .ok_or_else(|| anyhow!("threading has no _active"))?;
        let mut out = HashMap::new();
        for entry in self.dict_entries(active)? {
            // An int key's hash is the int itself (idents are far below 2^61 - 1).
            let Ok(name) = self.attribute(entry.value, "_name") else {
                continue;
            };
            if let Ok(name) = read_str(self.memory, self.layout, name) {
                out.insert(entry.hash, name);
            }
        }
        Ok(out)
    }
}
