//! The messages of google/pprof's `proto/profile.proto` (package `perftools.profiles`,
//! <https://github.com/google/pprof/blob/main/proto/profile.proto>), with its field numbers and
//! types; fields bpfprof never sets (`Line.column`, `Profile.doc_url`) are left out, which
//! readers treat as unset. Every `int64` naming a string is an index into `string_table`.

/// The whole profile.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    /// What each `Sample.value` measures.
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    /// The samples.
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    /// Binaries the locations belong to; `mapping[0]` is taken as the main binary.
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    /// Program locations referenced by samples.
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    /// Functions referenced by locations.
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Every string of the profile; entry 0 must be "".
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    /// Regexp of frames to drop, with their callees.
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    /// Regexp of frames to keep despite `drop_frames`.
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    /// Start of collection, in nanoseconds since the Unix epoch.
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    /// Length of collection.
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    /// The kind of event between samples.
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    /// Events between samples.
    #[prost(int64, tag = "12")]
    pub period: i64,
    /// Free-form text.
    #[prost(int64, repeated, packed = "true", tag = "13")]
    pub comment: Vec<i64>,
    /// The `type` of the sample value to show by default.
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

/// A measurement's type and unit.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    /// For example "cpu".
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    /// For example "nanoseconds".
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

/// Values measured at one stack.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// The stack, leaf first.
    #[prost(uint64, repeated, packed = "true", tag = "1")]
    pub location_id: Vec<u64>,
    /// One value per `Profile.sample_type`.
    #[prost(int64, repeated, packed = "true", tag = "2")]
    pub value: Vec<i64>,
    /// Context of the sample.
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

/// A key with a string or a number.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    /// The key.
    #[prost(int64, tag = "1")]
    pub key: i64,
    /// A string value.
    #[prost(int64, tag = "2")]
    pub str: i64,
    /// A numeric value.
    #[prost(int64, tag = "3")]
    pub num: i64,
    /// The unit of `num`.
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

/// A binary mapped into the process.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    /// Nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Load address.
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    /// End of the mapped range.
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    /// File offset of `memory_start`.
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    /// The binary's file name.
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// The binary's build id.
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    /// Locations are symbolized to functions.
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    /// Functions have source file names.
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    /// Lines have line numbers.
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    /// Locations list inlined functions.
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

/// A program location: one instruction, with the functions inlined at it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    /// Nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The mapping, or 0 when none applies.
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    /// The instruction address, if known.
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost inlined callee first, the function really holding the instruction last.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    /// Several symbols share the address (identical code folding).
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

/// A function and line within a location.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    /// The function.
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    /// The source line, or 0.
    #[prost(int64, tag = "2")]
    pub line: i64,
}

/// A function.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    /// Nonzero id.
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// Human-readable name.
    #[prost(int64, tag = "2")]
    pub name: i64,
    /// Name as the system knows it.
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    /// Source file.
    #[prost(int64, tag = "4")]
    pub filename: i64,
    /// First line of the function.
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}
