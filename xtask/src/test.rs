//! `cargo xtask test`: `cargo test --workspace` with the arguments passed on verbatim.

use std::ffi::OsString;

use anyhow::Result;

use crate::cmd::{cargo, run};

/// Options of `cargo xtask test`.
#[derive(clap::Args)]
pub struct Options {
    #[arg(
        value_name = "ARGS",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    args: Vec<OsString>,
}

/// Runs `cargo test --workspace ARGS`.
pub fn test(args: &[OsString]) -> Result<()> {
    println!("==> cargo test --workspace");
    run(cargo().args(["test", "--workspace"]).args(args))
}
