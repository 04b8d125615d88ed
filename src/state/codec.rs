//! The state file's text: the schema as JSON (serde), the previous
//! release's format read once, and the bounds a file must keep.

use serde::Deserialize;

use super::problem::Problem;
use super::schema::{Damage, GpuState, State, MAX_FIXED, MAX_SIZE, VERSION};
use super::v1;

/// The text of `state`, at most [`MAX_SIZE`] bytes.
pub(super) fn render(state: &State) -> Result<String, Problem> {
    let text = serde_json::to_string(state).map_err(Problem::Encode)? + "\n";
    if text.len() as u64 > MAX_SIZE {
        return Err(Problem::TooLarge(text.len()));
    }
    Ok(text)
}

/// A state file of this version, or of version 1 converted, within the bounds.
pub(super) fn parse(text: &str) -> Result<State, Damage> {
    /// The one field every version has.
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let state = if text.starts_with(v1::MAGIC) {
        v1::parse(text)?
    } else {
        let Version { version } = serde_json::from_str(text).map_err(Damage::NotJson)?;
        if version != VERSION {
            return Err(Damage::Version(version));
        }
        serde_json::from_str(text).map_err(Damage::Schema)?
    };
    within_bounds(state)
}

/// `state` if it keeps the bounds that span two collections (each
/// collection was bounded while it was read).
fn within_bounds(state: State) -> Result<State, Damage> {
    let fixed = |gpu: &GpuState| gpu.fixed.len() + gpu.fixed_labels.len() > MAX_FIXED;
    if let Some((uuid, _)) = state.gpus.iter().find(|(_, gpu)| fixed(gpu)) {
        return Err(Damage::Fixed(uuid.clone()));
    }
    if let Some((uuid, _)) = state.gpus.iter().find(|(_, gpu)| !gpu.tasks.is_bounded()) {
        return Err(Damage::Tasks(uuid.clone()));
    }
    Ok(state)
}
