//! A run's result files, fetched from the daemon through its socket: for owners who cannot
//! reach the daemon's state folder (a hardened unit, a container, another machine's mount).

use std::{collections::BTreeMap, path::Path};

use crate::{
    client::Client,
    error::{Error, Result},
};

/// Copies the result `files` of run `run_id` (format name -> the daemon's path) into `dir`,
/// under the daemon's file names; returns format name -> the copy's path.
pub fn copy_results(
    client: &mut Client,
    run_id: u64,
    files: &BTreeMap<String, String>,
    dir: &Path,
) -> Result<BTreeMap<String, String>> {
    let mut copied = BTreeMap::new();
    for (format, daemon_path) in files {
        let bytes = client.read_result(run_id, format)?;
        let name = Path::new(daemon_path)
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_else(|| format.clone().into());
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|source| Error::Output {
            path: path.clone(),
            source,
        })?;
        copied.insert(format.clone(), path.display().to_string());
    }
    Ok(copied)
}
